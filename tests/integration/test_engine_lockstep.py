"""Two gloo processes with different amounts of work make the same number of synced ``generate`` calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("lockstep_worker.py")


@pytest.mark.slow
def test_ranks_with_different_batch_counts_stay_in_lockstep() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    ranks = [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), "29517"], env=env, stdout=subprocess.PIPE,
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
    lengths = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [len(x) for x in lengths] == [7, 1]
