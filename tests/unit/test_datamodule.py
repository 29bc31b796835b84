"""Task batching, sharding, resumable positions and the lazily sampled rollout stream of the DataModule."""

from __future__ import annotations

import itertools

import pytest

from envace.training.datamodule import RolloutDataModule, RolloutStream, TaskBatches, TaskList, shard
from envace.types import ExpectedAnswer, SuccessSpec, Task


def make_tasks(n: int) -> list[Task]:
    success = SuccessSpec(answer=ExpectedAnswer(equals="x"))
    return [Task(id=f"t{i}", messages=({"role": "user", "content": "q"},), tools=(), success=success) for i in range(n)]


def ids(batches: list[list[Task]]) -> list[list[str]]:
    return [[t.id for t in batch] for batch in batches]


class RecordingSampler:
    """A fake ``RolloutSampler``: records every call and returns the task ids it was given."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def sample_rollouts(self, tasks: list[Task]) -> tuple[str, ...]:
        self.calls.append([t.id for t in tasks])
        return tuple(t.id for t in tasks)


# --- shard -----------------------------------------------------------------------------------------------------------


def test_shard_equal_counts_and_disjoint() -> None:
    order = list(range(10))
    # 10 // 3 = 3 per rank: strides [0,3,6,9] -> [0,3,6]; [1,4,7]; [2,5,8]
    assert [shard(order, r, 3) for r in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    order = [7, 2, 9, 4, 0, 5, 1]
    shares = [shard(order, r, 2) for r in range(2)]
    assert shares == [[7, 9, 0], [2, 4, 5]]  # 7 // 2 = 3 each, the trailing 1 dropped
    assert not set(shares[0]) & set(shares[1])
    assert shard(order, 0, 1) == order


# --- TaskBatches -----------------------------------------------------------------------------------------------------


def test_batches_have_batch_size_and_cover_an_epoch_without_repeats() -> None:
    tasks = make_tasks(10)
    batches = TaskBatches(tasks, batch_size=3, seed=0, shuffle=True)
    assert batches.batches_per_epoch() == 3  # 10 // 3, the trailing task dropped
    epoch = list(itertools.islice(iter(batches), 3))
    assert all(len(b) == 3 for b in epoch)
    seen = [t for b in ids(epoch) for t in b]
    assert len(seen) == len(set(seen)) == 9


def test_unshuffled_order() -> None:
    batches = TaskBatches(make_tasks(5), batch_size=2, seed=0, shuffle=False)
    assert ids(list(itertools.islice(iter(batches), 3))) == [["t0", "t1"], ["t2", "t3"], ["t0", "t1"]]


def test_reshuffles_per_epoch_deterministically() -> None:
    tasks = make_tasks(12)
    first = ids(list(itertools.islice(iter(TaskBatches(tasks, 4, seed=5, shuffle=True)), 6)))
    again = ids(list(itertools.islice(iter(TaskBatches(tasks, 4, seed=5, shuffle=True)), 6)))
    assert first == again  # same seed, same stream
    assert first[:3] != first[3:]  # epoch 1 is a different permutation than epoch 0
    assert sorted(t for b in first[3:] for t in b) == sorted(t.id for t in tasks)  # each epoch is a permutation
    # epoch e uses seed + e: epoch 1 of seed 5 is epoch 0 of seed 6
    shifted = ids(list(itertools.islice(iter(TaskBatches(tasks, 4, seed=6, shuffle=True)), 3)))
    assert first[3:] == shifted


def test_ranks_partition_an_epoch() -> None:
    tasks = make_tasks(10)
    per_rank = [
        ids(list(itertools.islice(iter(TaskBatches(tasks, 1, seed=3, shuffle=True, rank=r, world_size=3)), 3)))
        for r in range(3)
    ]
    # 10 // 3 = 3 tasks per rank, 1 per batch: 3 batches each, 9 distinct tasks in all
    union = [t for rank in per_rank for b in rank for t in b]
    assert len(union) == len(set(union)) == 9
    assert all(len(rank) == 3 for rank in per_rank)


# 10 tasks, batch 2: 5 batches per epoch. The epoch counter moves on when the next batch is asked for.
@pytest.mark.parametrize(
    ("consumed", "expected"),
    [(3, (0, 3)), (5, (0, 5)), (6, (1, 1)), (11, (2, 1))],  # mid-epoch, at and across epoch boundaries
)
def test_state_dict_resumes_exactly(consumed: int, expected: tuple[int, int]) -> None:
    tasks = make_tasks(10)
    original = TaskBatches(tasks, 2, seed=1, shuffle=True)
    stream = iter(original)
    for _ in range(consumed):
        next(stream)
    state = original.state_dict()
    assert state == {"epoch": expected[0], "position": expected[1]}
    resumed = TaskBatches(tasks, 2, seed=1, shuffle=True)
    resumed.load_state_dict(state)
    assert ids(list(itertools.islice(iter(resumed), 7))) == ids(list(itertools.islice(stream, 7)))


def test_state_after_a_full_epoch_continues_with_the_next_epoch() -> None:
    tasks = make_tasks(4)
    full = ids(list(itertools.islice(iter(TaskBatches(tasks, 2, seed=0, shuffle=True)), 4)))  # epochs 0 and 1
    resumed = TaskBatches(tasks, 2, seed=0, shuffle=True)
    resumed.load_state_dict({"epoch": 0, "position": 2})  # epoch 0 fully consumed
    assert ids(list(itertools.islice(iter(resumed), 2))) == full[2:]
    assert resumed.state_dict() == {"epoch": 1, "position": 2}


def test_too_few_tasks() -> None:
    with pytest.raises(ValueError, match="3 tasks cannot fill one batch of 2 tasks on each of 2 processes"):
        TaskBatches(make_tasks(3), batch_size=2, seed=0, shuffle=True, rank=0, world_size=2)


# --- RolloutStream and TaskList --------------------------------------------------------------------------------------


def test_stream_samples_lazily_one_call_per_batch() -> None:
    sampler = RecordingSampler()
    batches = TaskBatches(make_tasks(6), 2, seed=0, shuffle=False)
    stream = iter(RolloutStream(batches, sampler))
    assert sampler.calls == []  # nothing sampled ahead of time
    taken = list(itertools.islice(stream, 4))
    assert len(sampler.calls) == 4  # k items taken -> exactly k sampler calls
    assert sampler.calls == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"], ["t0", "t1"]]
    assert taken == [tuple(c) for c in sampler.calls]
    next(stream)
    assert len(sampler.calls) == 5


def test_task_list_shards_evaluation_batches() -> None:
    tasks = make_tasks(7)
    # rank 1 of 2: strides [1, 3, 5]; batches of 2: [t1, t3], [t5]
    assert ids(list(TaskList(tasks, 2, rank=1, world_size=2))) == [["t1", "t3"], ["t5"]]
    assert ids(list(TaskList(tasks, 4, rank=0, world_size=1))) == [["t0", "t1", "t2", "t3"], ["t4", "t5", "t6"]]


def test_task_list_evaluates_every_task_once_with_equal_batch_counts() -> None:
    tasks = make_tasks(10)
    # 3 ranks: ceil(10 / 3) = 4 tasks on the fullest rank, batches of 3 -> 2 batches on every rank
    per_rank = [ids(list(TaskList(tasks, 3, rank=r, world_size=3))) for r in range(3)]
    assert per_rank == [[["t0", "t3", "t6"], ["t9"]], [["t1", "t4", "t7"], []], [["t2", "t5", "t8"], []]]
    seen = sorted(t for rank in per_rank for batch in rank for t in batch)
    assert seen == sorted(f"t{i}" for i in range(10))


# --- RolloutDataModule -----------------------------------------------------------------------------------------------


def test_setup_fit_loads_the_builtin_bank() -> None:
    dm = RolloutDataModule(train_tasks="builtin:bank", batch_size=2)
    dm.setup("fit")
    assert len(dm.tasks["train"]) == 160
    assert dm.tasks["train"][0].id == "bank-train-0000-balance"
    assert "val" not in dm.tasks and dm.val_dataloader() == []


def test_missing_task_files_are_errors() -> None:
    with pytest.raises(ValueError, match="'validate' needs data.val_tasks"):
        RolloutDataModule().setup("validate")
    with pytest.raises(ValueError, match="'test' needs data.test_tasks"):
        RolloutDataModule().setup("test")
    with pytest.raises(ValueError, match="'fit' needs data.train_tasks"):
        RolloutDataModule(train_tasks=None).setup("fit")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        RolloutDataModule(batch_size=0)


def test_validate_and_test_loaders() -> None:
    dm = RolloutDataModule(val_tasks="builtin:bank", eval_batch_size=16)
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    assert [len(b) for b in batches] == [16] * 10
    assert batches[0][0].id == "bank-train-0000-balance"
    dm.setup("test")  # test_tasks defaults to val_tasks
    assert sum(len(b) for b in dm.test_dataloader()) == 160


def test_train_dataloader_needs_a_sampler() -> None:
    dm = RolloutDataModule(batch_size=2)
    dm.setup("fit")
    with pytest.raises(RuntimeError, match=r"no sampler.*connect\(\)"):
        dm.train_dataloader()


def test_train_dataloader_streams_sampled_batches() -> None:
    dm = RolloutDataModule(batch_size=3, seed=4)
    dm.setup("fit")
    sampler = RecordingSampler()
    dm.connect(sampler)
    assert dm.state_dict() == {}  # no stream yet
    loader = iter(dm.train_dataloader())
    first, second = next(loader), next(loader)
    assert len(sampler.calls) == 2
    assert list(first) == sampler.calls[0] and list(second) == sampler.calls[1]
    assert len(first) == 3
    assert dm.state_dict() == {"epoch": 0, "position": 2}


def test_state_round_trip_before_the_loader_exists() -> None:
    trained = RolloutDataModule(batch_size=4, seed=2)
    trained.setup("fit")
    trained.connect(RecordingSampler())
    loader = iter(trained.train_dataloader())
    for _ in range(41):  # 160 // 4 = 40 batches per epoch: one epoch and one batch
        next(loader)
    state = trained.state_dict()
    assert state == {"epoch": 1, "position": 1}

    resumed = RolloutDataModule(batch_size=4, seed=2)
    resumed.load_state_dict(state)  # Lightning restores the DataModule before it builds the loaders
    resumed.setup("fit")
    sampler = RecordingSampler()
    resumed.connect(sampler)
    assert list(next(iter(resumed.train_dataloader()))) == list(next(loader))
    assert resumed.state_dict() == {"epoch": 1, "position": 2}


def test_load_state_dict_updates_a_live_stream_and_ignores_empty_state() -> None:
    dm = RolloutDataModule(batch_size=4)
    dm.setup("fit")
    dm.connect(RecordingSampler())
    dm.train_dataloader()
    dm.load_state_dict({})
    assert dm.state_dict() == {"epoch": 0, "position": 0}
    dm.load_state_dict({"epoch": 3, "position": 7})
    assert dm.state_dict() == {"epoch": 3, "position": 7}


def test_max_train_tasks_keeps_the_first_tasks_only() -> None:
    dm = RolloutDataModule(train_tasks="builtin:bank", max_train_tasks=12)
    dm.setup("fit")
    full = RolloutDataModule(train_tasks="builtin:bank")
    full.setup("fit")
    assert [t.id for t in dm.tasks["train"]] == [t.id for t in full.tasks["train"][:12]]
    with pytest.raises(ValueError, match="max_train_tasks"):
        RolloutDataModule(max_train_tasks=0)


def test_demonstrations_keep_the_first_references_only() -> None:
    dm = RolloutDataModule(train_tasks="builtin:bank:6", demonstrations=2)
    dm.setup("fit")
    train = dm.tasks["train"]
    assert len(train) == 6 and all(t.reference for t in train[:2]) and not any(t.reference for t in train[2:])
    assert all(t.success.calls for t in train)  # the checklist stays: RL can still score every task
    with pytest.raises(ValueError, match="demonstrations must be at least 0"):
        RolloutDataModule(demonstrations=-1)
