"""The rehearsal-budget ablation callback under ``envace test``: every (mode, budget) runs in the real environment,
the budget is spent exactly, rehearsal makes no real call, and the curve, table, JSON and plot are written."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.cli.lightning import cli_main as main

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "lit_configs" / "tiny.yaml")
sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _scalars  # noqa: E402


@pytest.mark.slow
def test_the_ablation_runs_every_budget_in_both_modes_and_writes_its_files(tmp_path: Path,
                                                                          scripted_act: None) -> None:
    # the scripted act role calls get_balance(A1) then answers "120", attempts included: 2 committed turns per episode
    callback = json.dumps([{"class_path": "callbacks.rehearsal_budget.RehearsalBudgetAblation",
                            "init_args": {"tasks": "builtin:bank-test", "limit": 3, "budgets": [0, 1, 2],
                                          "horizon": 1, "batch_size": 2,  # chunks of 2 and 1 tasks
                                          "write_episodes": True,
                                          "output_dir": str(tmp_path / "ablation")}}])
    args = ["test", "--config", TINY, f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.callbacks={callback}",
            "--trainer.limit_test_batches=1", "--data.test_tasks=builtin:bank-test:2",
            "--model.rollout.rehearse_max_new_tokens=8"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(args)
    (ablation,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "RehearsalBudgetAblation"]
    rows = {(r["mode"], r["budget"]): r for r in ablation.history[-1]["rows"]}
    assert set(rows) == {(m, b) for m in ("parallel", "sequential") for b in (0, 1, 2)}
    for (_, budget), row in rows.items():
        assert row["attempts_per_episode"] == 2 * budget  # before each of the 2 committed turns
        assert row["private_real_calls"] == 0 and row["real_calls"] == 3  # one committed call per task
        assert row["success"] == rows[("parallel", 0)]["success"]  # the scripted act role ignores the memory
        assert (row["tokens_per_episode"] > 0) == (budget > 0)
        # the memory commit generates every committed turn: none is a picked attempt, none malformed
        assert (row["act_turns_per_episode"], row["picked_per_episode"], row["malformed_turns"]) == (2, 0, 0)
    plain = [{k: v for k, v in rows[(mode, 0)].items() if k != "mode"} for mode in ("parallel", "sequential")]
    assert plain[0] == plain[1]  # plain acting, run once
    files = sorted(p.name for p in (tmp_path / "ablation").iterdir())
    settings = [f"rehearsal_budget_step0_{m}_b{b}.jsonl" for m in ("parallel", "sequential") for b in (0, 1, 2)]
    assert files == sorted([f"rehearsal_budget_step0.{ext}" for ext in ("json", "md", "png")] + settings)
    for (mode, budget), row in rows.items():
        lines = (tmp_path / "ablation" / f"rehearsal_budget_step0_{mode}_b{budget}.jsonl").read_text().splitlines()
        episodes = [json.loads(line) for line in lines]
        assert len(episodes) == 3 and all(e["task"].startswith("bank-test-") for e in episodes)
        assert sum(e["success"] for e in episodes) / 3 == pytest.approx(row["success"])
        for episode in episodes:  # the memory the act role read before each of its 2 committed turns
            memory = episode.get("private_memory", [])
            assert [m["act_turn"] for m in memory] == ([0, 1] if budget else [])
            for m in memory:
                assert m["memory"].count("\nAttempt ") == budget
                assert ("get_balance" in m["memory"]) == (m["act_turn"] == 0)  # the scripted call, then its answer
                assert ("answer: 120" in m["memory"]) == (m["act_turn"] == 1)
                assert all(m["memory"] not in str(msg.get("content")) for msg in episode["messages"])  # private
            attempts = episode.get("private_attempts", [])  # what was imagined; the memory wrote each turn
            assert [(a["act_turn"], len(a["attempts"]), a["committed"]) for a in attempts] == (
                [(0, budget, None), (1, budget, None)] if budget else [])
    assert "| sequential | 2 | " in (tmp_path / "ablation" / "rehearsal_budget_step0.md").read_text()
    curve = _scalars(tmp_path)["rehearsal_budget/parallel/tokens_per_episode"]
    assert len(curve) == 3 and curve[0] == 0.0 and curve[1] > 0  # one point per budget


def test_the_table_marks_figures_an_older_record_did_not_measure() -> None:
    from callbacks.rehearsal_budget import markdown

    old = {"mode": "parallel", "budget": 2, "success": 0.1875, "tokens_per_episode": 491.1,
           "attempts_per_episode": 5.2, "real_calls": 79.0, "private_real_calls": 0.0}
    new = dict(old, budget=4, act_turns_per_episode=2.625, picked_per_episode=1.5, malformed_turns=12.0)
    text = markdown({"step": 0, "n_tasks": 64, "tasks": "builtin:bank-test", "granularity": "step", "horizon": 2,
                     "rows": [old, new]})
    assert "| parallel | 2 | 0.188 | 491.1 | 5.2 | 79 | 0 | – | – | – |" in text
    assert "| parallel | 4 | 0.188 | 491.1 | 5.2 | 79 | 0 | 2.62 | 1.50 | 12 |" in text
    assert "greedy" not in text.splitlines()[0]


def test_greedy_first_reaches_every_budgets_rehearsal_and_the_table() -> None:
    from callbacks.rehearsal_budget import RehearsalBudgetAblation, markdown

    ablation = RehearsalBudgetAblation(budgets=[0, 2], greedy_first=True, temperature=0.8)
    rehearsal = ablation._budget(2, "sequential")
    assert (rehearsal.greedy_first, rehearsal.temperature, rehearsal.mode) == (True, 0.8, "sequential")
    assert RehearsalBudgetAblation()._budget(2, "parallel").greedy_first is False
    text = markdown({"step": 0, "n_tasks": 1, "tasks": "t", "granularity": "step", "horizon": 2, "greedy_first": True,
                     "rows": []})
    assert text.splitlines()[0].endswith("horizon 2; each rehearsal's first attempt greedy)")


def test_bad_settings_are_refused_by_name() -> None:
    from callbacks.rehearsal_budget import RehearsalBudgetAblation

    with pytest.raises(ValueError, match="modes: 'both'"):
        RehearsalBudgetAblation(modes=["both"])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        RehearsalBudgetAblation(batch_size=0)
    with pytest.raises(ValueError, match="budgets: at least one, each >= 0"):
        RehearsalBudgetAblation(budgets=[-1])
    with pytest.raises(ValueError, match="granularity: 'turn'"):
        RehearsalBudgetAblation(granularity="turn")  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_stopped_ablation_keeps_the_settings_it_finished(tmp_path: Path, scripted_act: None,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from callbacks.rehearsal_budget import RehearsalBudgetAblation

    real_budget = RehearsalBudgetAblation._budget

    def stop_at_two(self: RehearsalBudgetAblation, budget: int, mode: str) -> object:
        if budget == 2:
            raise KeyboardInterrupt("stopped by the user")
        return real_budget(self, budget, mode)

    callback = json.dumps([{"class_path": "callbacks.rehearsal_budget.RehearsalBudgetAblation",
                            "init_args": {"tasks": "builtin:bank-test", "limit": 3, "budgets": [0, 1, 2],
                                          "modes": ["parallel"], "horizon": 1, "batch_size": 2,
                                          "write_episodes": True, "output_dir": str(tmp_path / "ablation")}}])
    args = ["test", "--config", TINY, f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks={callback}",
            "--trainer.limit_test_batches=1", "--data.test_tasks=builtin:bank-test:2",
            "--model.rollout.rehearse_max_new_tokens=8"]
    caplog.set_level(logging.INFO, logger="envace.runtime.progress")
    with (mock.patch.object(sys, "argv", ["envace"]),
          mock.patch.object(RehearsalBudgetAblation, "_budget", stop_at_two),
          pytest.raises((KeyboardInterrupt, SystemExit))):
        main(args)
    root = tmp_path / "ablation"
    record = json.loads((root / "rehearsal_budget_step0.json").read_text())
    assert record["complete"] is False and [r["budget"] for r in record["rows"]] == [0, 1]
    assert "incomplete" in (root / "rehearsal_budget_step0.md").read_text()
    written = sorted(p.name for p in root.glob("*.jsonl"))
    assert written == [f"rehearsal_budget_step0_parallel_b{b}.jsonl" for b in (0, 1)]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rehearsal budget, ")]
    assert [line.split(" |")[0] for line in lines] == [  # one line per chunk of 2 tasks
        "rehearsal budget, plain acting: 2/3 tasks", "rehearsal budget, plain acting: 3/3 tasks",
        "rehearsal budget, parallel budget 1: 2/3 tasks", "rehearsal budget, parallel budget 1: 3/3 tasks"]
    assert "about" in lines[0] and "about" not in lines[1]  # time left while tasks remain


def test_the_progress_line_counts_tasks_success_and_time_left() -> None:
    from types import SimpleNamespace

    from callbacks.rehearsal_budget import progress_line

    episodes = [SimpleNamespace(success=s) for s in (True, False, True, True)]
    assert progress_line("parallel budget 2", episodes, 16, 65.0) == (
        "rehearsal budget, parallel budget 2: 4/16 tasks | success 0.750 | 1m05s elapsed, about 3m15s left")
    assert progress_line("plain acting", episodes, 4, 9.4).endswith("4/4 tasks | success 0.750 | 9s elapsed")
