"""Activation checkpointing of a Hugging Face decoder: which layers recompute in backward, and what they recompute.

Three modes (the first two are the names torchtitan uses):

- ``full``: a checkpointed layer keeps only its input and recomputes its whole forward in backward (about a third
  more compute per layer);
- ``selective``: a checkpointed layer keeps the outputs of its matrix products and of its attention kernel and
  recomputes only the cheap operations between them (normalisations, rotary embeddings, the MLP's activation and
  product, dtype casts, the repetition of grouped keys and values). On SmolLM2-135M under bf16 autocast this keeps
  about half of a layer's activations for a few percent more step time (docs/performance.md, "Memory"); on a wide
  model the kept matrix products are most of a layer (a 7B layer keeps about 100 KB a token), so ``full`` is the
  choice where memory is the bound;
- ``light``: a layer recomputes only its two normalisations and its MLP's activation and product, each from its own
  input (three small checkpointed regions inside the layer, no matrix product among them). The normalisations also
  hand their output to the projections already in the autocast dtype, once, where each projection would otherwise
  keep its own 16-bit copy of it. On SmolLM2-135M (one forward and backward of 2 x 1000 tokens on 2 CPU cores) a
  layer keeps 33 KB a token instead of 44 KB in float32 and 19 KB instead of 30 KB under bf16 autocast, at the
  step time of no checkpointing, within 1.5% (``selective``: 25 and 14 KB, about 10% slower; docs/performance.md,
  "Memory").

All three use ``torch.utils.checkpoint`` (non-reentrant); ``selective`` uses its selective checkpointing contexts.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers.modeling_layers import GradientCheckpointingLayer

CheckpointMode = Literal["full", "selective", "light"]
CHECKPOINT_MODES: tuple[str, ...] = ("full", "selective", "light")
LIGHT_NORMS = ("input_layernorm", "post_attention_layernorm")
"""The normalisations of a decoder layer that feed only its projections (the names of Llama, Qwen2/3, Mistral)."""

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
        mode: ``full``, ``selective`` or ``light`` (the module docstring).

    Returns:
        The number of layers whose activations are (partly) recomputed in backward.
    """
    check_mode(mode)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    count = round(share * len(layers))
    chosen = {i * len(layers) // count for i in range(count)} if count else set()
    for layer in layers:
        lighten(layer, False)
    if mode == "light":
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = False
            lighten(layer, i in chosen)
        return sum(is_light(layer) for layer in layers)
    enable = getattr(model, "activation_checkpointing_enable", None)  # the name since transformers 5.x
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen
        if mode == "selective":
            layer._gradient_checkpointing_func = selective_checkpoint
    return len(chosen)


FULL_CHECKPOINT = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
"""What a ``full`` layer checkpoints with (as ``gradient_checkpointing_enable`` sets it, non-reentrant)."""


@contextmanager
def recomputed_in_full(model: nn.Module, on: bool = True) -> Iterator[int]:
    """While ``on``, every ``selective`` layer of ``model`` runs as a ``full`` one: it keeps only its input.

    For a micro-batch over the token budget: a row longer than ``micro_batch_tokens`` is a micro-batch of its own,
    and under ``selective`` its activations grow with its length past the budget's (measured on SmolLM2: 2.44 GB over
    the floor for one 2,048-token row, 1.30 GB in ``full``, for 8% more time on that row; docs/performance.md,
    "Memory"). A checkpoint records its function in the forward, so the forward must run inside; its backward may
    run later. ``full`` and ``light`` layers and layers without checkpointing are left as they are. Yields how many
    layers were switched (0 when off).
    """
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
              and getattr(m, "gradient_checkpointing", False) is True
              and getattr(m, "_gradient_checkpointing_func", None) is selective_checkpoint] if on else []
    for layer in layers:
        layer._gradient_checkpointing_func = FULL_CHECKPOINT
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer._gradient_checkpointing_func = selective_checkpoint


def check_mode(mode: str) -> None:
    """Raise ``ValueError`` naming the modes when ``mode`` is not one of them."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint_mode must be one of {list(CHECKPOINT_MODES)}, got {mode!r}")


def checkpointed_layers(model: nn.Module) -> dict[str, int]:
    """How many decoder layers of ``model`` (peft-wrapped or not) recompute in backward, per mode."""
    counts = dict.fromkeys(CHECKPOINT_MODES, 0)
    for module in model.modules():
        if not isinstance(module, GradientCheckpointingLayer):
            continue
        if is_light(module):
            counts["light"] += 1
        elif getattr(module, "gradient_checkpointing", False) is True:
            selective = getattr(module, "_gradient_checkpointing_func", None) is selective_checkpoint
            counts["selective" if selective else "full"] += 1
    return counts


def lighten(layer: nn.Module, on: bool = True) -> bool:
    """Make ``layer`` recompute its normalisations and its MLP's activation in backward (``light``), or undo it.

    A normalisation among ``LIGHT_NORMS`` runs as a checkpointed region that returns its output in the autocast
    dtype (when autocast is on): the projections it feeds would each cast it to that dtype anyway, and each keep its
    cast. An MLP of the gated form ``down(act(gate(x)) * up(x))`` runs its activation and product as a checkpointed
    region, so backward keeps ``gate(x)`` and ``up(x)`` and the product (the down projection's input), not also the
    activation's output. The forwards are replaced on the instances: parameter names, state dicts and adapters
    (peft wraps the projections, called by name) are unchanged. A layer of another shape is left as it is.

    Returns:
        Whether the layer is light now.
    """
    *norms, mlp = _light_parts(layer)
    for part in (*norms, mlp):
        if part is not None and "forward" in vars(part):
            del part.forward  # back to the class's forward
    if not on:
        return False
    if mlp is not None and all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        mlp.forward = types.MethodType(_light_mlp_forward, mlp)
    for norm in norms:
        if norm is not None:
            norm.forward = types.MethodType(_light_norm_forward(type(norm).forward), norm)
    return is_light(layer)


def is_light(layer: nn.Module) -> bool:
    """Whether ``lighten`` made ``layer`` light (its MLP or a normalisation runs a light forward)."""
    return any(p is not None and "forward" in vars(p) for p in _light_parts(layer))


def _light_parts(layer: nn.Module) -> list[nn.Module | None]:
    """The layer's ``LIGHT_NORMS`` and its ``mlp``, in that order (None where it has no such module)."""
    parts = [getattr(layer, name, None) for name in (*LIGHT_NORMS, "mlp")]
    return [p if isinstance(p, nn.Module) else None for p in parts]


def _light_mlp_forward(self: nn.Module, x: Tensor) -> Tensor:
    return self.down_proj(_recomputed(_gated, self.act_fn, self.gate_proj(x), self.up_proj(x)))


def _gated(act: Any, gate: Tensor, up: Tensor) -> Tensor:
    return act(gate) * up


def _light_norm_forward(forward: Any) -> Any:
    def light_forward(self: nn.Module, hidden: Tensor) -> Tensor:
        return _recomputed(_norm_in_autocast_dtype, forward, self, hidden)
    return light_forward


def _recomputed(function: Any, *args: Any) -> Any:
    """``function(*args)``, recomputed in backward (non-reentrant checkpoint) where autograd records it."""
    if not torch.is_grad_enabled():  # generation and scoring: nothing is kept, nothing to recompute
        return function(*args)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def _norm_in_autocast_dtype(forward: Any, module: nn.Module, hidden: Tensor) -> Tensor:
    out = forward(module, hidden)
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and out.is_floating_point():
        out = out.to(torch.get_autocast_dtype(device))
    return out


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


__all__ = ["CHECKPOINT_MODES", "KEPT_OPS", "LIGHT_NORMS", "CheckpointMode", "check_mode", "checkpoint_layers",
           "checkpointed_layers", "is_light", "lighten", "selective_checkpoint"]
