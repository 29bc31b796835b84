"""Rollout efficiency: generated tokens/s of envace's multi-turn rollout against one plain ``generate`` call.

envace's rollout (``EpisodeRunner``: act turns and rehearsed tool responses, batched across episodes) runs a batch of
built-in tasks, ``--group-size`` episodes each, in the rehearsed world (``--world rehearse``, EnvACE's training
setting) or the real one, with ``CachedEngine`` (prefix reuse across turns, finished rows leaving the batch; the
training default) or ``HFEngine`` (``--engine hf``: one ``generate`` per call). The backend's limit is one plain
``generate`` call on the same batch and lengths: one row per episode whose prompt is every token of the episode the
policy did not generate (the first prompt and each tool response, template included), producing the episode's mean
number of generated tokens (no stop token, so every row runs to the end). That call does the rollout's work minus
what makes it multi-turn: one prefill instead of one per turn, one call instead of several.
Efficiency = rollout tokens/s over plain tokens/s.

A second baseline, the first prompts alone with the same number of new tokens, is printed too: it never reads the
tool responses, so it does less work than the rollout (its ratio is the lower ``efficiency_first_prompt``).

``--engine vllm`` (in an environment with vLLM: ``.venv-vllm`` on CPU) rolls out with ``VLLMEngine`` on ``--model``
(a checkpoint directory), scheduling per episode (``rollout.continuous``; ``--schedule lockstep`` for the lock-step
micro-steps), and measures the baselines with one raw vLLM ``LLM.generate`` on the same engine (token prompts,
``ignore_eos``); the prefix cache is cleared before every timed run, so no run reuses another's prompts. vLLM takes a
length per row, so its main baseline is the same work exactly: each row reads its episode's context and generates
as many tokens as the episode generated (``each episode's lengths``); the mean-length row spreads the same total
evenly, which no rollout can match when a few episodes run longer than the rest. Its last line is
``SUMMARY vllm_efficiency=<over each episode's lengths> vllm_efficiency_mean_length=<...>
vllm_efficiency_first_prompt=<...>``.

Run from the repository root: ``.venv/bin/python benchmarks/rollout_efficiency.py [--tasks N] [--group-size G]``.
It prints a table and, last, ``SUMMARY efficiency=<rollout tokens/s over length-matched plain generate tokens/s>
efficiency_first_prompt=<...>``.
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

from envace.engines.base import HFEngine, SamplingParams  # noqa: E402
from envace.engines.kv_engine import CachedEngine  # noqa: E402


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
    """An engine that counts its ``generate`` calls (the rollout's micro-steps), or its ``wait`` calls when it takes
    requests one at a time (``VLLMEngine``: the rollout then schedules per episode)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, 0
        if hasattr(engine, "queue"):
            self.queue = engine.queue

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue one prompt on the wrapped engine."""
        return self.engine.submit(prompt, params)

    def wait(self) -> Any:
        """Wait and count."""
        self.calls += 1
        return self.engine.wait()

    def session(self) -> Any:
        """The wrapped engine's rollout session (a no-op context for an engine without one)."""
        from contextlib import nullcontext

        return getattr(self.engine, "session", nullcontext)()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Any:
        """Generate and count."""
        self.calls += 1
        return self.engine.generate(prompts, params)


class RawVLLM:
    """The baseline on vLLM: one ``LLM.generate`` over token prompts, ``new_tokens`` each, no stop."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def measure(self, prompts: list[list[int]], new_tokens: int | list[int]) -> Measure:
        """One timed raw ``generate`` (prefix cache cleared first): ``new_tokens`` per row, or each row its own."""
        import vllm

        lengths = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(prompts)
        params = [vllm.SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True, detokenize=False)
                  for n in lengths]
        requests = [vllm.inputs.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        self.engine.llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = self.engine.llm.generate(requests, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return Measure(seconds, sum(len(o.outputs[0].token_ids) for o in outputs), 1)


def vllm_engine(model_dir: str, tokenizer: Any) -> Any:
    """``VLLMEngine`` on ``model_dir``, in the model's own dtype (``--engine vllm``)."""
    from envace.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model_dir, stop_ids=[tokenizer.eos_token_id], dtype="auto")


def build(model: str, chat_template: str | None = None) -> tuple[Any, Any]:
    """The model (eval mode) and tokenizer: the tiny policy, or a local Hugging Face checkpoint."""
    from envace.policy import HFPolicy, TinyPolicy

    policy = TinyPolicy() if model == "tiny" else HFPolicy(model, chat_template=chat_template)
    network, tokenizer = policy.build()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return network.to(device).eval(), tokenizer


def rollout(model: Any, tokenizer: Any, tasks: list[Any],
            args: argparse.Namespace) -> tuple[Measure, list[list[int]], list[list[int]], list[int]]:
    """One rollout of ``tasks`` x group size; the measure, each episode's first act prompt, its context, and the
    number of tokens generated for it (both roles).

    The context is every token of the act stream the act role did not generate (first prompt, tool responses).
    """
    from envace.rollout.config import RolloutConfig
    from envace.rollout.runner import EpisodeRunner
    from envace.worlds import RealWorld, RehearseWorld

    if args.engine == "vllm":
        args.vllm.llm.reset_prefix_cache()  # each timed run starts cold, as the raw baseline does
        engine = CountingEngine(args.vllm)
    else:
        kind = CachedEngine if args.engine == "cached" else HFEngine
        engine = CountingEngine(kind(model, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id],
                                     max_batch_size=args.batch_limit))  # as training's engine (the turn's end)
    before = engine.engine.generated_tokens
    world = RehearseWorld() if args.world == "rehearse" else RealWorld()
    world.bind(tokenizer, model)
    config = RolloutConfig(max_turns=args.max_turns, act_max_new_tokens=args.act_max_new_tokens,
                           rehearse_max_new_tokens=args.rehearse_max_new_tokens, act_temperature=1.0,
                           rehearse_temperature=1.0, max_context_tokens=args.max_context_tokens,
                           generate_batch_size=args.batch_limit, continuous=args.schedule == "continuous")
    episodes_tasks = [t for t in tasks for _ in range(args.group_size)]
    groups = [i for i in range(len(tasks)) for _ in range(args.group_size)]
    start = time.perf_counter()
    episodes = EpisodeRunner(tokenizer, config).run(episodes_tasks, groups, engine, world)
    seconds = time.perf_counter() - start
    prompts = [_first_prompt(e) for e in episodes]
    contexts = [_context(e) for e in episodes]
    generated = [_generated(e) for e in episodes]
    return Measure(seconds, engine.engine.generated_tokens - before, engine.calls), prompts, contexts, generated


def _generated(episode: Any) -> int:
    """Tokens generated for an episode: its act turns and its rehearsed responses."""
    rows = [r for r in episode.act_rows()] + [r.sample for r in episode.rehearsals if r.sample is not None]
    return sum(sum(r.loss_mask) for r in rows)


def _first_prompt(episode: Any) -> list[int]:
    """The act row's ids before its first generated token (the episode's first prompt)."""
    from envace.types import Role

    roles = episode.act.role_ids
    first = roles.index(int(Role.ACT)) if int(Role.ACT) in roles else len(roles)
    return episode.act.token_ids[:first]


def _context(episode: Any) -> list[int]:
    """The act row's ids the act role did not generate, in order."""
    from envace.types import Role

    return [t for t, r in zip(episode.act.token_ids, episode.act.role_ids) if r != int(Role.ACT)]


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
    parser.add_argument("--engine", default="cached", choices=("cached", "hf", "vllm"),
                        help="the rollout's engine: CachedEngine (prefix reuse, finished rows leave), HFEngine, or "
                             "VLLMEngine (needs vLLM and a checkpoint directory as --model)")
    parser.add_argument("--chat-template", default=None,
                        help="a checkpoint's chat template replaced (e.g. chatml-tools for SmolLM2, whose own ignores "
                             "tools)")
    parser.add_argument("--world", default="rehearse", choices=("rehearse", "real"))
    parser.add_argument("--schedule", default="continuous", choices=("continuous", "lockstep"),
                        help="with --engine vllm: per-episode scheduling (rollout.continuous, the default) or "
                             "lock-step micro-steps (the other engines always run lock-step)")
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
    from envace.builtin.task_sets import load_task_set

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.engine == "vllm" and args.model == "tiny":
        parser.error("--engine vllm needs a checkpoint directory as --model (e.g. models/smollm2-135m-instruct)")
    model, tokenizer = build(args.model, args.chat_template)
    args.vllm = vllm_engine(args.model, tokenizer) if args.engine == "vllm" else None
    raw = RawVLLM(args.vllm) if args.vllm is not None else None

    def baseline(prompts: list[list[int]], new_tokens: int) -> Measure:
        if raw is not None:
            return raw.measure(prompts, new_tokens)
        return plain(model, tokenizer, prompts, new_tokens, args.batch_limit)

    tasks = load_task_set(args.tasks)
    rollout(model, tokenizer, tasks[:1], args)  # warm-up
    runs, exact, matched, firsts = [], [], [], []
    for _ in range(args.repeats):
        measure, prompts, contexts, generated = rollout(model, tokenizer, tasks, args)
        per_sequence = max(1, round(measure.tokens / len(prompts)))
        runs.append(measure)
        if raw is not None:  # vLLM takes one length per row: each sequence generates what its episode generated
            exact.append(raw.measure(contexts, [max(1, n) for n in generated]))
        matched.append(baseline(contexts, per_sequence))
        firsts.append(baseline(prompts, per_sequence))
    rate = statistics.median(m.rate for m in runs)
    episodes = len(tasks) * args.group_size
    plain_name = "raw vLLM generate" if raw is not None else "plain generate"
    context_len = statistics.fmean(len(c) for c in contexts)
    rows = [["run", "sequences", "prompt tokens/seq", "generate calls", "new tokens", "seconds", "tokens/s"],
            _row(f"envace rollout ({args.engine}, {_schedule(args)})", episodes,
                 statistics.fmean(len(p) for p in prompts), runs)]
    if exact:
        rows.append(_row(f"{plain_name}, each episode's lengths", episodes, context_len, exact))
    rows += [_row(f"{plain_name}, mean length", episodes, context_len, matched),
             _row(f"{plain_name}, first prompts", episodes, statistics.fmean(len(p) for p in prompts), firsts)]
    print(table(rows))  # noqa: T201
    print(f"\n{args.model} model, {args.world} world, {episodes} episodes ({len(tasks)} tasks x {args.group_size}), "  # noqa: T201
          f"median of {args.repeats} runs, {args.threads} torch thread(s), "
          f"{'CUDA' if torch.cuda.is_available() else 'CPU'}. The rollout's prompt tokens/seq is its first prompt; "
          "its later prompts add the tool responses that the baselines read in one prefill.")
    if exact:
        print(f"SUMMARY vllm_efficiency={rate / statistics.median(m.rate for m in exact):.3f} "  # noqa: T201
              f"vllm_efficiency_mean_length={rate / statistics.median(m.rate for m in matched):.3f} "
              f"vllm_efficiency_first_prompt={rate / statistics.median(m.rate for m in firsts):.3f}")
        return
    print(f"SUMMARY efficiency={rate / statistics.median(m.rate for m in matched):.3f} "  # noqa: T201
          f"efficiency_first_prompt={rate / statistics.median(m.rate for m in firsts):.3f}")


def _schedule(args: argparse.Namespace) -> str:
    return args.schedule if args.engine == "vllm" else "lock-step"


def _row(name: str, sequences: int, prompt_tokens: float, measures: list[Measure]) -> list[str]:
    return [name, str(sequences), f"{prompt_tokens:.0f}", f"{statistics.median(m.calls for m in measures):.0f}",
            f"{statistics.median(m.tokens for m in measures):.0f}",
            f"{statistics.median(m.seconds for m in measures):.2f}",
            f"{statistics.median(m.rate for m in measures):.1f}"]


if __name__ == "__main__":
    main()
