"""``envace export``: a LoRA policy's adapter and merged model, and a fully trained policy, round-trip from a
Lightning checkpoint to Hugging Face folders that ``transformers`` and ``peft`` load to the same logits."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from envace.cli.command import main
from envace.cli.lightning import cli_main
from envace.worlds.rehearse import FORMAT_FILE

TINY = str(Path(__file__).parents[2] / "lit_configs" / "tiny.yaml")
LORA = '--model.policy.init_args.lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}'
THINK = "--model.world.init_args.rehearse.think=true"


def _fit(tmp_path: Path, *extra: str) -> Path:
    """One training step of the tiny config; its last checkpoint."""
    args = ["fit", "--config", TINY, f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=1",
            "--trainer.limit_val_batches=0", "--model.rollout.act_max_new_tokens=8",
            "--model.rollout.rehearse_max_new_tokens=8", *extra]
    with mock.patch.object(sys, "argv", ["envace"]):
        cli_main(args)
    (checkpoint,) = tmp_path.rglob("last.ckpt")
    return checkpoint


def _format(folder: Path) -> dict:
    """The rehearse prompt format recorded beside an exported policy."""
    return json.loads((folder / FORMAT_FILE).read_text(encoding="utf-8"))


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(5, 45).unsqueeze(0)  # [1, 40]
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@pytest.mark.slow
def test_a_lora_policy_exports_its_adapter_and_a_merged_model(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.cli.export import load_policy
    from envace.policy import TinyPolicy

    checkpoint = _fit(tmp_path / "run", LORA)
    out = tmp_path / "export"
    with mock.patch.object(sys, "argv", ["envace"]):
        main(["export", "--config", TINY, "--ckpt_path", str(checkpoint), "--out", str(out), LORA])
    trained, _ = load_policy(TINY, str(checkpoint), [LORA])
    expected = _logits(trained)
    base, _ = TinyPolicy().build()  # the adapter-free base the LoRA policy was built on
    assert not torch.allclose(_logits(base), expected)  # the step trained the adapter
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert torch.allclose(_logits(merged), expected, atol=1e-5)
    adapted = PeftModel.from_pretrained(base, out / "adapter")
    assert torch.allclose(_logits(adapted), expected, atol=1e-5)
    assert AutoTokenizer.from_pretrained(out / "merged").chat_template  # the template travels with the model
    default = {"system_prompt": None, "show_act_reasoning": False, "all_tools": False, "think": False}
    assert _format(out / "merged") == _format(out / "adapter") == default


@pytest.mark.slow
def test_a_fully_trained_policy_exports_a_merged_model_and_bad_exports_are_refused(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from envace.cli.export import load_policy

    checkpoint = _fit(tmp_path / "run", THINK)
    out = tmp_path / "export"
    with mock.patch.object(sys, "argv", ["envace"]):
        written = main(["export", "--config", TINY, "--ckpt_path", str(checkpoint), "--out", str(out), THINK])
    assert written is None and sorted(p.name for p in out.iterdir()) == ["merged"]
    assert _format(out / "merged")["think"] is True  # the format it trained with, as fit's own export records it
    trained, _ = load_policy(TINY, str(checkpoint))
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(out / "merged")), _logits(trained))
    with pytest.raises(ValueError, match=r"does not fit the policy of .*missing \[.base_model\.model"):
        load_policy(TINY, str(checkpoint), [LORA])
    with pytest.raises(FileNotFoundError, match="--ckpt_path .*nope.ckpt: no checkpoint file"):
        load_policy(TINY, str(tmp_path / "nope.ckpt"))
    with pytest.raises(SystemExit):
        main(["export", "--config", TINY, "--ckpt_path", str(checkpoint), "--out", str(out), "--no-merged"])


@pytest.mark.slow
def test_a_qlora_policy_exports_an_exact_adapter_and_a_requantised_merged_model(tmp_path: Path, tiny_dir: str) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from envace.cli.export import load_policy
    from envace.policy.hf import keep_4bit_training_kernel

    qlora = ["--model.policy=envace.policy.HFPolicy", f"--model.policy.init_args.name_or_path={tiny_dir}",
             "--model.policy.init_args.load_in_4bit=true", LORA]
    checkpoint = _fit(tmp_path / "run", *qlora)
    out = tmp_path / "export"
    with mock.patch.object(sys, "argv", ["envace"]):
        main(["export", "--config", TINY, "--ckpt_path", str(checkpoint), "--out", str(out), *qlora])
    trained, _ = load_policy(TINY, str(checkpoint), qlora)
    expected = _logits(trained)
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)

    def adapted(training_kernel: bool) -> torch.Tensor:
        base = AutoModelForCausalLM.from_pretrained(tiny_dir, quantization_config=nf4, device_map="cpu")
        return _logits(PeftModel.from_pretrained(keep_4bit_training_kernel(base) if training_kernel else base,
                                                 out / "adapter"))

    # The 4-bit base on the kernel it trained with: the same operations on the same weights, bit for bit, whatever
    # the CPU (without AVX512-BF16 bitsandbytes has only this kernel).
    assert torch.equal(adapted(training_kernel=True), expected)
    # bitsandbytes' default on an AVX512-BF16 CPU repacks the weights for a bf16 inference kernel: bf16 keeps 8
    # mantissa bits (relative error 2^-8 per product), about 1e-3 on these logits of magnitude < 1.
    assert (adapted(training_kernel=False) - expected).abs().max() < 0.05
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", device_map="cpu")
    assert (_logits(merged) - expected).abs().max() < 0.05  # merged into the base, then quantised back to 4-bit
