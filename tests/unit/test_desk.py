"""The built-in help desk: its tools, its splits, specific answers, and the oracle's 100% in the real environment."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import run_oracle

from envace.builtin import TASK_SETS, domain_of
from envace.builtin.desk import HelpDesk
from envace.builtin.desk_oracle import OracleError, oracle_plan, oracle_turns, parse_request
from envace.builtin.desk_tasks import DESK, SPLITS, SYSTEM_PROMPT, main
from envace.builtin.desk_templates import (
    AGENTS,
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    TICKET_IDS,
    TRAIN_TEMPLATES,
    Plan,
    World,
    assign,
    error_answer,
    find_tickets,
    get_ticket,
    set_status,
)
from envace.builtin.generator import generate_split as _generate_split
from envace.builtin.generator import generate_tasks, render_tasks, run_reference, write_split_files
from envace.builtin.generator import task_key as _task_key
from envace.builtin.generator import template_of as _template_of
from envace.builtin.oracle import call_text
from envace.builtin.task_sets import load_task_set, resolve_task_path
from envace.data.task_reference import reference_calls
from envace.data.tasks import load_tasks
from envace.envs.real import RealEnvironment, tool_schemas_from_class
from envace.rewards.task_success import TaskSuccess, task_score
from envace.types import EnvSpec, ExpectedAnswer, SuccessSpec, Task, ToolCall

NAMES = {"train": "builtin:desk", "val": "builtin:desk-val", "test": "builtin:desk-test",
         "heldout": "builtin:desk-heldout"}  # fmt: skip
ERROR_TEMPLATES = ("unknown_ticket", "unknown_agent", "closed_ticket", "no_assignee", "close_reassign")
TICKETS = {
    "T105": {"title": "vpn down", "status": "open", "assignee": "ana"},
    "T230": {"title": "disk full", "status": "closed", "assignee": "ben"},
    "T318": {"title": "mouse dead", "status": "pending", "assignee": None},
}


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Task]]:
    return {split: load_task_set(name) for split, name in NAMES.items()}


def generate_split(name: str, n: int | None = None) -> list[Task]:
    return _generate_split(DESK, name, n)


def template_of(task: Task) -> str:
    return _template_of(DESK, task)


def task_key(task: Task) -> str:
    return _task_key(DESK, task)


def all_tasks(splits: dict[str, list[Task]]) -> list[Task]:
    return [task for tasks in splits.values() for task in tasks]


# --- the environment -------------------------------------------------------------------------------------------------


def test_desk_tools_on_hand_written_state() -> None:
    desk = HelpDesk(TICKETS, ["ana", "ben", "chen"])
    assert desk.get_ticket("T318") == {"ticket": "T318", "title": "mouse dead", "status": "pending", "assignee": None}
    assert desk.find_tickets("ana") == {"agent": "ana", "tickets": ["T105"]}
    assert desk.find_tickets("chen") == {"agent": "chen", "tickets": []}
    assert desk.assign("T318", "ana") == {"ticket": "T318", "title": "mouse dead", "status": "pending",
                                          "assignee": "ana"}  # fmt: skip
    assert desk.find_tickets("ana") == {"agent": "ana", "tickets": ["T105", "T318"]}  # ascending ids
    assert desk.set_status("T105", "closed")["status"] == "closed"
    assert desk.set_status("T230", "open") == {"ticket": "T230", "title": "disk full", "status": "open",
                                               "assignee": "ben"}  # fmt: skip
    assert TICKETS["T318"]["assignee"] is None  # the constructor copies the records


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (get_ticket("T999"), "unknown ticket 'T999'"),
        (find_tickets("zoe"), "unknown agent 'zoe'"),
        (assign("T230", "ana"), "ticket 'T230' is closed"),
        (assign("T105", "zoe"), "unknown agent 'zoe'"),
        (set_status("T318", "closed"), "ticket 'T318' has no assignee"),
        (set_status("T105", "done"), "unknown status 'done'"),
    ],
)
def test_desk_errors_change_nothing(call: ToolCall, message: str) -> None:
    env = RealEnvironment(EnvSpec("envace.builtin.desk.HelpDesk", {"tickets": TICKETS, "agents": ["ana", "ben"]}))
    content, ok = env.execute(call)
    assert not ok and json.loads(content) == {"error": f"ValueError: {message}"}
    assert json.loads(env.execute(get_ticket("T318"))[0])["assignee"] is None
    assert json.loads(env.execute(get_ticket("T230"))[0])["status"] == "closed"


def test_desk_tool_schemas_list_the_statuses() -> None:
    schemas = {t["function"]["name"]: t["function"] for t in tool_schemas_from_class(HelpDesk)}
    assert sorted(schemas) == ["assign", "find_tickets", "get_ticket", "set_status"]
    assert schemas["set_status"]["parameters"]["properties"]["status"]["enum"] == ["open", "pending", "closed"]


# --- splits ----------------------------------------------------------------------------------------------------------


def test_desk_names_resolve_and_the_domain_is_found() -> None:
    assert resolve_task_path("builtin:desk").name == "desk_tasks.jsonl"
    assert resolve_task_path("builtin:desk-train") == resolve_task_path("builtin:desk")
    assert {s.file for s in SPLITS.values()} == {f for n, f in TASK_SETS.items() if n.startswith("desk")}
    assert domain_of("desk-test") is DESK and domain_of("bank").name == "bank"


def test_desk_split_sizes_and_templates(splits: dict[str, list[Task]]) -> None:
    assert {s: len(t) for s, t in splits.items()} == {"train": 200, "val": 128, "test": 256, "heldout": 128}
    assert TRAIN_TEMPLATES == ("status", "assignee", "find", "reassign", "close", "reopen", "unknown_ticket",
                               "unknown_agent", "closed_ticket", "no_assignee")  # fmt: skip
    assert HELD_OUT_TEMPLATES == ("assign_close", "assign_find", "close_reassign", "reopen_reassign")
    for split, tasks in splits.items():
        expected = HELD_OUT_TEMPLATES if split == "heldout" else TRAIN_TEMPLATES
        assert [template_of(t) for t in tasks] == [expected[i % len(expected)] for i in range(len(tasks))]
        assert [t.metadata for t in tasks] == [{"template": template_of(t)} for t in tasks]
        assert all(t.id.startswith(f"desk-{split}-") for t in tasks)
    assert set(Counter(template_of(t) for t in splits["train"]).values()) == {20}


def test_desk_calls_answers_and_specs(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        name = template_of(task)
        assert len(task.success.calls) == TEMPLATES[name].calls == len(reference_calls(task)), task.id
        assert task.success.ordered and task.success.forbid_extra_calls
        answer = task.success.answer.equals
        assert answer.startswith("error: ") == (name in ERROR_TEMPLATES), task.id
        last = task.success.calls[-1].arguments
        if name in ("unknown_ticket",):
            assert answer == f"error: unknown ticket {last['ticket']}"
        if name == "unknown_agent":
            assert answer == f"error: unknown agent {last['agent']}"
        if name in ("closed_ticket", "close_reassign"):
            assert answer == f"error: ticket {last['ticket']} is closed"
        if name == "no_assignee":
            assert answer == f"error: ticket {last['ticket']} has no assignee"
        if name in ("find", "assign_find"):
            assert answer == "none" or all(part in TICKET_IDS for part in answer.split(" "))


def test_desk_world_context_goes_to_the_rehearse_role_only(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        tickets = task.environment.init_args["tickets"]
        assert all(f"{tid}: {json.dumps(record)}" in task.world_context for tid, record in tickets.items())
        assert task.messages[0]["content"] == SYSTEM_PROMPT
        assert all("Help desk tickets" not in m["content"] for m in task.messages)
        assert all(r["assignee"] is not None for r in tickets.values() if r["status"] == "closed")


def test_desk_generation_is_deterministic_disjoint_and_packaged(splits, tmp_path: Path) -> None:
    assert generate_split("val", n=10) == splits["val"][:10]
    keys = [task_key(t) for t in all_tasks(splits)]
    assert len(set(keys)) == len(keys)
    big_train = {task_key(t) for t in generate_split("train", n=600)}
    assert big_train.isdisjoint(task_key(t) for t in splits["test"])
    written = write_split_files(DESK, tmp_path)
    for path in written:
        assert path.read_bytes() == resolve_task_path(f"builtin:{_name_of(path.name)}").read_bytes(), path.name
    assert load_task_set("builtin:desk-test:3") == splits["test"][:3]


def _name_of(file: str) -> str:
    return next(name for name, f in TASK_SETS.items() if f == file)


def test_desk_command_line(tmp_path: Path) -> None:
    out = tmp_path / "custom.jsonl"
    main(["--out", str(out), "--n", "4", "--seed", "9", "--templates", "find,close"])
    assert out.read_text(encoding="utf-8") == render_tasks(DESK, generate_tasks(DESK, 4, 9, ["find", "close"]))
    assert [t.id for t in load_tasks(out)] == ["desk-s9-0000-find", "desk-s9-0001-close", "desk-s9-0002-find",
                                               "desk-s9-0003-close"]  # fmt: skip


def test_desk_reference_on_a_hand_computed_plan() -> None:
    env = EnvSpec("envace.builtin.desk.HelpDesk", {"tickets": TICKETS, "agents": ["ana", "ben"]})
    plan = Plan("...", (assign("T318", "ben"), find_tickets("ben")), "tickets")
    reference, calls, answer = run_reference(env, plan, DESK.answer)
    assert answer == "T230 T318" and len(calls) == 2  # ben held T230 (closed) and now T318
    plan = Plan("...", (set_status("T318", "closed"), get_ticket("T318")), "title")
    _, calls, answer = run_reference(env, plan, DESK.answer)
    assert answer == "error: ticket T318 has no assignee" and len(calls) == 1
    assert reference[-1] == {"role": "assistant", "content": "T230 T318"}


def test_desk_error_answer_is_canonical() -> None:
    assert error_answer("ValueError: unknown ticket 'T1'") == "error: unknown ticket T1"
    assert error_answer("ValueError: unknown agent 'zoe'") == "error: unknown agent zoe"
    assert error_answer("ValueError: ticket 'T1' is closed") == "error: ticket T1 is closed"
    assert error_answer("ValueError: ticket 'T1' has no assignee") == "error: ticket T1 has no assignee"
    with pytest.raises(ValueError, match="no canonical answer"):
        error_answer("ValueError: unknown status 'done'")


def test_a_wrong_ticket_or_agent_never_satisfies_the_spec(splits: dict[str, list[Task]]) -> None:
    """Swap the ticket or agent of one call for another of the world, or an unknown one: the spec is never met."""
    for task in splits["train"] + splits["heldout"]:
        world = World(**task.environment.init_args)
        plan = [call for call, _ in reference_calls(task)]
        for i, call in enumerate(plan):
            for key, pool in (("ticket", list(world.tickets) + ["T999"]), ("agent", world.agents + ["zoe"])):
                if key not in call.arguments:
                    continue
                wrong = ToolCall(call.name, {**call.arguments, key: next(v for v in pool if v != call.arguments[key])})
                made = plan[:i] + [wrong] + plan[i + 1 :]
                assert task_score(task, made, task.success.answer.equals) < 1.0, (task.id, wrong)


# --- the oracle ------------------------------------------------------------------------------------------------------


def desk_task(question: str) -> Task:
    env = EnvSpec("envace.builtin.desk.HelpDesk", {"tickets": TICKETS, "agents": ["ana", "ben", "chen"]})
    return Task("t", ({"role": "user", "content": question},), (), SuccessSpec(answer=ExpectedAnswer("x")),
                environment=env)


@pytest.mark.parametrize(
    ("question", "calls", "answer"),
    [
        ("Who is ticket T318 assigned to?", [get_ticket("T318")], "nobody"),
        ("Which tickets are assigned to chen?", [find_tickets("chen")], "none"),
        ("Which tickets are assigned to zoe?", [find_tickets("zoe")], "error: unknown agent zoe"),
        # T318 has no assignee until the first call gives it one, so the close succeeds
        ("Assign ticket T318 to chen, then close ticket T318, then tell me its title.",
         [assign("T318", "chen"), set_status("T318", "closed")], "mouse dead"),
        ("Close ticket T105, then assign ticket T105 to ben, then tell me its status.",
         [set_status("T105", "closed"), assign("T105", "ben")], "error: ticket T105 is closed"),
        ("Reopen ticket T230, then tell me who it is assigned to.", [set_status("T230", "open")], "ben"),
        ("Assign ticket T105 to ben, then tell me which tickets are assigned to ben.",
         [assign("T105", "ben"), find_tickets("ben")], "T105 T230"),
    ],
)
def test_desk_oracle_on_hand_computed_tasks(question: str, calls: list[ToolCall], answer: str) -> None:
    task = desk_task(question)
    assert oracle_plan(task) == (calls, answer)
    assert oracle_turns(task) == [call_text(c) for c in calls] + [answer]


def test_desk_oracle_rejects_what_it_cannot_read() -> None:
    with pytest.raises(OracleError, match="not a desk request"):
        parse_request("Tell me a joke")
    with pytest.raises(OracleError, match="not a desk update: 'delete ticket T1'"):
        parse_request("Delete ticket T1, then tell me its title.")
    with pytest.raises(OracleError, match="not a desk report"):
        parse_request("Close ticket T1, then sing.")
    with pytest.raises(OracleError, match="has no environment"):
        oracle_plan(replace(desk_task("Who is ticket T105 assigned to?"), environment=None))


def test_desk_oracle_agrees_with_every_success_spec(splits: dict[str, list[Task]]) -> None:
    for task in all_tasks(splits):
        calls, answer = oracle_plan(task)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in task.success.calls]
        assert answer == task.success.answer.equals, task.id


@pytest.mark.parametrize("split", ["test", "heldout"])
def test_desk_oracle_solves_every_task_in_the_real_environment(split: str, splits, tiny_tokenizer) -> None:
    tasks = splits[split]
    episodes = run_oracle(tiny_tokenizer, tasks, [oracle_turns(task) for task in tasks])
    assert [TaskSuccess()(ep) for ep in episodes] == [1.0] * len(tasks)
    for ep, task in zip(episodes, tasks):
        assert [m["content"] for m in ep.messages if m["role"] == "tool"] == [c for _, c in reference_calls(task)]


def test_agents_and_tickets_of_a_world_come_from_the_pools(splits: dict[str, list[Task]]) -> None:
    for task in splits["train"]:
        args = task.environment.init_args
        assert set(args["agents"]) <= set(AGENTS) and 3 <= len(args["agents"]) <= 4
        assert set(args["tickets"]) <= set(TICKET_IDS) and list(args["tickets"]) == sorted(args["tickets"])


_IDS, _AGENTS = "Tickets: T105 T230 T318.", "Agents: ana ben chen."
_T105 = 'T105: {"title": "vpn down", "status": "open", "assignee": "ana"}.'
_T230 = 'T230: {"title": "disk full", "status": "closed", "assignee": "ben"}.'
_T318 = 'T318: {"title": "mouse dead", "status": "pending", "assignee": null}.'
_T318_ANA = 'T318: {"title": "mouse dead", "status": "pending", "assignee": "ana"}.'  # as assign(T318, ana) left it


@pytest.mark.parametrize(
    ("done", "call", "expected"),
    [
        ([], get_ticket("T105"), f"{_IDS} {_T105}"),
        ([], get_ticket("T999"), f"{_IDS} T999 is not one of them."),
        ([], assign("T230", "ana"), f"{_IDS} {_AGENTS} {_T230} It is closed: it cannot be assigned."),
        ([], set_status("T318", "closed"), f"{_IDS} {_T318} It has no assignee: it cannot be closed."),
        ([assign("T318", "ana")], set_status("T318", "closed"), f"{_IDS} {_T318_ANA} Status pending -> closed."),
        ([assign("T318", "ana")], find_tickets("ana"),
         f"{_AGENTS} Assignees: T105 ana, T230 ben, T318 ana. Tickets assigned to ana: T105 T318."),
        ([], find_tickets("chen"),
         f"{_AGENTS} Assignees: T105 ana, T230 ben, T318 none. Tickets assigned to chen: none."),
        ([], find_tickets("zoe"), f"{_AGENTS} zoe is not one of them."),
        ([], assign("T105", "zoe"), f"{_IDS} {_AGENTS} zoe is not one of them."),
        ([], assign("T999", "zoe"), f"{_IDS} T999 is not one of them."),  # the ticket is looked up first, as HelpDesk
        ([], assign("T318", "ben"), f"{_IDS} {_AGENTS} {_T318} Assignee none -> ben."),
    ],
)
def test_the_desks_working_on_hand_written_states(done: list[ToolCall], call: ToolCall, expected: str) -> None:
    from envace.builtin.desk_templates import working

    assert working(World(TICKETS, ["ana", "ben", "chen"]), done, call) == expected
