"""Tests for envace.policy: the tiny tokenizer/model, HFPolicy, TinyPolicy, LoRA and per-role adapters."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import BALANCE_TOOLS as TOOLS
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from envace.policy import HFPolicy, LoraSpec, Policy, TinyPolicy, use_adapter
from envace.policy.chat import render
from envace.policy.hf import mark_all_adapters_trainable
from envace.policy.tiny import MARKUP, build_model, build_tokenizer

TEXTS = [
    "Hello, world!",
    '<tool_call>\n{"name": "transfer", "arguments": {"from_account": "A-1", "amount": 250}}\n</tool_call>',
    '<execution_result>\n{"balance": 1250.5, "error": null}\n</execution_result>',
    "naïve café — 日本語 🙂 ß Ωmega",
    "  leading spaces\n\n\ttabs and\r\nCRLF  ",
    "<|im_start|>user\nhi<|im_end|>\n",
]

# ---------------------------------------------------------------------------------------------------------------------
# tiny tokenizer / model
# ---------------------------------------------------------------------------------------------------------------------


def test_tiny_tokenizer_is_deterministic_and_copy_safe() -> None:
    a, b = build_tokenizer(), build_tokenizer()
    assert a is not b
    for text in TEXTS:
        assert a.encode(text, add_special_tokens=False) == b.encode(text, add_special_tokens=False)
    a.padding_side = "right"  # mutating one build must not leak into the next
    assert build_tokenizer().padding_side == "left"


def test_tiny_tokenizer_specials(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.eos_token == "<|im_end|>"
    assert tok.padding_side == "left"
    assert "<execution_result>" in MARKUP
    for tag in [*MARKUP, "<|im_start|>", "<|im_end|>"]:
        ids = tok.encode(tag, add_special_tokens=False)
        assert ids == [tok.convert_tokens_to_ids(tag)], tag
    # markup tags are not "special": skipping special tokens keeps them, but drops the control tokens
    text = "<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_tokenizer_round_trips(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_tiny_tokenizer_has_whole_number_tokens_and_compact_domain_text(tiny_tokenizer) -> None:
    for n in (0, 7, 42, 185, 999):
        assert len(tiny_tokenizer.tokenize(str(n))) == 1, n
    assert len(tiny_tokenizer.tokenize("1234")) == 2  # numbers split into runs of at most three digits
    # Merges span words: a tool-call prefix from the domain is a few tokens, not one per word and symbol.
    call = '{"name": "get_balance", "arguments": {"account": "'
    assert len(tiny_tokenizer.tokenize(call)) <= 3
    text = "Any text at all, even 日本語 or emoji 🙂, round-trips."
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


def test_tiny_tokenizer_fits_the_domain_it_is_given(tiny_tokenizer) -> None:
    from envace.policy.tiny import build_tokenizer

    desk = build_tokenizer(domains=("desk",))
    call = '{"name": "get_ticket", "arguments": {"ticket": "'
    assert len(desk.tokenize(call)) <= 6 < 10 <= len(tiny_tokenizer.tokenize(call))  # the bank BPE splits it up
    assert build_tokenizer().get_vocab() == tiny_tokenizer.get_vocab()  # the default stays the bank's
    assert TinyPolicy(domains=["desk"]).domains == ("desk",)
    with pytest.raises(ValueError, match="domains: unknown built-in domain 'shop'; valid: bank, desk"):
        TinyPolicy(domains=["shop"])


def test_save_tiny_round_trip(tiny_dir: str, tiny_tokenizer) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "system", "content": "You are a bank agent."}, {"role": "user", "content": "Balance?"}]
    prompt = render(tok, messages, TOOLS, add_generation_prompt=True)
    assert prompt == render(tiny_tokenizer, messages, TOOLS, add_generation_prompt=True)
    for text in [*TEXTS, prompt]:
        assert tok.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tok.padding_side == "left" and tok.pad_token_id == 0

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    enc = tok([prompt], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)  # [1, P + <=5]
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_build_model_is_deterministic_and_leaves_global_rng(tiny_tokenizer) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    m1 = build_model(tiny_tokenizer, seed=3)
    assert torch.equal(torch.rand(1), expected_next)  # global RNG untouched
    m2 = build_model(tiny_tokenizer, seed=3)
    m3 = build_model(tiny_tokenizer, seed=4)
    w1, w2, w3 = (m.model.layers[0].self_attn.q_proj.weight for m in (m1, m2, m3))
    assert torch.equal(w1, w2) and not torch.equal(w1, w3)
    assert m1.config.vocab_size == len(tiny_tokenizer)
    assert not m1.training


# ---------------------------------------------------------------------------------------------------------------------
# TinyPolicy, LoRA, adapters
# ---------------------------------------------------------------------------------------------------------------------


def _trainable(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_tiny_policy_full_model() -> None:
    policy: Policy = TinyPolicy(hidden=32, layers=1, seed=1)
    model, tok = policy.build()
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert all(p.requires_grad for p in model.parameters())
    assert tok.chat_template


def test_tiny_policy_lora_trains_only_lora() -> None:
    model, _ = TinyPolicy(lora=LoraSpec(r=4)).build()
    assert isinstance(model, PeftModel)
    names = _trainable(model)
    # 2 layers x 4 target modules (q, k, v, o) x 2 matrices (A, B) = 16
    assert len(names) == 16
    assert all("lora_" in n and ".default." in n for n in names)


def _perturb_adapter(model: PeftModel, name: str) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if f"lora_B.{name}." in n:
                p.normal_(std=1.0)


def test_adapters_each_role_has_its_own_and_all_are_trainable() -> None:
    model, tok = TinyPolicy(lora=LoraSpec(r=4), adapters=["act", "rehearse"]).build()
    assert set(model.peft_config) == {"act", "rehearse"}
    assert model.active_adapter == "act"
    # 2 adapters x 16 LoRA matrices each = 32, and nothing else
    names = _trainable(model)
    assert len(names) == 32 and all("lora_" in n for n in names)

    _perturb_adapter(model, "rehearse")  # lora_B starts at zero: make the adapters differ
    ids = torch.tensor([tok.encode("Your balance is 10.", add_special_tokens=False)])  # [1, T]
    with torch.no_grad():
        act_logits = model(ids).logits
        use_adapter(model, "rehearse")
        rehearse_logits = model(ids).logits
        use_adapter(model, "act")
        act_again = model(ids).logits
    assert model.active_adapter == "act"
    assert not torch.allclose(act_logits, rehearse_logits)
    assert torch.equal(act_logits, act_again)
    assert len(_trainable(model)) == 32  # switching never freezes the inactive adapter


def test_use_adapter_preserves_frozen_state_and_none_is_noop() -> None:
    model, _ = TinyPolicy(lora=LoraSpec(r=2), adapters=["act", "rehearse"]).build()
    use_adapter(model, None)
    assert model.active_adapter == "act"
    model.requires_grad_(False)
    use_adapter(model, "rehearse")  # peft would make "rehearse" trainable; use_adapter keeps it frozen
    assert _trainable(model) == []
    mark_all_adapters_trainable(model)
    assert len(_trainable(model)) == 2 * 16


def test_use_adapter_on_plain_model_raises() -> None:
    model, _ = TinyPolicy(layers=1).build()
    with pytest.raises(TypeError, match="needs a PeftModel"):
        use_adapter(model, "act")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"adapters": ["act"]}, "adapters needs lora"),
        ({"adapters": ["a", "a"], "lora": LoraSpec()}, "unique"),
        ({"load_in_4bit": True}, "load_in_4bit needs lora"),
        ({"dtype": "float64"}, "dtype must be one of"),
    ],
)
def test_hf_policy_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HFPolicy("unused", **kwargs)


def test_policy_is_selectable_by_class_path() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--policy", type=Policy)
    cfg = parser.parse_args(
        ['--policy={"class_path": "envace.policy.TinyPolicy", "init_args": {"layers": 1, "lora": {"r": 4}}}']
    )
    policy = parser.instantiate(cfg).policy
    assert isinstance(policy, TinyPolicy)
    assert policy.layers == 1 and policy.lora == LoraSpec(r=4)


# ---------------------------------------------------------------------------------------------------------------------
# HFPolicy
# ---------------------------------------------------------------------------------------------------------------------


def test_hf_policy_constructor_does_no_work() -> None:
    start = time.perf_counter()
    HFPolicy("does/not-exist")  # nothing is loaded, so no error yet
    assert time.perf_counter() - start < 0.1


def test_hf_policy_loads_tiny_dir(tiny_dir: str, tiny_tokenizer) -> None:
    model, tok = HFPolicy(tiny_dir).build()
    assert isinstance(model, LlamaForCausalLM)
    assert tok.padding_side == "left" and tok.chat_template
    ids = torch.tensor([tok.encode("deposit 5", add_special_tokens=False)])  # [1, T]
    reference = build_model(tiny_tokenizer)  # save_tiny saved build_model(seed=0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


def test_hf_policy_dtype_lora_and_checkpointing(tiny_dir: str) -> None:
    model, _ = HFPolicy(tiny_dir, dtype="bfloat16", lora=LoraSpec(r=2), gradient_checkpointing=True).build()
    assert model.base_model.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.base_model.model.is_gradient_checkpointing
    assert len(_trainable(model)) == 16
    model.train()
    ids = torch.tensor([[5, 6, 7, 8]])  # [1, 4]
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_hf_policy_sets_missing_pad_token(tmp_path) -> None:
    tok = build_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded = HFPolicy(str(tmp_path))._load_tokenizer()
    assert loaded.pad_token == "<|im_end|>"


def test_hf_policy_without_chat_template_fails_before_loading_weights(tmp_path) -> None:
    tok = build_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path)  # tokenizer files only: no config.json, no weights
    with pytest.raises(ValueError, match="has no chat template"):
        HFPolicy(str(tmp_path)).build()


def test_hf_policy_unknown_name_is_file_not_found() -> None:
    with pytest.raises(FileNotFoundError, match="'envace-test/no-such-model' is not a local directory"):
        HFPolicy("envace-test/no-such-model").build()


def test_hf_policy_4bit_generate_then_train(tiny_dir: str) -> None:
    import bitsandbytes as bnb

    model, tok = HFPolicy(tiny_dir, load_in_4bit=True, lora=LoraSpec(r=4)).build()
    quantised = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    # 2 layers x (q, k, v, o, gate, up, down) = 14 Linear4bit (embeddings/lm_head stay unquantised)
    assert len(quantised) == 14
    assert all(m.support_avx512bf16_for_cpu is False for m in quantised)  # the CPU repacking trap is disabled

    ids = torch.tensor([tok.encode("transfer 20 to B-2", add_special_tokens=False)])  # [1, T]
    model.eval()
    with torch.no_grad():  # a rollout-style forward first: on AVX512-BF16 CPUs this used to break training
        model(ids)
    model.train()
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if p.requires_grad]
    assert len(grads) == 16 and all(g is not None for g in grads)
    # lora_B starts at zero, so only the lora_B gradients are non-zero; the first layer's must be reached
    first_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert first_b.grad.abs().sum() > 0


def test_gradient_checkpointing_takes_a_fraction_of_the_layers(tiny_dir) -> None:
    with pytest.raises(ValueError, match="gradient_checkpointing must be a bool or a fraction"):
        HFPolicy(tiny_dir, gradient_checkpointing=1.5)
    model, _ = HFPolicy(tiny_dir, gradient_checkpointing=0.5).build()
    flags = [m.gradient_checkpointing for m in model.model.layers]
    assert sum(flags) == round(len(flags) * 0.5) and flags[0]  # evenly spaced from the first layer


def test_checkpoint_mode_selects_what_a_checkpointed_layer_recomputes(tiny_dir) -> None:
    from envace.policy.checkpointing import checkpointed_layers

    with pytest.raises(ValueError, match="checkpoint_mode must be one of"):
        HFPolicy(tiny_dir, gradient_checkpointing=True, checkpoint_mode="some")  # type: ignore[arg-type]
    model, _ = HFPolicy(tiny_dir, gradient_checkpointing=True, checkpoint_mode="selective",
                        lora=LoraSpec(r=2)).build()
    layers = len(model.base_model.model.model.layers)
    assert checkpointed_layers(model) == {"full": 0, "selective": layers, "light": 0}  # seen through the peft wrapper
    model, _ = HFPolicy(tiny_dir, gradient_checkpointing=0.5).build()
    assert checkpointed_layers(model) == {"full": round(len(model.model.layers) * 0.5), "selective": 0, "light": 0}
    model, _ = HFPolicy(tiny_dir, gradient_checkpointing=True, checkpoint_mode="light").build()
    assert checkpointed_layers(model) == {"full": 0, "selective": 0, "light": len(model.model.layers)}
    assert not model.is_gradient_checkpointing  # no layer recomputes as a whole
