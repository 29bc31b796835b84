"""The policy's weights as a serving engine loads them: Hugging Face checkpoint names, LoRA merged, shards gathered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from peft import PeftModel
from torch import nn


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (``DTensor``) is gathered, every rank calling in the same order."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def _delta(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s LoRA update for adapter ``name`` (``scale * B @ A``) on the whole matrices.

    Linear adapters are computed here from gathered factors (a sharded ``B @ A`` is not peft's to compute); other
    layer kinds use peft's ``get_delta_weight``.
    """
    lora_a, lora_b = module.lora_A[name], module.lora_B[name]
    if not (isinstance(lora_a, nn.Linear) and isinstance(lora_b, nn.Linear)):
        return _full(module.get_delta_weight(name))
    delta = (_full(lora_b.weight) @ _full(lora_a.weight)) * module.scaling[name]
    return delta.T if getattr(module, "fan_in_fan_out", False) else delta


def policy_weights(model: nn.Module, adapter: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every weight of the base model, under the names of its Hugging Face checkpoint.

    A LoRA policy (``PeftModel``) gives its base weights with ``adapter``'s update added (``W + scale * B @ A``),
    computed beside the model: the trained weights are never merged in place, so nothing is lost to rounding.
    ``adapter`` defaults to the active one. Tensors are detached and produced one at a time, so a receiver that
    loads as it reads holds one extra weight at a time; under FSDP2 each shard is gathered as it is produced, so
    every rank must consume the iterator together, in step.

    Raises:
        ValueError: ``adapter`` is not one of the model's adapters, or the base weights are 4-bit (QLoRA); raised
            before anything is produced.
    """
    if any(type(p).__name__ == "Params4bit" for p in model.parameters()):
        raise ValueError("policy_weights: the base weights are bitsandbytes 4-bit (QLoRA); handing them to a "
                         "serving engine needs dequantised weights, which is not built: use rollout.engine: cached")
    if not isinstance(model, PeftModel):
        return ((name, _full(t).detach()) for name, t in model.state_dict().items())
    name = adapter or model.active_adapter
    if name not in model.peft_config:
        raise ValueError(f"policy_weights: no LoRA adapter {name!r} (the model has {sorted(model.peft_config)})")
    return _merged(model.get_base_model(), name)


def _merged(base: nn.Module, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    layers = {f"{module_name}.weight": module for module_name, module in base.named_modules()
              if name in getattr(module, "lora_A", {})}
    with torch.no_grad():
        for key, tensor in base.state_dict().items():
            if ".lora_" in key:
                continue
            hf_name = key.replace(".base_layer.", ".")
            weight = _full(tensor).detach()
            if hf_name in layers:
                weight = weight + _delta(layers[hf_name], name).to(weight.dtype)
            yield hf_name, weight


def base_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every base weight under its Hugging Face name, without any LoRA update.

    What a serving engine that applies the LoRA adapters itself (per-role adapters on vLLM) starts from.

    Raises:
        ValueError: the base weights are bitsandbytes 4-bit (they cannot be written as a checkpoint).
    """
    if any(type(p).__name__ == "Params4bit" for p in model.parameters()):
        raise ValueError("base_weights: the base weights are bitsandbytes 4-bit; start the engine from the "
                         "policy's checkpoint directory (model.policy.init_args.name_or_path) instead")
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    with torch.no_grad():
        for key, tensor in base.state_dict().items():
            if ".lora_" not in key:
                yield key.replace(".base_layer.", "."), _full(tensor).detach()


def write_adapter(model: PeftModel, name: str, out: Path) -> Path:
    """Write LoRA adapter ``name`` as peft saves one (``adapter_config.json``, ``adapter_model.safetensors``).

    Shards are gathered first (under FSDP2 every rank calls this together). Returns ``out``.

    Raises:
        ValueError: ``model`` has no adapter ``name``.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    if name not in getattr(model, "peft_config", {}):
        raise ValueError(f"write_adapter: no LoRA adapter {name!r} (the model has "
                         f"{sorted(getattr(model, 'peft_config', {}))})")
    out.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=name)
    with torch.no_grad():
        weights = {key: _full(t).detach().to("cpu").contiguous() for key, t in state.items()}
    save_file(weights, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config[name].save_pretrained(str(out))
    return out
