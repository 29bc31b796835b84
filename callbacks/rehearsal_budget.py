"""The rehearsal-budget ablation: real-environment success on held-out tasks for growing private-rehearsal budgets.

For every mode (``parallel``, ``sequential``) and budget (attempts per committed act turn, e.g. 0, 1, 2, 4, 8), the
policy runs the held-out tasks with ``envace.rollout.rehearsing.RehearsingRunner``: attempts answered by its own
rehearse role, committed turns answered by the module's evaluation world (``RealWorld``: real success). Budget 0 is
plain acting, run once and shared by both modes. The callback logs the curves to TensorBoard
(``rehearsal_budget/<mode>/{success,tokens}`` with the budget as the x axis; other loggers get one key per budget)
and writes ``rehearsal_budget_step<N>.{json,md,png}`` (success and rehearsal tokens per episode against the budget)
under ``output_dir`` (default: the logger's directory); with ``write_episodes`` also every episode of every setting,
with the memory the act role read before each committed turn (``rehearsal_budget_step<N>_<mode>_b<budget>.jsonl``,
one ``callbacks.episode_writer.episode_record`` per line). It runs at the end of ``fit``, under ``envace test`` and
every ``every_n_steps`` steps. Real calls are counted: committed ones in ``real_calls``, rehearsal ones in
``private_real_calls`` (always 0).

Config::

    trainer:
      callbacks:
        - class_path: callbacks.rehearsal_budget.RehearsalBudgetAblation
          init_args: {tasks: builtin:bank-test, limit: 64, budgets: [0, 1, 2, 4, 8]}
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from envace.rollout.private_rehearsal import Granularity, PrivateRehearsal, Selector, check_selector
from envace.runtime.progress import elapsed_text, ensure_handler

report = rank_zero_only(logging.getLogger("envace.runtime.progress").info)
"""A progress line, logged on rank zero only."""

MODES = ("parallel", "sequential")


class RehearsalBudgetAblation(L.Callback):
    """Real success against the private-rehearsal budget, in both modes.

    Args:
        tasks: the held-out tasks (a task file, ``builtin:NAME`` or ``builtin:NAME:N``, as ``data.test_tasks``).
        limit: first tasks of the file (None: all).
        budgets: attempts per rehearsal to compare (0: plain acting).
        modes: ``parallel`` and/or ``sequential``.
        granularity: rehearse before every committed act turn (``step``) or before the first (``task``).
        horizon: most act turns of one imagined attempt.
        temperature: sampling temperature of the attempts.
        greedy_first: play each rehearsal's first attempt greedily (``PrivateRehearsal.greedy_first``).
        selector: what a rehearsal commits (default: the act role writes the turn with the memory).
        seed: seeds the attempts' sampling, the same for every budget and mode.
        batch_size: run the tasks in chunks of this many (None: all at once). The parallel mode generates
            ``batch_size x budget`` attempts at once, and their caches with them: 64 tasks of a 135M-parameter model
            at budget 4 with 128-token thinking rehearsals ran out of 23 GB on CPU.
        at_fit_end: run when ``fit`` ends.
        on_test: run at the end of ``envace test``.
        every_n_steps: also run every this many optimiser steps (0: never).
        output_dir: where the table, JSON and plot go (default: ``<log dir>/rehearsal_budget``).
        write_episodes: also write every episode of every (mode, budget) as JSON Lines, to read why a budget helps
            or hurts (the rehearsed responses and answers the act role read, then what it committed).
    """

    def __init__(
        self,
        tasks: str = "builtin:bank-test",
        limit: int | None = 64,
        budgets: list[int] | None = None,
        modes: list[str] | None = None,
        granularity: Granularity = "step",
        horizon: int = 2,
        temperature: float = 1.0,
        greedy_first: bool = False,
        selector: Selector | None = None,
        seed: int = 0,
        batch_size: int | None = None,
        at_fit_end: bool = True,
        on_test: bool = True,
        every_n_steps: int = 0,
        output_dir: str | None = None,
        write_episodes: bool = False,
    ) -> None:
        self.budgets = sorted(set([0, 1, 2, 4, 8] if budgets is None else budgets))
        self.modes = list(MODES if modes is None else modes)
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"modes: '{mode}'; valid: {', '.join(MODES)}")
        if any(b < 0 for b in self.budgets) or not self.budgets:
            raise ValueError(f"budgets: at least one, each >= 0; got {budgets}")
        if (limit is not None and limit < 1) or every_n_steps < 0:
            raise ValueError("limit must be >= 1 (or null) and every_n_steps >= 0")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (or null), got {batch_size}")
        self.batch_size = batch_size
        PrivateRehearsal(1, self.modes[0], granularity, horizon, temperature)  # checks the settings by field
        self.tasks_spec, self.limit = tasks, limit
        self.granularity, self.horizon, self.temperature = granularity, horizon, temperature
        self.greedy_first = greedy_first
        check_selector(selector, PrivateRehearsal(1, greedy_first=greedy_first))
        self.selector, self.seed = selector, seed
        self.at_fit_end, self.on_test, self.every_n_steps = at_fit_end, on_test, every_n_steps
        self.output_dir = output_dir
        self.write_episodes = write_episodes
        self.history: list[dict[str, Any]] = []

    # -- hooks ------------------------------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Run every ``every_n_steps`` optimiser steps."""
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and not self._done_at(step):
            self.evaluate(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Run on the final weights."""
        if self.at_fit_end and not self._done_at(trainer.global_step):
            self.evaluate(trainer, pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Run on a checkpoint under ``envace test``."""
        if self.on_test:
            self.evaluate(trainer, pl_module)

    def _done_at(self, step: int) -> bool:
        return bool(self.history) and self.history[-1]["step"] == step

    # -- the ablation -----------------------------------------------------------------------------------------------

    def evaluate(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        """Run every (mode, budget); log the curves, write the files, return the record.

        The files are rewritten after each setting (the record marked ``"complete": false`` until the last one), and
        a progress line is logged as each chunk of tasks finishes, so a stopped run keeps what it measured.
        """
        import torch

        from envace.builtin.task_sets import load_task_set

        ensure_handler()
        tasks = load_task_set(self.tasks_spec)[: self.limit]
        pl_module._bind_worlds()
        record: dict[str, Any] = {"step": trainer.global_step, "tasks": self.tasks_spec, "n_tasks": len(tasks),
                                  "granularity": self.granularity, "horizon": self.horizon,
                                  "temperature": self.temperature, "greedy_first": self.greedy_first, "rows": [],
                                  "complete": False}
        settings = [(mode, budget) for mode in self.modes for budget in self.budgets]
        with torch.no_grad():
            plain = self._run(pl_module, tasks, PrivateRehearsal(0), "plain acting") if 0 in self.budgets else None
            for index, (mode, budget) in enumerate(settings):
                if budget == 0 and plain is not None:
                    row, played = plain
                else:
                    row, played = self._run(pl_module, tasks, self._budget(budget, mode), f"{mode} budget {budget}")
                record["rows"].append({"mode": mode, "budget": budget, **row})
                record["complete"] = index == len(settings) - 1
                self._write(trainer, record, {(mode, budget): played} if self.write_episodes else {})
        self.history.append(record)
        self._log(trainer, record["rows"])
        return record

    def _budget(self, budget: int, mode: str) -> PrivateRehearsal:
        return PrivateRehearsal(budget, mode, self.granularity, self.horizon, self.temperature,  # type: ignore[arg-type]
                                greedy_first=self.greedy_first)

    def _run(self, module: Any, tasks: list[Any], rehearsal: PrivateRehearsal,
             name: str) -> tuple[dict[str, float], list[Any]]:
        """One setting: greedy committed turns in the evaluation world, attempts sampled under ``seed``."""
        import time

        import torch

        from envace.rewards.scoring import score_episodes
        from envace.rollout.rehearsing import RehearsingRunner

        torch.manual_seed(self.seed)
        config = replace(module.evaluator.rollout)
        runner = RehearsingRunner(module.tokenizer, config, rehearsal, module.prompter, self.selector)
        size = self.batch_size or max(len(tasks), 1)
        episodes: list[Any] = []
        started = time.monotonic()
        for start in range(0, len(tasks), size):  # chunks in order, the sampler's state carried across them
            chunk = tasks[start : start + size]
            played = runner.run(chunk, list(range(len(chunk))), module.act_engine, module.evaluator.world,
                                module.rehearse_engine, user=module.user)
            score_episodes(played, module.rewards)
            episodes += played
            report(progress_line(name, episodes, len(tasks), time.monotonic() - started))
        n = max(len(episodes), 1)
        return {
            "success": sum(float(e.success) for e in episodes) / n,
            "tokens_per_episode": sum(e.stats.private_tokens for e in episodes) / n,
            "attempts_per_episode": sum(e.stats.private_rehearsals for e in episodes) / n,
            "real_calls": float(sum(e.stats.real_calls for e in episodes)),
            "private_real_calls": float(sum(e.stats.private_real_calls for e in episodes)),
            # what was committed: act turns, those taken as a picked attempt generated them, and malformed ones
            "act_turns_per_episode": sum(e.stats.act_turns for e in episodes) / n,
            "picked_per_episode": sum(e.stats.private_commits for e in episodes) / n,
            "malformed_turns": float(sum(e.stats.act_parse_errors + e.stats.unknown_tools
                                         + e.stats.invalid_arguments for e in episodes)),
        }, episodes

    def _log(self, trainer: L.Trainer, rows: list[dict[str, Any]]) -> None:
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_scalar"):  # TensorBoard: a curve over the budget
                for row in rows:
                    for key in ("success", "tokens_per_episode"):
                        experiment.add_scalar(f"rehearsal_budget/{row['mode']}/{key}", row[key], row["budget"])
            else:
                logger.log_metrics({f"rehearsal_budget/{r['mode']}/success_b{r['budget']}": r["success"]
                                    for r in rows}, step=trainer.global_step)

    @rank_zero_only
    def _write(self, trainer: L.Trainer, record: dict[str, Any], episodes: dict[tuple[str, int], list[Any]]) -> None:
        """The record so far (JSON, table, plot) and the given settings' episodes."""
        from callbacks.episode_writer import episode_record

        root = Path(self.output_dir or Path(trainer.log_dir or trainer.default_root_dir) / "rehearsal_budget")
        root.mkdir(parents=True, exist_ok=True)
        name = f"rehearsal_budget_step{record['step']}"
        (root / f"{name}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        (root / f"{name}.md").write_text(markdown(record) + "\n", encoding="utf-8")
        plot(record, root / f"{name}.png")
        for (mode, budget), batch in episodes.items():
            lines = "".join(json.dumps(episode_record(e), ensure_ascii=False) + "\n" for e in batch)
            (root / f"{name}_{mode}_b{budget}.jsonl").write_text(lines, encoding="utf-8")


def progress_line(name: str, episodes: list[Any], total: int, elapsed: float) -> str:
    """``rehearsal budget, parallel budget 2: 32/256 tasks | success 0.969 | 1m05s elapsed, about 7m35s left``."""
    done = len(episodes)
    success = sum(float(e.success) for e in episodes) / max(done, 1)
    timing = elapsed_text(elapsed, done, total)
    return f"rehearsal budget, {name}: {done}/{total} tasks | success {success:.3f} | {timing}"


def markdown(record: dict[str, Any]) -> str:
    """The ablation as a Markdown table."""
    lines = [f"Private rehearsal budget at step {record['step']} ({record['n_tasks']} tasks of {record['tasks']}; "
             f"{record['granularity']} granularity, horizon {record['horizon']}"
             + ("; each rehearsal's first attempt greedy" if record.get("greedy_first") else "") + ")"
             + ("" if record.get("complete", True) else "; incomplete: the run has not finished every setting yet"),
             "",
             "| mode | budget | real success | rehearsal tokens / episode | attempts / episode | real calls | "
             "real calls in rehearsal | act turns / episode | picked attempts / episode | malformed act turns |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        lines.append(f"| {r['mode']} | {r['budget']} | {r['success']:.3f} | {r['tokens_per_episode']:.1f} | "
                     f"{r['attempts_per_episode']:.1f} | {r['real_calls']:.0f} | {r['private_real_calls']:.0f} | "
                     f"{_number(r, 'act_turns_per_episode', '.2f')} | {_number(r, 'picked_per_episode', '.2f')} | "
                     f"{_number(r, 'malformed_turns', '.0f')} |")
    return "\n".join(lines)


def _number(row: dict[str, Any], key: str, spec: str) -> str:
    """A row's figure, or – in a record written before it was measured."""
    return "–" if row.get(key) is None else format(row[key], spec)


def plot(record: dict[str, Any], path: Path) -> None:
    """Success and rehearsal tokens per episode against the budget, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for mode in dict.fromkeys(r["mode"] for r in record["rows"]):
        rows = [r for r in record["rows"] if r["mode"] == mode]
        budgets = [r["budget"] for r in rows]
        left.plot(budgets, [r["success"] for r in rows], marker="o", label=mode)
        right.plot(budgets, [r["tokens_per_episode"] for r in rows], marker="o", label=mode)
    left.set(xlabel="rehearsal budget (attempts per committed turn)", ylabel="real success", ylim=(0, 1))
    right.set(xlabel="rehearsal budget (attempts per committed turn)", ylabel="rehearsal tokens per episode")
    left.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
