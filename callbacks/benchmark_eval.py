"""Benchmark evaluation during training: BFCL-v4 multi-turn and tau^2 telecom (solo), scored as the authors score them.

Every ``every_n_steps`` optimiser steps, at the end of ``fit`` and (with ``on_test``) at the end of ``envace test``,
the callback runs the chosen benchmark subsets with the policy's act role (greedy) through envace's rollout, logs
the scores to the loggers (``bench/bfcl_<category>``, ``bench/tau2_telecom_solo_pass<k>``, ``bench/tau2_floor``) and
writes ``results_step<N>.json`` and ``results_step<N>.md`` under ``output_dir`` (default: the logger's directory,
``benchmarks/``). Every rank runs the same entries (sharded models generate in lockstep); rank zero writes.

Config::

    trainer:
      callbacks:
        - class_path: callbacks.benchmark_eval.BenchmarkEvaluation
          init_args: {every_n_steps: 100, bfcl_limit: 20, tau2_limit: 10}
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from envace.rollout.runner import RolloutConfig


class BenchmarkEvaluation(L.Callback):
    """Runs benchmark subsets with the policy and logs their scores.

    Args:
        every_n_steps: evaluate every this many optimiser steps (0: only at the end).
        at_fit_end: evaluate when ``fit`` ends.
        on_test: evaluate at the end of ``envace test`` (a checkpoint's scores).
        bfcl_categories: BFCL multi-turn categories (``envace.benchmarks.bfcl.MULTI_TURN``); empty: no BFCL.
        bfcl_limit: first entries of each category (None: all 200).
        tau2_split: tau^2 telecom split (``base``, ``train``, ``test``); None: no tau^2.
        tau2_limit: first tasks of the split (None: all).
        tau2_trials: episodes per tau^2 task (pass^1..pass^trials).
        act_max_new_tokens: generation budget of one act turn.
        max_context_tokens: context cap of an episode (the benchmarks' tool docs are long).
        output_dir: where results files go (default: ``<log dir>/benchmarks``).
    """

    def __init__(
        self,
        every_n_steps: int = 0,
        at_fit_end: bool = True,
        on_test: bool = True,
        bfcl_categories: list[str] | None = None,
        bfcl_limit: int | None = 10,
        tau2_split: str | None = "test",
        tau2_limit: int | None = 5,
        tau2_trials: int = 1,
        act_max_new_tokens: int = 256,
        max_context_tokens: int = 32768,
        output_dir: str | None = None,
    ) -> None:
        from envace.benchmarks import bfcl, tau2

        categories = ["multi_turn_base"] if bfcl_categories is None else list(bfcl_categories)
        for category in categories:
            if category not in bfcl.MULTI_TURN:
                raise ValueError(f"bfcl_categories: '{category}' is not a multi-turn category; valid: "
                                 f"{', '.join(bfcl.MULTI_TURN)}")
        if tau2_split is not None and tau2_split not in tau2.SPLITS:
            raise ValueError(f"tau2_split: '{tau2_split}'; valid: {', '.join(tau2.SPLITS)} or null")
        if every_n_steps < 0 or tau2_trials < 1:
            raise ValueError("every_n_steps must be >= 0 and tau2_trials >= 1")
        self.every_n_steps, self.at_fit_end, self.on_test = every_n_steps, at_fit_end, on_test
        self.bfcl_categories, self.bfcl_limit = categories, bfcl_limit
        self.tau2_split, self.tau2_limit, self.tau2_trials = tau2_split, tau2_limit, tau2_trials
        self.rollout = RolloutConfig(act_temperature=0.0, act_max_new_tokens=act_max_new_tokens, max_turns=100,
                                     max_tool_calls=200, max_context_tokens=max_context_tokens)
        self.output_dir = output_dir
        self.history: list[dict[str, Any]] = []  # the scores of every evaluation, in order

    # -- hooks ------------------------------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Evaluate every ``every_n_steps`` optimiser steps."""
        step = trainer.global_step
        due = self.every_n_steps and step > 0 and step % self.every_n_steps == 0
        if due and (not self.history or self.history[-1]["step"] != step):
            self.evaluate(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate the final weights."""
        if self.at_fit_end and (not self.history or self.history[-1]["step"] != trainer.global_step):
            self.evaluate(trainer, pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate a checkpoint under ``envace test``."""
        if self.on_test:
            self.evaluate(trainer, pl_module)

    # -- evaluation -------------------------------------------------------------------------------------------------

    def evaluate(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        """Run the subsets with the module's act engine; log and write the scores; return them."""
        import torch

        from envace.benchmarks import bfcl, tau2

        pl_module._bind_worlds()
        engine, tokenizer = pl_module.act_engine, pl_module.tokenizer
        scores: dict[str, float] = {}
        details: dict[str, Any] = {}
        with torch.no_grad():
            for category in self.bfcl_categories:
                entries = bfcl.load_multi_turn(category, limit=self.bfcl_limit)
                result = bfcl.evaluate_multi_turn(entries, engine, tokenizer, replace(self.rollout))
                scores[f"bfcl_{category}"] = result["accuracy"]
                details[f"bfcl_{category}"] = result["valid"]
            if self.tau2_split is not None:
                tasks = tau2.load_tasks("telecom", self.tau2_split)[: self.tau2_limit]
                result = tau2.evaluate_solo(tasks, engine, tokenizer, self.rollout, trials=self.tau2_trials)
                scores.update({f"tau2_telecom_solo_pass{k}": v for k, v in result["pass_hat"].items()})
                scores["tau2_floor"] = result["floor"]
                details["tau2_telecom_solo"] = result["rewards"]
        record = {"step": trainer.global_step, "scores": scores, "details": details}
        self.history.append(record)
        for logger in trainer.loggers:
            logger.log_metrics({f"bench/{k}": v for k, v in scores.items()}, step=trainer.global_step)
        self._write(trainer, record)
        return record

    @rank_zero_only
    def _write(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        root = Path(self.output_dir or Path(trainer.log_dir or trainer.default_root_dir) / "benchmarks")
        root.mkdir(parents=True, exist_ok=True)
        name = f"results_step{record['step']}"
        (root / f"{name}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        rows = [f"| {k} | {v:.3f} |" for k, v in record["scores"].items()]
        table = "\n".join([f"Benchmarks at step {record['step']}", "", "| score | value |", "|---|---|", *rows])
        (root / f"{name}.md").write_text(table + "\n", encoding="utf-8")
