"""``envace fit`` with ``model.rollout.engine: vllm``: the engine serves both roles, token in and token out, and holds
the trained weights after each optimiser step (runs in .venv-vllm: scripts/test_vllm.sh)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip("vllm")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from envace.cli.lightning import cli_main  # noqa: E402
from envace.engines.base import HFEngine, SamplingParams  # noqa: E402
from envace.engines.vllm_engine import VLLMEngine  # noqa: E402
from envace.policy.chat import encode, render  # noqa: E402

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")


def test_a_two_step_fit_rolls_out_with_vllm_and_syncs_after_every_step(tmp_path: Path) -> None:
    args = ["--config", TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]", "--model.grpo.group_size=2", "--model.rollout.act_max_new_tokens=16",
            "--model.rollout.rehearse_max_new_tokens=16", "--model.rollout.engine=vllm",
            "--model.rollout.vllm.dtype=float32", "--model.rollout.check_render=true",
            "--model.policy.init_args.hidden=128",  # head size 32: the smallest vLLM's CPU attention runs
            "--model.grpo.tis_cap=2.0"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    module = cli.model
    engine = module._vllm_engine
    assert isinstance(engine, VLLMEngine) and module.act_engine is engine and module.rehearse_engine is engine
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    scalars = {tag: [e.value for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
    assert len(scalars["train/engine_sync_s"]) == 2 and min(scalars["train/engine_sync_s"]) > 0
    assert min(scalars["train/generated_tokens"]) > 0 and "train/loss" in scalars
    assert len(engine.sync_seconds) == 2  # before each rollout: the initial weights, then step 1's
    # The engine's log-probs came with its tokens; in float32 they match the trainer's to rounding, so the
    # truncated importance weights (cap 2) are all but 1 and clip nothing.
    assert max(scalars["train/engine_gap_logp"]) < 1e-3 and max(scalars["train/engine_gap_kl"]) < 1e-5
    assert max(scalars["train/engine_gap_tis_clipped"]) == 0.0

    # The engine now gets step 2's weights and writes what the trained model writes.
    assert module.sync_engine() is not None and module.sync_engine() is None  # synced once per optimiser step
    tok, model = module.tokenizer, module.model.eval()
    prompts = [encode(tok, render(tok, [{"role": "user", "content": text}], None, add_generation_prompt=True))
               for text in ("What is the balance of A1?", "Transfer 5 from A1 to B2.")]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    hf = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id], max_batch_size=1)
    with torch.no_grad():
        assert [g.token_ids for g in engine.generate(prompts, greedy)] == [g.token_ids for g in
                                                                           hf.generate(prompts, greedy)]


def test_a_noshare_fit_serves_each_roles_adapter_through_vllm_lora(tmp_path: Path) -> None:
    lora = '{"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}'
    args = ["--config", TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]", "--model.grpo.group_size=2", "--model.rollout.act_max_new_tokens=16",
            "--model.rollout.rehearse_max_new_tokens=16", "--model.rollout.engine=vllm",
            "--model.rollout.vllm.dtype=float32", "--model.rollout.check_render=true",
            "--model.policy.init_args.hidden=128", f"--model.policy.init_args.lora={lora}",
            '--model.policy.init_args.adapters=["act", "rehearse"]', '--model.role_adapters=["act", "rehearse"]',
            "--model.grpo.align_weight=1.0", "--model.optimizer.init_args.lr=0.05"]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    module = cli.model
    engine = module._vllm_engine
    assert module.act_engine.adapter_name == "act" and module.rehearse_engine.adapter_name == "rehearse"
    assert module.act_engine.queue is engine.queue is module.rehearse_engine.queue
    assert len(engine.sync_seconds) == 2 * 2  # both adapters, before each of the two rollouts

    from envace.policy.hf import use_adapter

    assert module.sync_engine() is not None  # step 2's adapters
    tok, model = module.tokenizer, module.model.eval()
    trained = [n for n, p in model.named_parameters() if "lora_B.rehearse" in n and torch.count_nonzero(p) > 0]
    assert trained, "the alignment term should have moved the rehearse adapter"
    prompts = [encode(tok, render(tok, [{"role": "user", "content": text}], None, add_generation_prompt=True))
               for text in ("What is the balance of A1?", "Transfer 5 from A1 to B2.")]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    hf = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id], max_batch_size=1)
    for name, view in (("act", module.act_engine), ("rehearse", module.rehearse_engine)):
        use_adapter(model, name)
        with torch.no_grad():
            assert [g.token_ids for g in view.generate(prompts, greedy)] == [g.token_ids for g in
                                                                              hf.generate(prompts, greedy)], name
