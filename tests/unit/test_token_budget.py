"""A step's loss and gradients do not depend on the micro-batch token budget (SFT and the RL update).

Every path that trains rows packs them into micro-batches under ``micro_batch_tokens`` and accumulates gradients;
each head is normalised over the whole step, so splitting the rows may change only the order of float sums.

Tolerance: float32 throughout (the tiny policy, no autocast). Splitting a step into micro-batches changes the order in
which per-token terms are summed: into each head, and into each parameter's gradient (one addition per micro-batch).
Each reordered sum differs by at most a few float32 ulps per term (eps = 1.2e-7), a relative error around 1e-6 for
the few hundred terms here; ``rtol=1e-4`` leaves two orders of magnitude of margin, while a normalisation mistake
(a head divided by a micro-batch's token count instead of the step's) moves the values by tens of percent. ``atol``
covers gradient entries that are sums of opposite terms and so near zero.
"""

from __future__ import annotations

from contextlib import nullcontext
from unittest import mock

import pytest
import torch
from helpers import counting_prefix_passes

from envace.builtin.task_sets import load_task_set
from envace.losses.aggregation import ConstantNorm, SeqMeanTokenMean, TokenMean
from envace.policy import TinyPolicy
from envace.rollout.collate import RolloutBatch
from envace.training.module import EnvACEModule
from envace.training.sft import SFTModule
from envace.training.update import GRPOConfig, micro_batches, sum_heads
from envace.types import Role

RTOL, ATOL = 1e-4, 1e-7


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=RTOL, atol=ATOL, msg=name)


def _sft(budget: int, share_prefix: int = 0) -> SFTModule:
    module = SFTModule(TinyPolicy(hidden=32, layers=2), micro_batch_tokens=budget, micro_batch_size=64,
                       share_prefix=share_prefix)
    module.configure_model()
    return module


def _sft_step(budget: int, share_prefix: int = 0) -> tuple[dict[str, float], dict[str, torch.Tensor], int, list[int]]:
    module = _sft(budget, share_prefix)
    batch = module.sample_rollouts(load_task_set("builtin:bank:6"))
    calls, counting = counting_prefix_passes()
    with mock.patch.object(module, "manual_backward", lambda loss: loss.backward()), counting:
        _, stats = module._loss(batch, backward=True)
    return {k: float(v) for k, v in stats.items()}, _grads(module.model), len(module._micro_batches(batch)), calls


@pytest.mark.parametrize("share_prefix", [0, 16])
def test_sft_loss_and_gradients_do_not_depend_on_the_token_budget(share_prefix: int) -> None:
    whole, whole_grads, one, whole_prefixes = _sft_step(0, share_prefix)
    split, split_grads, many, split_prefixes = _sft_step(256, share_prefix)
    assert one <= 2 and many >= 4  # the budget really split the step (one role per micro-batch with share_prefix)
    # each role's rows share one prefix (bank's act and rehearse prompts), split over several micro-batches here
    # and computed once all the same (PrefixCarry)
    assert whole_prefixes == split_prefixes == ([40, 29] if share_prefix else [])
    assert whole.keys() == split.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], rel=RTOL), key
    _assert_same(whole_grads, split_grads)


def test_sft_validation_loss_runs_in_micro_batches_and_matches_the_whole_batch() -> None:
    module = _sft(0)
    batch = module.sample_rollouts(load_task_set("builtin:bank:6"))
    with torch.no_grad():
        _, whole = module._loss(batch)
        module.micro_batch_tokens = 128
        _, split = module._loss(batch)
    for key in whole:
        assert float(split[key]) == pytest.approx(float(whole[key]), rel=RTOL), key


def _rl_batch(vocab: int, seed: int = 0, shared: int = 0) -> RolloutBatch:
    """Rows of every kind the update trains: act and rehearse policy-gradient rows, alignment and imitation rows,
    of different lengths and loss masks, with behaviour log-probs that make the clip bite on some tokens.

    ``shared``: the rows of each role begin with that role's own ``shared`` tokens, scored only after them (a system
    prompt and tool schemas that ``share_prefix`` computes once)."""
    g = torch.Generator().manual_seed(seed)
    kinds = [(Role.ACT, False)] * 6 + [(Role.REHEARSE, False)] * 5
    kinds += [(Role.REHEARSE, True)] * 3 + [(Role.ACT, True)] * 2
    n, width = len(kinds), 90
    lengths = torch.randint(20 + shared, width + 1, (n,), generator=g)
    ids = torch.randint(5, vocab, (n, width), generator=g)
    for role in (Role.ACT, Role.REHEARSE):
        rows = torch.tensor([r == role for r, _ in kinds])
        ids[rows, :shared] = torch.randint(5, vocab, (shared,), generator=g)
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    loss_mask = attention.float() * (torch.arange(width)[None, :] >= 10 + shared).float()
    loss_mask *= (torch.rand(n, width, generator=g) > 0.2).float()
    ids = torch.where(attention.bool(), ids, torch.zeros_like(ids))
    return RolloutBatch(
        input_ids=ids, attention_mask=attention, loss_mask=loss_mask,
        row_role=torch.tensor([int(r) for r, _ in kinds]), is_align=torch.tensor([a for _, a in kinds]),
        rewards=torch.zeros(n), advantages=torch.randn(n, generator=g), temperatures=torch.ones(n),
        group_ids=torch.zeros(n, dtype=torch.long), episode_ids=torch.arange(n),
        old_logps=torch.log(torch.rand(n, width, generator=g).clamp(min=1e-3)) * loss_mask - 4.0 * loss_mask,
    )


def _rl_step(aggregation: object, budget: int,
             share_prefix: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    grpo = GRPOConfig(micro_batch_size=64, micro_batch_tokens=budget, align_weight=0.5, imitate_weight=0.3,
                      share_prefix=share_prefix)
    module = EnvACEModule(TinyPolicy(hidden=32, layers=2), grpo=grpo, aggregation=aggregation)
    module.configure_model()
    torch.manual_seed(0)
    batch = _rl_batch(module.model.config.vocab_size, shared=30 if share_prefix else 0)
    calls, counting = counting_prefix_passes()
    with mock.patch.object(module, "manual_backward", lambda loss: loss.backward()), \
            mock.patch.object(module, "_peer_max", lambda count: count), counting:
        stats = module._accumulate(batch)
    assert calls == ([30, 30] if share_prefix else [])  # each role's prefix once, however the rows are split
    return sum_heads(stats), _grads(module.model), len(stats)


@pytest.mark.parametrize("share_prefix", [0, 8])
@pytest.mark.parametrize("aggregation", [TokenMean(), SeqMeanTokenMean(), ConstantNorm(64.0)],
                         ids=["token_mean", "seq_mean_token_mean", "constant_norm"])
def test_rl_update_loss_and_gradients_do_not_depend_on_the_token_budget(aggregation: object,
                                                                        share_prefix: int) -> None:
    whole, whole_grads, one = _rl_step(aggregation, 0, share_prefix)
    split, split_grads, many = _rl_step(aggregation, 200, share_prefix)
    assert one == (2 if share_prefix else 1) and many >= 4  # one role per micro-batch with share_prefix
    assert whole.keys() == split.keys()
    assert float(whole["loss_align"]) > 0 and float(whole["loss_imitate"]) > 0 and float(whole["clip_frac_act"]) > 0
    for key in whole:  # every head, and the token-weighted rates and entropies
        torch.testing.assert_close(split[key], whole[key], rtol=RTOL, atol=1e-6, msg=key)
    _assert_same(whole_grads, split_grads)


def test_micro_batches_cover_every_row_once_under_the_budget() -> None:
    batch = _rl_batch(100)
    lengths = batch.attention_mask.sum(-1)
    parts = [m.rows for m in micro_batches(batch, torch.arange(len(batch)), 64, 200)]
    assert sorted(torch.cat(parts).tolist()) == list(range(len(batch)))
    for part in parts:
        assert len(part) == 1 or len(part) * int(lengths[part].max()) <= 200
    roles = [set(batch.row_role[m.rows].tolist()) for m in micro_batches(batch, torch.arange(len(batch)), 64, 200,
                                                                       share_prefix=8)]
    assert all(len(r) == 1 for r in roles)  # one role per micro-batch when prefixes are shared


def test_rl_behaviour_logps_do_not_depend_on_the_token_budget() -> None:
    """The old and reference log-probs (no gradient) run in the same micro-batches, a split prefix carried."""
    out = []
    for budget in (0, 200):
        grpo = GRPOConfig(micro_batch_size=64, micro_batch_tokens=budget, share_prefix=8)
        module = EnvACEModule(TinyPolicy(hidden=32, layers=2), grpo=grpo)
        module.configure_model()
        batch = _rl_batch(module.model.config.vocab_size, shared=30)
        calls, counting = counting_prefix_passes()
        with mock.patch.object(module, "_peer_max", lambda count: count), counting, torch.no_grad():
            out.append(module._logps_in_chunks(batch, module.model, nullcontext))
        assert calls == [30, 30]
    torch.testing.assert_close(out[1], out[0], rtol=RTOL, atol=ATOL)
    assert out[0].abs().sum() > 0


def test_a_micro_batch_over_the_budget_is_recomputed_in_full_with_the_same_loss_and_gradients() -> None:
    """A row longer than the budget runs alone; its selective layers then run as full ones (they keep only their
    input), the micro-batches within the budget stay selective, and the step's loss and gradients do not change."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    import envace.training.base as base
    from envace.policy.checkpointing import FULL_CHECKPOINT, checkpoint_layers, selective_checkpoint
    from envace.training.update import computed_tokens

    def step(switch: bool) -> tuple[dict[str, float], dict[str, torch.Tensor], list[tuple[bool, int]]]:
        module = _sft(0)
        assert checkpoint_layers(module.model, 1.0, "selective") == 2
        batch = module.sample_rollouts(load_task_set("builtin:bank:6"))
        lengths = batch.attention_mask.sum(-1).tolist()
        module.micro_batch_tokens = sorted(lengths)[len(lengths) // 2]  # half the rows are longer than the budget
        seen: list[tuple[bool, int]] = []
        real = base.recomputed_in_full

        def recording(model: torch.nn.Module, on: bool = True):  # what each micro-batch's forward ran with
            layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            funcs = {m._gradient_checkpointing_func for m in layers}
            assert funcs == {selective_checkpoint}  # restored after every micro-batch
            return real(model, on and switch)

        with mock.patch.object(base, "recomputed_in_full", recording), \
                mock.patch.object(module, "manual_backward", lambda loss: loss.backward()):
            for planned in module._micro_batches(batch):
                with module.over_budget(planned, lengths, module.micro_batch_tokens):
                    full = sum(m._gradient_checkpointing_func is FULL_CHECKPOINT for m in module.model.modules()
                               if isinstance(m, GradientCheckpointingLayer))
                seen.append((computed_tokens(planned, lengths) > module.micro_batch_tokens, full))
            _, stats = module._loss(batch, backward=True)
        return {k: float(v) for k, v in stats.items()}, _grads(module.model), seen

    selective, selective_grads, _ = step(False)
    mixed, mixed_grads, seen = step(True)
    over = [calls for is_over, calls in seen if is_over]
    assert over and len(over) < len(seen)  # the budget put some rows alone, over it, and packed the others
    assert all(calls == 2 for calls in over)  # both layers checkpointed in full in the micro-batches over the budget
    assert all(calls == 0 for is_over, calls in seen if not is_over)
    for key in selective:
        assert mixed[key] == pytest.approx(selective[key], rel=RTOL), key
    _assert_same(selective_grads, mixed_grads)
