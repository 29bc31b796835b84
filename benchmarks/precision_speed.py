"""Update and generation tokens/s of a model in float32 and in bf16 on this machine (CPU or GPU).

The two quantities of an RL step, measured apart from any rollout logic so that a precision whose step would take
hours (bf16 on a CPU without bf16 kernels) can still be measured in minutes:

- **update**: forward + backward of ``--rows`` rows of ``--row-tokens`` tokens each (one micro-batch, the loss the
  mean token log-probability, as an update's cost is dominated by the same matmuls), best of ``--repeats``; tokens/s
  counts the rows' tokens.
- **generate**: ``model.generate`` of ``--new-tokens`` tokens for ``--rows`` prompts of ``--prompt-tokens`` tokens
  (KV cache, greedy, stopping disabled so that every row writes all of them), best of ``--repeats``; tokens/s counts
  the new tokens.

``float32`` runs the model in float32. ``bf16-mixed`` is what Lightning's ``precision: bf16-mixed`` does: float32
weights, matmuls under ``torch.autocast`` in bf16. ``bf16-true`` casts the weights to bf16. The inputs are random
token ids from a fixed seed, the same for every precision. The table also shows the bf16/float32 matmul slowdown that
``envace.runtime.cpu_precision`` measures to decide its fallback.

Run from the repository root::

    .venv/bin/python benchmarks/precision_speed.py --model models/smollm2-135m-instruct [--threads 2]

The last line is ``SUMMARY`` with ``update_tok_s_<precision>`` and ``generate_tok_s_<precision>`` for each
precision, and ``bf16_matmul_slowdown``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envace.runtime.cpu_precision import bf16_matmul_slowdown  # noqa: E402

PRECISIONS = ("float32", "bf16-mixed", "bf16-true")


@dataclass
class Row:
    """One precision's measurements (seconds are the best of the repeats)."""

    precision: str
    update_s: float
    update_tokens: int
    generate_s: float
    new_tokens: int

    @property
    def update_tok_s(self) -> float:
        """Row tokens per second of forward + backward."""
        return self.update_tokens / self.update_s

    @property
    def generate_tok_s(self) -> float:
        """New tokens per second of generation."""
        return self.new_tokens / self.generate_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a local Hugging Face causal LM directory")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--rows", type=int, default=4, help="rows of the update batch and prompts of the generation")
    p.add_argument("--row-tokens", type=int, default=256, help="tokens per update row")
    p.add_argument("--prompt-tokens", type=int, default=256, help="tokens per generation prompt")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats (the best counts), after one warm-up")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    args = p.parse_args(argv)
    for name in ("rows", "row_tokens", "prompt_tokens", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def load(path: str, precision: str, device: str) -> torch.nn.Module:
    """The model in ``precision`` (float32 weights unless ``bf16-true``)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model


def autocast(precision: str, device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``bf16-mixed``, nothing otherwise."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def best_time(fn, repeats: int, device: str) -> float:
    """The shortest of ``repeats`` timed calls after one untimed warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def measure(args: argparse.Namespace, precision: str, device: str) -> Row:
    """Update and generation timings of one precision."""
    model = load(args.model, precision, device)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, vocab, (args.rows, args.row_tokens), generator=generator).to(device)
    prompts = torch.randint(0, vocab, (args.rows, args.prompt_tokens), generator=generator).to(device)

    def update() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(precision, device):
            logits = model(input_ids=rows).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, rows[:, 1:, None]).mean()
        (-logp).backward()

    def generate() -> None:
        with torch.no_grad(), autocast(precision, device):
            out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
        assert out.shape[1] == args.prompt_tokens + args.new_tokens

    model.train()
    update_s = best_time(update, args.repeats, device)
    model.eval()
    generate_s = best_time(generate, args.repeats, device)
    return Row(precision, update_s, args.rows * args.row_tokens, generate_s, args.rows * args.new_tokens)


def table(rows: list[Row], args: argparse.Namespace, device: str, slowdown: float | None) -> str:
    """The measurements as Markdown."""
    lines = [f"model {args.model}, device {device}, threads {torch.get_num_threads()}; update: {args.rows} rows x "
             f"{args.row_tokens} tokens; generate: {args.rows} prompts x {args.prompt_tokens} tokens, "
             f"{args.new_tokens} new tokens each; best of {args.repeats}", ""]
    if slowdown is not None:
        lines += [f"bf16/float32 matmul time on this CPU (envace.runtime.cpu_precision): {slowdown:.1f}x", ""]
    lines += ["| precision | update s | update tokens/s | generate s | generate tokens/s |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.precision} | {r.update_s:.2f} | {r.update_tok_s:.0f} | {r.generate_s:.2f} | "
                     f"{r.generate_tok_s:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure every precision, print the table and the summary line."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    slowdown = bf16_matmul_slowdown() if device == "cpu" else None
    rows = [measure(args, precision, device) for precision in args.precisions]
    print(table(rows, args, device, slowdown))
    summary = [f"update_tok_s_{r.precision}={r.update_tok_s:.1f} generate_tok_s_{r.precision}={r.generate_tok_s:.2f}"
               for r in rows]
    if slowdown is not None:
        summary.append(f"bf16_matmul_slowdown={slowdown:.2f}")
    print("SUMMARY " + " ".join(summary))


if __name__ == "__main__":
    main()
