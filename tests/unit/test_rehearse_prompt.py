"""The rehearse prompt shows the called tool's schema (every tool's with ``all_tools``) and the world context."""

from __future__ import annotations

from envace.builtin.task_sets import resolve_task_path
from envace.data.tasks import load_tasks
from envace.roles.rehearse import build_rehearse_messages
from envace.types import ToolCall


def test_only_the_called_tool_unless_asked() -> None:
    task = load_tasks(resolve_task_path("builtin:bank"))[0]
    call = ToolCall("get_balance", {"account": "A1"})
    names = [t["function"]["name"] for t in task.tools]
    assert len(names) == 4
    default = build_rehearse_messages(task, call, [], system_prompt="sys")[1]["content"]
    every = build_rehearse_messages(task, call, [], system_prompt="sys", all_tools=True)[1]["content"]
    assert '"name": "get_balance"' in default
    assert all(f'"name": "{n}"' not in default for n in names if n != "get_balance")
    assert all(f'"name": "{n}"' in every for n in names)
    assert task.world_context and task.world_context in default
