"""Role-wise GRPO advantages: hand-computed values for both baselines and the degenerate cases."""

from __future__ import annotations

import math

import pytest
import torch

from envace.training.advantages import group_advantages, role_group_ids
from envace.types import Role

NAN = float("nan")


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _ids(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


@pytest.mark.parametrize("baseline", ["episode", "row"])
def test_four_episodes_mean_baseline(baseline: str) -> None:
    # mean(1, 0, 0, 1) = 0.5 -> A = r - 0.5 = [0.5, -0.5, -0.5, 0.5]
    adv = group_advantages(_t([1, 0, 0, 1]), _ids([0, 0, 0, 0]), _ids([0, 1, 2, 3]), baseline=baseline)
    torch.testing.assert_close(adv, _t([0.5, -0.5, -0.5, 0.5]))


def test_four_episodes_scale_by_std() -> None:
    # population std of (1, 0, 0, 1) = sqrt(mean(0.25, 0.25, 0.25, 0.25)) = 0.5 -> A = +-0.5 / (0.5 + 1e-6) ~ +-1
    adv = group_advantages(_t([1, 0, 0, 1]), _ids([0, 0, 0, 0]), _ids([0, 1, 2, 3]), scale_by_std=True)
    torch.testing.assert_close(adv, _t([1, -1, -1, 1]), atol=1e-5, rtol=0)


def test_row_and_episode_baselines_differ() -> None:
    rewards, groups, episodes = _t([1, 1, 1, 0]), _ids([0, 0, 0, 0]), _ids([0, 0, 0, 1])  # episode 0 has 3 rows
    # row: mean(1, 1, 1, 0) = 0.75 -> [0.25, 0.25, 0.25, -0.75]
    row = group_advantages(rewards, groups, episodes, baseline="row")
    torch.testing.assert_close(row, _t([0.25, 0.25, 0.25, -0.75]))
    # episode: episode means (1, 0) -> mean 0.5 -> [0.5, 0.5, 0.5, -0.5]
    episode = group_advantages(rewards, groups, episodes, baseline="episode")
    torch.testing.assert_close(episode, _t([0.5, 0.5, 0.5, -0.5]))


def test_std_over_episodes_vs_rows() -> None:
    rewards, groups, episodes = _t([1, 1, 1, 0]), _ids([0, 0, 0, 0]), _ids([0, 0, 0, 1])
    # episode units (1, 0): mean 0.5, std 0.5 -> [1, 1, 1, -1]
    episode = group_advantages(rewards, groups, episodes, scale_by_std=True)
    torch.testing.assert_close(episode, _t([1, 1, 1, -1]), atol=1e-5, rtol=0)
    # row units (1, 1, 1, 0): mean 0.75, var = (3 * 0.0625 + 0.5625) / 4 = 0.1875, std = 0.4330127
    # -> 0.25 / 0.4330127 = 0.5773503, -0.75 / 0.4330127 = -1.7320508
    row = group_advantages(rewards, groups, episodes, baseline="row", scale_by_std=True)
    torch.testing.assert_close(row, _t([0.5773503, 0.5773503, 0.5773503, -1.7320508]), atol=1e-5, rtol=0)


def test_single_episode_group_is_zero() -> None:
    rewards, groups, episodes = _t([1, 0]), _ids([0, 0]), _ids([5, 5])
    # one episode: no baseline information in episode mode
    assert torch.equal(group_advantages(rewards, groups, episodes), torch.zeros(2))
    # row mode sees two rows: mean 0.5 -> [0.5, -0.5]
    torch.testing.assert_close(group_advantages(rewards, groups, episodes, baseline="row"), _t([0.5, -0.5]))
    # a single row is a single unit in row mode too
    assert torch.equal(group_advantages(_t([1]), _ids([0]), _ids([0]), baseline="row"), torch.zeros(1))


@pytest.mark.parametrize("scale_by_std", [False, True])
def test_all_equal_rewards_are_zero(scale_by_std: bool) -> None:
    # 0.1 is not exactly representable: the exact-zero path must not depend on rounding of the mean
    adv = group_advantages(_t([0.1, 0.1, 0.1]), _ids([0, 0, 0]), _ids([0, 1, 2]), scale_by_std=scale_by_std)
    assert torch.equal(adv, torch.zeros(3))


def test_nan_rewards_are_zero_and_excluded() -> None:
    # valid rewards (1, 0, 0.5): mean 0.5 -> [0.5, 0, -0.5, 0]; if NaN counted as 0 the mean would be 0.375
    adv = group_advantages(_t([1, NAN, 0, 0.5]), _ids([0, 0, 0, 0]), _ids([0, 1, 2, 3]))
    torch.testing.assert_close(adv, _t([0.5, 0, -0.5, 0]))
    # NaN inside an episode: episode 0 rows (1, NaN) -> episode mean 1; episode 1 -> 0; mean 0.5
    adv = group_advantages(_t([1, NAN, 0]), _ids([0, 0, 0]), _ids([0, 0, 1]))
    torch.testing.assert_close(adv, _t([0.5, 0, -0.5]))
    # only one valid unit left -> all 0
    adv = group_advantages(_t([1, NAN]), _ids([0, 0]), _ids([0, 1]))
    assert torch.equal(adv, torch.zeros(2))


def test_role_group_ids_separate_roles_of_a_task() -> None:
    act, rehearse = int(Role.ACT), int(Role.REHEARSE)
    task = _ids([0, 0, 0, 0, 1, 1])
    role = _ids([act, act, rehearse, rehearse, act, act])
    groups = role_group_ids(task, role)
    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[4] == groups[5]
    assert len({int(groups[0]), int(groups[2]), int(groups[4])}) == 3
    rewards = _t([1, 0, 0.4, 0.2, 1, 1])
    adv = group_advantages(rewards, groups, _ids([0, 1, 0, 1, 2, 3]))
    # act (task 0): mean 0.5 -> [0.5, -0.5]; rehearse (task 0): mean 0.3 -> [0.1, -0.1]; task 1 all equal -> 0
    torch.testing.assert_close(adv, _t([0.5, -0.5, 0.1, -0.1, 0, 0]))
    # grouping by task alone would mix the roles: mean(1, 0, 0.4, 0.2) = 0.4 -> first row 0.6, not 0.5
    mixed = group_advantages(rewards, task, _ids([0, 1, 0, 1, 2, 3]), baseline="row")
    assert mixed[0].item() == pytest.approx(0.6)


def test_sparse_interleaved_group_ids() -> None:
    # groups 7 and 3 interleaved: group 7 rewards (2, 0) -> mean 1; group 3 rewards (1, 3, 5) -> mean 3
    rewards = _t([2, 1, 0, 3, 5])
    groups = _ids([7, 3, 7, 3, 3])
    adv = group_advantages(rewards, groups, _ids([0, 1, 2, 3, 4]))
    torch.testing.assert_close(adv, _t([1, -2, -1, 0, 2]))


def _loop_reference(rewards: list[float], groups: list[int], episodes: list[int], baseline: str) -> list[float]:
    """Slow per-group loop implementation (independent of the vectorised code) with scale_by_std=True."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        rows = [i for i in range(len(rewards)) if groups[i] == g and not math.isnan(rewards[i])]
        keys = sorted({episodes[i] for i in rows}) if baseline == "episode" else rows
        members = {k: [i for i in rows if (episodes[i] if baseline == "episode" else i) == k] for k in keys}
        units = [sum(rewards[i] for i in m) / len(m) for m in members.values()]
        if len(units) < 2 or len({rewards[i] for i in rows}) == 1:
            continue
        mean = sum(units) / len(units)
        std = math.sqrt(sum((u - mean) ** 2 for u in units) / len(units))
        for i in rows:
            out[i] = (rewards[i] - mean) / (std + 1e-6 if std > 1e-6 else 1.0)
    return out


@pytest.mark.parametrize("baseline", ["episode", "row"])
def test_matches_loop_reference(baseline: str) -> None:
    n = 40
    groups = torch.randint(0, 5, (n,))
    episodes = torch.randint(0, 8, (n,))
    rewards = torch.rand(n, dtype=torch.float64).round(decimals=1)
    rewards[torch.rand(n) < 0.15] = NAN
    adv = group_advantages(rewards, groups, episodes, baseline=baseline, scale_by_std=True)
    expected = _loop_reference(rewards.tolist(), groups.tolist(), episodes.tolist(), baseline)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))
    assert torch.isfinite(adv).all()


def test_dtype_preserved_and_empty_input() -> None:
    adv = group_advantages(_t([1, 0]), _ids([0, 0]), _ids([0, 1]))
    assert adv.dtype == torch.float32
    empty = group_advantages(_t([]), _ids([]), _ids([]))
    assert empty.shape == (0,)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="baseline"):
        group_advantages(_t([1, 0]), _ids([0, 0]), _ids([0, 1]), baseline="step")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(_t([1, 0]), _t([0, 0]), _ids([0, 1]))
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(_t([1, 0]), _ids([0, 0, 0]), _ids([0, 1]))
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(_ids([1, 0]), _ids([0, 0]), _ids([0, 1]))
