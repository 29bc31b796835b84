"""CachedEngine: the same tokens as ``generate``, prefix reuse inside a session only, and its parts."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from envace.engines.base import HFEngine, SamplingParams, sessions
from envace.engines.kv_engine import CachedEngine, PrefixStore, sample_categorical
from envace.policy import TinyPolicy

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def noisy():
    """The tiny policy with large random weights: greedy outputs vary token to token (the default init repeats one)."""
    model, tok = TinyPolicy().build()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval(), tok


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randrange(20, 60))] for _ in range(n)]


def _stops_at_varied_lengths(model, tok, prompts) -> list[int]:
    """Stop ids that end the greedy rows at different lengths (each row's token at a different position)."""
    free = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7]).generate(prompts, GREEDY)
    return sorted({g.token_ids[k] for g, k in zip(free, [2, 4, 6, 8, 9, 1])})


def test_greedy_tokens_equal_generate_across_turns_with_reuse(noisy) -> None:
    model, tok = noisy
    prompts = _prompts(6, model.config.vocab_size)
    stops = _stops_at_varied_lengths(model, tok, prompts)
    hf = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=stops)
    cached = CachedEngine(model, pad_id=tok.pad_token_id, stop_ids=stops)
    rng = random.Random(1)
    with cached.session():
        first_hf, first = hf.generate(prompts, GREEDY), cached.generate(prompts, GREEDY)
        assert first == first_hf
        assert len({len(g.token_ids) for g in first}) > 2  # rows left the batch at different steps
        assert cached.reused_tokens == 0
        # The next turn: each prompt extends its row (prompt + turn + a tool response of varied length).
        second_prompts = [p + g.token_ids + [rng.randrange(5, 900) for _ in range(rng.randrange(1, 30))]
                          for p, g in zip(prompts, first)]
        assert cached.generate(second_prompts, GREEDY) == hf.generate(second_prompts, GREEDY)
    fed = sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, first))  # the last sampled token is not fed
    assert cached.reused_tokens == fed
    assert len(cached.store) == 0  # the session closed: nothing outlives it


def test_no_reuse_outside_a_session(noisy) -> None:
    model, tok = noisy
    prompts = _prompts(3, model.config.vocab_size, seed=2)
    cached = CachedEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    out = cached.generate(prompts, GREEDY)
    cached.generate([p + g.token_ids for p, g in zip(prompts, out)], GREEDY)
    assert cached.reused_tokens == 0 and len(cached.store) == 0


def test_partial_prefix_is_reused_and_shared_prefixes_match(noisy) -> None:
    model, tok = noisy
    base = [random.Random(3).randrange(5, 900) for _ in range(50)]
    hf = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    cached = CachedEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    with sessions(cached, cached, None):  # duplicates and engines without sessions are fine
        turn = cached.generate([base], GREEDY)[0].token_ids
        branch = [base[:40] + [7, 8, 9] * 5, base + turn[:5] + [11] * 3]  # diverges at 40; extends the stored row
        assert cached.generate(branch, GREEDY) == hf.generate(branch, GREEDY)
        assert cached.reused_tokens == 40 + 55


def test_sampling_matches_generate_distribution_at_the_first_step(noisy) -> None:
    """First-token frequencies of the two engines agree (both draw from softmax(logits / T) after top-k)."""
    model, tok = noisy
    prompt = _prompts(1, model.config.vocab_size, seed=4)[0]
    params = SamplingParams(max_new_tokens=1, temperature=1.5, top_k=5)
    counts = []
    for engine in (HFEngine(model, tok.pad_token_id, [len(tok) + 7]), CachedEngine(model, tok.pad_token_id, [999999])):
        torch.manual_seed(0)
        firsts = [g.token_ids[0] for g in engine.generate([prompt] * 2000, params)]
        counts.append({t: firsts.count(t) / len(firsts) for t in set(firsts)})
    assert set(counts[1]) <= set(counts[0]) | set(counts[1]) and len(counts[1]) <= 5  # top-k respected
    for t in set(counts[0]) | set(counts[1]):
        assert abs(counts[0].get(t, 0) - counts[1].get(t, 0)) < 0.05


def test_min_new_tokens_masks_the_stop_tokens(noisy) -> None:
    model, tok = noisy
    prompts = _prompts(4, model.config.vocab_size, seed=5)
    stops = _stops_at_varied_lengths(model, tok, prompts)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, min_new_tokens=10)
    for engine in (HFEngine(model, tok.pad_token_id, stops), CachedEngine(model, tok.pad_token_id, stops)):
        assert [len(g.token_ids) for g in engine.generate(prompts, params)] == [10] * 4


def test_sample_categorical_draws_the_given_distribution() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_categorical(probs, generator) for _ in range(4000)])  # [N, 2]
    freq = torch.stack([(draws[:, 0] == k).float().mean() for k in range(4)])
    assert torch.allclose(freq, probs[0], atol=0.03)
    assert (draws[:, 0] != 1).all() and (draws[:, 1] == 3).all()  # zero-probability entries are never drawn


def test_sample_categorical_never_points_past_the_last_nonzero_entry() -> None:
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0]])
    for _ in range(200):
        assert sample_categorical(probs).item() in (0, 1)


def _kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, n, 2), float(n)), torch.zeros(1, n, 2))]


def test_prefix_store_finds_the_longest_prefix_and_drops_superseded_rows() -> None:
    store = PrefixStore(max_entries=3, block=4)
    store.add(list(range(10)), _kv(10))
    kv, n, key = store.lookup(list(range(10)) + [50, 51])
    assert n == 10 and kv is not None and kv[0][0][0, 0, 0] == 10
    assert store.lookup(list(range(6)) + [99] * 6)[1] == 6  # found by its first block, extended inside the next
    assert store.lookup([1, 2, 3])[1] == 0  # shorter than a block: never reused
    assert store.lookup([99] + list(range(1, 10)))[1] == 0
    store.add(list(range(12)), _kv(12), supersedes=key)  # the grown row replaces its prefix
    assert len(store) == 1 and store.lookup(list(range(12)))[1] == 12


def test_prefix_store_evicts_the_least_recently_used_and_verifies_hash_matches() -> None:
    store = PrefixStore(max_entries=2, block=4)
    rows = [[i] * 8 for i in (1, 2, 3)]
    store.add(rows[0], _kv(8))
    store.add(rows[1], _kv(8))
    store.lookup(rows[0])  # row 0 used: row 1 is now the oldest
    store.add(rows[2], _kv(8))
    assert store.lookup(rows[0])[1] == 8 and store.lookup(rows[1])[1] == 0 and store.lookup(rows[2])[1] == 8
    key = next(iter(store._index))
    store._index[key] = next(iter(store._entries))  # a forged hash hit must be rejected by the token check
    assert store.lookup([7] * 8)[1] == 0
    with pytest.raises(ValueError, match="max_entries"):
        PrefixStore(max_entries=0)
    store.clear()
    assert len(store) == 0 and store.tokens == 0


def test_prefix_store_keeps_its_tokens_under_the_token_bound() -> None:
    store = PrefixStore(max_entries=100, block=4, max_tokens=20)
    rows = [[i] * 8 for i in range(1, 6)]
    for row in rows[:2]:
        store.add(row, _kv(8))
    assert store.tokens == 16 and len(store) == 2
    store.lookup(rows[0])  # row 0 used: row 1 is the least recently used
    store.add(rows[2], _kv(8))  # 24 tokens > 20: row 1 goes
    assert store.tokens == 16 and store.lookup(rows[1])[1] == 0 and store.lookup(rows[0])[1] == 8
    store.add([9] * 30, _kv(30))  # longer than the bound alone: kept, everything older goes
    assert len(store) == 1 and store.tokens == 30
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixStore(max_tokens=-1)


def test_sliding_window_models_fall_back_to_generate(tiny_tokenizer) -> None:
    cfg = MistralConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=8,
                        pad_token_id=tiny_tokenizer.pad_token_id)
    model = MistralForCausalLM(cfg).eval()
    engine = CachedEngine(model, tiny_tokenizer.pad_token_id, [len(tiny_tokenizer) + 7])
    assert not engine.reusable
    hf = HFEngine(model, tiny_tokenizer.pad_token_id, [len(tiny_tokenizer) + 7])
    with engine.session():
        assert engine.generate([[5] * 20], GREEDY) == hf.generate([[5] * 20], GREEDY)
    plain = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert CachedEngine(plain, 0, [1]).reusable


def test_empty_prompt_is_refused(noisy) -> None:
    model, tok = noisy
    with pytest.raises(ValueError, match="at least one token"):
        CachedEngine(model, tok.pad_token_id, [tok.eos_token_id]).generate([[5, 6], []], GREEDY)


def test_a_rehearsed_rollout_is_token_identical_with_either_engine(noisy) -> None:
    """Greedy multi-turn episodes match ``generate``'s token for token, and later turns reuse the earlier ones."""
    from dataclasses import replace

    from envace.builtin.task_sets import load_task_set
    from envace.rollout.config import RolloutConfig
    from envace.rollout.runner import EpisodeRunner
    from envace.worlds import RehearseWorld

    model, tok = noisy
    more = (({"role": "user", "content": "And then?"},), ({"role": "user", "content": "Anything else to check?"},))
    tasks = [replace(t, user_turns=more) for t in load_task_set("builtin:bank-test:3")]
    config = RolloutConfig(max_turns=3, act_max_new_tokens=12, rehearse_max_new_tokens=8, act_temperature=0.0,
                           rehearse_temperature=0.0)
    streams, reused = [], 0
    for kind in (HFEngine, CachedEngine):
        engine = kind(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id])
        world = RehearseWorld()
        world.bind(tok, model)
        episodes = EpisodeRunner(tok, config).run(tasks * 2, [0, 1, 2] * 2, engine, world)
        streams.append([e.act.token_ids for e in episodes])
        reused = getattr(engine, "reused_tokens", reused)
    assert streams[0] == streams[1]
    assert reused > 0 and max(len(s) for s in streams[0]) > 100


def test_columns_of_finished_rows_are_dropped_without_changing_the_tokens(noisy) -> None:
    """A long row that stops at once leaves its columns to nobody: they are dropped, and the short row's tokens
    are unchanged."""
    model, tok = noisy
    rng = random.Random(7)
    for _ in range(20):  # find prompts where the long row's first token never occurs in the short row's output
        long, short = [rng.randrange(5, 900) for _ in range(120)], [rng.randrange(5, 900) for _ in range(20)]
        free = HFEngine(model, tok.pad_token_id, [len(tok) + 7]).generate([long, short], GREEDY)
        stop = free[0].token_ids[0]
        if stop not in free[1].token_ids:
            break
    else:
        pytest.fail("no suitable prompts")
    hf = HFEngine(model, tok.pad_token_id, [stop]).generate([long, short], GREEDY)
    cached = CachedEngine(model, tok.pad_token_id, [stop])
    seen: list[int] = []
    original = cached._decode
    cached._decode = lambda batch, tokens: (seen.append(batch.mask.shape[1]), original(batch, tokens))[1]
    assert cached.generate([long, short], GREEDY) == hf
    assert len(hf[0].token_ids) == 1 and len(hf[1].token_ids) == 10
    assert seen[0] < 60  # the 120-column prompt width shrank to the short row's own columns


def test_a_prefix_shared_by_a_calls_prompts_is_computed_once(noisy) -> None:
    model, tok = noisy
    rng = random.Random(5)
    shared = [rng.randrange(5, 900) for _ in range(48)]  # a system prompt and tool schemas, say
    tails = [[rng.randrange(5, 900) for _ in range(rng.randrange(3, 12))] for _ in range(5)]
    prompts = [shared + tail for tail in tails]
    hf = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    cached = CachedEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    with cached.session():
        assert cached.generate(prompts, GREEDY) == hf.generate(prompts, GREEDY)
    assert cached.prefilled_tokens == 48 + sum(map(len, tails))  # the prefix once, then each tail
    assert cached.reused_tokens == 48 * len(prompts)
    plain = CachedEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])
    assert plain.generate(prompts, GREEDY) == hf.generate(prompts, GREEDY)  # outside a session: nothing stored
    assert plain.prefilled_tokens == sum(map(len, prompts)) and plain.reused_tokens == 0
