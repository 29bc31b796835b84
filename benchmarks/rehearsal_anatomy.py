"""What private rehearsal changed against plain acting, task by task: the anatomy of its gains and losses.

Reads the episode files a rehearsal ablation wrote (``callbacks.rehearsal_budget.RehearsalBudgetAblation`` with
``write_episodes: true``, as the controlled study's test-time rehearsal jobs run it: one
``rehearsal_budget_step<N>_<mode>_b<budget>.jsonl`` per setting) and sets every rehearsing setting beside plain
acting (budget 0) of the same directory (``envace.evaluation.rehearsal_anatomy``): each task whose success changed,
put down to one cause.

Run from the repository root: ``.venv/bin/python benchmarks/rehearsal_anatomy.py NAME=DIR [NAME=DIR ...]
[--details]``, where each DIR is an ablation's output directory (e.g. ``runs/study/smollm2-bank-seed0/rehearsal/a``).
Prints a Markdown table (one row per setting and direction) and a last line ``SUMMARY right_to_wrong=<n>
wrong_to_right=<n> <cause>=<n> ...`` summed over every setting (causes of the losses).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from envace.evaluation.rehearsal_anatomy import CAUSES, Anatomy, anatomy, markdown, read_episodes  # noqa: E402

SETTING = re.compile(r"^rehearsal_budget_step(\d+)_(parallel|sequential)_b(\d+)\.jsonl$")


def settings(directory: Path) -> list[tuple[str, Anatomy]]:
    """Every rehearsing setting of one ablation directory beside its plain acting.

    Raises:
        FileNotFoundError: no episode files (run the ablation with ``write_episodes: true``), or no budget 0.
    """
    files = [(m, p) for p in sorted(directory.iterdir()) if (m := SETTING.match(p.name))]
    if not files:
        raise FileNotFoundError(f"{directory}: no rehearsal_budget_step*_<mode>_b<budget>.jsonl files (run the "
                                "ablation with write_episodes: true)")
    out = []
    for match, path in files:
        step, mode, budget = match.group(1), match.group(2), int(match.group(3))
        if budget == 0:
            continue
        plain = directory / f"rehearsal_budget_step{step}_{mode}_b0.jsonl"
        if not plain.is_file():
            raise FileNotFoundError(f"{plain}: the plain-acting episodes to compare {path.name} with")
        out.append((f"step {step}, {mode}, budget {budget}", anatomy(read_episodes(plain), read_episodes(path))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--details", action="store_true", help="also list every changed task with what differed")
    args = parser.parse_args(argv)
    pairs = [d.split("=", 1) for d in args.dirs]
    if any(len(p) != 2 for p in pairs):
        parser.error("each directory is NAME=DIR")
    rows, losses, gains = [], Counter(), 0
    for name, directory in pairs:
        for label, result in settings(Path(directory)):
            rows.append((f"{name}, {label}", result))
            counts = result.counts()
            losses.update(counts["right_to_wrong"])
            gains += sum(counts["wrong_to_right"].values())
    print(markdown(rows))  # noqa: T201
    if args.details:
        for label, result in rows:
            for c in result.changes:
                print(f"- {label}: {c.task} {c.change} ({c.cause}, turn {c.turn}): {c.detail}")  # noqa: T201
    causes = " ".join(f"{cause}={losses.get(cause, 0)}" for cause in CAUSES)
    print(f"\nSUMMARY right_to_wrong={sum(losses.values())} wrong_to_right={gains} {causes}")  # noqa: T201


if __name__ == "__main__":
    main()
