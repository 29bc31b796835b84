"""Messages from envace's dependencies that say nothing a user can act on, silenced one by one (``quiet``).

Each entry names the message and why it is noise here; everything else a dependency says is left alone.
"""

from __future__ import annotations

import logging
import warnings

LOG_NOISE: dict[str, tuple[str, ...]] = {
    # On AVX512-BF16 CPUs bitsandbytes tries the `kernels` package (which downloads kernels from a hub at run time)
    # and falls back to its own CPU kernel. envace never wants the download; the fallback is the tested path.
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
    # Advertisements for hosted services that every Trainer logs (through Lightning's rank-zero logger).
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip:",),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip:",),
}
"""Logger name -> message prefixes dropped from it."""

WARNING_NOISE: tuple[str, ...] = (
    # envace's training step takes the rollout stream's iterator on purpose (one optimiser step per rollout batch).
    r"You are using the `dataloader_iter` step flavor",
    r"Found `dataloader_iter` argument in the `training_step`",
    # Both LightningModules move rollout batches themselves (lists of episodes, not tensors), whatever the DataModule.
    r"You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a `LightningDataModule`",
    # envace's checkpoints are meant to hold the weights after the step they are numbered by (what resume needs).
    r"Using ModelCheckpoint with manual optimization and every_n_train_steps, but no pre-optimization state",
    # Lightning's own use of torch's pytree API (torch 2.13 deprecates it); nothing in envace calls it.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # envace's command and demo call LightningCLI with an explicit argument list by design.
    r"LightningCLI's args parameter is intended to run from within Python",
)
"""Regular expressions matching the start of warnings that are silenced."""


class _DropPrefixes(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record to drop."""
        return not str(record.msg).startswith(self.prefixes)


def quiet() -> None:
    """Install the filters (idempotent)."""
    for name, prefixes in LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
            logger.addFilter(_DropPrefixes(prefixes))
    for pattern in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=pattern)
