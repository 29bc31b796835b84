"""envace against TRL's ``GRPOTrainer``: wall time of one GRPO optimiser step on the same inputs (CPU).

Protocol (a fair side-by-side: identical inputs, identical work, identical optimisation, separate processes):

- **Identical inputs.** One tiny Qwen2 (hidden 64, 2 layers, seed 0, fp32) and its tokenizer are built in code once
  and saved to a temporary folder; each side loads that folder fresh in its own process. The chat template is TRL's
  bundled ``qwen2_5.jinja``, byte for byte. 64 single-turn arithmetic prompts (no tools) go to envace as a JSONL task
  file and to TRL as a conversational dataset, in the same order (no shuffling). The reward is the same pure-Python
  function on both sides: 1.0 if the completion contains the answer string.
- **Identical work per step.** 8 prompts x G=4 = 32 completions, each exactly 32 new tokens (``min_new_tokens=32``
  on both sides: TRL's ``generation_kwargs``; envace's engine ``generate`` is wrapped here to set
  ``SamplingParams.min_new_tokens``), sampling at temperature 1.0, top_p 1.0, top_k 0. envace uses its own rollout
  engine (``--engine``, default envace's ``model.rollout.engine``: ``cached`` samples the same distribution by
  inverse CDF, ``hf`` calls ``generate``). One forward/backward over all 32 rows in one micro-batch, per-token entropy
  on both sides, no reference model (beta 0), no old-log-prob forward (on-policy), no gradient checkpointing, fp32.
- **Identical optimisation.** Fused AdamW (lr 1e-5, betas 0.9/0.999, eps 1e-8, weight decay 0), gradient-norm
  clip 1.0, linear decay to 0 over the run, clipped ratio loss with epsilon 0.2, token-level mean over the whole
  batch (TRL ``loss_type="dapo"``, envace ``TokenMean``), group-scaled advantages.
- **Known differences that remain.** TRL's group std is the unbiased one plus 1e-4, envace's the population one plus
  1e-6 (the advantages differ by a constant factor, not the work). TRL's reward sees the decoded completion, envace's
  the parsed final answer. TRL also suppresses the pad token until the 32nd token (it is one of its EOS ids); envace
  stops on ``<|im_end|>`` only. envace logs no external logger (``logger: false``) as TRL runs with
  ``report_to="none"``. A completion that contains ``<tool_call>`` or ``</tool_call>`` is a malformed call to envace:
  it appends the error feedback as a tool message before the episode ends (the "rows with feedback" column); the
  update cuts every row after its last trained token, so that tail costs envace the feedback's rendering only.
- **Process layout.** Each side runs in its own subprocess (this script re-invoked with ``--side``), alternating
  envace/TRL for ``--pairs`` pairs and swapping which one goes first in every pair. Each run does ``--warmup``
  steps, then ``--steps`` timed steps. envace runs through its real training path: ``envace.cli.lightning.cli_main``
  builds ``EnvACEModule``, ``RolloutDataModule`` and the Lightning ``Trainer`` from a YAML config, then ``trainer.fit``.
  TRL runs ``GRPOTrainer.train``.
- **What is timed.** Per optimiser step, from the start of step k to its end (rollout, reward, advantages, loss,
  backward, optimiser): a Lightning callback (``on_train_batch_start``/``end``) and a ``TrainerCallback``
  (``on_step_begin``/``end``). "step-to-step" is the start of step k to the start of step k+1 (it adds the
  frameworks' between-step bookkeeping). "gen+score" is envace's logged ``rollout_time_s`` and the wall time of
  TRL's ``_generate_and_score_completions``; "generate" is generation alone (envace's engine ``generate``, TRL's
  ``model.generate``); "update" is step - gen+score (envace's own ``update_time_s``, which stops before its
  logging, is shown too).

Run from the repository root (TRL is an optional dependency: ``.venv/bin/pip install -e '.[vs-trl]'``)::

    .venv/bin/python benchmarks/vs_trl.py [--pairs 3] [--steps 10] [--warmup 2] [--threads 1] [--engine cached|hf]
        [--model models/smollm2-135m-instruct]

``--model DIR`` runs both sides on a real model instead of the tiny Qwen2 (its own tokenizer, TRL's ChatML
``qwen2_5.jinja`` template).

It prints a Markdown table and, last, ``SUMMARY trl_over_envace_step_time=<f> threads=<n>``: the median over pairs
of (TRL median step time / envace median step time); above 1 means envace is faster.
"""

from __future__ import annotations

import os

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from envace.types import Episode  # noqa: E402 (light: the CLI resolves the reward's type hints against it)

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = ".venv/bin/pip install -e '.[vs-trl]'"
SIDES = ("envace", "trl")
SEED = 0
NUM_PROMPTS = 64
PROMPTS_PER_STEP = 8
GROUP_SIZE = 4
NEW_TOKENS = 32
LEARNING_RATE = 1e-5
CLIP_EPSILON = 0.2
MODEL_DIR = "model"  # weights, config and tokenizer: HFPolicy and from_pretrained both read one folder
TASKS_FILE = "tasks.jsonl"
LOAD_WARNING = 0.7
WORDS = ("the", "account", "balance", "is", "transfer", "money", "to", "from", "please", "check", "what", "how",
         "much", "open", "close", "card", "number", "answer", "question", "tool", "call", "result", "error", "user",
         "assistant", "system", "you", "are", "helpful")


# -- shared inputs -----------------------------------------------------------------------------------------------------


def arithmetic_rows(count: int = NUM_PROMPTS) -> list[tuple[str, str]]:
    """The benchmark's prompts and answers: ``count`` deterministic addition questions."""
    rng = random.Random(SEED)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append((f"What is {a} + {b}? Answer with the number.", str(a + b)))
    return rows


def corpus_lines(count: int = 12_000) -> list[str]:
    """Tokenizer training text: arithmetic, plain words and tool-call JSON, deterministic."""
    rng = random.Random(SEED)
    words = WORDS
    lines = []
    for i in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if i % 3 == 0:
            lines.append(f"What is {a} + {b}? Answer with the number. The answer is {a + b}.")
        elif i % 3 == 1:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))))
        else:
            lines.append(json.dumps({"name": "add", "arguments": {"a": a, "b": b}}))
    return lines


def build_model_dir(out: Path) -> None:
    """Build the tiny Qwen2 and its tokenizer in code and save both to ``out``.

    Raises:
        RuntimeError: the saved tokenizer's chat template is not TRL's ``qwen2_5.jinja`` byte for byte.
    """
    import importlib.resources as ir

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus_lines(), trainers.BpeTrainer(
        vocab_size=2048, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    template = (ir.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     additional_special_tokens=["<|im_start|>", "<|im_end|>"], padding_side="left",
                                     clean_up_tokenization_spaces=False, model_max_length=4096)
    hf_tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"])
    hf_tok.chat_template = template
    hf_tok.save_pretrained(out)

    torch.manual_seed(SEED)
    cfg = Qwen2Config(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=hf_tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=hf_tok.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).float()
    model.generation_config.eos_token_id = [cfg.eos_token_id, hf_tok.pad_token_id]
    model.save_pretrained(out)
    if AutoTokenizer.from_pretrained(out).chat_template != template:
        raise RuntimeError(f"{out}: the saved chat template differs from TRL's qwen2_5.jinja")


def use_model_dir(source: Path, out: Path) -> None:
    """Copy a local Hugging Face model (e.g. ``models/smollm2-135m-instruct``) to ``out``, with TRL's template.

    Both sides then load the same real model and tokenizer; the chat template is TRL's ``qwen2_5.jinja`` (ChatML,
    the format SmolLM2's own template writes), set on the model's own tokenizer.

    Raises:
        RuntimeError: the tokenizer has no ChatML control tokens (``<|im_start|>``, ``<|im_end|>``).
    """
    import importlib.resources as ir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
        raise RuntimeError(f"{source}: its tokenizer has no <|im_start|>/<|im_end|> tokens for the ChatML template")
    tokenizer.chat_template = (ir.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    tokenizer.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    stops = [vocab["<|im_end|>"]] + ([tokenizer.pad_token_id] if tokenizer.pad_token_id != vocab["<|im_end|>"] else [])
    model.generation_config.eos_token_id = stops
    model.save_pretrained(out)


def write_tasks(path: Path) -> None:
    """The prompts as an envace JSONL task file: one user message, no tools, the answer as a ``contains`` check."""
    with path.open("w", encoding="utf-8") as f:
        for i, (question, answer) in enumerate(arithmetic_rows()):
            record = {"id": f"add-{i:02d}", "messages": [{"role": "user", "content": question}], "tools": [],
                      "success": {"answer": {"contains": [answer]}}}
            f.write(json.dumps(record) + "\n")


def contains_answer(text: str, answer: str) -> float:
    """The benchmark's reward, identical on both sides: 1.0 if ``answer`` occurs in ``text``, else 0.0."""
    return 1.0 if answer in text else 0.0


class ContainsAnswer:
    """envace reward (the ``Reward`` protocol): ``contains_answer`` on the episode's final answer."""

    def __call__(self, episode: Episode) -> float:
        """Score ``episode`` against its task's first ``contains`` string."""
        expected = episode.task.success.answer
        return contains_answer(episode.final_answer or "", expected.contains[0] if expected else "")


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
            "rewards": [{"class_path": "vs_trl.ContainsAnswer"}],
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


# -- orchestration -----------------------------------------------------------------------------------------------------


def worker(side: str, workdir: Path, out: Path, max_steps: int, threads: int, engine: str | None) -> None:
    """Run one side in this process and write its per-step records to ``out`` (JSON)."""
    import torch

    torch.set_num_threads(threads)
    run: Callable[[Path, int, int, str | None], list[dict[str, float]]] = run_envace if side == "envace" else run_trl
    records = run(workdir, max_steps, threads, engine)
    out.write_text(json.dumps({"side": side, "steps": records}), encoding="utf-8")


def run_side(side: str, workdir: Path, index: int, args: argparse.Namespace) -> list[dict[str, float]]:
    """Run ``side`` in a fresh subprocess; its per-step records.

    Raises:
        RuntimeError: the worker failed (its output's tail is in the message).
    """
    out = workdir / f"{side}-{index}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--workdir", str(workdir),
           "--out", str(out), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--threads", str(args.threads)] + (["--engine", args.engine] if args.engine else [])
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (workdir / f"{side}-{index}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{side} worker failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    steps = json.loads(out.read_text(encoding="utf-8"))["steps"]
    if len(steps) != args.warmup + args.steps:
        raise RuntimeError(f"{side} worker recorded {len(steps)} steps, expected {args.warmup + args.steps}")
    return steps


def summarise(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Medians of one run over its timed steps (``update_s`` = step - gen+score)."""
    timed = steps[warmup:]
    out = {key: statistics.median(s[key] for s in timed) for key in timed[0] if key != "cycle_s"}
    cycles = [s["cycle_s"] for s in timed if "cycle_s" in s]
    out["cycle_s"] = statistics.median(cycles) if cycles else float("nan")
    out["update_s"] = statistics.median(s["step_s"] - s["gen_score_s"] for s in timed)
    out["completion_len"] = out["gen_tokens"] / out["completions"]
    return out


def median_of(runs: list[dict[str, float]], key: str) -> float:
    """Median over runs of one per-run median."""
    return statistics.median(r[key] for r in runs)


def report(results: list[tuple[str, list[dict[str, float]]]], pairs: list[tuple[int, str]], warmup: int) -> str:
    """The Markdown tables: per side, per pair, and every timed step."""
    runs = {side: [summarise(steps, warmup) for s, steps in results if s == side] for side in SIDES}
    lines = [
        "| side | median s/step | step-to-step s | gen+score s | of which generate s | update s | envace logged "
        "update s | gen tokens/step | mean completion len | prompt tokens | update seq len | rows with feedback |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        r = runs[side]
        logged = f"{median_of(r, 'update_logged_s'):.3f}" if side == "envace" else "-"
        lines.append(
            f"| {side} | {median_of(r, 'step_s'):.3f} | {median_of(r, 'cycle_s'):.3f} | "
            f"{median_of(r, 'gen_score_s'):.3f} | {median_of(r, 'generate_s'):.3f} | {median_of(r, 'update_s'):.3f} | "
            f"{logged} | {median_of(r, 'gen_tokens'):.0f} | {median_of(r, 'completion_len'):.2f} | "
            f"{median_of(r, 'prompt_tokens'):.1f} | {median_of(r, 'update_width'):.0f} | "
            f"{median_of(r, 'feedback_rows'):.1f} |"
        )
    lines += ["", "| pair | first | envace s/step | TRL s/step | TRL / envace |", "|---|---|---|---|---|"]
    for i, (pair, first) in enumerate(pairs):
        e, t = runs["envace"][i]["step_s"], runs["trl"][i]["step_s"]
        lines.append(f"| {pair} | {first} | {e:.3f} | {t:.3f} | {t / e:.3f} |")
    lines += ["", "Timed step times (s), per run in execution order:"]
    for side, steps in results:
        lines.append(f"- {side}: " + " ".join(f"{s['step_s']:.3f}" for s in steps[warmup:]))
    return "\n".join(lines)


def step_ratio(results: list[tuple[str, list[dict[str, float]]]], warmup: int) -> float:
    """Median over pairs of TRL's median step time over envace's."""
    per_side = {side: [summarise(steps, warmup)["step_s"] for s, steps in results if s == side] for side in SIDES}
    return statistics.median(t / e for e, t in zip(per_side["envace"], per_side["trl"], strict=True))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the benchmark's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3, help="envace/TRL run pairs (the first side alternates)")
    p.add_argument("--steps", type=int, default=10, help="timed optimiser steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and OMP/MKL_NUM_THREADS")
    p.add_argument("--engine", choices=("cached", "hf"), help="envace's model.rollout.engine (default: envace's)")
    p.add_argument("--model", type=Path, help="a local Hugging Face model directory to compare on (e.g. "
                   "models/smollm2-135m-instruct, from envace prepare-model) instead of the tiny Qwen2 built in code")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # worker mode
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pairs < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--pairs, --steps and --threads must be at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> None:
    """Build the shared inputs, run the alternating pairs, print the tables and the SUMMARY line."""
    args = parse_args(argv)
    if args.side is not None:
        worker(args.side, args.workdir, args.out, args.warmup + args.steps, args.threads, args.engine)
        return
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"benchmarks/vs_trl.py needs {' and '.join(missing)}: {INSTALL_HINT}")
    load = os.getloadavg()[0]
    if load > LOAD_WARNING:
        print(f"WARNING: load average {load:.2f} > {LOAD_WARNING}: other processes compete, timings will be noisy",  # noqa: T201
              flush=True)
    with tempfile.TemporaryDirectory(prefix="envace-vs-trl-") as tmp:
        workdir = Path(tmp)
        if args.model is None:
            build_model_dir(workdir / MODEL_DIR)
        else:
            use_model_dir(args.model, workdir / MODEL_DIR)
        write_tasks(workdir / TASKS_FILE)
        results: list[tuple[str, list[dict[str, float]]]] = []
        pairs: list[tuple[int, str]] = []
        for pair in range(args.pairs):
            order = SIDES if pair % 2 == 0 else SIDES[::-1]
            pairs.append((pair + 1, order[0]))
            for side in order:
                print(f"pair {pair + 1}/{args.pairs}: {side} ...", flush=True)  # noqa: T201
                results.append((side, run_side(side, workdir, pair, args)))
    threads = {int(s["threads"]) for _, steps in results for s in steps}
    from envace.rollout.runner import RolloutConfig

    engine = args.engine or RolloutConfig().engine
    model = args.model or "the tiny Qwen2 built in code"
    print(f"\n{model}: {args.pairs} pairs x ({args.warmup} warm-up + {args.steps} timed steps); "  # noqa: T201
          f"{PROMPTS_PER_STEP} prompts x G={GROUP_SIZE} x {NEW_TOKENS} new tokens per step; envace engine {engine}; "
          "torch threads "
          f"{sorted(threads)}; load average "
          f"before {load:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print(report(results, pairs, args.warmup))  # noqa: T201
    print(f"SUMMARY trl_over_envace_step_time={step_ratio(results, args.warmup):.3f} "  # noqa: T201
          f"threads={max(threads)}")


if __name__ == "__main__":
    main()
