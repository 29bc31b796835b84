"""End-to-end ``envace fit`` on the tiny config: it trains, logs the required TensorBoard tags (live fidelity per
tool and real calls saved among them), counts every real call, and in rehearse mode makes zero real tool calls while
the rehearse role is trained."""

from __future__ import annotations

import glob
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envace.cli.lightning import cli_main as main
from envace.envs.real import RealEnvironment
from envace.policy import TinyPolicy

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")
REQUIRED_TAGS = [
    "train/loss_act",
    "train/loss_rehearse",
    "train/loss_align",
    "train/reward_act",
    "train/reward_rehearse",
    "train/parse_error_rate_act",
    "train/parse_error_rate_rehearse",
]


def _fit(tmp_path: Path, *extra: str):
    args = ["fit", "--config", TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        return main(args)


def _scalars(tmp_path: Path) -> dict[str, list[float]]:
    files = glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, "no TensorBoard event file written"
    acc = EventAccumulator(files[0])
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def real_call_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = RealEnvironment.execute

    def counting(self, call):
        calls[0] += 1
        return original(self, call)

    monkeypatch.setattr(RealEnvironment, "execute", counting)
    return calls


@pytest.mark.slow
def test_fit_tiny_trains_every_tensor_and_logs_the_required_tags(tmp_path: Path, real_call_counter) -> None:
    cli = _fit(tmp_path)
    initial, _ = TinyPolicy().build()  # the same seed builds the same initial weights
    trained = dict(cli.model.model.named_parameters())
    for name, before in initial.named_parameters():
        assert not torch.equal(before, trained[name].detach().cpu()), f"{name} did not change"
    scalars = _scalars(tmp_path)
    for tag in REQUIRED_TAGS:
        assert tag in scalars and len(scalars[tag]) == 2, tag
    assert all(v == v for v in scalars["train/loss"])  # finite, not NaN
    assert real_call_counter[0] == scalars["train/real_calls_total"][-1] == cli.model.real_calls_total


@pytest.mark.slow
def test_hybrid_tiny_fit_logs_live_fidelity_per_tool_and_real_calls_saved(
    tmp_path: Path, real_call_counter, scripted_act: None
) -> None:
    cli = _fit(tmp_path, "--trainer.max_steps=3", "--model.audit.fraction=1.0")
    scalars = _scalars(tmp_path)
    for tag in ("train/fidelity/get_balance/exact_match", "train/fidelity/get_balance/leaf_f1",
                "train/fidelity/get_balance/key_match", "train/fidelity/exact_match", "train/real_calls_saved",
                "train/real_calls_saved_total", "train/world_mix_real", "train/world_cache_hit_rate",
                "train/fidelity_horizon", "train/sim2real_gap", "train/collusion_gap", "train/real_calls_audit"):
        assert tag in scalars, tag
    # 8 episodes a step, one call each: what was not answered for real was saved
    saved, spent = scalars["train/real_calls_saved"], scalars["train/real_calls"]
    assert all(a + b == 8.0 for a, b in zip(saved, spent)) and sum(saved) > 0
    assert scalars["train/real_calls_saved_total"][-1] == sum(saved) == cli.model.real_calls_saved_total
    # every real execution is counted: answers and audit replays
    assert real_call_counter[0] == sum(spent) + sum(scalars["train/real_calls_audit"])
    assert real_call_counter[0] == scalars["train/real_calls_total"][-1]
    assert scalars["train/world_mix_real"][0] == pytest.approx(0.5)  # the curriculum starts half real


@pytest.mark.slow
def test_rehearse_mode_trains_the_rehearse_role_with_zero_real_calls(
    tmp_path: Path, real_call_counter, scripted_act: None
) -> None:
    cli = _fit(tmp_path, "--model.grpo.align_weight=0", "--model.world=envace.worlds.RehearseWorld",
               "--model.audit=null", "--model.guard=null")
    scalars = _scalars(tmp_path)
    assert real_call_counter[0] == 0
    assert scalars["train/real_calls"] == [0.0, 0.0]
    assert min(scalars["train/calls_per_episode"]) == 1.0  # every episode made its call, answered by rehearsal
    assert min(scalars["train/tokens_rehearse"]) > 0
    episode = cli.model.last_episodes[0]
    assert episode.stats.rehearse_calls == 1 and episode.stats.real_calls == 0
    assert episode.rehearsals[0].sample is not None  # the rehearse row was trained on


@pytest.mark.slow
def test_fit_is_deterministic_on_cpu_for_a_fixed_seed(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        _fit(tmp_path / name)
        scalars = _scalars(tmp_path / name)
        runs.append({k: v for k, v in scalars.items() if not k.endswith(("_time_s", "tokens_per_s"))})
    assert runs[0] == runs[1]
    assert runs[0]["train/loss"][0] != runs[0]["train/loss"][1]  # the steps did differ from each other
