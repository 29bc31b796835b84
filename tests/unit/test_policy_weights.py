"""``policy_weights``: what a serving engine loads equals the policy it stands for (envace.engines.weights)."""

from __future__ import annotations

import copy

import pytest
import torch

from envace.engines.weights import policy_weights
from envace.policy.hf import LoraSpec, apply_lora
from envace.policy.tiny import build_model


@pytest.fixture
def model(tiny_tokenizer):
    return build_model(tiny_tokenizer, seed=3)


def test_a_full_model_gives_its_own_checkpoint_names_and_values(model) -> None:
    weights = dict(policy_weights(model))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert not any(t.requires_grad for t in weights.values())


def test_a_lora_policy_gives_the_merged_weights_and_stays_unmerged(model, tiny_tokenizer) -> None:
    peft_model = apply_lora(copy.deepcopy(model), LoraSpec(r=4, alpha=8))
    with torch.no_grad():  # a trained adapter: B is zero at initialisation, which would hide a missing update
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    weights = dict(policy_weights(peft_model))
    merged = copy.deepcopy(peft_model).merge_and_unload()
    assert weights.keys() == merged.state_dict().keys() == model.state_dict().keys()
    for key, value in merged.state_dict().items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6)  # float32 rounding of one add
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(weights[q], model.state_dict()[q])  # the update is in
    assert all(torch.equal(before[k], v) for k, v in peft_model.state_dict().items())  # nothing merged in place
    ids = torch.tensor([[1, 5, 9, 12]])
    served = build_model(tiny_tokenizer, seed=0)
    served.load_state_dict(weights)
    torch.testing.assert_close(served(ids).logits, peft_model(ids).logits, rtol=0, atol=1e-5)


def test_an_unknown_adapter_is_refused(model) -> None:
    peft_model = apply_lora(copy.deepcopy(model), LoraSpec(r=4, alpha=8), adapters=["act", "rehearse"])
    assert dict(policy_weights(peft_model, "rehearse")).keys() == model.state_dict().keys()
    with pytest.raises(ValueError, match="no LoRA adapter 'world'"):
        policy_weights(peft_model, "world")


def test_4bit_base_weights_are_refused_not_handed_over_packed(model) -> None:
    class Params4bit(torch.nn.Parameter):  # what bitsandbytes' QLoRA base weights are
        pass

    layer = model.model.layers[0].mlp.up_proj
    layer.weight = Params4bit(layer.weight.data, requires_grad=False)
    with pytest.raises(ValueError, match="4-bit"):
        policy_weights(model)
