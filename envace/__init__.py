"""envace: train LLM tool-use agents with EnvACE world rehearsal, on PyTorch Lightning."""

from envace.runtime.noise import quiet

quiet()  # drop dependencies' messages that nobody can act on (envace.runtime.noise lists each and why)
