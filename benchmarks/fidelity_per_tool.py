"""Teacher-forced rehearsal fidelity per tool of exported policies: how well each one plays the environment.

Every reference call of the tasks is rehearsed greedily with the real history before it
(``envace.world_model.fidelity``: exact match of the response, leaf F1 of its JSON leaves, error agreement), and the
scores are grouped by tool.

Run from the repository root: ``.venv/bin/python benchmarks/fidelity_per_tool.py NAME=DIR [NAME=DIR ...]
[--tasks builtin:bank-test] [--dtype auto|bfloat16|float32] [--misses DIR]``, where each DIR is a policy in Hugging
Face format (an ``export_dir``, or ``models/smollm2-135m-instruct``). Prints a Markdown table (one row per policy
and tool, then all tools) and a last line ``SUMMARY <name>_exact_match=... <name>_leaf_f1=...``. ``--misses DIR``
also writes ``DIR/<name>.jsonl``: every probe that is not an exact match, with the call, the generated text (the
working included), the parsed response, the target and the scores.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from envace.builtin.task_sets import load_task_set  # noqa: E402
from envace.engines.kv_engine import CachedEngine  # noqa: E402
from envace.policy import HFPolicy  # noqa: E402
from envace.roles.compare import rehearsal_target, score_reply  # noqa: E402
from envace.runtime.cpu_precision import cpu_dtype  # noqa: E402
from envace.world_model.fidelity import Probe, per_tool, reference_probes, rehearse_replies, summarize  # noqa: E402
from envace.worlds import RehearseWorld  # noqa: E402
from envace.worlds.base import ToolReply  # noqa: E402


def fidelity(policy_dir: str, tasks_spec: str, dtype: str, max_new_tokens: int,
             chat_template: str | None, think: bool = False, misses: Path | None = None
             ) -> tuple[dict[str, dict[str, float]], dict[str, float], float]:
    """Per-tool and overall fidelity of one policy, and the seconds it took; the misses go to ``misses`` (JSONL)."""
    model, tokenizer = HFPolicy(policy_dir, dtype=dtype, chat_template=chat_template).build()
    model.eval().requires_grad_(False)
    world = RehearseWorld(think=think)
    world.bind(tokenizer, model)
    engine = CachedEngine(model, pad_id=tokenizer.pad_token_id, stop_ids=[tokenizer.eos_token_id], max_batch_size=64)
    probes = reference_probes(load_task_set(tasks_spec))
    start = time.perf_counter()
    with torch.no_grad():
        replies = rehearse_replies(probes, world, engine, max_new_tokens)
    seconds = time.perf_counter() - start
    scores = [score_reply(reply, probe.real) for reply, probe in zip(replies, probes, strict=True)]
    if misses is not None:
        records = [miss_record(p, r, asdict(s), tokenizer) for p, r, s in zip(probes, replies, scores, strict=True)
                   if s.exact_match < 1.0]
        misses.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return per_tool(scores, [p.request.call.name for p in probes]), summarize(scores), seconds


def miss_record(probe: Probe, reply: ToolReply, scores: dict[str, float], tokenizer: Any) -> dict[str, Any]:
    """One missed probe: the task, the call, what the rehearse role generated and what it should have answered."""
    generated = None
    if reply.sample is not None:
        row = reply.sample
        generated = tokenizer.decode([t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m])
    return {"task": probe.request.task.id, "tool": probe.tool, "arguments": probe.request.call.arguments,
            "generated": generated, "response": reply.content, "target": rehearsal_target(probe.real),
            "parse_error": reply.parse_error, "truncated": reply.truncated, **scores}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--tasks", default="builtin:bank-test")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: bfloat16 on a CPU with fast bf16 matmuls, else float32 "
                             "(envace.runtime.cpu_precision)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--think", action="store_true",
                        help="the rehearse prompt of a thinking rehearse role (RehearseWorld(think=True))")
    parser.add_argument("--misses", type=Path, default=None, metavar="DIR",
                        help="write each policy's missed probes (not an exact match) to DIR/NAME.jsonl")
    parser.add_argument("--chat-template", default=None,
                        help="replace the tokenizers' template (e.g. chatml-tools for the untrained SmolLM2)")
    args = parser.parse_args(argv)
    if args.dtype == "auto":
        args.dtype = cpu_dtype() if not torch.cuda.is_available() else "bfloat16"
    pairs = [p.split("=", 1) for p in args.policies]
    if any(len(p) != 2 for p in pairs):
        parser.error("each policy is NAME=DIR")
    print(f"Teacher-forced rehearsal fidelity on {args.tasks}, greedy, {args.dtype}, "
          f"at most {args.max_new_tokens} new tokens\n")
    print("| policy | tool | probes | exact match | leaf F1 | error agreement |")
    print("|---|---|---|---|---|---|")
    summary = []
    for name, path in pairs:
        misses = None
        if args.misses is not None:
            args.misses.mkdir(parents=True, exist_ok=True)
            misses = args.misses / f"{name}.jsonl"
        tools, overall, seconds = fidelity(path, args.tasks, args.dtype, args.max_new_tokens, args.chat_template,
                                           args.think, misses)
        for tool, m in [*tools.items(), ("all", overall)]:
            print(f"| {name} | {tool} | {int(m['probes'])} | {m['exact_match']:.3f} | {m['leaf_f1']:.3f} | "
                  f"{m['error_agreement']:.3f} |")
        print(f"| {name} | ({seconds:.0f} s) | | | | |", flush=True)
        summary += [f"{name}_exact_match={overall['exact_match']:.3f}", f"{name}_leaf_f1={overall['leaf_f1']:.3f}"]
    print("\nSUMMARY " + " ".join(summary))


if __name__ == "__main__":
    main()
