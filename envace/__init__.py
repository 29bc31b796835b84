"""envace: train LLM tool-use agents with EnvACE world rehearsal, on PyTorch Lightning."""

from envace.noise import quiet

quiet()  # drop dependencies' messages that nobody can act on (envace.noise lists each and why)
