"""token_logps: hand-computed log-softmax values, temperature, padding, entropy and gradients with a fake model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from helpers import shared_rows
from torch import Tensor, nn

from envace.policy.logprobs import token_logps

LN2, LN3 = math.log(2.0), math.log(3.0)


@dataclass
class _Output:
    logits: Tensor


class FixedLogits(nn.Module):
    """A 'causal LM' whose logits are a fixed (trainable) tensor, whatever the input; records its inputs."""

    def __init__(self, logits: Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())
        self.seen: list[tuple[Tensor, Tensor]] = []

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> _Output:
        self.seen.append((input_ids, attention_mask))
        return _Output(self.logits[: input_ids.shape[0], : input_ids.shape[1]])


def _logits_1x3() -> Tensor:
    """V=3. Position 0 predicts token 1, position 1 predicts token 2; position 2's logits are unused."""
    return torch.tensor(
        [
            [
                [0.0, 0.0, LN2],  # softmax: exp = [1, 1, 2] -> [1/4, 1/4, 1/2]
                [LN3, 0.0, 0.0],  # softmax: exp = [3, 1, 1] -> [3/5, 1/5, 1/5]
                [5.0, -5.0, 7.0],  # unused (nothing follows the last token)
            ]
        ]
    )


IDS = torch.tensor([[0, 1, 2]])
MASK = torch.ones(1, 3, dtype=torch.long)


def test_hand_values_and_position_zero() -> None:
    model = FixedLogits(_logits_1x3())
    logps, entropy = token_logps(model, IDS, MASK)
    # token 1 after position 0: log(1/4); token 2 after position 1: log(1/5); position 0 has no prefix: 0
    expected = torch.tensor([[0.0, -math.log(4.0), -math.log(5.0)]])
    torch.testing.assert_close(logps, expected)
    assert entropy is None
    assert logps.shape == (1, 3)
    ids, mask = model.seen[0]
    assert torch.equal(ids, IDS) and torch.equal(mask, MASK)  # the model sees the batch as given


def test_padding_positions_are_zero() -> None:
    logits = _logits_1x3().repeat(2, 1, 1)  # [2, 3, 3]
    ids = torch.tensor([[0, 1, 2], [0, 1, 0]])  # row 1: last token is padding (pad id 0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logps, entropy = token_logps(FixedLogits(logits), ids, mask, with_entropy=True)
    torch.testing.assert_close(logps[1], torch.tensor([0.0, -math.log(4.0), 0.0]))
    assert entropy is not None
    assert entropy[1, 2].item() == 0.0 and entropy[1, 0].item() == 0.0
    assert entropy[1, 1].item() > 0.0


def test_temperature_two_halves_the_logits() -> None:
    logps, _ = token_logps(FixedLogits(_logits_1x3()), IDS, MASK, torch.tensor([2.0]))
    # halved position 0: exp([0, 0, ln2/2]) = [1, 1, sqrt2] -> p(1) = 1 / (2 + sqrt2)
    # halved position 1: exp([ln3/2, 0, 0]) = [sqrt3, 1, 1] -> p(2) = 1 / (2 + sqrt3)
    expected = torch.tensor([[0.0, -math.log(2 + math.sqrt(2)), -math.log(2 + math.sqrt(3))]])
    torch.testing.assert_close(logps, expected)


def test_temperature_zero_is_treated_as_one() -> None:
    model = FixedLogits(_logits_1x3().repeat(2, 1, 1))
    ids, mask = IDS.repeat(2, 1), MASK.repeat(2, 1)
    greedy, _ = token_logps(model, ids, mask, torch.tensor([0.0, 1.0]))
    plain, _ = token_logps(model, ids, mask)
    torch.testing.assert_close(greedy, plain)
    torch.testing.assert_close(greedy[0], torch.tensor([0.0, -math.log(4.0), -math.log(5.0)]))


def test_per_row_temperatures() -> None:
    model = FixedLogits(_logits_1x3().repeat(2, 1, 1))
    logps, _ = token_logps(model, IDS.repeat(2, 1), MASK.repeat(2, 1), torch.tensor([1.0, 2.0]))
    assert logps[0, 1].item() == pytest.approx(-math.log(4.0))  # row 0 at T=1
    assert logps[1, 1].item() == pytest.approx(-math.log(2 + math.sqrt(2)))  # row 1 at T=2


def test_entropy_hand_values() -> None:
    uniform = torch.zeros(1, 3, 3)  # every position uniform over V=3
    _, entropy = token_logps(FixedLogits(uniform), IDS, MASK, with_entropy=True)
    assert entropy is not None
    # uniform over V: H = log V = log 3 at every predicted position; position 0 is 0
    torch.testing.assert_close(entropy, torch.tensor([[0.0, LN3, LN3]]))
    _, entropy = token_logps(FixedLogits(_logits_1x3()), IDS, MASK, with_entropy=True)
    assert entropy is not None
    # [1/4, 1/4, 1/2]: H = 2 * (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2
    assert entropy[0, 1].item() == pytest.approx(1.5 * LN2)
    assert not entropy.requires_grad


def test_gradient_flows_to_logits() -> None:
    model = FixedLogits(_logits_1x3())
    logps, _ = token_logps(model, IDS, MASK)
    logps.sum().backward()
    grad = model.logits.grad
    assert grad is not None
    # d log softmax(z)[k] / dz = onehot(k) - softmax(z)
    # position 0, target 1: [0, 1, 0] - [1/4, 1/4, 1/2] = [-1/4, 3/4, -1/2]
    # position 1, target 2: [0, 0, 1] - [3/5, 1/5, 1/5] = [-3/5, -1/5, 4/5]
    # position 2 predicts nothing: 0
    expected = torch.tensor([[[-0.25, 0.75, -0.5], [-0.6, -0.2, 0.8], [0.0, 0.0, 0.0]]])
    torch.testing.assert_close(grad, expected)


def test_gradient_through_temperature() -> None:
    model = FixedLogits(_logits_1x3())
    logps, _ = token_logps(model, IDS, MASK, torch.tensor([2.0]))
    logps[0, 1].backward()
    grad = model.logits.grad
    assert grad is not None
    # z/2 at position 0: p = [1, 1, sqrt2] / (2 + sqrt2); grad = (onehot(1) - p) / 2
    p = torch.tensor([1.0, 1.0, math.sqrt(2)]) / (2 + math.sqrt(2))
    torch.testing.assert_close(grad[0, 0], (torch.tensor([0.0, 1.0, 0.0]) - p) / 2)
    assert torch.count_nonzero(grad[0, 1:]) == 0


@pytest.mark.parametrize("mask_keep", [True, False], ids=["mask-logits-to-keep", "older-transformers"])
def test_positions_path_equals_the_full_path_on_a_real_model(tiny_tokenizer, mask_keep, monkeypatch) -> None:
    from envace.policy import logprobs
    from envace.policy.tiny import build_model

    if mask_keep and not logprobs.MASK_LOGITS_TO_KEEP:
        pytest.skip("this transformers release has no boolean 2-D logits_to_keep")
    monkeypatch.setattr(logprobs, "MASK_LOGITS_TO_KEEP", mask_keep)  # False: the path of older releases

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    positions = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0]])  # row 1's last 1 is padding: ignored
    temps = torch.tensor([0.7, 1.3])
    full, full_ent = token_logps(model, ids, mask, temps, with_entropy=True)
    part, part_ent = token_logps(model, ids, mask, temps, with_entropy=True, positions=positions)
    scored = positions.bool() & mask.bool()
    scored[:, 0] = False  # the first token has no prefix
    torch.testing.assert_close(part[scored], full[scored])
    torch.testing.assert_close(part_ent[scored], full_ent[scored])
    assert (part[~scored] == 0).all() and (part_ent[~scored] == 0).all()


def test_positions_path_backpropagates_only_through_kept_positions(tiny_tokenizer) -> None:
    from envace.policy.tiny import build_model

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=3)
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    logps, _ = token_logps(model, ids, mask, positions=torch.tensor([[0, 0, 0, 1]]))
    logps.sum().backward()
    full, _ = token_logps(model, ids, mask)
    assert logps[0, 3].item() == pytest.approx(full[0, 3].item(), abs=1e-6)
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


# -- a shared prefix computed once (share_prefix) ----------------------------------------------------------------------


def _padded(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return ids, (ids > 0).long()


def test_prefix_groups_pick_the_runs_that_save_the_most() -> None:
    from envace.policy.logprobs import prefix_groups

    a = [1] * 10  # the prefix every row shares (a system prompt)
    rows = [a + [2] * 50 + [7, 8], a + [3] * 5 + [9], a + [2] * 50 + [5], a + [3] * 5 + [4, 4]]
    ids, mask = _padded(rows)
    nothing = torch.zeros_like(ids, dtype=torch.bool)
    # rows 0 and 2 share 60 tokens: one group saves 60 - 32; rows 1 and 3 share 15: saves -17, so they run plain,
    # and all four together share only 10 (saves 3 * 10 - 32 < 28)
    assert prefix_groups(ids, mask, nothing, min_prefix=8) == [([0, 2], 60), ([1, 3], 0)]
    assert prefix_groups(ids, mask, nothing, min_prefix=8, overhead=0) == [([0, 2], 60), ([1, 3], 15)]
    assert prefix_groups(ids, mask, nothing, min_prefix=61) == [([0, 1, 2, 3], 0)]  # nothing long enough
    keep = nothing.clone()
    keep[2, 30] = True  # row 2 is scored from position 30 on: its group's prefix ends there
    assert prefix_groups(ids, mask, keep, min_prefix=8, overhead=0) == [([0, 2], 30), ([1, 3], 15)]
    short = torch.tensor([[1, 2, 0], [1, 2, 3]])  # every row keeps one token of its own: at most 1 here
    assert prefix_groups(short, (short > 0).long(), torch.zeros_like(short, dtype=torch.bool), 1, 0) == [([0, 1], 1)]


def test_grouped_share_prefix_matches_the_plain_forward(tiny_tokenizer) -> None:
    from envace.policy import TinyPolicy

    model, _ = TinyPolicy(hidden=64, layers=2).build()
    model.train()
    g = torch.Generator().manual_seed(1)
    system = torch.randint(5, 3000, (12,), generator=g).tolist()
    tasks = [torch.randint(5, 3000, (30,), generator=g).tolist() for _ in range(2)]
    rows = [system + tasks[i % 2] + torch.randint(5, 3000, (5 + i,), generator=g).tolist() for i in range(5)]
    ids, mask = _padded(rows)
    scored = torch.zeros(ids.shape)
    for i, row in enumerate(rows):
        scored[i, 44 : len(row)] = 1
    results = []
    for share in (0, 8):
        model.zero_grad()
        logps, _ = token_logps(model, ids, mask, positions=scored, share_prefix=share)
        logps.sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (shared, shared_grads) = results
    from envace.policy.logprobs import prefix_groups

    keep = torch.nn.functional.pad(scored[:, 1:].bool() & mask[:, 1:].bool(), (0, 1))
    assert sorted(prefix_groups(ids, mask, keep, 8)) == [([0, 2, 4], 42), ([1, 3], 42)]  # two tasks' rows, two groups
    assert torch.allclose(plain, shared, atol=1e-5, rtol=1e-5) and plain.abs().sum() > 0  # float32 ulps, as below
    for a, b in zip(plain_grads, shared_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_share_prefix_gives_the_plain_forwards_logps_and_gradients(tiny_tokenizer) -> None:
    from envace.policy import TinyPolicy

    model, _ = TinyPolicy(hidden=64, layers=2).build()
    model.train()
    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    temps = torch.tensor([1.0, 0.7, 1.0, 1.3])
    results = []
    for share in (0, 8):
        model.zero_grad()
        logps, _ = token_logps(model, ids, mask, temps, positions=scored, share_prefix=share)
        logps.sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (shared, shared_grads) = results
    # float32: the prefix's keys and values are the same numbers either way; only the attention's summation order
    # (one cached prefix against one full sequence) differs, a few ulps of values of order 1-10
    assert torch.allclose(plain, shared, atol=1e-5, rtol=1e-5) and plain.abs().sum() > 0
    for a, b in zip(plain_grads, shared_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_share_prefix_falls_back_when_the_prefix_is_short_or_missing(tiny_tokenizer) -> None:
    from envace.policy import TinyPolicy

    model, _ = TinyPolicy(hidden=64, layers=2).build()
    ids, mask, scored = shared_rows(6, [10, 12], first_scored=3)  # scored inside the prefix: 2 shareable tokens
    with torch.no_grad():
        plain, _ = token_logps(model, ids, mask, positions=scored)
        shared, _ = token_logps(model, ids, mask, positions=scored, share_prefix=4)  # under the minimum of 4
    assert torch.equal(plain, shared)  # the same single forward, bit for bit


@pytest.mark.parametrize(("share", "mode"), [(1.0, "full"), (0.5, "full"), (1.0, "selective"), (0.5, "selective"),
                                            (1.0, "light"), (0.5, "light")])
def test_share_prefix_works_under_activation_checkpointing(tiny_tokenizer, share, mode) -> None:
    from envace.policy import TinyPolicy
    from envace.policy.checkpointing import checkpoint_layers, checkpointed_layers

    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    results = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model, _ = TinyPolicy(hidden=64, layers=4).build()
        if checkpointed:
            assert checkpoint_layers(model, share, mode) == round(4 * share)
            assert checkpointed_layers(model)[mode] == round(4 * share)
        model.train()
        logps, _ = token_logps(model, ids, mask, positions=scored, share_prefix=8)
        logps.sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (ckpt, ckpt_grads) = results
    # the checkpointed forward runs the same operations on the same numbers, and its recomputation in backward
    # reads the same read-only prefix states: the log-probs are bit-identical; the gradients are the same sums,
    # allowed a few ulps in case a kernel orders a reduction differently when recomputing
    assert torch.equal(plain, ckpt) and plain.abs().sum() > 0
    for a, b in zip(plain_grads, ckpt_grads):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("mode", ["selective", "light"])
@pytest.mark.parametrize("backward_in_autocast", [True, False])
def test_checkpointing_under_bf16_autocast_matches_no_checkpointing(tiny_tokenizer, backward_in_autocast,
                                                                    mode) -> None:
    """The shared prefix's pass fills autocast's cast cache before the suffix pass; backward may run inside the
    autocast region (the cache still full: Lightning's manual backward) or after it (the cache cleared)."""
    from envace.policy import TinyPolicy
    from envace.policy.checkpointing import checkpoint_layers

    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    results = []
    for run in ("float32", None, mode):
        torch.manual_seed(0)
        model, _ = TinyPolicy(hidden=64, layers=4).build()
        if run not in (None, "float32"):
            checkpoint_layers(model, 1.0, run)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run != "float32"):
            logps, _ = token_logps(model, ids, mask, positions=scored, share_prefix=8)
            if backward_in_autocast:
                logps.sum().backward()
        if not backward_in_autocast:
            logps.sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
    (_, exact_grads), (plain, plain_grads), (ckpt, ckpt_grads) = results
    # the forward runs the same kernels on the same bf16 casts of the weights and activations (a light norm casts
    # its output once where each projection cast it before): the log-probs are bit-identical
    assert torch.equal(plain, ckpt) and plain.abs().sum() > 0
    # the gradients are the same sums rounded differently: the plain forward's two passes (prefix, suffix) share
    # autocast's one cached bf16 copy of each weight, whose gradient autograd sums in bf16 before casting it to
    # float32, where the selective forward casts each weight per pass (its cast cache is off) and the two gradients
    # meet in float32; a light norm's output gradient is the bf16 sum of the three projections' (plain: three
    # float32 casts summed in float32). So each gradient must be as close to the plain one as bf16 rounding puts
    # the plain one from float32: within twice that distance, tensor by tensor (measured: 0.3x for selective,
    # 1.1x for light); a wrong gradient is off by its own size
    for exact, a, b in zip(exact_grads, plain_grads, ckpt_grads):
        assert (b - a).norm() <= 2 * (a - exact).norm()


def test_selective_checkpointing_keeps_the_matrix_products_only(tiny_tokenizer, monkeypatch) -> None:
    import envace.policy.checkpointing as checkpointing
    from envace.policy import TinyPolicy

    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    saved = {}
    for mode in (None, "full", "selective"):
        model, _ = TinyPolicy(hidden=64, layers=4).build()
        if mode:
            checkpointing.checkpoint_layers(model, 1.0, mode)
        model.train()
        saved[mode] = _saved_bytes(lambda model=model: token_logps(model, ids, mask, positions=scored, share_prefix=8))
    kept: dict[str, int] = {}
    policy = checkpointing._keep_products

    def recording(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if decision == checkpointing.CheckpointPolicy.MUST_SAVE:
            outputs = ctx.op_output if isinstance(ctx.op_output, tuple) else (ctx.op_output,)
            size = sum(t.untyped_storage().nbytes() for t in outputs if isinstance(t, Tensor))
            kept[op.name()] = kept.get(op.name(), 0) + size
        return decision

    monkeypatch.setattr(checkpointing, "_keep_products", recording)
    model, _ = TinyPolicy(hidden=64, layers=4).build()
    checkpointing.checkpoint_layers(model, 1.0, "selective")
    model.train()
    inputs = _saved_bytes(lambda: token_logps(model, ids, mask, positions=scored, share_prefix=8))
    # a selective layer keeps what a full one keeps (its input) plus the outputs of its products and attention:
    # the norms, the rotary embedding, the MLP's activation and product and the repeated keys are recomputed
    assert inputs == saved["full"]
    assert set(kept) <= {op.name() for op in checkpointing.KEPT_OPS} and "aten::mm" in kept
    assert saved["full"] < saved["full"] + sum(kept.values()) < saved[None] * 0.75


@pytest.mark.parametrize("autocast", [False, True])
def test_light_checkpointing_keeps_no_normalised_copy_no_duplicate_cast_and_no_activation_output(tiny_tokenizer,
                                                                                                autocast) -> None:
    from envace.policy import TinyPolicy
    from envace.policy.checkpointing import checkpoint_layers, checkpointed_layers

    ids = torch.randint(5, 3000, (3, 50), generator=torch.Generator().manual_seed(0))
    saved = {}
    for mode in (None, "light"):
        torch.manual_seed(0)
        model, _ = TinyPolicy(hidden=64, layers=4).build()  # intermediate 192
        if mode:
            assert checkpoint_layers(model, 1.0, mode) == 4 and checkpointed_layers(model)["light"] == 4
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            saved[mode] = _saved_bytes(lambda model=model: model(input_ids=ids, use_cache=False))
    tokens, h, i = 150, 64, 192
    # per norm: its float32 normalised copy (4h) and rsqrt (4); under autocast also the 2 + 1 extra bf16 casts of
    # the attention and MLP norms' outputs and the bf16 SiLU output, in float32 the float32 SiLU output
    per_token = 2 * (4 * h + 4) + (3 * 2 * h + 2 * i if autocast else 4 * i)
    # and each norm's weight (4h bytes), kept by the plain product with the normalised copy
    assert saved[None] - saved["light"] == 4 * (tokens * per_token + 2 * 4 * h)


def test_light_checkpointing_is_undone_and_keeps_names_copies_and_adapters(tiny_tokenizer) -> None:
    import copy

    from envace.policy import LoraSpec, TinyPolicy
    from envace.policy.checkpointing import checkpoint_layers, checkpointed_layers, is_light
    from envace.policy.hf import apply_lora

    model, _ = TinyPolicy(hidden=64, layers=4).build()
    keys = list(model.state_dict())
    assert checkpoint_layers(model, 0.5, "light") == 2
    assert [is_light(layer) for layer in model.model.layers] == [True, False, True, False]
    twin = copy.deepcopy(model)  # the export copies the model: its light forwards run on the copy's own modules
    assert checkpointed_layers(twin)["light"] == 2
    assert twin.model.layers[0].mlp.forward.__self__ is twin.model.layers[0].mlp
    assert checkpoint_layers(model, 1.0, "full") == 4 and checkpointed_layers(model) == {"full": 4, "selective": 0,
                                                                                       "light": 0}
    assert list(model.state_dict()) == keys
    checkpoint_layers(model, 1.0, "light")
    wrapped = apply_lora(model, LoraSpec(r=2, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]))
    assert checkpointed_layers(wrapped)["light"] == 4
    wrapped.train()
    ids = torch.randint(5, 3000, (2, 12))
    wrapped(input_ids=ids, use_cache=False).logits.float().sum().backward()
    lora = [p for n, p in wrapped.named_parameters() if "lora_B" in n and "mlp" in n]
    assert lora and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora)  # through the light MLP


def _saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd and checkpointing keep for backward while ``run`` runs.

    The storages are held until counted: one freed during ``run`` could otherwise hand its address to a later one,
    and the two would count once.
    """
    storages: dict[int, torch.UntypedStorage] = {}

    def pack(t: Tensor) -> Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(s.nbytes() for s in storages.values())


def _saved_prefix_bytes(model: nn.Module, ids: Tensor, mask: Tensor, scored: Tensor, prefix_len: int) -> int:
    """Bytes of the tensors autograd keeps for backward whose sequence axis is the shared prefix's."""
    saved = [0]

    def pack(t: Tensor) -> Tensor:
        if t.dim() >= 2 and prefix_len in t.shape[-3:-1]:
            saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logps(model, ids, mask, positions=scored, share_prefix=8)
    return saved[0]


def test_activation_checkpointing_also_recomputes_the_shared_prefix(tiny_tokenizer) -> None:
    from envace.policy import TinyPolicy
    from envace.policy.checkpointing import checkpoint_layers

    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    model, _ = TinyPolicy(hidden=64, layers=4).build()
    model.train()
    plain = _saved_prefix_bytes(model, ids, mask, scored, 40)
    checkpoint_layers(model, 1.0)
    checkpointed = _saved_prefix_bytes(model, ids, mask, scored, 40)
    # without checkpointing every layer keeps its prefix activations (norms, projections, MLP: tens of KB); with
    # every layer checkpointed the prefix pass keeps only what lies outside the layers (the embedding's output)
    assert plain > 0 and checkpointed < plain / 10


def test_scores_in_chunks_equal_the_whole_and_keep_no_float32_vocabulary_tensor(tiny_tokenizer, monkeypatch) -> None:
    import envace.policy.logprobs as logprobs
    from envace.policy import TinyPolicy

    ids, mask, scored = shared_rows(12, [10, 25, 7, 18], first_scored=5)
    temps = torch.tensor([1.0, 0.3, 0.0, 0.7])
    results = []
    for chunk in (10**6, 7):  # one chunk (the whole), then 7 positions at a time, with a ragged last chunk
        monkeypatch.setattr(logprobs, "SCORE_CHUNK", chunk)
        torch.manual_seed(0)
        model, _ = TinyPolicy(hidden=64, layers=2).build()
        vocab = model.config.vocab_size
        saved: list[Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
            logps, entropy = token_logps(model, ids, mask, temps, positions=scored, with_entropy=True)
        (logps * torch.arange(logps.numel()).reshape(logps.shape)).sum().backward()  # a different weight per token
        results.append((logps.detach(), entropy, [p.grad.clone() for p in model.parameters()]))
        # the float32 work is recomputed in backward: autograd keeps no vocabulary-wide tensor of its own (without
        # chunks the log-sum-exp kept its temperature-scaled input, a new [K, V] tensor)
        assert not [t for t in saved if t.shape[-1:] == (vocab,) and t._base is None]
    (whole, whole_ent, whole_grads), (chunked, chunked_ent, chunked_grads) = results
    # every operation is per position: the chunks compute the same numbers
    assert torch.equal(whole, chunked) and whole.abs().sum() > 0
    assert torch.equal(whole_ent, chunked_ent) and whole_ent.sum() > 0
    for a, b in zip(whole_grads, chunked_grads):  # the same sums; a few ulps if a kernel orders one differently
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)


def test_recomputed_in_full_keeps_what_full_checkpointing_keeps_and_restores_selective(tiny_tokenizer,
                                                                                      monkeypatch) -> None:
    from transformers.modeling_layers import GradientCheckpointingLayer

    import envace.policy.checkpointing as checkpointing
    from envace.policy import TinyPolicy

    ids, mask, scored = shared_rows(40, [10, 25, 7, 18], first_scored=42)
    kept = {"n": 0}
    policy = checkpointing._keep_products

    def counting(ctx, op, *args, **kwargs):  # selective checkpointing's policy: called for selective layers only
        decision = policy(ctx, op, *args, **kwargs)
        kept["n"] += decision == checkpointing.CheckpointPolicy.MUST_SAVE
        return decision

    monkeypatch.setattr(checkpointing, "_keep_products", counting)
    saved, grads, products = {}, {}, {}
    for mode in ("full", "selective", "switched"):
        model, _ = TinyPolicy(hidden=64, layers=4).build()
        checkpointing.checkpoint_layers(model, 1.0, "full" if mode == "full" else "selective")
        model.train()
        kept["n"] = 0
        with checkpointing.recomputed_in_full(model, on=mode == "switched") as switched:
            assert switched == (4 if mode == "switched" else 0)
            saved[mode] = _saved_bytes(lambda model=model: token_logps(model, ids, mask, positions=scored)[0].sum()
                                       .backward())
        products[mode], grads[mode] = kept["n"], [p.grad for p in model.parameters()]
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert len(layers) == 4 and (mode == "full" or all(
            m._gradient_checkpointing_func is checkpointing.selective_checkpoint for m in layers))
    # switched: the layers keep their inputs only and no product, as full ones; selective ones keep products too
    assert saved["switched"] == saved["full"] == saved["selective"]
    assert products["switched"] == products["full"] == 0 < products["selective"]
    # the same float32 operations in the same order: only what is kept for backward differs
    for a, b in zip(grads["selective"], grads["switched"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
