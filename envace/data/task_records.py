"""A ``Task`` rendered back into its JSON record: the inverse of ``parse_task``.

This module owns ``task_to_record`` (optional fields omitted when unset) and ``standard_to_record`` (one checklist
standard). Writing records to a task file is ``envace.data.tasks.write_tasks``.
"""

from __future__ import annotations

from typing import Any

from envace.types import Standard, Task


def standard_to_record(standard: Standard) -> dict[str, Any]:
    """The JSON object of one standard (the inverse of the checklist parser)."""
    return {
        "question": standard.question,
        "focus_on": standard.focus_on,
        "pass_condition": standard.pass_condition,
        "failure_examples": list(standard.failure_examples),
        "evidence": [{"snippet": s} for s in standard.evidence],
        "weight": standard.weight,
        "required_for_next_turn": standard.required_for_next_turn,
    }


def task_to_record(task: Task) -> dict[str, Any]:
    """The JSON record of ``task`` (the inverse of ``parse_task``); optional fields are omitted when unset."""
    success: dict[str, Any] = {
        "calls": [{"name": c.name, "arguments": c.arguments, "weight": c.weight} for c in task.success.calls],
        "ordered": task.success.ordered,
        "forbid_extra_calls": task.success.forbid_extra_calls,
    }
    if task.success.answer is not None:
        answer = task.success.answer
        success["answer"] = {"equals": answer.equals, "contains": list(answer.contains), "weight": answer.weight}
    if task.success.state is not None:
        state = task.success.state
        success["state"] = {"tables": state.tables, "writes": state.writes, "weight": state.weight}
    record: dict[str, Any] = {"id": task.id, "messages": list(task.messages), "tools": list(task.tools)}
    record["success"] = success
    if task.reference:
        record["reference"] = list(task.reference)
    if task.world_context is not None:
        record["world_context"] = task.world_context
    if task.environment is not None:
        record["environment"] = {"class_path": task.environment.class_path, "init_args": task.environment.init_args}
    if task.user_turns:
        record["user_turns"] = [list(turn) for turn in task.user_turns]
    if task.tool_unlocks:
        record["tool_unlocks"] = [list(names) for names in task.tool_unlocks]
    if task.user is not None:
        record["user"] = task.user
    if task.checklists:
        record["checklists"] = [
            [[standard_to_record(s) for s in standards] for standards in checklist] for checklist in task.checklists
        ]
    if task.metadata:
        record["metadata"] = task.metadata
    return record
