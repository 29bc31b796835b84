"""The DataModule: streams freshly sampled rollouts of task batches, sharded by rank, resumable.

It loads and validates the task files in ``setup`` (before any model is built), and its training stream asks a
connected ``RolloutSampler`` (the LightningModule) to sample each batch at the moment the training step asks for
it, so every update trains on rollouts of the current weights. The DataModule never reaches into the trainer or the
model: the module connects itself through ``connect``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Protocol

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from envace.builtin.task_sets import load_task_set
from envace.types import Task


class RolloutSampler(Protocol):
    """Samples a training batch of rollouts for a batch of tasks."""

    def sample_rollouts(self, tasks: list[Task]) -> Any:
        """Rollouts of ``tasks`` under the current policy."""
        ...


def shard(order: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s share of ``order``: a stride, cut so every rank gets the same count (lockstep under FSDP)."""
    per_rank = len(order) // world_size
    return order[rank::world_size][:per_rank]


class TaskBatches:
    """Epochs of shuffled, rank-sharded task batches with a resumable position.

    Args:
        tasks: all tasks.
        batch_size: tasks per batch.
        seed: shuffling seed (epoch ``e`` uses ``seed + e``).
        shuffle: shuffle each epoch.
        rank: this process's rank.
        world_size: number of processes.
    """

    def __init__(
        self, tasks: list[Task], batch_size: int, seed: int, shuffle: bool, rank: int = 0, world_size: int = 1
    ) -> None:
        if len(tasks) < batch_size * world_size:
            raise ValueError(
                f"{len(tasks)} tasks cannot fill one batch of {batch_size} tasks on each of {world_size} processes"
            )
        self.tasks, self.batch_size, self.seed, self.shuffle = tasks, batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0  # batches already consumed in this epoch

    def batches_per_epoch(self) -> int:
        """Full batches per epoch on this rank (a trailing partial batch is dropped)."""
        return (len(self.tasks) // self.world_size) // self.batch_size

    def epoch_batches(self) -> list[list[Task]]:
        """This rank's batches of the current epoch."""
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        mine = shard(order, self.rank, self.world_size)
        n = self.batches_per_epoch() * self.batch_size
        return [[self.tasks[i] for i in mine[s : s + self.batch_size]] for s in range(0, n, self.batch_size)]

    def __iter__(self) -> Iterator[list[Task]]:
        """Endless batches, continuing from the saved position."""
        while True:
            for batch in self.epoch_batches()[self.position :]:
                self.position += 1
                yield batch
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        """Stream position, for checkpoints."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a checkpointed position."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class RolloutStream(IterableDataset):
    """Yields one freshly sampled rollout batch per task batch."""

    def __init__(self, batches: TaskBatches, sampler: RolloutSampler) -> None:
        self.batches, self.sampler = batches, sampler

    def __iter__(self) -> Iterator[Any]:
        for tasks in self.batches:
            yield self.sampler.sample_rollouts(tasks)


class TaskList(IterableDataset):
    """One rank's evaluation tasks: a stride over all of them, so every task is evaluated exactly once.

    Every rank gets the same number of batches (a rank with fewer tasks ends with a shorter or empty batch), so all
    ranks take part in the same number of evaluation steps; the rollout runner keeps their generations in lockstep.
    """

    def __init__(self, tasks: list[Task], batch_size: int, rank: int, world_size: int) -> None:
        mine = tasks[rank::world_size]
        n_batches = math.ceil(math.ceil(len(tasks) / world_size) / batch_size)
        self.batches = [mine[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]

    def __iter__(self) -> Iterator[list[Task]]:
        return iter(self.batches)


def _limit_demonstrations(tasks: list[Task], keep: int | None) -> list[Task]:
    """``tasks`` with the reference trajectory of all but the first ``keep`` removed (None keeps all)."""
    if keep is None:
        return tasks
    return [t if i < keep else replace(t, reference=()) for i, t in enumerate(tasks)]


class RolloutDataModule(L.LightningDataModule):
    """Streams rollouts of training tasks; serves validation and test tasks.

    Args:
        train_tasks: task JSONL file, or a built-in set (``builtin:bank``; ``builtin:bank:2000`` generates 2000).
            ``reference:PATH`` loads rows in the EnvACE authors' format (``docs/task-format.md``). ``PATH:N`` takes
            the first N tasks of a file (an error if it holds fewer), as do ``val_tasks`` and ``test_tasks``.
        val_tasks: tasks for ``validate`` and validation during ``fit``; None disables validation.
        test_tasks: tasks for ``test``; default: ``val_tasks``.
        batch_size: tasks per training step on each process (each is rolled out ``group_size`` times).
        eval_batch_size: tasks per evaluation batch.
        shuffle: reshuffle the training tasks every epoch.
        seed: shuffling seed.
        max_train_tasks: train on the first this-many tasks of the file only; None uses them all.
        demonstrations: keep the reference trajectory of the first this-many training tasks only; the others
            become tasks without demonstrations (RL still trains on them; the alignment term and prediction-error
            shaping only use the kept references). For a warm start from limited demonstrations and RL on more
            tasks, give SFT those first tasks and RL the same number here. None keeps every reference.
    """

    def __init__(
        self,
        train_tasks: str = "builtin:bank",
        val_tasks: str | None = None,
        test_tasks: str | None = None,
        batch_size: int = 4,
        eval_batch_size: int = 16,
        shuffle: bool = True,
        seed: int = 0,
        max_train_tasks: int | None = None,
        demonstrations: int | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError("batch_size and eval_batch_size must be at least 1")
        if max_train_tasks is not None and max_train_tasks < 1:
            raise ValueError(f"max_train_tasks must be at least 1, got {max_train_tasks}")
        if demonstrations is not None and demonstrations < 0:
            raise ValueError(f"demonstrations must be at least 0, got {demonstrations}")
        self.max_train_tasks = max_train_tasks
        self.demonstrations = demonstrations
        self.paths = {"train": train_tasks, "val": val_tasks, "test": test_tasks or val_tasks}
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.shuffle, self.seed = shuffle, seed
        self.tasks: dict[str, list[Task]] = {}
        self.sampler: RolloutSampler | None = None
        self.batches: TaskBatches | None = None
        self._pending_state: dict[str, int] | None = None

    def setup(self, stage: str) -> None:
        """Load and validate the task files this stage needs (before any model is built).

        Raises:
            ValueError: a task file the stage needs is not configured (only ``val_tasks`` is optional, for fit).
        """
        needed = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"], "predict": []}[stage]
        for split in needed:
            path = self.paths[split]
            if path is None:
                if stage == "fit" and split == "val":
                    continue  # validation during fit is optional
                raise ValueError(f"'{stage}' needs data.{split}_tasks")
            if split not in self.tasks:
                tasks = load_task_set(path)
                if split == "train":
                    tasks = _limit_demonstrations(tasks[: self.max_train_tasks], self.demonstrations)
                self.tasks[split] = tasks

    def connect(self, sampler: RolloutSampler) -> None:
        """Attach the sampler the training stream draws rollouts from."""
        self.sampler = sampler

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        """An endless stream of rollout batches (``num_workers=0``: the policy lives in this process)."""
        if self.sampler is None:
            raise RuntimeError("RolloutDataModule has no sampler: the LightningModule must call connect() in setup")
        rank, world = self._rank()
        self.batches = TaskBatches(self.tasks["train"], self.batch_size, self.seed, self.shuffle, rank, world)
        if self._pending_state is not None:
            self.batches.load_state_dict(self._pending_state)
        return DataLoader(RolloutStream(self.batches, self.sampler), batch_size=None, num_workers=0)

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank()
        dataset = TaskList(self.tasks[split], self.eval_batch_size, rank, world)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader | list[Any]:
        """Validation task batches (empty without ``val_tasks``)."""
        return self._eval_loader("val") if "val" in self.tasks else []

    def test_dataloader(self) -> DataLoader:
        """Test task batches."""
        return self._eval_loader("test")

    def state_dict(self) -> dict[str, Any]:
        """The training stream's position."""
        return self.batches.state_dict() if self.batches is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training stream where the checkpoint left it."""
        if state_dict:
            self._pending_state = dict(state_dict)
            if self.batches is not None:
                self.batches.load_state_dict(state_dict)
