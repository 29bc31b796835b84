"""What counts as a tool error: a raised exception, or a returned object whose "error" value is truthy.

One rule (``envace.types.is_error_value``) for ``RealEnvironment.execute``'s ``ok``, the ``tool_error_rate`` metric,
fidelity's error agreement and the checklist reward's tool errors.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from envace.envs.real import RealEnvironment
from envace.evaluation.metrics import reports_error, rollout_metrics
from envace.rewards.transcript import is_tool_error
from envace.roles.compare import is_error, score_response
from envace.types import (
    EnvSpec,
    Episode,
    EpisodeStats,
    ExpectedAnswer,
    Rehearsal,
    Role,
    Sample,
    SuccessSpec,
    Task,
    ToolCall,
    is_error_value,
)


class Lookup:
    """Both conventions: ``find`` raises, ``find_soft`` returns an error object."""

    def __init__(self, items: dict[str, int]) -> None:
        self.items = dict(items)

    def find(self, name: str) -> dict:
        """Find an item, raising when it is unknown.

        Args:
            name: the item.
        """
        if name not in self.items:
            raise KeyError(f"unknown item '{name}'")
        return {"name": name, "count": self.items[name]}

    def find_soft(self, name: str) -> dict:
        """Find an item, returning an error object when it is unknown.

        Args:
            name: the item.
        """
        if name not in self.items:
            return {"error": f"unknown item '{name}'", "status": "failed"}
        return {"name": name, "count": self.items[name], "error": None}


class Box:
    """A toolbox whose results are texts it writes itself."""

    def tool_names(self) -> list[str]:
        return ["get"]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        key = arguments.get("key")
        return json.dumps({"error": "no such key"}) if key == "x" else "plain text value"


@pytest.fixture(autouse=True)
def user_module(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("user_lookup")
    module.Lookup, module.Box = Lookup, Box  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "user_lookup", module)


@pytest.mark.parametrize("value, expected", [
    ({"error": "not found"}, True),
    ({"error": {"code": 404}, "status": "failed"}, True),
    ({"error": True}, True),
    ({"error": 1}, True),
    ({"error": None, "result": 5}, False),
    ({"error": ""}, False),
    ({"error": False}, False),
    ({"error": {}}, False),
    ({"errors": ["x"]}, False),
    ("error", False),
    (["error"], False),
    (None, False),
])
def test_the_rule(value: Any, expected: bool) -> None:
    assert is_error_value(value) is expected


def test_raised_and_returned_errors_are_both_not_ok() -> None:
    env = RealEnvironment(EnvSpec("user_lookup.Lookup", {"items": {"pen": 2}}), timeout_s=0)
    content, ok = env.execute(ToolCall("find", {"name": "cup"}))
    assert (json.loads(content), ok) == ({"error": "KeyError: \"unknown item 'cup'\""}, False)
    content, ok = env.execute(ToolCall("find_soft", {"name": "cup"}))
    assert (json.loads(content), ok) == ({"error": "unknown item 'cup'", "status": "failed"}, False)  # as returned
    content, ok = env.execute(ToolCall("find_soft", {"name": "pen"}))
    assert (json.loads(content), ok) == ({"name": "pen", "count": 2, "error": None}, True)  # a null error: fine
    assert env.execute(ToolCall("find", {"name": "pen"}))[1] is True
    assert env.calls_made == 4


def test_a_toolbox_error_text_is_not_ok() -> None:
    env = RealEnvironment(EnvSpec("user_lookup.Box"), timeout_s=0)
    assert env.execute(ToolCall("get", {"key": "x"})) == ('{"error": "no such key"}', False)
    assert env.execute(ToolCall("get", {"key": "y"})) == ("plain text value", True)


def test_fidelity_and_checklist_use_the_same_rule() -> None:
    raised, returned = '{"error": "KeyError: boom"}', '{"error": "unknown item", "status": "failed"}'
    fine = '{"error": null, "result": 5}'
    assert is_error(raised) and is_error(returned) and not is_error(fine)
    assert [is_tool_error({"role": "tool", "content": c}) for c in (raised, returned, fine)] == [True, True, False]
    assert score_response(returned, raised).error_agree == 1.0  # both errors: they agree
    assert score_response(fine, raised).error_agree == 0.0


SPEC = SuccessSpec(answer=ExpectedAnswer(equals="x"))
TASK = Task(id="t", messages=({"role": "user", "content": "q"},), tools=(), success=SPEC)
CALL = ToolCall("find", {"name": "cup"})


def episode(rehearsals: list[Rehearsal], failed: bool = False) -> Episode:
    stats = EpisodeStats(act_turns=1)
    if failed:
        stats.fail("environment: boom")
    act = Sample([1], [int(Role.ACT)], [1], Role.ACT, 0, 0)
    return Episode(TASK, 0, [], act, rehearsals, [r.call for r in rehearsals], "x", stats)


def test_tool_error_rate_hand_computed() -> None:
    raised = Rehearsal(CALL, '{"error": "KeyError: boom"}', True, source="real")
    returned = Rehearsal(CALL, '{"error": "unknown item"}', True, source="cache")
    rehearsed = Rehearsal(CALL, '{"error": {"code": "E1"}}', True, source="rehearse")
    fine = Rehearsal(CALL, '{"error": null, "count": 2}', True, source="real")
    text = Rehearsal(CALL, "Error but free text", True, source="real")
    substituted = Rehearsal(CALL, '{"error": {"code": "MALFORMED"}}', False, source="rehearse")  # a parse error
    assert [reports_error(r) for r in (raised, returned, rehearsed, fine, text, substituted)] == [
        True, True, True, False, False, False]
    episodes = [
        episode([raised, fine, substituted]),
        episode([returned, rehearsed, text]),
        episode([raised, raised], failed=True),  # a failed episode is left out
    ]
    assert rollout_metrics(episodes)["tool_error_rate"] == pytest.approx(3 / 5)  # 3 errors / 5 well-formed answers
    assert rollout_metrics([episode([])])["tool_error_rate"] == 0.0
