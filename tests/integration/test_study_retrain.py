"""A warm start of the controlled study trained again without validating exports the weights it recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--model.init_args.policy.init_args.hidden=32", "--model.init_args.policy.init_args.layers=1",
         "--model.init_args.rollout.act_max_new_tokens=8", "--model.init_args.rollout.rehearse_max_new_tokens=8",
         "--trainer.min_steps=0", "--data.batch_size=2", "--data.val_tasks=builtin:bank-val:4",
         "--data.eval_batch_size=4")


@pytest.mark.slow
def test_skipping_the_only_validation_after_the_last_step_leaves_the_weights_bit_identical(study_settings, study_jobs,
                                                                                           tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the presets name their configs relative to the repository

    def scope(out: str):
        return study_settings.Settings(str(tmp_path / out), 1, 3,
                                       extra_warm=(*SMALL, "--trainer.val_check_interval=3"))

    first = study_jobs.warm_start(scope("first"), 0)
    assert first["val_steps"] == [3] and study_jobs.validation_chose_nothing(first)
    again = study_jobs.warm_start(scope("again"), 0, unvalidated=True)
    assert again["val_steps"] == [] and again["steps"] == 3
    # bit-identical by construction: the same steps on the same data, validation draws nothing training uses after it
    assert again["weights_sha256"] == first["weights_sha256"]
