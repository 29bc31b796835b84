"""bf16 on a CPU without a fast bf16 matmul kernel: measured once, and a bf16 precision falls back to float32.

A CPU with AMX runs bf16 matmuls about twice as fast as float32, which is why the SmolLM2 configs ask for
``precision: bf16-mixed``. A CPU without them (AVX2 only, many laptops and cloud machines) sends every bf16 matmul to
ATen's scalar reference loop instead: measured here, a 2048x576 by 576x1536 product took 3.1 s in bf16 against 0.10 s
in float32, so a SmolLM2 SFT step that takes 30 s on one machine did not finish in 15 minutes on the other. A CPU with
AVX512-BF16 but no AMX sits between: measured on such a Xeon, a bf16 matmul took 1.1-1.5x the float32 time and
SmolLM2's forward + backward ran at 130 (bf16-true) and 108 (bf16-mixed) against 163 tokens/s in float32, so bf16 is
kept only where it is faster. Whether a CPU has such a kernel is not one flag (oneDNN also emulates bf16 on plain
AVX512, and ``ONEDNN_MAX_CPU_ISA`` can cap it), so envace measures it: a small bf16 and float32 matmul, timed.

``envace fit|validate|test`` on the CPU with a bf16 ``trainer.precision`` asks ``resolve_cpu_precision``; where bf16
is slower than float32 (more than ``SLOWDOWN_LIMIT`` times its time) it runs ``32-true`` and logs one warning line
that says so and why. ``ENVACE_CPU_BF16=keep`` keeps bf16 anyway (e.g. to reproduce a bf16 run's numerics exactly).
"""

from __future__ import annotations

import logging
import os
import time
from functools import cache

import torch

logger = logging.getLogger("envace.runtime.cpu_precision")

SLOWDOWN_LIMIT = 1.0
"""bf16 matmuls slower than float32 by more than this factor fall back.

Measured: about 0.5 with AMX, 1.1-1.5 with AVX512-BF16 alone (where SmolLM2 trains 1.3-1.5x slower in bf16), 13-73
with AVX2 only. Each lies on one side of 1.0 in every measurement so far.
"""
KEEP_ENV = "ENVACE_CPU_BF16"
"""``ENVACE_CPU_BF16=keep`` keeps a bf16 precision on a CPU without bf16 kernels."""
FALLBACK = "32-true"


def is_bf16(precision: object) -> bool:
    """A Lightning precision value that computes in bf16: ``bf16``, ``bf16-mixed``, ``bf16-true``."""
    return str(precision).startswith("bf16")


@cache
def bf16_matmul_slowdown(size: int = 512, repeats: int = 3) -> float:
    """How many times longer a bf16 matmul takes than a float32 one on this CPU (best of ``repeats``; cached).

    ``size`` 512 takes a few milliseconds in float32 and, without bf16 kernels, about 0.2 s in bf16 (measured on an
    AVX2 CPU: 31x; smaller products are dominated by dispatch and gave anything from 1x to 90x). With kernels bf16
    is about as fast or faster: the two cases lie far apart, beyond timing noise.
    """
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        for _ in range(2):  # warm-up: first-call dispatch, allocation, thread pool start
            a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        times[dtype] = max(best, 1e-9)
    return times[torch.bfloat16] / times[torch.float32]


def cpu_dtype() -> str:
    """The faster float dtype for a model on this CPU: ``bfloat16`` where bf16 matmuls are fast, else ``float32``."""
    return "bfloat16" if bf16_matmul_slowdown() <= SLOWDOWN_LIMIT else "float32"


def on_cpu(accelerator: object) -> bool:
    """The Trainer runs on the CPU: ``accelerator`` is ``cpu`` (or a ``CPUAccelerator``), or ``auto`` with no GPU."""
    if not isinstance(accelerator, str):
        from lightning.pytorch.accelerators import CPUAccelerator

        return isinstance(accelerator, CPUAccelerator)
    name = accelerator.lower()
    return name == "cpu" or (name == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available())


def resolve_cpu_precision(precision: object, accelerator: object, slowdown: float | None = None) -> object:
    """``precision``, or ``32-true`` where it is bf16 on a CPU whose bf16 matmuls are slow (logged once).

    Args:
        precision: the config's ``trainer.precision``.
        accelerator: the config's ``trainer.accelerator``.
        slowdown: the measured bf16/float32 time ratio (default: ``bf16_matmul_slowdown()``; tests pass a value).
    """
    if not is_bf16(precision) or not on_cpu(accelerator):
        return precision
    ratio = bf16_matmul_slowdown() if slowdown is None else slowdown
    if ratio <= SLOWDOWN_LIMIT:
        return precision
    cpu = torch.backends.cpu.get_cpu_capability()
    if os.environ.get(KEEP_ENV, "").strip().lower() == "keep":
        logger.warning("precision %s kept (%s=keep): bf16 matmuls take %.1fx float32's time on this CPU (%s)",
                       precision, KEEP_ENV, ratio, cpu)
        return precision
    logger.warning(
        "precision %s -> %s: this CPU (%s) has no fast bf16 matmul kernel; a bf16 matmul took %.1fx the float32 "
        "time, so bf16 would be slower, not faster. %s=keep keeps bf16.", precision, FALLBACK, cpu, ratio, KEEP_ENV,
    )
    return FALLBACK
