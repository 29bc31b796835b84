"""The two sides of ``benchmarks/vs_trl.py``, each one timed GRPO run in this process: envace's and TRL's.

``run_envace`` runs ``envace fit`` on ``envace_config`` through envace's real training path, ``run_trl`` runs
``GRPOTrainer.train``; both time each optimiser step and generation (``timed``) and return per-step records. The
script runs each side in its own subprocess, on the inputs of ``vs_trl_inputs``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vs_trl_inputs import (
    CLIP_EPSILON,
    GROUP_SIZE,
    LEARNING_RATE,
    MODEL_DIR,
    NEW_TOKENS,
    PROMPTS_PER_STEP,
    SEED,
    TASKS_FILE,
    arithmetic_rows,
    contains_answer,
)

# -- envace side -------------------------------------------------------------------------------------------------------


def envace_config(workdir: Path, max_steps: int, engine: str | None) -> dict[str, Any]:
    """The ``envace fit`` config of the benchmark (every setting that matters written out).

    Args:
        workdir: holds the model folder and the task file; envace writes under ``workdir/envace``.
        max_steps: optimiser steps of the run.
        engine: ``model.rollout.engine`` (``cached`` or ``hf``); None keeps envace's default.
    """
    rollout = {"max_turns": 1, "act_max_new_tokens": NEW_TOKENS, "act_temperature": 1.0, "top_p": 1.0,
               "generate_batch_size": PROMPTS_PER_STEP * GROUP_SIZE, **({"engine": engine} if engine else {})}
    return {
        "seed_everything": SEED,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "precision": "32-true", "max_steps": max_steps, "min_epochs": 0,
            "limit_val_batches": 0, "num_sanity_val_steps": 0, "check_val_every_n_epoch": None,
            "log_every_n_steps": 1, "enable_checkpointing": False, "enable_progress_bar": False,
            "enable_model_summary": False, "logger": False, "default_root_dir": str(workdir / "envace"),
        },
        "model": {
            "policy": {"class_path": "envace.policy.HFPolicy",
                       "init_args": {"name_or_path": str(workdir / MODEL_DIR), "dtype": "float32",
                                     "gradient_checkpointing": False}},
            "rewards": [{"class_path": "vs_trl_inputs.ContainsAnswer"}],
            "rollout": rollout,
            "grpo": {"group_size": GROUP_SIZE, "ppo_epochs": 1, "mini_batches": 1,
                     "micro_batch_size": PROMPTS_PER_STEP * GROUP_SIZE, "micro_batch_tokens": 0,
                     "scale_by_std": True, "align_weight": 0.0, "kl_weight": 0.0, "imitate_weight": 0.0,
                     "grad_clip": 1.0},
            "policy_loss": {"class_path": "envace.losses.policy.ClippedPolicyLoss",
                            "init_args": {"clip_low": CLIP_EPSILON, "clip_high": CLIP_EPSILON, "dual_clip": None}},
            "aggregation": {"class_path": "envace.losses.aggregation.TokenMean"},
            "optimizer": {"class_path": "torch.optim.AdamW",
                          "init_args": {"lr": LEARNING_RATE, "betas": [0.9, 0.999], "eps": 1e-8,
                                        "weight_decay": 0.0, "fused": True}},
            "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.LinearLR",
                             "init_args": {"start_factor": 1.0, "end_factor": 0.0, "total_iters": max_steps}},
            "log_entropy": True, "eval_fidelity": False, "eval_imagined": False,
        },
        "data": {"train_tasks": str(workdir / TASKS_FILE), "batch_size": PROMPTS_PER_STEP, "shuffle": False,
                 "seed": SEED},
    }


def timed(target: Any, sink: list[float], min_new_tokens: bool = False) -> None:
    """Wrap ``target.generate`` (on the instance): each call's wall time goes to ``sink``.

    With ``min_new_tokens`` (an envace engine), every call also gets ``SamplingParams.min_new_tokens`` equal to its
    ``max_new_tokens``, so each completion has the full budget, as TRL's ``generation_kwargs`` make it there.
    """
    inner = target.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        if min_new_tokens:
            prompts, params = args
            args = (prompts, replace(params, min_new_tokens=params.max_new_tokens))
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    target.generate = generate


def run_envace(workdir: Path, max_steps: int, threads: int, engine: str | None) -> list[dict[str, float]]:
    """One ``envace fit`` of ``max_steps`` steps in this process with rollout engine ``engine``; per-step records."""
    from unittest import mock

    import lightning as L
    import torch

    import envace.training.module
    from envace.cli.lightning import cli_main
    from envace.evaluation.evaluator import policy_engine
    from envace.rollout.collate import trained_length

    records: list[dict[str, float]] = []
    generate_s: list[float] = []

    def timed_engine(module: Any, model: Any, tokenizer: Any, rollout: Any, adapter: str | None = None) -> Any:
        """envace's own engine for ``rollout.engine``, timed and with ``min_new_tokens``."""
        built = policy_engine(module, model, tokenizer, rollout, adapter)
        timed(built, generate_s, min_new_tokens=True)
        return built

    class StepTimer(L.Callback):
        """Times each training step and reads what the module logged for it."""

        start = 0.0

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            torch.set_num_threads(threads)

        def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
            now = time.perf_counter()
            if records:
                records[-1]["cycle_s"] = now - self.start
            generate_s.clear()
            self.start = now

        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
            step_s = time.perf_counter() - self.start
            logged = {k.removeprefix("train/"): float(v) for k, v in trainer.callback_metrics.items()}
            episodes = pl_module.last_episodes
            prompt = [e.act.loss_mask.index(1) if 1 in e.act.loss_mask else len(e.act.loss_mask) for e in episodes]
            records.append({
                "step_s": step_s, "gen_score_s": logged["rollout_time_s"], "generate_s": sum(generate_s),
                "update_logged_s": logged["update_time_s"], "gen_tokens": logged["generated_tokens"],
                "completions": float(len(episodes)), "prompt_tokens": statistics.mean(prompt),
                "update_width": float(max(trained_length(e.act) for e in episodes)),  # as collate cuts the rows
                "feedback_rows": float(sum(len(e.act.loss_mask) > p + NEW_TOKENS for e, p in zip(episodes, prompt))),
                "reward": statistics.mean(e.reward for e in episodes), "threads": float(torch.get_num_threads()),
            })

    config_path = workdir / "envace.yaml"
    config_path.write_text(json.dumps(envace_config(workdir, max_steps, engine), indent=1), encoding="utf-8")
    with (mock.patch.object(envace.training.module, "policy_engine", timed_engine),
          mock.patch.object(sys, "argv", ["envace"])):
        cli = cli_main(["--config", str(config_path)], run=False)
        cli.trainer.callbacks.append(StepTimer())
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return records


# -- TRL side ----------------------------------------------------------------------------------------------------------


def run_trl(workdir: Path, max_steps: int, threads: int, engine: str | None = None) -> list[dict[str, float]]:
    """One ``GRPOTrainer.train`` of ``max_steps`` steps in this process; the per-step records (``engine`` unused)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(workdir / MODEL_DIR, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(workdir / MODEL_DIR)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a}
                                 for q, a in arithmetic_rows()])

    records: list[dict[str, float]] = []
    current: dict[str, float] = {}

    def contains_answer_reward(completions: list[list[dict[str, str]]], answer: list[str], **_: Any) -> list[float]:
        rewards = [contains_answer(c[-1]["content"], a) for c, a in zip(completions, answer, strict=True)]
        current["reward"] = statistics.mean(rewards)
        return rewards

    generate_s: list[float] = []

    class StepTimer(TrainerCallback):
        """Times each optimiser step (``on_step_begin`` to ``on_step_end``)."""

        start = 0.0

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            torch.set_num_threads(threads)

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            if records:
                records[-1]["cycle_s"] = now - self.start
            current.clear()
            generate_s.clear()
            self.start = now

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_s = time.perf_counter() - self.start
            records.append({"step_s": step_s, "generate_s": sum(generate_s), **current,
                            "threads": float(torch.get_num_threads())})

    config = GRPOConfig(
        output_dir=str(workdir / "trl"), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE, gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE, max_completion_length=NEW_TOKENS, max_steps=max_steps,
        learning_rate=LEARNING_RATE, optim="adamw_torch_fused", adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=0,
        logging_steps=1, use_vllm=False, beta=0.0, loss_type="dapo", epsilon=CLIP_EPSILON, scale_rewards="group",
        num_iterations=1, mask_truncated_completions=False, temperature=1.0, top_p=1.0, top_k=0,
        gradient_checkpointing=False, generation_kwargs={"min_new_tokens": NEW_TOKENS}, shuffle_dataset=False,
        save_strategy="no", seed=SEED, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=contains_answer_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()])
    timed(trainer.model, generate_s)
    score = trainer._generate_and_score_completions

    def generate_and_score(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = score(*args, **kwargs)
        current["gen_score_s"] = time.perf_counter() - start
        completion_mask, prompt_mask = out["completion_mask"], out["prompt_mask"]
        current["gen_tokens"] = float(completion_mask.sum())
        current["completions"] = float(completion_mask.shape[0])
        current["prompt_tokens"] = float(prompt_mask.sum(-1).float().mean())
        current["update_width"] = float(prompt_mask.shape[1] + completion_mask.shape[1])
        current["feedback_rows"] = 0.0  # TRL appends nothing after a completion
        return out

    trainer._generate_and_score_completions = generate_and_score
    trainer.train()
    return records
