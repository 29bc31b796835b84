"""Two gloo processes with different amounts of work make the same synced ``generate`` calls and forwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("lockstep_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "port"), [("hf", "29517"), ("cached", "29519")])
def test_ranks_with_different_batch_counts_stay_in_lockstep(kind: str, port: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    ranks = [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), port, kind], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    try:
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    except subprocess.TimeoutExpired:
        pytest.fail("a rank hung: the ranks made different numbers of synced generate calls")
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (_, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err[-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [len(r["lengths"]) for r in results] == [7, 1]
    assert results[0]["forwards"] == results[1]["forwards"]  # a sharded model's forwards are collectives
