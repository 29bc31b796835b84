"""The benchmark command lines on tiny inputs: the gold policy scores 100% and the results file is written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_policy_with_the_gold_policy(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    _script("evaluate_policy").main(["--model", "gold", "--bfcl-limit", "2", "--tau2-limit", "1", "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "SUMMARY bfcl_multi_turn_base=1.000 tau2_telecom_solo=1.000 tau2_floor=0.000"
    results = json.loads(out.read_text())
    assert results["bfcl_multi_turn_base"]["valid"] == {"multi_turn_base_0": True, "multi_turn_base_1": True}


def test_harness_check_on_a_few_entries(capsys) -> None:
    module = _script("harness_check")
    rows = module.bfcl_rows(limit=2)
    assert [r[0] for r in rows] == list(module.bfcl.MULTI_TURN)
    assert all(r[2] == 1.0 and r[4] == 1.0 for r in rows)  # gold calls valid, fidelity EM 1
    assert all(r[3] == 1.0 for r in rows)  # the gold policy through the rollout, every category
