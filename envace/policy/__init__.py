"""The trained model and how it reads and writes tokens.

The trained model: building it and its tokenizer (``hf``; the offline tiny model, ``tiny``), chat templates and
rendering (``chat``, ``templates``), activation checkpointing (``checkpointing``), token log-probabilities with
shared prefixes (``logprobs``), and the packaged pretrained models of ``envace prepare-model`` (``packaged``).

May import: the packages below it: envace.types, errors, runtime, losses, envs, roles, data, builtin.
"""

from envace.policy.hf import HFPolicy, LoraSpec, Policy, TinyPolicy, use_adapter

__all__ = ["HFPolicy", "LoraSpec", "Policy", "TinyPolicy", "use_adapter"]
