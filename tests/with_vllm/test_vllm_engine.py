"""``VLLMEngine`` against the transformers path on a real model (SmolLM2-135M-Instruct), on CPU.

Runs where vLLM is installed (``scripts/setup_vllm_env.sh`` makes the CPU environment; ``scripts/test_vllm.sh`` runs
this folder in it); skipped elsewhere. Both sides run in float32: greedy continuations must match token for token,
and the engine's log-probs must equal the trainer's recomputed ones within ``LOGPROB_TOL``.
"""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm")

from envace.engines.base import HFEngine, SamplingParams  # noqa: E402
from envace.engines.vllm_engine import VLLMEngine  # noqa: E402
from envace.policy.chat import encode, render  # noqa: E402

LOGPROB_TOL = 2e-3
"""float32 on both sides, but different kernels (vLLM's paged attention and fused layers against transformers' eager
ones), so log-probs agree to rounding, not bit for bit: the largest gap measured on this suite's prompts was 2.3e-5;
the bound leaves room for other CPUs' kernels while still catching a wrong weight or position (gaps of 0.1 and up)."""

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a bank assistant."}, {"role": "user", "content": "Hi, can you help me?"}],
    [{"role": "user", "content": "Count from one to five."}, {"role": "assistant", "content": "One, two, three."},
     {"role": "user", "content": "Go on."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    return [encode(tok, render(tok, chat, None, add_generation_prompt=True)) for chat in CHATS]


@pytest.fixture(scope="module")
def model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(smollm2_dir, tok):
    return VLLMEngine(smollm2_dir, stop_ids=[tok.eos_token_id], dtype="float32")


def hf_greedy(model, tok, prompts: list[list[int]]) -> list[list[int]]:
    engine = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id], max_batch_size=1)
    return [g.token_ids for g in engine.generate(prompts, GREEDY)]


def trainer_logprobs(model, prompt: list[int], continuation: list[int]) -> list[float]:
    ids = torch.tensor([prompt + continuation])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(continuation)[:, None])[:, 0].tolist()


def test_greedy_continuations_and_logprobs_match_transformers(engine, model, tok, prompts) -> None:
    ours = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in ours] == hf_greedy(model, tok, prompts)
    for prompt, gen in zip(prompts, ours):
        assert gen.logprobs is not None and len(gen.logprobs) == len(gen.token_ids)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, trainer_logprobs(model, prompt, gen.token_ids))) < (
            LOGPROB_TOL)
        assert gen.finished == (gen.token_ids[-1] == tok.eos_token_id)
    assert engine.generated_tokens == sum(len(g.token_ids) for g in ours)


def test_after_an_optimiser_step_the_engine_generates_with_the_new_weights(engine, model, tok, prompts) -> None:
    before = [g.token_ids for g in engine.generate(prompts, GREEDY)]
    trained = type(model)(model.config)
    trained.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
    target = encode(tok, " Banana banana banana.")
    ids = torch.tensor([prompts[0] + target])
    labels = ids.clone()
    labels[0, : len(prompts[0])] = -100
    trained.train()
    trained(ids, labels=labels).loss.backward()
    optimizer.step()
    trained.eval()
    seconds = engine.load_weights(trained.state_dict().items())
    after = [g.token_ids for g in engine.generate(prompts, GREEDY)]
    assert after == hf_greedy(trained, tok, prompts)
    assert after != before  # the step changed what greedy decoding writes, so the comparison means something
    assert seconds > 0 and engine.sync_seconds[-1] == seconds
    engine.load_weights(model.state_dict().items())  # and back: the prefix cache holds nothing of the trained weights
    assert [g.token_ids for g in engine.generate(prompts, GREEDY)] == before


def test_sampling_follows_the_roles_parameters(engine, tok, prompts) -> None:
    capped = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
    assert len(capped.token_ids) == 3 and not capped.finished
    floor = engine.generate(prompts[:1], SamplingParams(max_new_tokens=6, temperature=0.0, min_new_tokens=6))[0]
    assert len(floor.token_ids) == 6 and tok.eos_token_id not in floor.token_ids[:-1]
    sampled = engine.generate([prompts[3]] * 4, SamplingParams(max_new_tokens=12, temperature=1.0))
    assert len({tuple(g.token_ids) for g in sampled}) > 1
    assert engine.generate([], GREEDY) == []
