"""Crash-safe checkpoint files: written atomically, loaded as plain data, a damaged file named with its alternatives.

Lightning's default writer stages a checkpoint in the system's temporary folder and moves it into place. Across
filesystems that move is a copy into the target path, so a process killed mid-copy leaves a truncated checkpoint
where the previous good one was; nothing is flushed to disk either. ``AtomicCheckpointIO`` writes next to the target,
flushes the file to disk, renames it over the target (``os.replace``, atomic on POSIX and Windows) and flushes the
folder: at any instant the path holds either the complete previous checkpoint or the complete new one.

The ``envace`` command installs it on every Trainer that has no checkpoint plugin of its own (``envace.cli.lightning``).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from envace.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file that cannot be loaded: truncated, corrupt, or holding objects that are not plain data."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic and whose loads are ``weights_only`` with clear errors.

    Remote paths (``s3://``, ...) are written by Lightning's own writer (object stores commit whole objects).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` through a flushed temporary file renamed over it."""
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO.save_checkpoint takes no storage_options, got {storage_options!r}")
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.partial-{os.getpid()}")
        try:
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _sync_folder(target.parent)

    def load_checkpoint(self, path: _PATH, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Load ``path`` as plain data (``weights_only=True`` unless asked otherwise), naming what is wrong with it.

        Raises:
            FileNotFoundError: no file at ``path``.
            CheckpointError: the file is truncated or corrupt, or holds objects that are not plain data.
        """
        if "://" not in str(path) and not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        try:
            return super().load_checkpoint(path, map_location, True if weights_only is None else weights_only)
        except pickle.UnpicklingError as err:
            whole = "://" in str(path) or zipfile.is_zipfile(path)  # torch.save writes a zip: a broken one is not
            if whole and ("weights_only" in str(err) or "Weights only load failed" in str(err)):
                raise CheckpointError(
                    f"checkpoint {path} holds objects other than plain data (tensors, numbers, strings, lists, "
                    "dicts); envace loads checkpoints with weights_only=True and never unpickles code from them. "
                    f"Detail: {str(err).splitlines()[0]}") from err
            raise CheckpointError(damaged_message(path, err)) from err
        except Exception as err:  # noqa: BLE001 - torch's unpicklers raise anything (IndexError, KeyError, ...) on
            raise CheckpointError(damaged_message(path, err)) from err  # damaged bytes; each is reported


def damaged_message(path: _PATH, err: BaseException) -> str:
    """What is wrong with the checkpoint ``path`` that raised ``err`` on reading, and the earlier ones beside it."""
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    message = (f"checkpoint {path} cannot be read ({type(err).__name__}: {detail}); the file is truncated or "
               "corrupt, or not a checkpoint")
    others = _other_checkpoints(path)
    if others:
        message += "; resume from an earlier one with --ckpt_path=<file>: " + ", ".join(others)
    return message


def _other_checkpoints(path: _PATH) -> list[str]:
    """The other ``.ckpt`` files next to ``path``, newest first."""
    if "://" in str(path):
        return []
    target = Path(path)
    files = [p for p in target.parent.glob("*.ckpt") if p.resolve() != target.resolve() and p.is_file()]
    return [str(p) for p in sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)]


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entry list to disk, so the rename survives a power loss (a no-op where unsupported)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    """This process's random states (Python, NumPy, torch CPU and CUDA) as plain data a ``weights_only`` load reads."""
    import random

    import numpy as np

    kind, keys, position, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned (CUDA states only where this process has as many devices)."""
    import random

    import numpy as np

    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["position"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _as_tuple(value: Any) -> Any:
    """``random.getstate()``'s nested tuples, which a checkpoint round trip may have turned into lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


MOVED: dict[str, str] = {
    "envace.module": "envace.training.module", "envace.sft": "envace.training.sft",
    "envace.base_module": "envace.training.base", "envace.update": "envace.training.update",
    "envace.advantages": "envace.training.advantages", "envace.memory": "envace.training.memory",
    "envace.data.datamodule": "envace.training.datamodule", "envace.logprobs": "envace.policy.logprobs",
    "envace.models": "envace.policy.packaged", "envace.chat_model": "envace.engines.chat_model",
    "envace.rollout.engine": "envace.engines.base", "envace.rollout.kv_engine": "envace.engines.kv_engine",
    "envace.rollout.vllm_engine": "envace.engines.vllm_engine", "envace.rollout.weights": "envace.engines.weights",
    "envace.rollout.stream": "envace.engines.stream", "envace.users": "envace.worlds.users",
    "envace.scoring": "envace.rewards.scoring", "envace.private_rehearsal": "envace.rollout.private_rehearsal",
    "envace.fidelity": "envace.world_model.fidelity", "envace.audit": "envace.world_model.audit",
    "envace.guard": "envace.world_model.guard", "envace.quality": "envace.world_model.quality",
    "envace.alignment": "envace.world_model.alignment", "envace.evaluation": "envace.evaluation.evaluator",
    "envace.metrics": "envace.evaluation.metrics", "envace.task_sets": "envace.builtin.task_sets",
    "envace.noise": "envace.runtime.noise", "envace.progress": "envace.runtime.progress",
    "envace.cpu_precision": "envace.runtime.cpu_precision", "envace.distributed": "envace.runtime.distributed",
    "envace.checkpoint": "envace.runtime.checkpoint",
}
"""Modules that moved when envace's layout changed (old -> new): a class path of a checkpoint written before names
the old module, and ``upgrade_class_paths`` renames it."""
MOVED_CLASSES: dict[str, str] = {
    f"envace.rewards.checklist.{name}": f"envace.rewards.judges.{name}" for name in ("HTTPJudge", "LocalJudge",
                                                                                     "ScriptedJudge")
}
"""Classes that moved between modules of one package (old class path -> new), beyond ``MOVED``'s whole modules."""


def upgrade_class_paths(value: Any) -> Any:
    """``value`` (a checkpoint's hyperparameters: dicts, lists, strings) with every moved class path renamed.

    A string is renamed when it is a class path ``envace.<module>.<Name>`` whose module moved (``MOVED``) or whose
    class moved (``MOVED_CLASSES``), so a checkpoint written before the move resumes (``envace fit --ckpt_path``)
    and loads (``load_from_checkpoint``) with the class paths of today. Nothing is imported.
    """
    if isinstance(value, dict):
        return {key: upgrade_class_paths(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(upgrade_class_paths(item) for item in value)
    if not isinstance(value, str) or not value.startswith("envace.") or " " in value:
        return value
    module, _, name = value.rpartition(".")
    if module in MOVED and name[:1].isupper():
        value = f"{MOVED[module]}.{name}"
    return MOVED_CLASSES.get(value, value)
