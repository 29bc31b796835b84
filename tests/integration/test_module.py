"""The LightningModule's variants end to end on the tiny policy: per-role adapters ("noshare"), KL to the
adapter-disabled base, several PPO epochs, and the validate/test subcommands."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli.lightning import cli_main as main
from envace.policy import TinyPolicy
from envace.training.module import EnvACEModule

sys.path.insert(0, str(Path(__file__).parent))
from test_fit_tiny import _scalars  # noqa: E402

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")
LORA = '{"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}'


def _run(tmp_path: Path, command: str, *extra: str):
    args = [command, "--config", TINY, f"--trainer.default_root_dir={tmp_path}",
            *extra]
    if command == "fit":
        args += ["--trainer.limit_val_batches=0"]
    with mock.patch.object(sys, "argv", ["envace"]):
        return main(args)


def _lora(model: torch.nn.Module, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f"lora_B.{adapter}." in n}


@pytest.mark.slow
def test_noshare_adapters_keep_the_roles_apart(tmp_path: Path, scripted_act: None) -> None:
    # Only the alignment term carries a gradient here (act advantages are all zero, rehearse rows share one reward),
    # and alignment rows are rehearse rows: the rehearse adapter must move, the act adapter must not.
    cli = _run(
        tmp_path, "fit", "--trainer.max_steps=2", f"--model.policy.init_args.lora={LORA}",
        '--model.policy.init_args.adapters=["act", "rehearse"]', '--model.role_adapters=["act", "rehearse"]',
        "--model.grpo.align_weight=1.0", "--model.grpo.rehearse_weight=0.0",
    )
    model = cli.model.model
    act, rehearse = _lora(model, "act"), _lora(model, "rehearse")
    assert act and rehearse
    assert all(torch.count_nonzero(t) == 0 for t in act.values())  # LoRA B starts at zero and stayed there
    assert any(torch.count_nonzero(t) > 0 for t in rehearse.values())
    base, _ = TinyPolicy().build()
    base_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    assert base_params == sum(p.numel() for p in base.parameters())  # one frozen base for both roles, no copy
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


@pytest.mark.slow
def test_imitation_term_trains_the_act_role_only(tmp_path: Path) -> None:
    # Only the imitation term carries a gradient (both policy-gradient heads and the alignment term are off): the
    # demonstrations' act turns are act rows, so the act adapter must move and the rehearse adapter must not.
    cli = _run(
        tmp_path, "fit", "--trainer.max_steps=2", f"--model.policy.init_args.lora={LORA}",
        '--model.policy.init_args.adapters=["act", "rehearse"]', '--model.role_adapters=["act", "rehearse"]',
        "--model.grpo.imitate_weight=1.0", "--model.grpo.align_weight=0", "--model.grpo.act_weight=0",
        "--model.grpo.rehearse_weight=0",
    )
    model = cli.model.model
    act, rehearse = _lora(model, "act"), _lora(model, "rehearse")
    assert any(torch.count_nonzero(t) > 0 for t in act.values())
    assert all(torch.count_nonzero(t) == 0 for t in rehearse.values())
    imitate = _scalars(tmp_path)["train/loss_imitate"]
    assert len(imitate) == 2 and all(v > 0 for v in imitate)


def test_grpo_config_refuses_bad_values() -> None:
    from envace.training.update import GRPOConfig

    with pytest.raises(ValueError, match="grpo.imitate_weight"):
        GRPOConfig(imitate_weight=-1.0)
    with pytest.raises(ValueError, match="grpo.group_size"):
        GRPOConfig(group_size=0)


@pytest.mark.slow
def test_kl_with_lora_uses_the_adapter_disabled_base(tmp_path: Path) -> None:
    cli = _run(
        tmp_path, "fit", "--trainer.max_steps=2", f"--model.policy.init_args.lora={LORA}",
        "--model.grpo.kl_weight=0.1", "--model.grpo.align_weight=1.0",
    )
    assert cli.model.reference is None  # no second copy of the model
    kl = _scalars(tmp_path)["train/kl"]
    assert kl[0] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at zero: policy == base
    assert kl[1] > 0.0  # after one update the adapter moved the policy away from the base


@pytest.mark.slow
def test_several_ppo_epochs_count_optimiser_steps(tmp_path: Path) -> None:
    cli = _run(tmp_path, "fit", "--trainer.max_steps=4", "--model.grpo.ppo_epochs=2", "--model.grpo.mini_batches=3")
    assert cli.trainer.global_step == 4  # max_steps counts optimiser steps (manual optimisation)
    scalars = _scalars(tmp_path)
    assert len(scalars["train/loss"]) == 1  # one rollout batch made all 4 steps (2 epochs x 2+ mini-batches)
    (tokens,), (seconds,), (rate,) = (scalars[f"train/{k}"] for k in ("row_tokens", "update_time_s",
                                                                      "update_tokens_per_s"))
    assert tokens > 0 and rate == pytest.approx(2 * tokens / seconds, rel=1e-4)  # both epochs passed every row


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "test"])
def test_validate_and_test_run_in_the_real_world(tmp_path: Path, command: str) -> None:
    cli = _run(tmp_path, command, "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1")
    prefix = "val" if command == "validate" else "test"
    metrics = cli.trainer.callback_metrics
    assert f"{prefix}/success_act" in metrics and f"{prefix}/real_calls" in metrics
    for key in ("exact_match", "leaf_f1", "key_match", "parse_rate", "error_agreement"):
        assert 0.0 <= float(metrics[f"{prefix}/fidelity_{key}"]) <= 1.0  # teacher-forced rehearsal fidelity


@pytest.mark.slow
def test_frozen_world_answers_calls_and_is_never_trained(tmp_path: Path, scripted_act: None) -> None:
    cli = _run(tmp_path, "fit", "--trainer.max_steps=2", "--model.world=envace.worlds.FrozenWorld")
    world = cli.model.world
    frozen_before, _ = TinyPolicy().build()  # FrozenWorld() copies the initial policy
    for (name, before), after in zip(frozen_before.named_parameters(), world.engine.model.parameters()):
        assert torch.equal(before, after), f"frozen simulator weight {name} changed"
    episode = cli.model.last_episodes[0]
    assert episode.stats.rehearse_calls == 1 and episode.stats.real_calls == 0
    assert episode.rehearsals[0].sample is None  # the simulator's tokens are not trained
    assert _scalars(tmp_path)["train/tokens_rehearse"] == [0.0, 0.0]


@pytest.mark.slow
def test_real_world_baseline_executes_every_call(tmp_path: Path, scripted_act: None) -> None:
    cli = _run(tmp_path, "fit", "--trainer.max_steps=2", "--model.world=envace.worlds.RealWorld")
    episode = cli.model.last_episodes[0]
    assert episode.stats.real_calls == 1 and episode.stats.rehearse_calls == 0
    assert _scalars(tmp_path)["train/real_calls"] == [8.0, 8.0]  # 2 tasks x 4 episodes, one call each


@pytest.mark.slow
def test_imagined_episodes_are_replayed_in_the_real_world(tmp_path: Path, scripted_act: None) -> None:
    # every imagined episode rehearses one get_balance(A1) and answers "120": its replay gives the horizon (0 if the
    # random rehearser got the balance wrong, 1 if not) and the gap (TaskSuccess reads no response: 0)
    cli = _run(tmp_path, "test", "--trainer.limit_test_batches=1", "--data.test_tasks=builtin:bank-test:8",
               "--model.rollout.rehearse_max_new_tokens=8")
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert 0.0 <= metrics["test/imagined_horizon"] <= 1.0
    assert metrics["test/imagined_departed_rate"] == pytest.approx(1.0 - metrics["test/imagined_horizon"])
    assert metrics["test/sim2real_gap"] == 0.0


@pytest.mark.slow
def test_qlora_4bit_policy_trains_on_cpu(tmp_path: Path, tiny_dir: str) -> None:
    # bitsandbytes NF4 base + LoRA: generate (eval mode) then train on the same model, the trap packages.md warns of.
    cli = _run(
        tmp_path, "fit", "--trainer.max_steps=2", "--model.policy=envace.policy.HFPolicy",
        f"--model.policy.init_args.name_or_path={tiny_dir}", "--model.policy.init_args.load_in_4bit=true",
        f"--model.policy.init_args.lora={LORA}",
    )
    import bitsandbytes as bnb

    model = cli.model.model
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert any(torch.count_nonzero(t) > 0 for t in _lora(model, "default").values())  # the adapter learned
    assert all(v == v for v in _scalars(tmp_path)["train/loss"])


@pytest.mark.slow
def test_fidelity_gate_refuses_a_warm_start_that_rehearses_badly_before_any_step(tmp_path: Path) -> None:
    # The random tiny policy rehearses none of the reference calls exactly: a gate of 0.5 stops the run at once.
    with pytest.raises(ValueError, match=r"fidelity gate: the policy rehearses 0\.000 .* below fidelity_gate=0\.5"):
        _run(tmp_path, "fit", "--trainer.max_steps=1", "--model.fidelity_gate=0.5",
             "--data.val_tasks=builtin:bank-val:4", "--model.rollout.rehearse_max_new_tokens=8")


def test_fidelity_gate_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match=r"fidelity_gate must be in \[0, 1\]"):
        EnvACEModule(TinyPolicy(), fidelity_gate=1.5)


@pytest.mark.slow
def test_lr_schedule_steps_once_per_optimiser_step_and_real_calls_are_totalled(tmp_path: Path) -> None:
    cli = _run(
        tmp_path, "fit", "--trainer.max_steps=2", "--model.world=envace.worlds.RealWorld",
        "--model.lr_scheduler=torch.optim.lr_scheduler.LinearLR",
        "--model.lr_scheduler.start_factor=0.5", "--model.lr_scheduler.total_iters=4",
    )
    scheduler = cli.model.lr_schedulers()
    assert scheduler.last_epoch == 2  # stepped after each of the 2 optimiser steps
    base = cli.model.optimizers().optimizer.defaults["lr"]
    # LinearLR: factor 0.5 + (1 - 0.5) * step / 4 -> 0.75 after 2 steps
    assert cli.model.optimizers().param_groups[0]["lr"] == pytest.approx(0.75 * base)
    scalars = _scalars(tmp_path)
    logged, total = scalars["train/real_calls"], scalars["train/real_calls_total"]
    assert cli.model.real_calls_total == pytest.approx(sum(logged)) and total[-1] == pytest.approx(sum(logged))


@pytest.mark.slow
def test_a_simulated_user_writes_the_later_user_turns_in_training(tmp_path: Path, scripted_act: None) -> None:
    import json

    from envace.builtin.task_sets import resolve_task_path
    from envace.data.task_records import task_to_record
    from envace.data.tasks import load_tasks

    tasks = load_tasks(resolve_task_path("builtin:bank"))[:2]
    path = tmp_path / "user_tasks.jsonl"
    lines = [json.dumps({**task_to_record(t), "user": "You want your balance, then thank the agent."}) for t in tasks]
    path.write_text("\n".join(lines) + "\n")
    user = json.dumps({"model": {"policy": {"class_path": "envace.policy.TinyPolicy"}, "max_new_tokens": 6}})
    cli = _run(tmp_path, "fit", "--trainer.max_steps=1", f"--data.train_tasks={path}", f"--model.user={user}",
               "--model.rollout.max_user_turns=2", "--model.world=envace.worlds.RealWorld")
    for episode in cli.model.last_episodes:
        # call, answer; the simulated user's message; answer again; the user-turn limit ends it
        assert episode.stats.user_turns == 2 and episode.stats.user_turn_limit
        assert [m["role"] for m in episode.messages].count("user") == 2
        assert episode.final_answer == "120"
    assert cli.model.user.model.engine is not None  # built once, next to the policy


@pytest.mark.slow
def test_envace_test_runs_the_rehearsal_agent_with_a_budget_from_the_command_line(tmp_path: Path,
                                                                                  scripted_act: None) -> None:
    # the scripted act role calls get_balance(A1), then answers "120": every committed turn is preceded by 2
    # imagined attempts (one act turn each), the majority of which is committed as it was generated
    cli = _run(tmp_path, "test", "--trainer.limit_test_batches=1", "--data.test_tasks=builtin:bank-test:4",
               "--model.test_rehearsal.rehearsals=2", "--model.test_rehearsal.horizon=1",
               "--model.rehearsal_selector=envace.rollout.private_rehearsal.MajorityCommit",
               "--model.rollout.rehearse_max_new_tokens=8")
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["test/private_rehearsals_per_episode"] == 4.0  # 2 committed turns x 2 attempts
    assert metrics["test/private_real_calls"] == 0.0 and metrics["test/real_calls"] == 4.0  # the committed calls
    for episode in cli.model.last_episodes:
        assert episode.stats.private_commits == 2 and episode.final_answer == "120"


def test_fidelity_gate_does_not_apply_to_a_world_that_never_rehearses(tmp_path: Path, caplog) -> None:
    # The same random tiny policy as above, trained against real tools: its rehearsals answer no call, so no gate.
    with caplog.at_level("INFO"):
        cli = _run(tmp_path, "fit", "--trainer.max_steps=1", "--model.fidelity_gate=0.5",
                   "--model.world=envace.worlds.RealWorld", "--data.val_tasks=builtin:bank-val:4",
                   "--model.rollout.rehearse_max_new_tokens=8", "--model.rollout.act_max_new_tokens=8")
    assert cli.trainer.global_step == 1
    assert "fidelity gate: not checked, the training world (RealWorld) answers no call by rehearsal" in caplog.text


def test_worlds_say_whether_they_rehearse_and_a_real_world_lends_its_rehearse_prompts() -> None:
    from envace.worlds import HybridWorld, RealWorld, RehearseWorld
    from envace.worlds.hybrid import Mix, MixSchedule
    from envace.worlds.rehearse import alignment_prompter

    assert RealWorld().rehearses is False and getattr(RehearseWorld(), "rehearses", True) is True
    real_only = MixSchedule(start=Mix(real=1.0, rehearse=0.0), end=Mix(real=1.0, rehearse=0.0))
    assert HybridWorld(real_only).rehearses is False
    cached = MixSchedule(start=Mix(cache=1.0, rehearse=0.0), end=Mix(cache=1.0, rehearse=0.0))
    assert HybridWorld(cached, on_miss="rehearse").rehearses is True  # a miss is rehearsed
    assert HybridWorld(cached, on_miss="real").rehearses is False
    ramp = MixSchedule(start=Mix(real=1.0, rehearse=0.0), end=Mix(rehearse=1.0), steps=10)
    assert HybridWorld(ramp).rehearses is True
    assert alignment_prompter(RealWorld()).think is False
    assert alignment_prompter(RealWorld(rehearse=RehearseWorld(think=True))).think is True  # the alignment rows think
