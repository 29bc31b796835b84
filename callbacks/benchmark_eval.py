"""Benchmark evaluation during training: BFCL-v4, tau^2, FinMCP and VitaBench, scored as their authors score them.

Every ``every_n_steps`` optimiser steps, at the end of ``fit`` and (with ``on_test``) at the end of ``envace test``,
the callback runs the chosen benchmark subsets with the policy's act role (greedy) through envace's harnesses
(``envace.benchmarks``), logs the scores to the loggers as ``bench/<key>`` and writes ``results_step<N>.json`` and
``results_step<N>.md`` under ``output_dir`` (default: the logger's directory, ``benchmarks/``). Every rank runs the
same entries (sharded models generate in lockstep); rank zero writes.

Keys:

- BFCL: ``bfcl_<category>`` per category (multi-turn categories through the rollout and BFCL's
  ``multi_turn_checker``; single-turn ones through BFCL's AST checker), except ``irrelevance``, logged as
  ``bfcl_non_live_irrelevance`` because ``bfcl_irrelevance`` is the aggregate's Irrelevance component. The
  components of the offline aggregate (``bfcl_non_live``, ``bfcl_live``, ``bfcl_irrelevance``, ``bfcl_multi_turn``)
  whose categories all ran, and ``bfcl_offline`` when every component did. It is not BFCL-v4 overall: the agentic
  40% needs the network.
- tau^2: ``tau2_<domain>_<mode>_pass<k>`` (k up to ``tau2_trials``) and ``tau2_<domain>_<mode>_floor`` (the
  do-nothing policy's score, printed next to every tau^2 score). User-mode scores depend on the ``user`` model,
  which the Markdown names.
- FinMCP (teacher-forced): ``finmcp_tp``, ``finmcp_tr``, ``finmcp_tf1``, ``finmcp_emr`` (macro over records; the
  micro scores and the tool-schema source are in the details).
- VitaBench: ``vita_reward`` and ``vita_rubric_score`` (the official rubric judge, played by ``judge``) and
  ``vita_order_match_unofficial`` (an unofficial proxy).

Config::

    trainer:
      callbacks:
        - class_path: callbacks.benchmark_eval.BenchmarkEvaluation
          init_args:
            every_n_steps: 100
            bfcl_categories: [multi_turn_base, simple_python, irrelevance]
            bfcl_limit: 20
            tau2_domains: [retail]
            tau2_mode: user
            tau2_limit: 10
            user:
              class_path: envace.engines.chat_model.ChatModel
              init_args: {policy: {class_path: envace.policy.HFPolicy, init_args: {name_or_path: /models/user}}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from envace.benchmarks.suite import (
    BFCL_AGENTIC_NOTE,
    BFCL_COMPONENTS,
    ORDER_MATCH_NOTE,
    bfcl_key,
    describe_model,
    split_bfcl_categories,
)
from envace.engines.chat_model import ChatModel
from envace.rollout.config import RolloutConfig


def _check_limits(**limits: int | None) -> None:
    """Each ``*_limit`` is None (all) or positive."""
    for name, value in limits.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, or null for all; got {value}")


def _check_counts(**counts: tuple[int, int]) -> None:
    """Each ``name=(value, least)`` has ``value >= least``."""
    for name, (value, least) in counts.items():
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")


def _existing_file(name: str, path: str) -> Path:
    """``path`` as a Path when it is a file."""
    if not Path(path).is_file():
        raise ValueError(f"{name}: no file at '{path}'")
    return Path(path)


def _tau2_domains(domains: list[str] | None, split: str | None, mode: str, user: ChatModel | None) -> list[str]:
    """The tau^2 domains to run, checked with the split, the mode and the user model ([] when tau^2 is off)."""
    from envace.benchmarks import tau2, tau2_tasks

    chosen = ["telecom"] if domains is None else list(domains)
    if split is not None and split not in tau2.SPLITS:
        raise ValueError(f"tau2_split: '{split}'; valid: {', '.join(tau2.SPLITS)} or null")
    if mode not in tau2_tasks.MODES:
        raise ValueError(f"tau2_mode: '{mode}'; valid: {', '.join(tau2_tasks.MODES)}")
    for domain in chosen:
        if domain not in tau2.DOMAINS:
            raise ValueError(f"tau2_domains: unknown domain '{domain}'; valid: {', '.join(tau2.DOMAINS)}")
        if chosen.count(domain) > 1:
            raise ValueError(f"tau2_domains: '{domain}' is listed twice")
        if mode == "solo" and domain not in tau2.SOLO_DOMAINS:
            raise ValueError(f"tau2_domains: '{domain}' has no solo mode (only {', '.join(tau2.SOLO_DOMAINS)}); "
                             "set tau2_mode: user and a user model")
    if split is None or not chosen:
        return []
    if mode == "user" and user is None:
        raise ValueError("user: tau2_mode 'user' needs the simulated user's model "
                         "(envace.engines.chat_model.ChatModel over a local checkpoint)")
    return chosen


def _load_finmcp(path: str | None, tools: str | None) -> tuple[list[Any], dict[str, Any] | None]:
    """FinMCP records and tool schemas (None: the records' own or inferred ones), read and checked."""
    from envace.benchmarks.finmcp import load_finmcp
    from envace.benchmarks.finmcp_eval import load_tool_schemas

    if path is None:
        if tools is not None:
            raise ValueError("finmcp_tools: given without finmcp_path")
        return [], None
    try:
        records = load_finmcp(_existing_file("finmcp_path", path))
    except ValueError as exc:
        raise ValueError(f"finmcp_path: {exc}") from exc
    if not records:
        raise ValueError(f"finmcp_path: '{path}' holds no records")
    if tools is None:
        return records, None
    try:
        return records, load_tool_schemas(_existing_file("finmcp_tools", tools))
    except ValueError as exc:
        raise ValueError(f"finmcp_tools: {exc}") from exc


def _load_vita(path: str | None, language: str, user: ChatModel | None, judge: ChatModel | None) -> list[Any]:
    """VitaBench tasks, read and checked with the models they need ([] without ``path``)."""
    from envace.benchmarks import vita

    if language not in vita.LANGUAGES:
        raise ValueError(f"vita_language: '{language}'; valid: {', '.join(vita.LANGUAGES)}")
    if path is None:
        return []
    if judge is None:
        raise ValueError("judge: vita_path needs a judge model (envace.engines.chat_model.ChatModel over a local "
                         "checkpoint) to play VitaBench's rubric judge")
    if user is None:
        raise ValueError("user: vita_path needs the simulated user's model (envace.engines.chat_model.ChatModel)")
    try:
        tasks = vita.load_vita(_existing_file("vita_path", path))
    except ValueError as exc:
        raise ValueError(f"vita_path: {exc}") from exc
    if not tasks:
        raise ValueError(f"vita_path: '{path}' holds no tasks")
    return tasks


@dataclass
class Report:
    """The scores of one evaluation, with what the Markdown prints next to them.

    Attributes:
        scores: key -> value (logged as ``bench/<key>``).
        details: per benchmark, what explains the scores (per-entry verdicts, failures, notes).
        floors: score key -> the do-nothing floor printed next to it.
        notes: score key -> a note (user model, unofficial, ...).
        remarks: lines under the Markdown table.
    """

    scores: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    remarks: list[str] = field(default_factory=list)

    def add(self, key: str, value: float | None, floor: float | None = None, note: str = "") -> None:
        """Record a score (a None score is left out: nothing was scored)."""
        if value is None:
            return
        self.scores[key] = float(value)
        if floor is not None:
            self.floors[key] = float(floor)
        if note:
            self.notes[key] = note


class BenchmarkEvaluation(L.Callback):
    """Runs benchmark subsets with the policy and logs their scores.

    Args:
        every_n_steps: evaluate every this many optimiser steps (0: only at the end).
        at_fit_end: evaluate when ``fit`` ends.
        on_test: evaluate at the end of ``envace test`` (a checkpoint's scores).
        bfcl_categories: BFCL categories: multi-turn (``envace.benchmarks.bfcl_data.MULTI_TURN``) and single-turn
            (``envace.benchmarks.bfcl_ast.SINGLE_TURN``); default ``[multi_turn_base]``; empty: no BFCL.
        bfcl_limit: first entries of each category (None: all).
        bfcl_split: multi-turn entries to run: ``all`` (the benchmark's 200), or ``eval`` (the ids held out of
            ``envace.benchmarks.bfcl.export_training_tasks``: score a policy trained on BFCL there) or ``train``.
        tau2_split: tau^2 split (``base``, ``train``, ``test``); None: no tau^2.
        tau2_limit: first tasks of the split, per domain (None: all).
        tau2_trials: episodes per tau^2 task (pass^1..pass^trials).
        act_max_new_tokens: generation budget of one act turn (and of one single-turn or FinMCP answer).
        max_context_tokens: context cap of an episode (the benchmarks' tool docs are long), and the longest FinMCP
            prompt generated.
        output_dir: where results files go (default: ``<log dir>/benchmarks``).
        tau2_domains: tau^2 domains (default ``[telecom]``; empty: no tau^2).
        tau2_mode: ``solo`` (telecom only, no user) or ``user`` (``user`` plays the customer).
        user: the simulated user's model (a local ``ChatModel``) for tau^2 user mode and VitaBench.
        max_user_turns: most user turns of a conversation with a simulated user (0: no limit).
        finmcp_path: a FinMCP-Bench file (JSON array or JSON Lines); None: no FinMCP.
        finmcp_tools: a tool-schema file for FinMCP's prompts (default: the records' own, else inferred ones).
        finmcp_limit: first FinMCP records (None: all).
        vita_path: a VitaBench task file (needs ``user``, ``judge`` and VitaBench's code); None: no VitaBench.
        vita_limit: first VitaBench tasks (None: all).
        vita_trials: episodes per VitaBench task.
        vita_language: ``english`` or ``chinese``.
        judge: VitaBench's rubric judge's model (a local ``ChatModel``).
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
        tau2_domains: list[str] | None = None,
        tau2_mode: str = "solo",
        user: ChatModel | None = None,
        max_user_turns: int = 30,
        finmcp_path: str | None = None,
        finmcp_tools: str | None = None,
        finmcp_limit: int | None = None,
        vita_path: str | None = None,
        vita_limit: int | None = None,
        vita_trials: int = 1,
        vita_language: str = "english",
        judge: ChatModel | None = None,
        bfcl_split: str = "all",
    ) -> None:
        _check_limits(bfcl_limit=bfcl_limit, tau2_limit=tau2_limit, finmcp_limit=finmcp_limit, vita_limit=vita_limit)
        _check_counts(every_n_steps=(every_n_steps, 0), tau2_trials=(tau2_trials, 1), vita_trials=(vita_trials, 1),
                      act_max_new_tokens=(act_max_new_tokens, 1), max_context_tokens=(max_context_tokens, 1),
                      max_user_turns=(max_user_turns, 0))
        self.every_n_steps, self.at_fit_end, self.on_test = every_n_steps, at_fit_end, on_test
        self.bfcl_categories = ["multi_turn_base"] if bfcl_categories is None else list(bfcl_categories)
        self.multi_turn, self.single_turn = split_bfcl_categories(self.bfcl_categories)
        self.bfcl_limit = bfcl_limit
        if bfcl_split not in ("all", "train", "eval"):
            raise ValueError(f"bfcl_split: '{bfcl_split}'; valid: all, train, eval")
        self.bfcl_split = bfcl_split
        self.tau2_domains = _tau2_domains(tau2_domains, tau2_split, tau2_mode, user)
        self.tau2_split, self.tau2_mode = tau2_split, tau2_mode
        self.tau2_limit, self.tau2_trials = tau2_limit, tau2_trials
        self.finmcp_records, self.finmcp_tools = _load_finmcp(finmcp_path, finmcp_tools)
        self.finmcp_records = self.finmcp_records[:finmcp_limit]
        self.vita_tasks = _load_vita(vita_path, vita_language, user, judge)[:vita_limit]
        self.vita_trials, self.vita_language = vita_trials, vita_language
        self.user, self.judge = user, judge
        self.act_max_new_tokens, self.max_context_tokens = act_max_new_tokens, max_context_tokens
        self.rollout = RolloutConfig(act_temperature=0.0, act_max_new_tokens=act_max_new_tokens, max_turns=100,
                                     max_tool_calls=200, max_context_tokens=max_context_tokens,
                                     max_user_turns=max_user_turns)
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

        pl_module._bind_worlds()
        engine, tokenizer = pl_module.act_engine, pl_module.tokenizer
        report = Report()
        with torch.no_grad():
            self._bfcl(engine, tokenizer, report)
            self._tau2(engine, tokenizer, report)
            self._finmcp(engine, tokenizer, report)
            self._vita(engine, tokenizer, report)
        record = {"step": trainer.global_step, "scores": report.scores, "details": report.details,
                  "floors": report.floors, "notes": report.notes, "remarks": report.remarks}
        self.history.append(record)
        for logger in trainer.loggers:
            logger.log_metrics({f"bench/{k}": v for k, v in report.scores.items()}, step=trainer.global_step)
        self._write(trainer, record)
        return record

    def _bfcl(self, engine: Any, tokenizer: Any, report: Report) -> None:
        """The BFCL categories, each through its harness, then the offline aggregate of those that ran."""
        from envace.benchmarks import bfcl, bfcl_ast, bfcl_data

        accuracy: dict[str, float] = {}
        counts: dict[str, int] = {}
        for category in self.multi_turn:
            entries = bfcl_data.load_split(category, self.bfcl_split, limit=self.bfcl_limit)
            result = bfcl.evaluate_multi_turn(entries, engine, tokenizer, replace(self.rollout))
            accuracy[category], counts[category] = result["accuracy"], len(entries)
            report.details[bfcl_key(category)] = result["valid"]
        if self.single_turn:
            entries = [e for c in self.single_turn for e in bfcl_ast.load_single_turn(c, limit=self.bfcl_limit)]
            result = bfcl_ast.evaluate_single_turn(entries, engine, tokenizer, max_new_tokens=self.act_max_new_tokens)
            accuracy.update(result["categories"])
            counts.update(result["counts"])
            for entry in entries:
                report.details.setdefault(bfcl_key(entry.category), {})[entry.id] = result["valid"][entry.id]
        for category in self.bfcl_categories:
            report.add(bfcl_key(category), accuracy[category],
                       note="reported, not in bfcl_offline" if category in bfcl_ast.RELEVANCE else "")
        if accuracy:
            self._bfcl_aggregate(accuracy, counts, report)

    def _bfcl_aggregate(self, accuracy: dict[str, float], counts: dict[str, int], report: Report) -> None:
        """Log the aggregate's components that ran, and ``bfcl_offline`` when all did; explain the rest."""
        from envace.benchmarks import bfcl_ast

        aggregate = bfcl_ast.offline_aggregate(accuracy, counts)
        for part in BFCL_COMPONENTS:
            report.add(f"bfcl_{part}", aggregate[part], note="component of bfcl_offline")
        report.add("bfcl_offline", aggregate["bfcl_offline"], note=BFCL_AGENTIC_NOTE)
        live = {c: counts[c] for c in bfcl_ast.LIVE_AST if c in counts}
        weighting = (f"Live is weighted by the entries evaluated here (bfcl_limit={self.bfcl_limit}: {live}), "
                     "not by BFCL's full category sizes"
                     if self.bfcl_limit is not None else "Live is weighted by BFCL's full category sizes")
        report.details["bfcl_aggregate"] = {
            "missing": aggregate["missing"], "note": aggregate["note"], "simple": aggregate["simple"],
            "live_relevance": aggregate["live_relevance"], "counts": counts, "live_weighting": weighting}
        report.remarks.append(f"BFCL: {aggregate['note']}.")
        if aggregate["missing"]:
            report.remarks.append(f"BFCL: no bfcl_offline, its categories did not all run (missing: "
                                  f"{', '.join(aggregate['missing'])}).")
        if live:
            report.remarks.append(f"BFCL: {weighting}.")

    def _tau2(self, engine: Any, tokenizer: Any, report: Report) -> None:
        """Each tau^2 domain in the chosen mode: pass^k with the floor next to it, and the user model named."""
        from envace.benchmarks import tau2, tau2_eval

        solo = self.tau2_mode == "solo"
        who = "none (solo)" if solo else describe_model(self.user)
        for domain in self.tau2_domains:
            tasks = tau2.load_tasks(domain, self.tau2_split)[: self.tau2_limit]
            result = tau2_eval.evaluate(tasks, engine, tokenizer, domain, self.tau2_mode,
                                        user=None if solo else self.user, rollout=replace(self.rollout),
                                        trials=self.tau2_trials)
            name = f"tau2_{domain}_{self.tau2_mode}"
            for k, value in result["pass_hat"].items():
                report.add(f"{name}_pass{k}", value, floor=result["floor"], note=f"user: {who}")
            report.add(f"{name}_floor", result["floor"], note="the do-nothing policy's score")
            report.details[name] = {"split": self.tau2_split, "user_model": who, "rewards": result["rewards"],
                                    "failed": result["failed"], "failed_trials": sum(result["failed"].values())}
            if result["failed"]:
                report.remarks.append(f"tau^2 {domain}: {sum(result['failed'].values())} trial(s) whose simulated user "
                                      "failed are left out of pass^k.")

    def _finmcp(self, engine: Any, tokenizer: Any, report: Report) -> None:
        """FinMCP's teacher-forced protocol: macro TP/TR/TF1/EMR logged, micro and the schema source in details."""
        if not self.finmcp_records:
            return
        from envace.benchmarks.finmcp_eval import evaluate_finmcp

        result = evaluate_finmcp(self.finmcp_records, engine, tokenizer, tools=self.finmcp_tools,
                                 max_new_tokens=self.act_max_new_tokens, max_prompt_tokens=self.max_context_tokens)
        scores = result["scores"]
        source = f"macro over records; tool schemas: {result['schema_source']}"
        for key, metric in (("tp", "precision"), ("tr", "recall"), ("tf1", "f1"), ("emr", "exact_match")):
            report.add(f"finmcp_{key}", scores.macro[metric], note=source)
        report.details["finmcp"] = {
            "micro": scores.micro, "macro": scores.macro, "records": scores.records, "groups": scores.groups,
            "schema_source": result["schema_source"], "schema_sources": result["schema_sources"],
            **{k: result[k] for k in ("steps", "generated", "overflow", "parse_errors", "truncated", "predictions")}}
        if result["schema_source"] in ("inferred", "mixed"):
            report.remarks.append("FinMCP: tool schemas inferred from the gold calls (less than the real benchmark "
                                  "shows); pass finmcp_tools for the real ones.")

    def _vita(self, engine: Any, tokenizer: Any, report: Report) -> None:
        """VitaBench episodes with the simulated user, judged by the rubric judge; the order proxy labelled."""
        if not self.vita_tasks:
            return
        from envace.benchmarks.vita_eval import evaluate_vita
        from envace.benchmarks.vita_scoring import RubricJudge

        assert self.user is not None and self.judge is not None  # checked at construction
        result = evaluate_vita(self.vita_tasks, engine, tokenizer, self.user, RubricJudge(self.judge),
                               trials=self.vita_trials, rollout=replace(self.rollout), language=self.vita_language)
        models = f"user: {describe_model(self.user)}; judge: {describe_model(self.judge)}"
        report.add("vita_reward", result["avg_reward"], note=models)
        report.add("vita_rubric_score", result["avg_rubric_score"], note=models)
        report.add("vita_order_match_unofficial", result["order_match_unofficial"]["mean"], note=ORDER_MATCH_NOTE)
        report.details["vita"] = {
            "user_model": describe_model(self.user), "judge_model": describe_model(self.judge),
            "order_match_note": ORDER_MATCH_NOTE,
            **{k: result[k] for k in ("official", "scored", "pass_hat", "pass_at", "rewards", "failed", "premature",
                                      "judge_failures", "judged", "judge_calls")}}
        if result["scored"] == 0:
            report.remarks.append("VitaBench: no episode could be scored (see details: failed users, judge failures).")

    @rank_zero_only
    def _write(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        root = Path(self.output_dir or Path(trainer.log_dir or trainer.default_root_dir) / "benchmarks")
        root.mkdir(parents=True, exist_ok=True)
        name = f"results_step{record['step']}"
        (root / f"{name}.json").write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
        (root / f"{name}.md").write_text(markdown(record), encoding="utf-8")


def markdown(record: dict[str, Any]) -> str:
    """An evaluation record as a Markdown table (score, value, floor, note) with its remarks under it."""
    floors, notes = record.get("floors", {}), record.get("notes", {})
    rows = [f"| {k} | {v:.3f} | {floors[k]:.3f} | {notes.get(k, '')} |" if k in floors
            else f"| {k} | {v:.3f} | – | {notes.get(k, '')} |" for k, v in record["scores"].items()]
    lines = [f"Benchmarks at step {record['step']}", "", "| score | value | floor | note |", "|---|---|---|---|", *rows]
    remarks = record.get("remarks", [])
    return "\n".join(lines + ([""] + [f"- {r}" for r in remarks] if remarks else [])) + "\n"
