"""The checklist reward judged by a model: scores, shortcut, retries, failure masking, cache and the HTTP judge."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from envace.rewards.checklist import ChecklistReward, judging_failed, mask_groups_with_failed_judging
from envace.rewards.checklist_prompt import build_prompt, read_checklists
from envace.rewards.judges import HTTPJudge, JudgeRequest, JudgeUnavailable, LocalJudge, ScriptedJudge
from envace.rewards.scoring import score_episodes
from envace.rewards.transcript import split_reasoning, split_user_turns
from envace.rewards.verdicts import VERDICT_FIELDS, parse_verdict
from envace.types import Episode, ExpectedAnswer, Role, Sample, SuccessSpec


def verdict_text(answer: bool, **extra: Any) -> str:
    return json.dumps({**{name: "ok" for name in VERDICT_FIELDS}, "answer": answer, **extra})


def standard(question: str, weight: Any, focus_on: str = "assistant.content", required: bool = False) -> dict:
    return {"question": question, "focus_on": focus_on, "pass_condition": f"pass {question}",
            "failure_examples": [f"fail {question}"], "evidence": [{"snippet": f"snippet {question}"}],
            "weight": weight, "required_for_next_turn": required}


def call(name: str) -> list[dict]:
    return [{"type": "function", "function": {"name": name, "arguments": {"x": 1}}}]


MESSAGES = [
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Book a flight."},
    {"role": "assistant", "content": "", "reasoning": "search first", "tool_calls": call("search")},  # t1 s1
    {"role": "tool", "name": "search", "content": '{"flights": [1]}'},
    {"role": "assistant", "content": "", "tool_calls": call("book")},  # t1 s2
    {"role": "tool", "name": "book", "content": '{"booked": 1}'},
    {"role": "assistant", "content": "Booked flight 1."},  # t1 s3
    {"role": "user", "content": "Cancel it."},
    {"role": "assistant", "content": "", "tool_calls": call("cancel")},  # t2 s1
    {"role": "tool", "name": "cancel", "content": '{"error": "ValueError: too late"}'},
    {"role": "assistant", "content": "Sorry, it cannot be cancelled."},  # t2 s2
]

CHECKLIST = (
    (standard("A", 0.6, "assistant.tool_calls", required=True), standard("B", 0.4)),
    (standard("C", 0.7, "tool.content"), standard("D", 0.3)),
)


def make_episode(messages: list[dict] = MESSAGES, checklists: Any = (CHECKLIST,), task_id: str = "t0",
                 group: int = 0) -> Episode:
    task = SimpleNamespace(id=task_id, checklists=checklists,
                           success=SuccessSpec(answer=ExpectedAnswer(contains=("booked",))))
    act = Sample([1, 2], [Role.ACT, Role.ACT], [1, 1], Role.ACT, 0, group)
    return Episode(task=task, group_index=group, messages=[dict(m) for m in messages], act=act)  # type: ignore[arg-type]


# A: met at turn 1 step 2 only; B never; C: judged at turn 2 step 2 only (step 1 is followed by a tool error), no;
# D: met at turn 2 step 2.
PASSES = {(0, 1, 0), (1, 1, 1)}


def table_judge(**kwargs: Any) -> ScriptedJudge:
    return ScriptedJudge(lambda r: (r.turn, r.step, r.standard) in PASSES, **kwargs)


def test_turn_and_episode_scores_by_hand() -> None:
    judge = table_judge()
    reward = ChecklistReward(judge, stop_on_required=False)
    score, turns = reward.score(make_episode())
    assert turns == pytest.approx([0.6, 0.3])  # r_1 = 0.6 * A (OR over steps), r_2 = 0.3 * D
    assert score == pytest.approx((0.6 + 0.3) / 1 / 2)
    # turn 1: 3 steps x 2 standards; turn 2: C only at step 2 (shortcut at step 1), D at both steps
    assert judge.calls == 6 + 1 + 2
    assert not any(r.turn == 1 and r.step == 0 and r.standard == 0 for r in judge.requests)
    metrics = reward.metrics()
    assert metrics["checklist/pass_rate/1.1"] == 1.0 and metrics["checklist/pass_rate/1.2"] == 0.0
    assert metrics["checklist/pass_rate/2.2"] == 1.0
    assert metrics["checklist/judge_calls"] == 9 and metrics["checklist/shortcuts"] == 1
    assert metrics["checklist/judge_failures"] == 0 and metrics["checklist/cache_hits"] == 0
    assert reward.metrics()["checklist/judge_calls"] == 0  # reset


def test_two_checklists_and_turns_not_reached() -> None:
    episode = make_episode(MESSAGES[:7], checklists=(CHECKLIST, CHECKLIST))  # only turn 1 reached
    reward = ChecklistReward(table_judge(), stop_on_required=False)
    score, turns = reward.score(episode)
    assert turns == pytest.approx([1.2, 0.0])  # both checklists meet A
    assert score == pytest.approx(1.2 / 2 / 2)
    assert "checklist/pass_rate/c2.1.1" in reward.metrics()


def test_incomplete_last_turn_is_not_scored() -> None:
    episode = make_episode(MESSAGES[:10])  # turn 2 ends on a tool response: a budget cut it
    assert [t.completed for t in split_user_turns(episode.messages)] == [True, False]
    reward = ChecklistReward(ScriptedJudge(lambda r: True), stop_on_required=False)
    assert reward.score(episode)[1] == pytest.approx([1.0, 0.0])
    reward = ChecklistReward(ScriptedJudge(lambda r: True), stop_on_required=False, score_incomplete_turns=True)
    assert reward.score(episode)[1] == pytest.approx([1.0, 0.3])  # turn 2: C failed by the tool error, D met


def test_stop_on_required_scores_later_turns_zero_without_judging() -> None:
    judge = ScriptedJudge(lambda r: r.standard == 1)  # B and D met, A (required) never
    score, turns = ChecklistReward(judge, stop_on_required=True).score(make_episode())
    assert turns == pytest.approx([0.4, 0.0]) and score == pytest.approx(0.4 / 2)
    assert all(r.turn == 0 for r in judge.requests)
    score, turns = ChecklistReward(table_judge(), stop_on_required=True).score(make_episode())
    assert turns == pytest.approx([0.6, 0.3])  # A met: the conversation goes on


def test_shortcut_on_tool_error() -> None:
    judge = ScriptedJudge(lambda r: True)
    reward = ChecklistReward(judge, stop_on_required=False)
    _, turns = reward.score(make_episode())
    # C is judged only at step 2 (no tool after it) and passes there; step 1 was failed without a call
    assert turns[1] == pytest.approx(1.0)
    assert reward.metrics()["checklist/shortcuts"] == 1
    only_error = MESSAGES[:10] + [{"role": "assistant", "content": "", "tool_calls": call("cancel")},
                                  {"role": "tool", "name": "error", "content": '{"error": {"code": "x"}}'},
                                  {"role": "assistant", "content": "done"}]
    judge = ScriptedJudge(lambda r: r.standard == 0)  # the judge would pass C anywhere
    _, turns = ChecklistReward(judge, stop_on_required=False).score(make_episode(only_error))
    assert turns[1] == pytest.approx(0.7)  # met at the last step, which has no tool response


def test_prompt_sections_and_serialisation() -> None:
    episode = make_episode()
    turns = split_user_turns(episode.messages)
    prompt = build_prompt(read_checklists(episode.task)[0][1][1], episode.messages, turns, 1, 1)
    for section in ("# Role", "# Objective", "# Criteria", "**Question:** D", "**Focus on:** assistant.content",
                    "**Pass condition:** pass D", '**Failure examples:** ["fail D"]',
                    '**Reference snippet:** ["snippet D"]', "# Previous Messages", "# Current Messages to Evaluate",
                    "# Special rule of tool call", "# Evaluation Process", "# Output Format"):
        assert section in prompt
    previous, current = prompt.split("# Previous Messages")[1].split("# Current Messages to Evaluate")
    assert "Role: system\ncontent: You are a travel agent." in previous
    assert "# Turn: 1\nRole: user\ncontent: Book a flight." in previous
    assert "## Step: 1\nRole: assistant\ncontent.thinking: search first\ncontent.user_visible_reply: (none)" in previous
    assert "# Turn: 2\nRole: user\ncontent: Cancel it." in current
    # no reasoning and no think block: no thinking, the whole content is the reply
    assert ("## Step: 2\nRole: assistant\ncontent.thinking: (none)\n"
            "content.user_visible_reply: Sorry, it cannot be cancelled.\ntool_call: []") in current
    assert "Role: tool\nname: cancel\ncontent:" in current
    think = {"role": "assistant", "content": "<think>hmm</think>Hello"}
    assert split_reasoning(think) == ("hmm", "Hello")


def test_parse_verdict_is_strict() -> None:
    assert parse_verdict(verdict_text(True)).answer is True  # type: ignore[union-attr]
    assert parse_verdict("<think>x</think>```json\n" + verdict_text(False) + "\n```").answer is False  # type: ignore
    for bad in ("yes", verdict_text(True, extra="x"), verdict_text(True) + " trailing",
                json.dumps({**{n: "ok" for n in VERDICT_FIELDS}, "answer": "true"}),
                json.dumps({**{n: 1 for n in VERDICT_FIELDS}, "answer": True}), "[]", "{}"):
        assert parse_verdict(bad) is None, bad


def test_malformed_verdict_retried_then_none_raises() -> None:
    replies = iter(["not json", verdict_text(True)])
    judge = ScriptedJudge(lambda r: next(replies), retries=2)
    assert judge.judge([JudgeRequest("p")]) == [True] and judge.attempts == 2
    judge = ScriptedJudge(lambda r: "not json", retries=2)
    assert judge.judge([JudgeRequest("p")]) == [None] and judge.attempts == 3
    reward = ChecklistReward(ScriptedJudge(lambda r: "not json", retries=1))
    with pytest.raises(JudgeUnavailable, match="task 't0'.*scripted.*malformed verdict"):
        reward(make_episode())
    assert reward.metrics()["checklist/judge_failures"] > 0
    assert issubclass(JudgeUnavailable, RuntimeError)


def test_failed_judging_fails_the_episode_and_masks_its_group() -> None:
    # group 0: two episodes, the judge fails on the one that mentions BOOM; group 1 is fine
    boom = [*MESSAGES[:6], {"role": "assistant", "content": "BOOM"}]
    episodes = [make_episode(MESSAGES[:7], task_id="a", group=0), make_episode(boom, task_id="a", group=0),
                make_episode(MESSAGES[:7], task_id="b", group=1)]
    judge = ScriptedJudge(lambda r: None if "BOOM" in r.prompt else True)
    score_episodes(episodes, [ChecklistReward(judge)])
    assert [e.stats.failed for e in episodes] == [False, True, False]
    assert "JudgeUnavailable" in episodes[1].stats.failure and judging_failed(episodes[1])
    assert episodes[0].reward > 0
    assert mask_groups_with_failed_judging(episodes) == 1
    assert [e.stats.failed for e in episodes] == [True, True, False]
    assert "masked" in episodes[0].stats.failure and episodes[0].reward == 0.0 and episodes[0].samples() == []
    assert episodes[2].reward > 0 and not judging_failed(episodes[2])
    assert mask_groups_with_failed_judging(episodes) == 0


def test_other_failures_do_not_mask_groups() -> None:
    episodes = [make_episode(group=0), make_episode(group=0)]
    episodes[0].stats.fail("world FrozenWorld: RuntimeError: boom")
    assert mask_groups_with_failed_judging(episodes) == 0 and not episodes[1].stats.failed


def test_cached_verdicts_are_not_requested_again() -> None:
    judge = table_judge()
    reward = ChecklistReward(judge, stop_on_required=False)
    first = reward(make_episode())
    calls = judge.calls
    assert reward(make_episode(group=1)) == first  # the same conversation in another episode of the group
    assert judge.calls == calls
    assert reward.metrics()["checklist/cache_hits"] == calls
    # a changed step changes only the requests whose prompt contains it
    changed = [*MESSAGES[:10], {"role": "assistant", "content": "Sorry, too late."}]
    reward(make_episode(changed))
    assert judge.calls == calls + 2  # C and D at the new step 2 of turn 2
    # another judge identity is another cache key
    other = ChecklistReward(table_judge(identity="other"))
    other.cache = reward.cache
    other(make_episode())
    assert other.judge.calls > 0  # type: ignore[attr-defined]


def test_weights_that_are_not_numbers_are_named() -> None:
    bad = ((standard("A", 0.5), standard("B", "0.5")),)
    with pytest.raises(ValueError, match=r"task 't0', checklist 1, turn 1, standard 2: weight must be a finite number"):
        ChecklistReward(ScriptedJudge(lambda r: True))(make_episode(checklists=(bad,)))
    with pytest.raises(ValueError, match="has no checklists"):
        ChecklistReward(ScriptedJudge(lambda r: True))(make_episode(checklists=()))


def test_dataclass_standards_are_read() -> None:
    std = SimpleNamespace(question="A", focus_on="assistant.content", pass_condition="p", failure_examples=("f",),
                          evidence=("snippet text",), weight=1.0, required_for_next_turn=False)
    judge = ScriptedJudge(lambda r: True)
    assert ChecklistReward(judge).score(make_episode(MESSAGES[:7], checklists=(((std,),),)))[0] == 1.0
    assert '**Reference snippet:** ["snippet text"]' in judge.requests[0].prompt


def test_local_judge_retries_malformed_replies() -> None:
    class Model:
        def __init__(self) -> None:
            self.replies = [["junk", verdict_text(False)], [verdict_text(True)]]
            self.chats: list = []

        def complete(self, chats: list) -> list:
            self.chats.append(chats)
            return [SimpleNamespace(text=t, overflow=False) for t in self.replies.pop(0)]

    model = Model()
    judge = LocalJudge(model, retries=1, name="judge-model")  # type: ignore[arg-type]
    assert judge.judge([JudgeRequest("p1"), JudgeRequest("p2")]) == [True, False]
    assert model.chats[1] == [[{"role": "user", "content": "p1"}]]
    assert judge.identity.startswith("local:judge-model")


# ---------------------------------------------------------------------------------------------------------------------
# HTTPJudge against a stub server on loopback
# ---------------------------------------------------------------------------------------------------------------------


class Stub:
    """A scripted OpenAI-compatible server: each POST takes the next ``(status, content)``."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script, self.bodies, self.headers = list(script), [], []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                stub.bodies.append(json.loads(self.rfile.read(length)))
                stub.headers.append(dict(self.headers))
                stub.paths.append(self.path)
                status, content = stub.script.pop(0)
                body = (json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
                        if status == 200 else content).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.paths: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Stub:
        self.thread.start()
        return self

    def __exit__(self, *args: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def http_judge(url: str, **kwargs: Any) -> tuple[HTTPJudge, list[float]]:
    waits: list[float] = []
    judge = HTTPJudge(url, "judge-model", attempts=3, timeout=5, sleep=waits.append, **kwargs)
    return judge, waits


def test_http_judge_good_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_JUDGE_KEY", "secret")
    with Stub([(200, verdict_text(True))]) as stub:
        judge, waits = http_judge(stub.url, api_key_env="TEST_JUDGE_KEY")
        assert judge.judge([JudgeRequest("the prompt")]) == [True]
    body = stub.bodies[0]
    assert stub.paths == ["/v1/chat/completions"] and waits == []
    assert body["model"] == "judge-model" and body["messages"] == [{"role": "user", "content": "the prompt"}]
    assert body["temperature"] == 0.6 and body["top_p"] == 0.8 and body["max_tokens"] == 6000
    schema = body["response_format"]["json_schema"]
    assert schema["name"] == "evaluation_verdict" and schema["schema"]["properties"]["answer"] == {"type": "boolean"}
    assert stub.headers[0]["Authorization"] == "Bearer secret"


def test_http_judge_retries_malformed_and_server_errors() -> None:
    with Stub([(200, "not a verdict"), (200, verdict_text(False)), (500, "overloaded"), (200, verdict_text(True))
               ]) as stub:
        judge, waits = http_judge(stub.url, concurrency=1)
        assert judge.judge([JudgeRequest("a"), JudgeRequest("b")]) == [False, True]
    assert len(stub.bodies) == 4 and waits == [1, 1] and judge.last_error == ""


def test_http_judge_backoff_and_http_error_message() -> None:
    with Stub([(503, "busy")] * 3) as stub:
        judge, waits = http_judge(stub.url)
        assert judge.judge([JudgeRequest("a")]) == [None]
    assert waits == [1, 2]
    assert stub.url + "/chat/completions" in judge.last_error and "HTTP 503" in judge.last_error


def test_http_judge_unreachable_endpoint_gives_none_with_a_clear_message() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    judge, waits = http_judge(f"http://127.0.0.1:{port}/v1", backoff_cap=1.5)
    assert judge.judge([JudgeRequest("a")]) == [None]
    assert waits == [1, 1.5]
    assert f"http://127.0.0.1:{port}/v1/chat/completions" in judge.last_error
    assert "cannot reach the server" in judge.last_error and judge.errors == [judge.last_error]
    reward = ChecklistReward(judge)
    with pytest.raises(JudgeUnavailable, match=f"127.0.0.1:{port}.*cannot reach the server"):
        reward(make_episode(MESSAGES[:7]))


def test_http_judge_needs_its_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_JUDGE_KEY_MISSING", raising=False)
    with pytest.raises(ValueError, match="TEST_JUDGE_KEY_MISSING"):
        HTTPJudge("http://127.0.0.1:1/v1", "m", api_key_env="TEST_JUDGE_KEY_MISSING")
