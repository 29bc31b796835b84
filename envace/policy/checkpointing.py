"""Activation checkpointing of a Hugging Face decoder: which layers recompute in backward, and what they recompute.

Two modes (the names torchtitan uses):

- ``full``: a checkpointed layer keeps only its input and recomputes its whole forward in backward (about a third
  more compute per layer);
- ``selective``: a checkpointed layer keeps the outputs of its matrix products and of its attention kernel and
  recomputes only the cheap operations between them (normalisations, rotary embeddings, the MLP's activation and
  product, dtype casts, the repetition of grouped keys and values). On SmolLM2-135M under bf16 autocast this keeps
  about half of a layer's activations for a few percent more step time (docs/performance.md, "Memory"); on a wide
  model the kept matrix products are most of a layer (a 7B layer keeps about 100 KB a token), so ``full`` is the
  choice where memory is the bound.

Both modes use ``torch.utils.checkpoint`` (non-reentrant); ``selective`` uses its selective checkpointing contexts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers.modeling_layers import GradientCheckpointingLayer

CheckpointMode = Literal["full", "selective"]
CHECKPOINT_MODES: tuple[str, ...] = ("full", "selective")

_aten = torch.ops.aten
KEPT_OPS = frozenset(
    getattr(_aten, name).default
    for name in ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention")
    if hasattr(_aten, name)
)
"""The operations whose outputs a ``selective`` layer keeps: matrix products and the fused attention kernels."""


def checkpoint_layers(model: nn.Module, share: float, mode: CheckpointMode = "full") -> int:
    """Turn on activation checkpointing (non-reentrant) for ``share`` of the decoder layers, evenly spaced.

    Args:
        model: a transformers causal LM (before any peft wrapping).
        share: the fraction of the decoder layers to checkpoint, in [0, 1].
        mode: ``full`` or ``selective`` (the module docstring).

    Returns:
        The number of layers whose activations are recomputed in backward.
    """
    check_mode(mode)
    enable = getattr(model, "activation_checkpointing_enable", None)  # the name since transformers 5.x
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    count = round(share * len(layers))
    chosen = {i * len(layers) // count for i in range(count)} if count else set()
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen
        if mode == "selective":
            layer._gradient_checkpointing_func = selective_checkpoint
    return len(chosen)


def check_mode(mode: str) -> None:
    """Raise ``ValueError`` naming the modes when ``mode`` is not one of them."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint_mode must be one of {list(CHECKPOINT_MODES)}, got {mode!r}")


def checkpointed_layers(model: nn.Module) -> dict[str, int]:
    """How many decoder layers of ``model`` (peft-wrapped or not) recompute in backward, per mode."""
    counts = dict.fromkeys(CHECKPOINT_MODES, 0)
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and getattr(module, "gradient_checkpointing", False) is True:
            selective = getattr(module, "_gradient_checkpointing_func", None) is selective_checkpoint
            counts["selective" if selective else "full"] += 1
    return counts


def selective_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` that keeps the ``KEPT_OPS`` outputs and recomputes everything else.

    Selective checkpointing needs the recomputation to run no operation more often than the forward did. Autocast's
    cast cache can break that: a forward may take its casts of the weights from the cache (filled by an earlier
    forward of the step, such as a shared prefix's pass) while the recomputation, after the cache was cleared, casts
    them again. The forward therefore runs with the cast cache off (it casts every weight it uses, about 0.1 s for
    SmolLM2's layers on 2 cores); the recomputation uses the cache where it is on.
    """
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=_contexts, **kwargs)


def _keep_products(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _contexts() -> tuple[Any, Any]:
    forward, recompute = create_selective_checkpoint_contexts(_keep_products)
    return _without_cast_cache(forward), recompute


@contextmanager
def _without_cast_cache(inner: Any) -> Iterator[None]:
    """``inner`` with autocast's cast cache off (``selective_checkpoint``)."""
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        with inner:
            yield
    finally:
        torch.set_autocast_cache_enabled(before)


__all__ = ["CHECKPOINT_MODES", "KEPT_OPS", "CheckpointMode", "check_mode", "checkpoint_layers", "checkpointed_layers",
           "selective_checkpoint"]
