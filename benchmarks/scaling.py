"""Step time and peak memory as the group size, the turns and the context length grow (the tiny config).

Each setting runs ``envace fit --config lit_configs/tiny.yaml`` for ``--steps`` steps in a fresh process (so its peak
resident memory, or its peak CUDA memory on a GPU, is its own), with one knob changed from the base setting:

- ``group_size``: episodes per task (``model.grpo.group_size``);
- ``turns``: the act turns an episode may take (``model.rollout.max_turns``, tool calls alike); the random tiny policy
  is kept talking by a small ``act_max_new_tokens`` so episodes do reach the cap;
- ``context``: the tokens of one act turn (``model.rollout.act_max_new_tokens``), hence the context length.

Step time is the median over the steps after the first (a warm-up) of the rollout and the update time the module
logs. The growth factor of a knob is (step time at its largest value / at its smallest) over (largest / smallest
value): at most 1 means no worse than linear. Run from the repository root:
``.venv/bin/python benchmarks/scaling.py [--steps 4]``. It prints a table; the last line is
``SUMMARY group_size_growth=<f> turns_growth=<f> context_growth=<f>``.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {
    "group_size": ("model.grpo.group_size", (2, 4, 8)),
    "turns": ("model.rollout.max_turns", (2, 4, 8)),
    "context": ("model.rollout.act_max_new_tokens", (16, 32, 64)),
}
BASE = {"model.grpo.group_size": 4, "model.rollout.max_turns": 4, "model.rollout.max_tool_calls": 8,
        "model.rollout.act_max_new_tokens": 24, "model.rollout.max_context_tokens": 4096}

CHILD = """
import json, resource, statistics, sys
sys.path.insert(0, {bench!r})
import torch
torch.set_num_threads(1)
from rollout_throughput import read_steps, run_fit
run_fit({args!r})
steps = read_steps({workdir!r})[1:]
peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else \
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({{"step_s": statistics.median(s.rollout_s + s.update_s for s in steps),
                               "rollout_s": statistics.median(s.rollout_s for s in steps),
                               "generated": statistics.median(s.generated for s in steps), "peak_mib": peak}}))
"""


def run_setting(overrides: dict[str, int], steps: int) -> dict[str, float]:
    """One ``envace fit`` in a fresh process: median step time, rollout time, generated tokens, peak memory."""
    with tempfile.TemporaryDirectory() as workdir:
        args = ["fit", "--config", str(ROOT / "lit_configs" / "tiny.yaml"), f"--trainer.max_steps={steps}",
                "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false", "--trainer.callbacks=[]",
                f"--trainer.default_root_dir={workdir}",
                *(f"--{k}={v}" for k, v in {**BASE, **overrides}.items())]
        code = CHILD.format(bench=str(ROOT / "benchmarks"), args=args, workdir=workdir)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"setting {overrides} failed:\n{done.stderr[-3000:]}")
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))


def growth(rows: list[tuple[int, dict[str, float]]]) -> float:
    """Step-time ratio of the largest to the smallest value, over the value ratio (<= 1: no worse than linear)."""
    (low, first), (high, last) = rows[0], rows[-1]
    return (last["step_s"] / first["step_s"]) / (high / low)


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps per setting (the first is a warm-up)")
    parser.add_argument("--knobs", nargs="+", default=list(KNOBS), choices=list(KNOBS))
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first is a warm-up)")
    lines = ["| knob | value | step s | rollout s | generated tokens | peak MiB |", "|---|---|---|---|---|---|"]
    growths = {}
    for knob in args.knobs:
        key, values = KNOBS[knob]
        rows = [(v, run_setting({key: v}, args.steps)) for v in values]
        growths[knob] = growth(rows)
        lines += [f"| {knob} | {v} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['generated']:.0f} | "
                  f"{r['peak_mib']:.0f} |" for v, r in rows]
    print("\n".join(lines))  # noqa: T201
    print(f"\nmedian of {args.steps - 1} steps after a warm-up; base setting: {BASE}")  # noqa: T201
    print("SUMMARY " + " ".join(f"{k}_growth={v:.3f}" for k, v in growths.items()))  # noqa: T201


if __name__ == "__main__":
    main()
