"""The weights of a run's best validation, kept in a file rather than in memory (``export_best``).

A host copy of the weights held for the whole run is memory a run pays for at every step (0.5 GB for SmolLM2-135M,
15 GB for an 8B model), and it was lost with the process: a resumed run forgot its best. ``BestWeights`` writes the
weights of each best validation to ``best_weights-step{N}.pt`` in the run's root directory (written to a temporary
name, then renamed, so a killed run never leaves a half-written file under the real name) and removes the previous
one. A checkpoint records the score and the step, so a resumed run finds its file again; where a later validation
replaced that file before the run was killed, the resumed run takes the newest file written at or before the
checkpoint's step (the file holds its score). At the end of ``fit`` the export loads it (``weights_only``,
memory-mapped) and the file is removed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

CHECKPOINT_KEY = "envace_best_weights"
PREFIX = "best_weights-step"
"""A best validation's file is ``{PREFIX}{step}.pt`` in the run's root directory."""


class BestWeights:
    """The score, step and file of the best validation so far of one logged metric.

    Args:
        metric: the logged metric to maximise (e.g. ``"val/success_act"``).
    """

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.score: float | None = None
        self.step: int | None = None
        self.path: Path | None = None

    def better(self, score: float) -> bool:
        """Whether ``score`` replaces the kept weights: higher, or tied (the later weights have trained longer)."""
        return self.score is None or score >= self.score

    def keep(self, score: float, step: int, state: dict[str, Tensor], root: str | os.PathLike[str],
             write: bool = True) -> None:
        """Record ``score`` at ``step`` as the best; ``write`` (global rank 0): save ``state``, remove the files before.

        Raises:
            OSError: the file could not be written (the previous best stays as it was).
        """
        path = Path(root) / f"{PREFIX}{step}.pt"
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            weights = {k: v.detach().cpu() for k, v in state.items()}
            torch.save({"score": score, "step": step, "state_dict": weights}, partial)
            os.replace(partial, path)
            for other in _files(path.parent).values():  # the best before, and any a resume left behind
                if other != path:
                    other.unlink(missing_ok=True)
        self.score, self.step, self.path = score, step, path

    def load(self) -> dict[str, Tensor]:
        """The kept weights, memory-mapped from their file.

        Raises:
            FileNotFoundError: the file is gone (naming it).
        """
        assert self.path is not None, "no best weights kept"
        if not self.path.is_file():
            raise FileNotFoundError(f"the best weights of {self.metric} (step {self.step}) are gone: {self.path}")
        return _read(self.path)["state_dict"]

    def remove(self) -> None:
        """Delete the file (after the export holds the same weights)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the metric, the score, the step and the file."""
        return {"metric": self.metric, "score": self.score, "step": self.step,
                "path": None if self.path is None else str(self.path)}

    def load_state_dict(self, state: dict[str, Any], checkpoint_step: int | None = None) -> None:
        """Restore a checkpoint's best (written at or before ``checkpoint_step``, the checkpoint's global step).

        Where its file is gone, the newest ``best_weights-step*.pt`` beside it written at or before that step is taken:
        a validation at the checkpoint's own step runs after the checkpoint is saved. Where none is left, or the
        checkpoint tracked another metric, the best starts over (a warning).
        """
        if state.get("score") is None or state.get("path") is None:
            return
        if state.get("metric") != self.metric:
            rank_zero_warn(f"export_best: the checkpoint tracked {state.get('metric')!r}, this run {self.metric!r}; "
                           "the best weights start over")
            return
        path = Path(state["path"])
        if not path.is_file():
            path = _newest(path.parent, checkpoint_step)
        if path is None:
            rank_zero_warn(f"export_best: the checkpoint's best weights (step {state['step']}) are gone "
                           f"({state['path']}); the best weights start over")
            return
        stored = _read(path)
        self.score, self.step, self.path = float(stored["score"]), int(stored["step"]), path


def _read(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _files(folder: Path) -> dict[int, Path]:
    """The ``best_weights-step{N}.pt`` files in ``folder``, by N."""
    found = {}
    for path in folder.glob(f"{PREFIX}*.pt"):
        step = path.stem.removeprefix(PREFIX)
        if step.isdigit():
            found[int(step)] = path
    return found


def _newest(folder: Path, before: int | None) -> Path | None:
    """The ``best_weights-step{N}.pt`` in ``folder`` with the largest N at most ``before`` (None: any), or None."""
    files = {step: path for step, path in _files(folder).items() if before is None or step <= before}
    return files[max(files)] if files else None
