"""Per-role LoRA adapters (the noshare variant) served by one vLLM engine, against transformers with the same adapters.

SmolLM2-135M in float32 with two LoRA adapters whose B factors are made non-zero (peft starts them at zero, which
would make every adapter the base): greedy output through each adapter's view of the engine must equal the
transformers model with that adapter active, the two roles must write differently, and after a step that changes
one adapter and a reload the engine must follow (runs in .venv-vllm: scripts/test_vllm.sh).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from envace.engines.base import HFEngine, SamplingParams  # noqa: E402
from envace.engines.vllm_engine import VLLMEngine  # noqa: E402
from envace.engines.weights import write_adapter  # noqa: E402
from envace.policy.chat import encode, render  # noqa: E402
from envace.policy.hf import LoraSpec, apply_lora, use_adapter  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "user", "content": "Write a short poem about the sea."}]]


@pytest.fixture(scope="module")
def setup(smollm2_dir, smollm2_tokenizer, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    model = apply_lora(base, LoraSpec(r=8, alpha=16, target_modules=["q_proj", "v_proj", "o_proj"]),
                       adapters=["act", "rehearse"]).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    engine = VLLMEngine(smollm2_dir, stop_ids=[smollm2_tokenizer.eos_token_id], dtype="float32", max_lora_rank=8)
    out = tmp_path_factory.mktemp("adapters")
    for name in ("act", "rehearse"):
        engine.load_adapter(name, write_adapter(model, name, out / name))
    tok = smollm2_tokenizer
    prompts = [encode(tok, render(tok, chat, None, add_generation_prompt=True)) for chat in CHATS]
    return model, engine, out, prompts


def hf_greedy(model, tok, adapter: str, prompts: list[list[int]]) -> list[list[int]]:
    use_adapter(model, adapter)
    engine = HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id], max_batch_size=1)
    return [g.token_ids for g in engine.generate(prompts, GREEDY)]


def test_each_roles_view_generates_through_its_own_adapter(setup, smollm2_tokenizer) -> None:
    model, engine, _, prompts = setup
    act = [g.token_ids for g in engine.adapter("act").generate(prompts, GREEDY)]
    rehearse = [g.token_ids for g in engine.adapter("rehearse").generate(prompts, GREEDY)]
    assert act == hf_greedy(model, smollm2_tokenizer, "act", prompts)
    assert rehearse == hf_greedy(model, smollm2_tokenizer, "rehearse", prompts)
    assert act != rehearse  # the adapters differ enough to change greedy output: the comparison means something
    # both views run on one queue: requests of both roles in flight together, one wait returns them
    tickets = {engine.adapter("act").submit(prompts[0], GREEDY): "act",
               engine.adapter("rehearse").submit(prompts[0], GREEDY): "rehearse"}
    finished = {}
    while len(finished) < 2:
        finished.update({tickets[t]: g.token_ids for t, g in engine.wait()})
    assert finished == {"act": act[0], "rehearse": rehearse[0]}


def test_a_reloaded_adapter_replaces_the_old_one(setup, smollm2_tokenizer) -> None:
    model, engine, out, prompts = setup
    before = [g.token_ids for g in engine.adapter("act").generate(prompts, GREEDY)]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B.act" in name:
                param.mul_(-3.0)
    seconds = engine.load_adapter("act", write_adapter(model, "act", out / "act"))
    after = [g.token_ids for g in engine.adapter("act").generate(prompts, GREEDY)]
    assert seconds > 0 and after != before
    assert after == hf_greedy(model, smollm2_tokenizer, "act", prompts)
    rehearse = [g.token_ids for g in engine.adapter("rehearse").generate(prompts, GREEDY)]
    assert rehearse == hf_greedy(model, smollm2_tokenizer, "rehearse", prompts)  # the other adapter is untouched


def test_an_adapter_never_loaded_is_refused(setup) -> None:
    _, engine, _, prompts = setup
    with pytest.raises(RuntimeError, match="'judge' was never loaded"):
        engine.adapter("judge").generate(prompts, GREEDY)
