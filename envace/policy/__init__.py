"""Policy package: building model + tokenizer (``hf``), the offline tiny model (``tiny``), chat rendering (``chat``)."""

from envace.policy.hf import HFPolicy, LoraSpec, Policy, TinyPolicy, use_adapter

__all__ = ["HFPolicy", "LoraSpec", "Policy", "TinyPolicy", "use_adapter"]
