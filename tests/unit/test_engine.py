"""HFEngine: greedy decoding equals a hand-rolled argmax loop, whatever the checkpoint's generation defaults."""

from __future__ import annotations

import torch

from envace.engines.base import HFEngine, SamplingParams, cut_at_stop
from envace.policy import TinyPolicy


def manual_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_greedy_matches_argmax_and_ignores_checkpoint_defaults() -> None:
    model, tok = TinyPolicy().build()
    model.generation_config.repetition_penalty = 5.0  # a checkpoint default that must not leak into rollouts
    model.generation_config.top_k = 3
    engine = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[len(tok) + 7])  # a stop id that never occurs
    prompts = [[5, 6, 7, 8, 9], [11, 12]]  # different lengths: left padding must not change the result
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for prompt, gen in zip(prompts, out):
        assert gen.token_ids == manual_greedy(model, prompt, 6)
        assert not gen.finished
    assert engine.generated_tokens == 12


def test_sampling_is_seeded() -> None:
    model, tok = TinyPolicy().build()
    engine = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id])
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    torch.manual_seed(3)
    first = engine.generate([[5, 6, 7]] * 3, params)
    torch.manual_seed(3)
    assert engine.generate([[5, 6, 7]] * 3, params) == first


def test_cut_at_stop() -> None:
    assert cut_at_stop([4, 5, 2, 0, 0], {2}, pad_id=0).token_ids == [4, 5, 2]
    cut = cut_at_stop([4, 5, 0, 0], {2}, pad_id=0)
    assert cut.token_ids == [4, 5] and not cut.finished
