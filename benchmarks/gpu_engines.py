"""Rollout engines side by side on a GPU: tokens/s of each engine, the vLLM engine's sync time and memory.

Prepared for a machine with one CUDA GPU, run in one command (an environment with vLLM: ``pip install -e '.[vllm]'``):

    python benchmarks/gpu_engines.py --models DIR_OF_QWEN2.5-0.5B-INSTRUCT DIR_OF_A_7B

For each model directory that exists (others are listed as absent and skipped) and each engine (``--engines``,
default ``cached hf vllm vllm-lockstep``: the last is vLLM with lock-step micro-steps instead of per-episode
scheduling), it runs the same multi-turn rollout as ``rollout_efficiency.py``: built-in bank tasks,
``--group-size`` episodes each, the act role and the rehearsed world sharing the policy, sampling at T=1, the
model's own chat template. The trainer's copy of the policy sits on the GPU in ``--dtype``; the vLLM engine is
colocated (``--gpu-memory-utilization``, sleep mode on, as ``lit_configs/qwen7b.yaml`` runs it). Per model and engine
it reports:

- rollout tokens/s (median of ``--repeats`` timed rollouts after one warm-up) and the generated tokens;
- for vLLM: engine start-up seconds, the weight sync (``load_weights`` of the policy's full weights, median of
  ``--repeats``), ``sleep`` and ``wake_up`` seconds;
- GPU memory in GiB: the trainer's peak allocation during the rollouts (``torch.cuda.max_memory_allocated``) and the
  device's used memory with the engine awake and asleep (``torch.cuda.mem_get_info``; vLLM allocates outside
  torch's allocator statistics).

The last line is ``SUMMARY vllm_speedup=<vLLM tokens/s over cached tokens/s, first model> vllm_sync_s=<...>
models=<measured>``. Without CUDA the same code runs on CPU (memory columns are n/a); the test suite runs it that way
on SmolLM2 with a tiny budget.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import rollout_efficiency as efficiency  # noqa: E402

ENGINES = ("cached", "hf", "vllm", "vllm-lockstep")
GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="Hugging Face checkpoint directories (absent: skipped)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--tasks", default="builtin:bank-test:16", help="a task set (data.train_tasks syntax)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--act-max-new-tokens", type=int, default=256)
    p.add_argument("--rehearse-max-new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="timed rollouts (and syncs) after one warm-up; medians")
    p.add_argument("--dtype", default="bfloat16", help="the trainer's and the engine's dtype")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    p.add_argument("--chat-template", default=None, help="replace the checkpoint's chat template (e.g. chatml-tools)")
    p.add_argument("--batch-limit", type=int, default=64, help="most prompts per generate call (cached, hf)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.group_size < 1:
        p.error("--repeats and --group-size must be at least 1")
    return args


def load(model_dir: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """The trainer's copy of the policy (eval mode, on the GPU when there is one) and its tokenizer."""
    from envace.policy import HFPolicy

    dtype = args.dtype if torch.cuda.is_available() else "float32"
    network, tokenizer = HFPolicy(model_dir, dtype=dtype, chat_template=args.chat_template).build()
    return network.to("cuda" if torch.cuda.is_available() else "cpu").eval(), tokenizer


def start_vllm(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> tuple[Any, float]:
    """The colocated engine, as ``rollout.engine: vllm`` starts it; and its start-up seconds."""
    from envace.engines.vllm_engine import VLLMEngine, VLLMOptions

    options = VLLMOptions(dtype=args.dtype if torch.cuda.is_available() else "float32",
                          gpu_memory_utilization=args.gpu_memory_utilization, sleep=torch.cuda.is_available())
    start = time.perf_counter()
    engine = VLLMEngine.from_options(model_dir, [tokenizer.eos_token_id], options)
    return engine, time.perf_counter() - start


def used_gib() -> float | None:
    """The device's used memory in GiB (every allocator, vLLM's included); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def measure_engine(name: str, model_dir: str, model: Any, tokenizer: Any, tasks: list[Any],
                   args: argparse.Namespace) -> dict[str, Any]:
    """One engine's row: rollout tokens/s, and for vLLM its start-up, sync, sleep/wake seconds and memory."""
    from envace.engines.weights import policy_weights

    row: dict[str, Any] = {"model": Path(model_dir).name, "engine": name}
    kind, _, schedule = name.partition("-")
    run = argparse.Namespace(**vars(args), engine=kind, world="rehearse", max_context_tokens=8192,
                             schedule=schedule or "continuous", vllm=None)
    engine = None
    if kind == "vllm":
        engine, row["startup_s"] = start_vllm(model_dir, tokenizer, args)
        run.vllm = engine
        syncs = [engine.load_weights(policy_weights(model)) for _ in range(args.repeats)]
        row["sync_s"] = statistics.median(syncs)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    efficiency.rollout(model, tokenizer, tasks[:1], run)  # warm-up
    measures = [efficiency.rollout(model, tokenizer, tasks, run)[0] for _ in range(args.repeats)]
    row["tokens"] = statistics.median(m.tokens for m in measures)
    row["tokens_per_s"] = statistics.median(m.rate for m in measures)
    if torch.cuda.is_available():
        row["trainer_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    row["used_awake_gib"] = used_gib()
    if engine is not None:
        start = time.perf_counter()
        engine.sleep()
        row["sleep_s"] = time.perf_counter() - start
        row["used_asleep_gib"] = used_gib()
        start = time.perf_counter()
        engine.wake_up()
        row["wake_s"] = time.perf_counter() - start
        engine.close()  # its memory back before the next engine or model is measured
    return row


COLUMNS = [("model", "model", "{}"), ("engine", "engine", "{}"), ("tokens", "new tokens", "{:.0f}"),
           ("tokens_per_s", "tokens/s", "{:.1f}"), ("startup_s", "start s", "{:.1f}"), ("sync_s", "sync s", "{:.2f}"),
           ("sleep_s", "sleep s", "{:.2f}"), ("wake_s", "wake s", "{:.2f}"),
           ("trainer_peak_gib", "trainer peak GiB", "{:.2f}"), ("used_awake_gib", "GPU used GiB", "{:.2f}"),
           ("used_asleep_gib", "used asleep GiB", "{:.2f}")]


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the rows (n/a where a value does not apply)."""
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [fmt.format(row[key]) if row.get(key) is not None else "n/a" for key, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], measured: list[str]) -> str:
    """The machine-readable last line."""
    first = [r for r in rows if r["model"] == Path(measured[0]).name] if measured else []
    by_engine = {r["engine"]: r for r in first}
    speedup = (by_engine["vllm"]["tokens_per_s"] / by_engine["cached"]["tokens_per_s"]
               if {"vllm", "cached"} <= set(by_engine) else None)
    sync = by_engine.get("vllm", {}).get("sync_s")
    return (f"SUMMARY vllm_speedup={'n/a' if speedup is None else f'{speedup:.2f}'} "
            f"vllm_sync_s={'n/a' if sync is None else f'{sync:.2f}'} models={len(measured)}")


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    args = parse_args(argv)
    from envace.builtin.task_sets import load_task_set

    tasks = load_task_set(args.tasks)
    present = [m for m in args.models if Path(m, "config.json").is_file()]
    for missing in sorted(set(args.models) - set(present)):
        print(f"absent, skipped: {missing} (no config.json)")  # noqa: T201
    if any(name.startswith("vllm") for name in args.engines):
        from envace.engines.vllm_engine import require_vllm

        require_vllm()
    rows = []
    for model_dir in present:
        model, tokenizer = load(model_dir, args)
        for name in args.engines:
            rows.append(measure_engine(name, model_dir, model, tokenizer, tasks, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)  # noqa: T201 - progress, one row at a time
        del model
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (no CUDA: memory columns n/a)"
    print(f"\n{device}; {len(tasks)} tasks x {args.group_size} episodes, act {args.act_max_new_tokens} / rehearse "  # noqa: T201
          f"{args.rehearse_max_new_tokens} new tokens per turn, up to {args.max_turns} turns, median of "
          f"{args.repeats}\n")
    print(table(rows))  # noqa: T201
    print(summary(rows, present))  # noqa: T201


if __name__ == "__main__":
    main()
