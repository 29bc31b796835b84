"""``envace export``: a trained policy out of a Lightning checkpoint, in Hugging Face format.

::

    envace export --config lit_configs/qwen7b.yaml --ckpt_path runs/qwen7b/.../last.ckpt --out exports/qwen7b

The config (and any ``--key=value`` overrides after it, as for ``envace fit``) rebuilds the policy exactly as it was
trained; the checkpoint's weights are loaded into it (``torch.load(weights_only=True)``), and written as

- ``<out>/merged``: the full model with any LoRA adapters merged in, and the tokenizer. ``transformers``'
  ``AutoModelForCausalLM.from_pretrained`` loads it with nothing of envace installed;
- ``<out>/adapter``: for a LoRA or QLoRA policy, the adapter(s) alone (``peft``'s format) and the tokenizer, to load
  on top of the base model with ``PeftModel.from_pretrained``. For QLoRA, load the base in 4-bit as in training;
  this reproduces the trained policy exactly when the 4-bit layers compute as in training. On a GPU, or a CPU
  without AVX512-BF16, they always do. On a CPU with AVX512-BF16, bitsandbytes by default repacks 4-bit weights
  for a bf16 inference kernel at the first no-grad forward (logits about 1e-3 apart on the tiny model); call
  ``envace.policy.hf.keep_4bit_training_kernel(base)`` before loading the adapter to keep training's kernel.
  The merged model of a QLoRA policy is 4-bit again: the adapters are merged into the dequantised base, which is
  quantised back, a small rounding (a largest logit difference of 0.007 on the tiny model).

Each folder also holds ``envace_rehearse.json``, the rehearse prompt settings the policy was trained with (as
``envace fit``'s own export writes it), so a later stage refuses a policy prompted otherwise.

A checkpoint written by ``ModelParallelStrategy`` (FSDP2) holds sharded weights in a folder: consolidate it with
Lightning first; ``envace export`` reads one file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from peft import PeftModel

from envace.training.export import export


def load_policy(config: str, ckpt_path: str, overrides: list[str] | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the config's policy, built, with the checkpoint's policy weights loaded."""
    module = load_module(config, ckpt_path, overrides)
    return module.model.eval(), module.tokenizer


def load_module(config: str, ckpt_path: str, overrides: list[str] | None = None) -> Any:
    """The config's module (``EnvACEModule`` or ``SFTModule``), its policy built, with the checkpoint's weights.

    Raises:
        FileNotFoundError: no checkpoint file at ``ckpt_path``.
        ValueError: the checkpoint holds no policy weights, or they do not fit the config's policy (the keys are
            named).
    """
    from envace.cli.lightning import ConfigCheckCLI, cli_main

    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no checkpoint file there")
    module = cli_main(["--config", config, *(overrides or [])], run=False, cli_class=ConfigCheckCLI).model
    module.configure_model()
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    weights = {k.removeprefix("model."): v for k, v in checkpoint.get("state_dict", {}).items()
               if k.startswith("model.")}
    if not weights:
        raise ValueError(f"{ckpt_path}: no policy weights ('model.*' keys in its state_dict)")
    missing, unexpected = _load(module.model, weights)
    if missing or unexpected:
        raise ValueError(f"{ckpt_path} does not fit the policy of {config}: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]} (was it trained with another policy or LoRA setting?)")
    module.model.eval()
    return module


def _load(model: Any, weights: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load ``weights``; a LoRA policy takes only its adapters (its frozen base is the config's, rebuilt as trained).

    Returns the missing and unexpected keys. A 4-bit (QLoRA) base keeps its quantisation state in extra keys that a
    plain ``load_state_dict`` cannot take, which is one more reason to load the adapters alone.
    """
    if not isinstance(model, PeftModel):
        missing, unexpected = model.load_state_dict(weights, strict=False)
        return list(missing), list(unexpected)
    adapters = {k: v for k, v in weights.items() if "lora_" in k}
    own = {k for k in model.state_dict() if "lora_" in k}
    _, unexpected = model.load_state_dict(adapters, strict=False)
    return sorted(own - set(adapters)), list(unexpected)


def main(argv: list[str]) -> dict[str, str]:
    """``envace export --config C --ckpt_path P --out DIR [--no-merged] [--key=value ...]``."""
    parser = argparse.ArgumentParser(prog="envace export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the config the policy was trained with")
    parser.add_argument("--ckpt_path", required=True, help="a Lightning checkpoint file (e.g. last.ckpt)")
    parser.add_argument("--out", required=True, help="output folder: <out>/merged and, with LoRA, <out>/adapter")
    parser.add_argument("--no-merged", action="store_true", help="write only the adapter of a LoRA policy")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if not o.startswith("--")]
    if bad:
        parser.error(f"unrecognised arguments: {' '.join(bad)} (overrides are --key=value, as for envace fit)")
    module = load_module(args.config, args.ckpt_path, overrides)
    if args.no_merged and not isinstance(module.model, PeftModel):
        parser.error("--no-merged: the policy has no LoRA adapter, so the merged model is all there is to export")
    written = export(module.model, module.tokenizer, args.out, merged=not args.no_merged, prompter=module.prompter)
    for kind, where in written.items():
        rank_zero_info(f"exported the {kind} policy to {where}")
    return written
