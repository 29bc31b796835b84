"""VitaBench: the task loader, the adapter over the benchmark's environment, the rubric judge and the order proxy.

Every task here is synthetic, written in VitaBench's task format; no real data is used. VitaBench's own code is not
available to the tests (no package ships it): a tiny stand-in ``vita`` package, written to a temporary folder, stands
in for the user's checkout of the benchmark's repository.
"""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import call_text

from envace.benchmarks import vita
from envace.benchmarks.vita import VitaFormatError, VitaToolbox, load_vita, to_task
from envace.benchmarks.vita_scoring import RubricJudge, order_match, parse_judge_reply, score_vita, sliding_windows

NOODLES = {"order_type": "delivery", "store_id": "S1", "location": {"address": "Ward 3"},
           "products": [{"product_id": "P1", "quantity": 2}, {"product_id": "P2", "quantity": 1}]}
TEA = {"order_type": "instore", "store_id": "S2", "products": [{"product_id": "P9", "quantity": 1}]}


def vita_task(task_id: str = "T1", rubrics: tuple[str, ...] = ("The store is Noodle House", "Two bowls are ordered"),
              overall: tuple[str, ...] = ("The order goes to Ward 3",),
              required: tuple[dict[str, Any], ...] = (NOODLES,)) -> dict[str, Any]:
    """A small task in VitaBench's format (cf. delivery/tasks_en.json, abridged)."""
    return {
        "id": task_id, "domain": "delivery", "message_history": [],
        "environment": {"time": "2025-06-21 11:20:00", "user_id": "U1", "orders": {},
                        "stores": {"S1": {"name": "Noodle House", "store_id": "S1"},
                                   "S3": {"name": "Tea Corner", "store_id": "S3"}}},
        "user_scenario": {"user_profile": {"occupation": "Doctor", "personality": "Impatient"}},
        "instructions": "Order two bowls of mild rice noodles to Ward 3.",
        "evaluation_criteria": {
            "expected_states": [{"required_orders": [copy.deepcopy(o) for o in required], "optional_orders": [],
                                 "state_rubrics": list(rubrics)}],
            "overall_rubrics": list(overall),
        },
    }


def write_tasks(folder: Path, records: list[Any], name: str = "tasks_en.json") -> Path:
    path = folder / name
    if name.endswith(".jsonl"):
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    else:
        path.write_text(json.dumps(records), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Loader
# ---------------------------------------------------------------------------------------------------------------------


def test_a_valid_file_loads_as_array_or_json_lines(tmp_path) -> None:
    second = vita_task(7)
    second["domain"] = "delivery,instore"
    for name in ("tasks_en.json", "tasks.jsonl"):
        path = write_tasks(tmp_path, [vita_task("T1"), second], name)
        tasks = load_vita(path)
        assert [(t.id, t.domain) for t in tasks] == [("T1", "delivery"), ("7", "delivery,instore")]
        first = tasks[0]
        assert first.source == str(path) and first.raw["user_scenario"]["user_profile"]["occupation"] == "Doctor"
        assert first.rubrics == ("The store is Noodle House", "Two bowls are ordered", "The order goes to Ward 3")
        assert first.required_orders == [NOODLES] and first.time == "2025-06-21 11:20:00"
        assert [t.id for t in load_vita(path, ids=["7", "T1"])] == ["7", "T1"]


def _set(path: str, value: Any):
    def mutate(record: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = record
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return mutate


def _drop(key: str):
    return lambda record: record.pop(key)


STATES = "evaluation_criteria/expected_states"


@pytest.mark.parametrize("mutate, message", [
    (_drop("instructions"), "missing field 'instructions'"),
    (_set("id", None), "field 'id': must be a non-empty string or an integer"),
    (_set("domain", "food"), "field 'domain': must be one of delivery, instore, ota, cross_domain"),
    (_set("environment", []), "field 'environment': must be an object, got a list"),
    (_set("instructions", 5), "field 'instructions': must be a string, got a number"),
    (_set("user_scenario/user_profile", "x"), "field 'user_scenario.user_profile': must be an object"),
    (_set("evaluation_criteria", None), "field 'evaluation_criteria': must be an object, got null"),
    (_set(STATES, {}), "field 'evaluation_criteria.expected_states': must be a list of objects"),
    (_set(f"{STATES}/0/state_rubrics", "x"),
     "field 'evaluation_criteria.expected_states[0].state_rubrics': must be a list of strings"),
    (_set(f"{STATES}/0/required_orders", [1]),
     "field 'evaluation_criteria.expected_states[0].required_orders': must be a list of objects"),
    (_set(f"{STATES}/0/optional_orders", "none"),
     "field 'evaluation_criteria.expected_states[0].optional_orders': must be a list of objects"),
    (_set("evaluation_criteria/overall_rubrics", [3]),
     "field 'evaluation_criteria.overall_rubrics': must be a list of strings"),
    (_set("message_history", "hi"), "field 'message_history': must be a list of messages"),
])
def test_each_bad_field_is_reported_with_the_file_the_index_and_the_field(tmp_path, mutate, message) -> None:
    bad = vita_task("T2")
    mutate(bad)
    path = write_tasks(tmp_path, [vita_task("T1"), bad])
    with pytest.raises(VitaFormatError) as info:
        load_vita(path)
    assert str(info.value).startswith(f"{path}[1]: {message}")


def test_json_lines_errors_name_the_line(tmp_path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(vita_task("T1")) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(VitaFormatError, match=r"tasks\.jsonl:2: not valid JSON"):
        load_vita(path)
    bad = vita_task("T2")
    bad["domain"] = "flights"
    path.write_text(json.dumps(vita_task("T1")) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(VitaFormatError, match=r"tasks\.jsonl:3: field 'domain'"):
        load_vita(path)


def test_unknown_and_duplicate_ids_are_refused(tmp_path) -> None:
    path = write_tasks(tmp_path, [vita_task("T1"), vita_task("T2")])
    with pytest.raises(VitaFormatError, match=r"unknown task id\(s\) \['nope'\]; 2 valid, e.g. \['T1', 'T2'\]"):
        load_vita(path, ids=["T1", "nope"])
    path = write_tasks(tmp_path, [vita_task("T1"), vita_task("T1")])
    with pytest.raises(VitaFormatError, match=r"\[1\]: duplicate task id 'T1' \(first at .*tasks_en\.json\[0\]\)"):
        load_vita(path)


# ---------------------------------------------------------------------------------------------------------------------
# Rubric judge
# ---------------------------------------------------------------------------------------------------------------------


class ScriptedJudgeEngine:
    """An engine answering each prompt with the next scripted reply; it records every batch (decoded prompts)."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.batches = tokenizer, list(replies), []

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        from envace.engines.base import Generation
        from envace.policy.chat import decode, encode

        self.batches.append([decode(self.tokenizer, p) for p in prompts])
        return [Generation(encode(self.tokenizer, self.replies.pop(0)) + [self.tokenizer.eos_token_id], True)
                for _ in prompts]


def make_judge(tokenizer: Any, replies: list[str], **kwargs: Any) -> tuple[RubricJudge, ScriptedJudgeEngine]:
    from envace.engines.chat_model import ChatModel

    engine = ScriptedJudgeEngine(tokenizer, replies)
    return RubricJudge(ChatModel.from_engine(engine, tokenizer), **kwargs), engine


def conversation(count: int) -> list[dict[str, Any]]:
    """A system message, then ``count`` messages (user / assistant with a call / tool ...), each saying its number."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "policy"}]
    for n in range(1, count + 1):
        role = ("user", "assistant", "tool")[n % 3]
        message: dict[str, Any] = {"role": role, "content": f"m{n}"}
        if role == "assistant":
            message["tool_calls"] = [{"type": "function", "function": {"name": "search", "arguments": {"q": n}}}]
        if role == "tool":
            message["name"] = "search"
        messages.append(message)
    return messages


def load_one(tmp_path: Path, record: dict[str, Any]) -> vita.VitaTask:
    return load_vita(write_tasks(tmp_path, [record], f"{record['id']}.json"))[0]


def test_windows_are_vitabenchs() -> None:
    # 23 messages, window 10, overlap 2: starts every 8 messages; the third window is the first to reach the end
    assert sliding_windows(23, 10, 2) == [(0, 10), (8, 18), (16, 23)]
    assert sliding_windows(18, 10, 2) == [(0, 10), (8, 18)]
    assert sliding_windows(11, 10, 2) == [(0, 10), (8, 11)]
    assert sliding_windows(10, 10, 2) == [(0, 10)]
    assert sliding_windows(3, 10, 2) == [(0, 3)]
    assert sliding_windows(0, 10, 2) == []
    assert sliding_windows(7, 4, 1) == [(0, 4), (3, 7)]


@pytest.mark.parametrize("reply, offered, met", [
    ('{"met": [1, 3]}', [1, 2, 3], {1, 3}),
    ('{"met": []}', [1], set()),
    ('```json\n{"met": [2]}\n```', [1, 2], {2}),
    ('<think>the user asked for noodles</think>\n```json\n{"met": [1]}\n```', [1], {1}),
    ('The first rubric is met.', [1], None),
    ('{"met": [1], "why": "ordered"}', [1], None),
    ('{"met": [true]}', [1], None),
    ('{"met": ["1"]}', [1], None),
    ('{"met": [4]}', [1, 2], None),
    ('{"met": [1]} and more', [1], None),
])
def test_a_judge_reply_must_be_exactly_the_met_json(reply, offered, met) -> None:
    assert parse_judge_reply(reply, offered) == met


def test_rubrics_are_met_window_by_window_and_the_judge_sees_only_unmet_ones(tmp_path, tiny_tokenizer) -> None:
    long_task = vita_task("A", rubrics=("r-store", "r-bowls"), overall=("r-address",))
    long_task["evaluation_criteria"]["expected_states"].append(  # a repeated rubric counts once
        {"required_orders": [], "optional_orders": [], "state_rubrics": ["r-store"]})
    a = load_one(tmp_path, long_task)
    b = load_one(tmp_path, vita_task("B", rubrics=("b-one",), overall=("b-two",)))
    assert a.rubrics == ("r-store", "r-bowls", "r-address")
    judge, engine = make_judge(tiny_tokenizer, [
        '{"met": [1]}', '```json\n{"met": [1, 2]}\n```',  # window 1: A and B in one batch
        '<think>m12 places the order</think>\n{"met": [3]}',  # window 2: A only (B has one window)
        '{"met": []}',  # window 3
    ])
    verdicts = judge.judge([a, b], [conversation(23), conversation(5)])
    assert [len(batch) for batch in engine.batches] == [2, 1, 1]
    assert verdicts[0].met == [True, False, True] and verdicts[0].reward == 0.0
    assert verdicts[0].rubric_score == pytest.approx(2 / 3)
    assert verdicts[1].met == [True, True] and verdicts[1].reward == 1.0 and verdicts[1].rubric_score == 1.0
    first, second, third = engine.batches[0][0], engine.batches[1][0], engine.batches[2][0]
    assert "1. r-store" in first and "2. r-bowls" in first and "3. r-address" in first
    assert "r-store" not in second and "2. r-bowls" in second and "3. r-address" in second
    assert "2. r-bowls" in third and "r-address" not in third
    # windows over the 23 non-system messages: 1-10, 9-18, 17-23 (numbered from 1)
    assert '[1] assistant: m1 search({"q": 1})' in first and "[2] tool (search): m2" in first
    assert "[3] user: m3" in first and "[10] assistant: m10" in first and "[11]" not in first
    assert "messages 9 to 18 of 23" in second and "[8]" not in second and "[19]" not in second
    assert "[9] user: m9" in second and "[18] user: m18" in second
    assert "messages 17 to 23 of 23" in third and "[16]" not in third and "[23]" in third
    assert "Saturday" in first and "Order two bowls" in first


def test_an_invalid_verdict_is_retried_then_the_episode_fails_apart_from_the_scores(tmp_path, tiny_tokenizer) -> None:
    t1 = load_one(tmp_path, vita_task("T1", rubrics=("one",), overall=("two",)))
    t2 = load_one(tmp_path, vita_task("T2", rubrics=("three",), overall=("four",), required=()))
    judge, engine = make_judge(tiny_tokenizer, [
        '{"met": [1, 2]}', "Rubric 1 is met.", '{"met": [2]}',  # T1 trial 0, T1 trial 1, T2
        '{"met": [1], "why": "x"}',  # retry 1 of T1 trial 1
        '{"met": [7]}',  # retry 2: rubric 7 was not offered
    ])
    ordered = [dict(NOODLES, order_id="OT9", create_time="2025-06-21 11:25:00")]
    result = score_vita([t1, t1, t2], [conversation(3)] * 3, judge, final_orders=[ordered, [], []])
    assert [len(batch) for batch in engine.batches] == [3, 1, 1]
    assert engine.batches[1][0] == engine.batches[0][1] == engine.batches[2][0]  # the same question again
    assert [(e["reward"], e["rubric_score"], e["failed"]) for e in result["episodes"]] == [
        (1.0, 1.0, False), (None, None, True), (0.0, 0.5, False)]
    assert result["judge_failures"] == [{"task_id": "T1", "trial": 1, "reason": result["episodes"][1]["reason"]}]
    assert "no valid verdict after 3 attempts" in result["episodes"][1]["reason"]
    assert result["scored"] == 2 and result["avg_reward"] == 0.5 and result["avg_rubric_score"] == 0.75
    assert result["pass_hat"] == {1: 0.5} and result["pass_at"] == {1: 0.5}
    proxy = result["order_match_unofficial"]
    assert proxy["note"].startswith("unofficial proxy") and proxy["mean"] == pytest.approx(2 / 3)
    assert proxy["without_required_orders"] == 1
    assert [e["order_match_unofficial"] for e in result["episodes"]] == [1.0, 0.0, 1.0]


def test_pass_hat_over_several_scored_trials(tmp_path, tiny_tokenizer) -> None:
    t1 = load_one(tmp_path, vita_task("T1", rubrics=("one",), overall=()))
    judge, _ = make_judge(tiny_tokenizer, ['{"met": [1]}', '{"met": [1]}', '{"met": []}', '{"met": [1]}'])
    result = score_vita([t1] * 4, [conversation(2)] * 4, judge)
    assert [e["trial"] for e in result["episodes"]] == [0, 1, 2, 3]
    assert result["pass_hat"][1] == 0.75 and result["pass_hat"][2] == pytest.approx(3 / 6)
    assert result["pass_hat"][4] == 0.0 and result["pass_at"][4] == 1.0
    assert "order_match_unofficial" not in result


def test_judge_settings_are_checked(tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="overlap < window"):
        make_judge(tiny_tokenizer, [], window=4, overlap=4)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        make_judge(tiny_tokenizer, [], retries=-1)


# ---------------------------------------------------------------------------------------------------------------------
# Order proxy (unofficial)
# ---------------------------------------------------------------------------------------------------------------------


def test_order_match_counts_required_orders_placed(tmp_path) -> None:
    record = vita_task("T1", required=(NOODLES,))
    record["evaluation_criteria"]["expected_states"].append(  # the same order in two states counts once
        {"required_orders": [NOODLES, TEA], "optional_orders": [], "state_rubrics": []})
    task = load_one(tmp_path, record)
    assert len(task.required_orders) == 2
    placed = dict(NOODLES, order_id="OT1", status="paid", create_time="2025-06-21 11:30:00", total_price=12.0,
                  products=[{"product_id": "P2", "quantity": 1, "price": 2.0}, {"product_id": "P1", "quantity": 2.0}])
    tea = dict(TEA, order_id="OI1", location={"address": "anywhere"})  # in-store: the address is not compared
    assert order_match(task, [placed, tea]) == 1.0
    three = dict(placed, products=[{"product_id": "P1", "quantity": 3}, {"product_id": "P2", "quantity": 1}])
    assert order_match(task, [three, tea]) == 0.5  # wrong quantity
    assert order_match(task, [dict(placed, location={"address": "Ward 4"}), tea]) == 0.5  # wrong delivery address
    assert order_match(task, [dict(placed, store_id="S9"), dict(tea, order_type="delivery")]) == 0.0
    assert order_match(task, [dict(tea, location=None)]) == 0.5  # in-store without an address
    assert order_match(task, []) == 0.0
    assert order_match(load_one(tmp_path, vita_task("T9", required=())), []) == 1.0  # nothing required


# ---------------------------------------------------------------------------------------------------------------------
# Adapter over the benchmark's environment
# ---------------------------------------------------------------------------------------------------------------------


STAND_IN = {
    "vita/__init__.py": "",
    "vita/data_model/__init__.py": "",
    "vita/data_model/message.py": '''
        from dataclasses import dataclass

        @dataclass
        class ToolCall:
            name: str
            arguments: dict
            id: str = ""
            requestor: str = "assistant"

        @dataclass
        class ToolMessage:
            id: str
            name: str
            role: str
            content: str = None
            requestor: str = "assistant"
            error: bool = False
    ''',
    "vita/domains/__init__.py": "",
    "vita/domains/delivery/__init__.py": "",
    "vita/domains/delivery/environment.py": '''
        import json

        from vita.data_model.message import ToolMessage


        class Tool:
            def __init__(self, name, params):
                self.name = name
                self.openai_schema = {"type": "function", "function": {
                    "name": name, "description": name, "parameters": {
                        "type": "object", "properties": {p: {"type": "string"} for p in params}, "required": params}}}


        class Order:
            def __init__(self, **data):
                self.data = data

            def model_dump(self, mode="python"):
                return dict(self.data)


        class DB:
            def __init__(self, db):
                self.time, self.stores, self.orders = db.get("time"), db.get("stores", {}), {}


        class Tools:
            def __init__(self, db):
                self.db = db

            def search_stores(self, keyword):
                return [s for s in self.db.stores.values() if keyword in s["name"]]

            def create_order(self, store_id, product_id, quantity, address):
                order_id = f"OT{len(self.db.orders)}"
                self.db.orders[order_id] = Order(
                    order_id=order_id, order_type="delivery", store_id=store_id, location={"address": address},
                    products=[{"product_id": product_id, "quantity": int(quantity)}], create_time=self.db.time)
                return f"Order {order_id} created"


        class Environment:
            def __init__(self, db, language):
                self.tools, self.language = Tools(DB(db)), language

            def get_tools(self):
                return [Tool("search_stores", ["keyword"]),
                        Tool("create_order", ["store_id", "product_id", "quantity", "address"])]

            def get_policy(self):
                return "Policy for delivery. Current time: {time}"

            def get_response(self, call):
                try:
                    result, error = getattr(self.tools, call.name)(**call.arguments), False
                except Exception as exc:
                    result, error = f"Error: {exc}", True
                content = result if isinstance(result, str) else json.dumps(result)
                return ToolMessage(id=call.id, name=call.name, role="tool", content=content, error=error)


        def get_environment(db=None, language=None):
            return Environment(db or {}, language)
    ''',
    "vita/environment/__init__.py": "",
    "vita/environment/environment.py": '''
        from vita.domains.delivery.environment import get_environment


        def get_cross_environment(domain, environment, language=None):
            env = get_environment(environment, language)
            env.domains = domain
            return env
    ''',
}


@pytest.fixture
def stand_in_vita(tmp_path, monkeypatch):
    """A minimal ``vita`` package standing in for the user's checkout of VitaBench (its real code is not here)."""
    root = tmp_path / "checkout"
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [n for n in sys.modules if n == "vita" or n.startswith("vita.")]:
        del sys.modules[name]


def test_the_toolbox_runs_calls_on_the_benchmarks_environment(tmp_path, stand_in_vita, monkeypatch) -> None:
    from envace.envs.real import is_toolbox

    bowls = dict(NOODLES, products=[{"product_id": "P1", "quantity": 2}])
    task = load_vita(write_tasks(tmp_path, [vita_task("T1", required=(bowls,))]))[0]
    box = VitaToolbox(task.source, "T1")
    assert order_match(task, box.orders()) == 0.0
    assert is_toolbox(box) and box.tool_names() == ["search_stores", "create_order"]
    assert json.loads(box.call_tool("search_stores", {"keyword": "Noodle"})) == [
        {"name": "Noodle House", "store_id": "S1"}]
    placed = box.call_tool("create_order", {"store_id": "S1", "product_id": "P1", "quantity": "2",
                                            "address": "Ward 3"})
    assert placed == "Order OT0 created"
    assert box.call_tool("create_order", {"store_id": "S1"}).startswith("Error: ")
    assert box.orders() == [{"order_id": "OT0", "order_type": "delivery", "store_id": "S1",
                             "location": {"address": "Ward 3"}, "products": [{"product_id": "P1", "quantity": 2}],
                             "create_time": "2025-06-21 11:20:00"}]
    assert order_match(task, box.orders()) == 1.0
    assert vita.build_environment("cross_domain", task.environment).domains == "delivery,instore,ota"
    monkeypatch.setattr(vita, "BINDINGS", vita.VitaBindings(tool_call="vita.data_model.message.Nope"))
    with pytest.raises(ImportError, match="has no 'vita.data_model.message.Nope'.*BINDINGS"):
        VitaToolbox(task.source, "T1")


def test_to_task_builds_an_envace_task_for_a_simulated_user(tmp_path, stand_in_vita) -> None:
    from envace.envs.real import RealEnvironment
    from envace.types import EnvSpec, SuccessSpec, ToolCall

    with_history = vita_task("T2")
    with_history["message_history"] = [
        {"role": "assistant", "content": "Hello, how can I help you?"},
        {"role": "user", "content": "Noodles please."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "name": "search_stores", "arguments": {"keyword": "Noodle"}, "requestor": "assistant"}]},
        {"role": "tool", "id": "c1", "name": "search_stores", "content": "[]", "requestor": "assistant"},
    ]
    first, second = load_vita(write_tasks(tmp_path, [vita_task("T1"), with_history]))
    task = to_task(first)
    assert task.id == "T1"
    assert task.messages == ({"role": "system", "content": "Policy for delivery. Current time: 2025-06-21 11:20:00"},
                             {"role": "assistant", "content": "Hello, how can I help you?"})
    assert [t["function"]["name"] for t in task.tools] == ["search_stores", "create_order"]
    assert task.success == SuccessSpec(calls=(), answer=None)
    assert task.environment == EnvSpec("envace.benchmarks.vita.VitaToolbox",
                                       {"path": first.source, "task_id": "T1", "language": "english"})
    assert "2025-06-21 11:20:00 (Saturday)" in task.user and "- occupation: Doctor" in task.user
    assert task.user.endswith("# Instructions\nOrder two bowls of mild rice noodles to Ward 3.")
    content, ok = RealEnvironment(task.environment).execute(ToolCall("search_stores", {"keyword": "Tea"}))
    assert ok and json.loads(content) == [{"name": "Tea Corner", "store_id": "S3"}]
    replayed = to_task(second, system_prompt="Be brief.")
    assert replayed.messages[0] == {"role": "system", "content": "Be brief."}
    assert replayed.messages[3] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "search_stores", "arguments": {"keyword": "Noodle"}}}]}
    assert replayed.messages[4] == {"role": "tool", "content": "[]", "name": "search_stores"}


def test_a_missing_vitabench_says_how_to_install_the_users_checkout(tmp_path, monkeypatch) -> None:
    task = load_vita(write_tasks(tmp_path, [vita_task("T1")]))[0]
    monkeypatch.setitem(sys.modules, "vita", None)  # no `vita` module importable
    for attempt in (lambda: VitaToolbox(task.source, "T1"), lambda: vita.tool_schemas(task), lambda: to_task(task)):
        with pytest.raises(ImportError) as info:
            attempt()
        message = str(info.value)
        assert "not on PyPI" in message and "pip install -e <vitabench checkout>" in message and "\n" not in message
    with pytest.raises(ValueError, match="unknown VitaBench language 'klingon'"):
        vita.build_environment("delivery", task.environment, "klingon")


# ---------------------------------------------------------------------------------------------------------------------
# End to end: the policy, a simulated user, the benchmark's environment and the judge
# ---------------------------------------------------------------------------------------------------------------------

BOWLS = dict(NOODLES, products=[{"product_id": "P1", "quantity": 2}])
ORDER = {"store_id": "S1", "product_id": "P1", "quantity": "2", "address": "Ward 3"}


def small_rollout(**kwargs: Any) -> Any:
    from envace.rollout.config import RolloutConfig

    return RolloutConfig(**{"act_temperature": 0.0, "max_turns": 10, "max_tool_calls": 10, "max_context_tokens": 8192,
                            **kwargs})


def test_episodes_run_end_to_end_and_a_budget_cut_one_scores_0_without_the_judge(tmp_path, stand_in_vita,
                                                                                  tiny_tokenizer) -> None:
    from helpers import ScriptedEngine

    from envace.benchmarks.vita_eval import evaluate_vita
    from envace.worlds.users import ScriptedUser

    tasks = load_vita(write_tasks(tmp_path, [vita_task("T1", required=(BOWLS,)), vita_task("T2", required=(BOWLS,))]))
    act = ScriptedEngine(tiny_tokenizer, [
        call_text("search_stores", {"keyword": "Noodle"}), call_text("create_order", {"store_id": "S1"}),  # T1, T2
        call_text("create_order", ORDER), "Sorry, I cannot help.",
        "Your order OT0 is placed.", "Still cannot.",  # T1's user then stops; T2's second user turn was its last
    ])
    user = ScriptedUser({"T1": ["Two bowls of noodles to Ward 3, please.", None], "T2": ["Hello?", "Anyone?", "Hi?"]})
    judge, judge_engine = make_judge(tiny_tokenizer, ['{"met": [1, 2, 3]}'])
    rollout = small_rollout(max_user_turns=2, validate_calls=True)  # overridden: the environment answers bad calls
    result = evaluate_vita(tasks, act, tiny_tokenizer, user, judge, rollout=rollout)
    assert act.remaining == 0
    assert [len(batch) for batch in judge_engine.batches] == [1]  # T1 only: T2 is not judged
    (prompt,) = judge_engine.batches[0]
    assert "[2] user: Two bowls of noodles to Ward 3, please." in prompt
    assert 'create_order({"store_id": "S1", "product_id": "P1", "quantity": "2", "address": "Ward 3"})' in prompt
    assert "[6] tool (create_order): Order OT0 created" in prompt and "messages 1 to 7 of 7" in prompt
    one, two = result["episodes"]
    assert (one["task_id"], one["reward"], one["rubric_score"], one["order_match_unofficial"]) == ("T1", 1.0, 1.0, 1.0)
    assert [m["role"] for m in one["trajectory"]] == ["assistant", "user", "assistant", "tool", "assistant", "tool",
                                                      "assistant"]
    assert json.loads(one["trajectory"][3]["content"]) == [{"name": "Noodle House", "store_id": "S1"}]
    assert one["final_orders"] == [{"order_id": "OT0", "order_type": "delivery", "store_id": "S1",
                                    "location": {"address": "Ward 3"},
                                    "products": [{"product_id": "P1", "quantity": 2}],
                                    "create_time": "2025-06-21 11:20:00"}]
    assert (two["task_id"], two["reward"], two["rubric_score"], two["met"]) == ("T2", 0.0, 0.0, [False] * 3)
    assert two["premature"] == "user_turn_limit" and two["final_orders"] == [] and two["order_match_unofficial"] == 0.0
    assert two["trajectory"][3]["content"].startswith("Error: ")  # the missing arguments reached the environment
    assert result["premature"]["episodes"] == 1 and result["premature"]["reasons"] == {"user_turn_limit": 1}
    assert result["judged"] == 1 and result["judge_calls"] == 1
    assert result["rewards"] == {"T1": [1.0], "T2": [0.0]} and result["failed"] == {} and result["user_failures"] == []
    assert result["scored"] == 2 and result["avg_reward"] == 0.5 and result["pass_hat"] == {1: 0.5}
    assert result["order_match_unofficial"]["mean"] == 0.5
    assert [e.stats.user_stop for e in result["rollouts"]] == [True, False]


def test_a_model_user_plays_the_user_and_its_failures_are_reported_apart(tmp_path, stand_in_vita,
                                                                         tiny_tokenizer) -> None:
    from helpers import ScriptedEngine

    from envace.benchmarks.vita import USER_GUIDELINES
    from envace.benchmarks.vita_eval import evaluate_vita
    from envace.engines.chat_model import ChatModel

    wordy = vita_task("T2")
    wordy["instructions"] += " Extra detail." * 300  # its user's chat overflows the user model's prompt budget
    tasks = load_vita(write_tasks(tmp_path, [vita_task("T1", required=(BOWLS,)), wordy]))
    user_engine = ScriptedJudgeEngine(tiny_tokenizer, ["Two bowls to Ward 3, please."] * 2 + ["Thanks! ###STOP###"] * 2)
    user = ChatModel.from_engine(user_engine, tiny_tokenizer, max_prompt_tokens=1500)
    act = ScriptedEngine(tiny_tokenizer, [call_text("create_order", ORDER)] * 2 + ["Order OT0 is placed."] * 2)
    judge, judge_engine = make_judge(tiny_tokenizer, ['{"met": [2]}'] * 2)
    result = evaluate_vita(tasks, act, tiny_tokenizer, user, judge, trials=2, rollout=small_rollout())
    assert [len(batch) for batch in user_engine.batches] == [2, 2]  # T2's users never generate
    opening = user_engine.batches[0][0]
    assert USER_GUIDELINES.splitlines()[0] in opening and "Order two bowls of mild rice noodles" in opening
    assert "Hello, how can I help you?" in opening
    assert result["failed"] == {"T2": 2}
    assert [(f["task_id"], f["trial"]) for f in result["user_failures"]] == [("T2", 0), ("T2", 1)]
    assert "simulated user could not reply" in result["user_failures"][0]["reason"]
    assert [(e["task_id"], e["trial"]) for e in result["episodes"]] == [("T1", 0), ("T1", 1)]
    assert [len(batch) for batch in judge_engine.batches] == [2]
    assert all(e["reward"] == 0.0 and e["rubric_score"] == pytest.approx(1 / 3) for e in result["episodes"])
    assert all(e["order_match_unofficial"] == 1.0 and len(e["final_orders"]) == 1 for e in result["episodes"])
    assert result["rewards"] == {"T1": [0.0, 0.0], "T2": []} and result["scored"] == 2
    assert result["avg_rubric_score"] == pytest.approx(1 / 3) and result["pass_hat"] == {1: 0.0, 2: 0.0}
    assert result["premature"]["episodes"] == 0 and len(result["rollouts"]) == 4


@pytest.mark.slow
def test_a_tiny_random_policy_user_and_judge_run_end_to_end_deterministically(tmp_path, stand_in_vita,
                                                                               tiny_tokenizer) -> None:
    import torch

    from envace.benchmarks.vita_eval import evaluate_vita
    from envace.engines.base import HFEngine
    from envace.engines.chat_model import ChatModel
    from envace.policy.tiny import build_model

    def engine(seed: int) -> HFEngine:
        model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=seed, max_positions=8192)
        return HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])

    tasks = load_vita(write_tasks(tmp_path, [vita_task("T1", required=(BOWLS,))]))
    agent = engine(0)
    user = ChatModel.from_engine(engine(1), tiny_tokenizer, max_new_tokens=8, temperature=1.0)
    judge = RubricJudge(ChatModel.from_engine(engine(2), tiny_tokenizer, max_new_tokens=8, temperature=1.0))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate_vita(tasks, agent, tiny_tokenizer, user, judge, trials=2,
                               rollout=small_rollout(act_max_new_tokens=8, act_temperature=1.0, max_user_turns=2))
        for row in result["episodes"]:  # scored rows; a judge that never wrote valid JSON is counted apart
            assert 0.0 <= row["reward"] <= 1.0 and 0.0 <= row["order_match_unofficial"] <= 1.0
        assert result["scored"] + len(result["judge_failures"]) + len(result["user_failures"]) == 2
        runs.append(([e.messages for e in result["rollouts"]], result["rewards"], len(result["judge_failures"])))
    assert runs[0] == runs[1]
