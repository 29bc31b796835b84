"""tau^2-Bench tasks for training: the train split as envace tasks, their environment, and tau^2's own reward.

- ``Tau2Toolbox``: a task's tau^2 environment as an envace real environment, so ``RealWorld``, ``HybridWorld`` and
  the audits run converted tasks;
- ``training_task`` / ``export_training_tasks`` (``python -m envace.benchmarks.tau2_train --export OUT.jsonl``): the
  ``train`` split only (the ``test`` ids are refused), with the gold actions and their real responses as the
  reference and a success checklist for envace's ``TaskSuccess``;
- ``Tau2Reward``: tau^2's evaluators on a replay of the episode's calls, the faithful training reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envace.benchmarks.tau2 import DOMAINS, SOLO_DOMAINS, fresh_environment, load_tasks, reward
from envace.benchmarks.tau2_tasks import MODES, to_task
from envace.benchmarks.tau2_world import episode_trajectory, execute_call


class Tau2Reward:
    """tau^2's own reward of an episode, whatever world answered its calls (a training reward).

    The episode's calls are replayed, in order, on a fresh environment in the task's initial state (the real
    responses, not the rehearsed ones, enter the trajectory), its assistant messages are added, and tau^2's evaluators
    score the result (``reward``). Unlike envace's other rewards it runs an environment: tau^2 defines success on the
    state the calls leave. Tasks must come from ``to_task``/``training_task`` (their environment names the domain,
    the task and the mode). In user mode the user's own phone calls are not part of the episode's calls, so telecom
    trains in solo mode.
    """

    def __call__(self, episode: Any) -> float:
        """The reward of ``episode``; 0 if a user-mode episode was not ended by its user."""
        spec = episode.task.environment
        if spec is None or spec.class_path != "envace.benchmarks.tau2_train.Tau2Toolbox":
            raise ValueError(f"task '{episode.task.id}': Tau2Reward scores tau^2 tasks (environment "
                             "envace.benchmarks.tau2.Tau2Toolbox), converted by envace.benchmarks.tau2.training_task")
        domain, solo = spec.init_args["domain"], bool(spec.init_args.get("solo", False))
        if not solo and not episode.stats.user_stop:
            return 0.0
        (task,) = load_tasks(domain, "base", ids=[str(spec.init_args["task_id"])])
        handle = {"env": fresh_environment(task, domain, solo), "trajectory": []}
        for call in episode.calls:
            execute_call(handle, call, "assistant")
        return reward(task, episode_trajectory(episode, handle), domain, solo=solo)


class Tau2Toolbox:
    """A tau^2 task's environment as an envace real environment (a toolbox: ``envace.envs.real.is_toolbox``).

    Fresh and in the task's initial state; the agent's tools, plus the phone's in solo mode. Training tasks name it
    (``training_task``), so ``RealWorld``, ``HybridWorld`` and the audits run them.

    Args:
        domain: the task's domain.
        task_id: the task id (in the ``base`` split).
        solo: telecom solo mode.
    """

    def __init__(self, domain: str, task_id: str, solo: bool = False) -> None:
        (task,) = load_tasks(domain, "base", ids=[task_id])
        self.env = fresh_environment(task, domain, solo)
        tools = self.env.get_tools() + (self.env.get_user_tools() if solo else [])
        self.names = [t.name for t in tools]

    def tool_names(self) -> list[str]:
        """The tools the agent may call."""
        return list(self.names)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call as the agent; the ToolMessage content (tau^2 writes errors as ``Error: ...``)."""
        from tau2.data_model.message import ToolCall

        return self.env.get_response(ToolCall(id="call", name=name, arguments=dict(arguments),
                                              requestor="assistant")).content or ""


def reference_messages(task: Any, domain: str, mode: str = "solo") -> list[dict[str, Any]]:
    """The gold actions as the agent's continuation, with the real responses of a replay, then the closing message.

    In user mode the user's own gold actions (telecom's phone) run on the environment, in order, but are not the
    agent's to make, so they are left out of the reference.
    """
    from tau2.data_model.message import ToolCall

    solo = mode == "solo"
    env = fresh_environment(task, domain, solo)
    messages: list[dict[str, Any]] = []
    for index, action in enumerate(task.evaluation_criteria.actions or []):
        requestor = "assistant" if solo else action.requestor
        call = ToolCall(id=f"gold_{index}", name=action.name, arguments=action.arguments, requestor=requestor)
        content = env.get_response(call).content or ""
        if requestor == "assistant":
            messages += [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": action.name, "arguments": dict(action.arguments)}}]},
                {"role": "tool", "name": action.name, "content": content}]
    say = task.evaluation_criteria.communicate_info or []
    messages.append({"role": "assistant", "content": " ".join(say) if say else "Done."})
    return messages


def training_task(task: Any, domain: str, mode: str = "solo") -> Any:
    """A train-split task as an envace training task: ``to_task`` plus its gold reference and a success checklist.

    The checklist (for envace's ``TaskSuccess``) is the agent's gold actions, in any order, and the strings it must
    communicate; tau^2's gold actions are one path among several, so ``Tau2Reward`` (tau^2's own evaluators on a
    replay) is the faithful training reward. A task with neither (one the agent must decline) has no checklist.

    Raises:
        ValueError: the task is in the domain's ``test`` split (held out for evaluation).
    """
    from dataclasses import replace

    from envace.types import ExpectedAnswer, ExpectedCall, SuccessSpec

    held_out = {str(t.id) for t in load_tasks(domain, "test")}
    if str(task.id) in held_out:
        raise ValueError(f"tau^2 {domain} task {task.id} is in the test split, held out for evaluation; train on "
                         "the 'train' split")
    criteria = task.evaluation_criteria
    calls = tuple(ExpectedCall(a.name, dict(a.arguments)) for a in criteria.actions or []
                  if mode == "solo" or a.requestor == "assistant")
    say = tuple(criteria.communicate_info or ())
    success = SuccessSpec(calls=calls, ordered=False, answer=ExpectedAnswer(contains=say) if say else None)
    return replace(to_task(task, domain, mode), reference=tuple(reference_messages(task, domain, mode)),
                   success=success)


def export_training_tasks(domains: list[str], path: str | Path, mode: str = "user") -> dict[str, int]:
    """Write the ``train`` split of ``domains`` as an envace task file (JSON Lines); returns counts.

    User-mode tasks need a simulated user during training (``EnvACEModule(user=...)``); solo mode is telecom's.
    Tasks whose gold actions break their own tool schemas, and tasks without a checklist (``training_task``), are
    skipped and counted.
    """
    from envace.data.tasks import write_tasks

    converted = [training_task(task, domain, mode) for domain in domains for task in load_tasks(domain, "train")]
    checked = [t for t in converted if t.success.calls or t.success.answer is not None]
    return {**write_tasks(checked, path), "skipped_no_checklist": len(converted) - len(checked)}


def main(argv: list[str] | None = None) -> None:
    """``python -m envace.benchmarks.tau2_train --export OUT.jsonl [--domains ...] [--mode user|solo]``."""
    import argparse

    parser = argparse.ArgumentParser(description="Export tau^2 train-split tasks as envace training tasks.")
    parser.add_argument("--export", required=True, metavar="OUT.jsonl")
    parser.add_argument("--domains", nargs="+", default=None, choices=DOMAINS,
                        help="default: every domain in user mode, the solo ones (telecom) in solo mode")
    parser.add_argument("--mode", default="user", choices=MODES)
    args = parser.parse_args(argv)
    domains = args.domains or list(DOMAINS if args.mode == "user" else SOLO_DOMAINS)
    userless = [d for d in domains if args.mode == "solo" and d not in SOLO_DOMAINS]
    if userless:
        parser.error(f"--mode solo: only {', '.join(SOLO_DOMAINS)} runs without a user simulator, not "
                     f"{', '.join(userless)}")
    counts = export_training_tasks(domains, args.export, args.mode)
    print(f"{args.export}: {counts}")  # noqa: T201 (a command line's result)


if __name__ == "__main__":
    main()
