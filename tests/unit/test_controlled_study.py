"""The controlled study's pure parts: lever parsing, the job plan and the report (hand-computed numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("controlled_study", ROOT / "benchmarks" / "controlled_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["controlled_study"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("controlled_study", None)


def test_levers_keep_their_order_and_a_repeated_name_adds_overrides(study):
    levers = study.parse_levers(["wm:--data.demonstrations=2000", "g8:--model.grpo.group_size=8",
                                 "wm:--model.grpo.align_weight=2.0"])
    assert levers == (("wm", ("--data.demonstrations=2000", "--model.grpo.align_weight=2.0")),
                      ("g8", ("--model.grpo.group_size=8",)))


@pytest.mark.parametrize("spec", ["--model.grpo.group_size=8", "g8:group_size=8", "g 8:--x=1", "../x:--x=1"])
def test_bad_lever_specs_are_refused_by_name(study, spec):
    with pytest.raises(ValueError, match="--lever"):
        study.parse_levers([spec])


def test_plan_adds_each_lever_per_seed_after_the_main_arms(study):
    settings = study.Settings("out", 10, 20, levers=(("g8", ("--model.grpo.group_size=8",)),))
    keys = [job.key for job in study.plan(settings, [0, 1])]
    assert keys[-4:] == ["s0-L-g8", "s0-eval-L-g8", "s1-L-g8", "s1-eval-L-g8"]
    lever_job = next(job for job in study.plan(settings, [0, 1]) if job.key == "s1-L-g8")
    assert lever_job.needs == ("s1-warm",) and lever_job.args[2] == "L-g8"


def _results(success: dict[str, list[float]]) -> dict[str, dict]:
    results = {}
    for arm, values in success.items():
        for seed, value in enumerate(values):
            split = {"success_act": value, "imagined_success": 0.5, "fidelity_exact_match": 0.25,
                     "fidelity_leaf_f1": 0.5}
            results[f"s{seed}-eval-{arm}"] = {"test": split, "heldout": dict(split, success_act=0.0)}
            key = "warm" if arm == "d" else arm
            results[f"s{seed}-{key}"] = {"seconds": 100.0, "real_calls": 7.0 if arm == "b" else 0.0,
                                         "val_success_best": 0.8, "steps": 1000}
    return results


def test_report_summary_and_paired_lever_gains(study):
    success = {"a": [0.9, 0.8], "b": [0.9, 0.9], "c": [0.7, 0.7], "d": [0.6, 0.8], "e": [0.7, 0.7],
               "L-g8": [0.8, 1.0]}
    settings = study.Settings("out", 10, 20, levers=(("g8", ("--model.grpo.group_size=8",)),))
    text = study.report(_results(success), [0, 1], settings, "cmd")
    # gain = mean(a) - max(mean(d), mean(e)) = 0.85 - 0.7; std = largest of std(a), std(d), std(e) = 0.1 * sqrt(2)
    assert text.splitlines()[-1] == "SUMMARY gain=0.150 std=0.141 real_calls_rl=0"
    lever_row = next(line for line in text.splitlines() if line.startswith("| g8:"))
    cells = [cell.strip() for cell in lever_row.split("|")[1:-1]]
    # paired over (d): +0.2, +0.2 -> +0.200 +- 0; over (a): -0.1, +0.2 -> +0.050 +- 0.212
    assert cells[2] == "+0.200 ± 0.000" and cells[3] == "+0.050 ± 0.212"
    assert cells[1].startswith("0.900 ± 0.141")
    assert "| (b) RL against the real tools |" in text and "| 14 |" in text  # real calls summed over seeds


def test_report_without_levers_has_no_lever_table(study):
    success = {arm: [0.5, 0.6] for arm in "abcde"}
    text = study.report(_results(success), [0, 1], study.Settings("out", 10, 20), "cmd")
    assert "Levers" not in text
