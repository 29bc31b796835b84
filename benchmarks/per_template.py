"""Real success per task template of exported bank policies (greedy, real tools), side by side.

Run from the repository root: ``.venv/bin/python benchmarks/per_template.py NAME=DIR [NAME=DIR ...]
[--tasks builtin:bank-test]``, where each DIR is a policy exported in Hugging Face format (``export_dir``). Prints a
Markdown table: one row per template (tasks, then each policy's success), and a last row with the totals.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402

from envace.builtin.make_tasks import template_of  # noqa: E402
from envace.builtin.task_sets import load_task_set  # noqa: E402
from envace.engines.base import HFEngine  # noqa: E402
from envace.policy import HFPolicy  # noqa: E402
from envace.rewards import TaskSuccess  # noqa: E402
from envace.rewards.scoring import score_episodes  # noqa: E402
from envace.rollout.config import RolloutConfig  # noqa: E402
from envace.rollout.runner import EpisodeRunner  # noqa: E402
from envace.types import Task  # noqa: E402
from envace.worlds import RealWorld  # noqa: E402

ROLLOUT = RolloutConfig(max_turns=5, max_tool_calls=4, act_max_new_tokens=48, rehearse_max_new_tokens=32,
                        act_temperature=0.0, rehearse_temperature=0.0)


def successes(policy_dir: str, tasks: list[Task]) -> list[float]:
    """Greedy real-environment success of each task."""
    model, tokenizer = HFPolicy(policy_dir).build()
    model.eval()
    world = RealWorld()
    world.bind(tokenizer, model)
    engine = HFEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id], max_batch_size=64)
    with torch.no_grad():
        episodes = EpisodeRunner(tokenizer, ROLLOUT).run(tasks, list(range(len(tasks))), engine, world, engine)
    score_episodes(episodes, [TaskSuccess()])
    return [float(e.success) for e in episodes]


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--tasks", default="builtin:bank-test")
    args = parser.parse_args()
    tasks = load_task_set(args.tasks)
    names = [p.split("=", 1)[0] for p in args.policies]
    per_policy = [successes(p.split("=", 1)[1], tasks) for p in args.policies]
    rows: dict[str, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        rows[template_of(task)].append(i)
    lines = ["| template | tasks | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for template, idx in rows.items():
        cells = [f"{sum(s[i] for i in idx) / len(idx):.3f}" for s in per_policy]
        lines.append(f"| {template} | {len(idx)} | " + " | ".join(cells) + " |")
    lines.append(f"| all | {len(tasks)} | " + " | ".join(f"{sum(s) / len(s):.3f}" for s in per_policy) + " |")
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    main()
