"""Rollout efficiency: generated tokens/s of envace's multi-turn rollout against one plain ``generate`` call.

envace's rollout (``EpisodeRunner``: act turns and rehearsed tool responses, batched across episodes, finished
episodes leaving the batch) runs a batch of built-in tasks, ``--group-size`` episodes each, in the rehearsed world
(``--world rehearse``, EnvACE's training setting) or the real one. The backend's limit is one plain ``generate`` call
on the same number of sequences, from the same first prompts, producing the same number of new tokens per sequence
as the rollout produced per episode (no stop token, so every row runs to the end). Efficiency = rollout tokens/s
over plain tokens/s. The rollout pays for what a single call does not: several calls per episode (one per act turn
and one per batch of tool responses), each re-reading its growing prompt.

Run from the repository root: ``.venv/bin/python benchmarks/rollout_efficiency.py [--tasks N] [--group-size G]``.
It prints a table and, last, ``SUMMARY efficiency=<rollout tokens/s over plain generate tokens/s>``.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from envace.rollout.engine import HFEngine, SamplingParams  # noqa: E402


@dataclass
class Measure:
    """One timed run: wall seconds, generated tokens, and ``generate`` calls."""

    seconds: float
    tokens: int
    calls: int

    @property
    def rate(self) -> float:
        """Generated tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class CountingEngine:
    """An engine that counts its ``generate`` calls (the rollout's micro-steps)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.calls = engine, 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Any:
        """Generate and count."""
        self.calls += 1
        return self.engine.generate(prompts, params)


def build(model: str) -> tuple[Any, Any]:
    """The model (eval mode) and tokenizer: the tiny policy, or a local Hugging Face checkpoint."""
    from envace.policy import HFPolicy, TinyPolicy

    network, tokenizer = (TinyPolicy() if model == "tiny" else HFPolicy(model)).build()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return network.to(device).eval(), tokenizer


def rollout(model: Any, tokenizer: Any, tasks: list[Any], args: argparse.Namespace) -> tuple[Measure, list[int]]:
    """One rollout of ``tasks`` x group size; the measure and the first act prompt of each episode."""
    from envace.rollout.runner import EpisodeRunner, RolloutConfig
    from envace.worlds import RealWorld, RehearseWorld

    engine = CountingEngine(HFEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id],
                                     max_batch_size=args.batch_limit))  # as training's engine (the turn's end)
    world = RehearseWorld() if args.world == "rehearse" else RealWorld()
    world.bind(tokenizer, model)
    config = RolloutConfig(max_turns=args.max_turns, act_max_new_tokens=args.act_max_new_tokens,
                           rehearse_max_new_tokens=args.rehearse_max_new_tokens, act_temperature=1.0,
                           rehearse_temperature=1.0, max_context_tokens=args.max_context_tokens,
                           generate_batch_size=args.batch_limit)
    episodes_tasks = [t for t in tasks for _ in range(args.group_size)]
    groups = [i for i in range(len(tasks)) for _ in range(args.group_size)]
    start = time.perf_counter()
    episodes = EpisodeRunner(tokenizer, config).run(episodes_tasks, groups, engine, world)
    seconds = time.perf_counter() - start
    prompts = [_first_prompt(e) for e in episodes]
    return Measure(seconds, engine.engine.generated_tokens, engine.calls), prompts


def _first_prompt(episode: Any) -> list[int]:
    """The act row's ids before its first generated token (the episode's first prompt)."""
    from envace.types import Role

    roles = episode.act.role_ids
    first = roles.index(int(Role.ACT)) if int(Role.ACT) in roles else len(roles)
    return episode.act.token_ids[:first]


def plain(model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int, batch_limit: int) -> Measure:
    """One ``generate`` over ``prompts``, ``new_tokens`` each (a stop id outside the vocabulary: none stops early)."""
    engine = HFEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=[model.config.vocab_size],
                      max_batch_size=batch_limit)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    start = time.perf_counter()
    engine.generate(prompts, params)
    return Measure(time.perf_counter() - start, engine.generated_tokens, 1)


def table(rows: list[list[str]]) -> str:
    """A Markdown table."""
    head, *body = rows
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in body])


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, or a local Hugging Face checkpoint directory")
    parser.add_argument("--tasks", default="builtin:bank-test:16", help="a task set (data.train_tasks syntax)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--world", default="rehearse", choices=("rehearse", "real"))
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--act-max-new-tokens", type=int, default=48)
    parser.add_argument("--rehearse-max-new-tokens", type=int, default=32)
    parser.add_argument("--max-context-tokens", type=int, default=4096)
    parser.add_argument("--batch-limit", type=int, default=64, help="most prompts per generate call (both sides)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (after one warm-up); medians")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.group_size < 1:
        parser.error("--repeats and --group-size must be at least 1")
    from envace.data.tasks import load_task_set

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = build(args.model)
    tasks = load_task_set(args.tasks)
    rollout(model, tokenizer, tasks[:1], args)  # warm-up
    runs, plains = [], []
    for _ in range(args.repeats):
        measure, prompts = rollout(model, tokenizer, tasks, args)
        per_sequence = max(1, round(measure.tokens / len(prompts)))
        runs.append(measure)
        plains.append(plain(model, tokenizer, prompts, per_sequence, args.batch_limit))
    rollout_rate = statistics.median(m.rate for m in runs)
    plain_rate = statistics.median(m.rate for m in plains)
    episodes = len(tasks) * args.group_size
    prompt_tokens = statistics.fmean(len(p) for p in prompts)
    print(table([  # noqa: T201
        ["run", "sequences", "generate calls", "new tokens", "seconds", "tokens/s"],
        ["envace rollout", str(episodes), f"{statistics.median(m.calls for m in runs):.0f}",
         f"{statistics.median(m.tokens for m in runs):.0f}", f"{statistics.median(m.seconds for m in runs):.2f}",
         f"{rollout_rate:.1f}"],
        ["plain generate", str(episodes), "1", f"{statistics.median(m.tokens for m in plains):.0f}",
         f"{statistics.median(m.seconds for m in plains):.2f}", f"{plain_rate:.1f}"],
    ]))
    print(f"\n{args.model} model, {args.world} world, {episodes} episodes ({len(tasks)} tasks x {args.group_size}), "  # noqa: T201
          f"first prompt {prompt_tokens:.0f} tokens on average, median of {args.repeats} runs, {args.threads} "
          f"torch thread(s), {'CUDA' if torch.cuda.is_available() else 'CPU'}.")
    print(f"SUMMARY efficiency={rollout_rate / plain_rate:.3f}")  # noqa: T201


if __name__ == "__main__":
    main()
