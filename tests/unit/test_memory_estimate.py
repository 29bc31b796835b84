"""The peak-memory estimate and the check that stops a run that cannot fit before its first step."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from envace.cli.command import main
from envace.training.memory import (
    GIB,
    PROCESS_BYTES,
    MemoryEstimate,
    OutOfMemoryPlan,
    Workload,
    activation_bytes_per_token,
    check_fits,
    estimate,
    kv_bytes_per_token,
)

ROOT = Path(__file__).parents[2]


def _smollm2_shape() -> LlamaConfig:
    """SmolLM2-135M's shape (30 layers, hidden 576, MLP 1536, 9 heads of 64, 3 KV heads, vocabulary 49152)."""
    return LlamaConfig(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                       num_key_value_heads=3, head_dim=64, vocab_size=49152)


def test_per_token_sizes_by_hand() -> None:
    config = _smollm2_shape()
    # per layer: 40 x 576 + 10 x 1536 + 8 x (3 x 64) = 23040 + 15360 + 1536 = 39936 bytes; 30 layers
    assert activation_bytes_per_token(config, mixed=True) == 30 * 39936
    assert activation_bytes_per_token(config, mixed=False) == 30 * int(39936 * 1.6)
    # checkpointing keeps each layer's float32 input (4 x 576) and one layer's activations
    assert activation_bytes_per_token(config, mixed=True, checkpointed=30) == 30 * 4 * 576 + 39936
    assert activation_bytes_per_token(config, mixed=True, checkpointed=10) == 20 * 39936 + 10 * 4 * 576 + 39936
    # selective checkpointing keeps the input and, in bf16, the products' outputs: 4 x 576 (q, attention output, o,
    # down) + 2 x 192 (k, v) + 2 x 1536 (gate, up) = 5760 values x 2 bytes, + 4 x 576 = 13824 bytes a layer
    assert activation_bytes_per_token(config, mixed=True, selective=30) == 30 * 13824 + 39936
    assert activation_bytes_per_token(config, mixed=False, selective=30) == 30 * (4 * 5760 + 4 * 576) + int(
        39936 * 1.6)
    assert activation_bytes_per_token(config, mixed=True, checkpointed=10, selective=10) == (
        10 * 39936 + 10 * 4 * 576 + 10 * 13824 + 39936)
    # a light layer keeps its two norms' float32 inputs (2 x 4 x 576) and, in bf16, their outputs, q and the
    # attention output (4 x 576), k and v (2 x 192), gate, up and their product (3 x 1536): 2 x 7296 + 4608 = 19200
    # bytes (measured on SmolLM2: 19.0 KB a layer-token); nothing is recomputed at layer scale
    assert activation_bytes_per_token(config, mixed=True, light=30) == 30 * 19200
    assert activation_bytes_per_token(config, mixed=False, light=30) == 30 * (4 * 7296 + 8 * 576)
    assert activation_bytes_per_token(config, mixed=True, selective=10, light=20) == 10 * 13824 + 20 * 19200 + 39936
    assert kv_bytes_per_token(config, 2) == 2 * 30 * 192 * 2


def test_the_estimate_counts_checkpointed_layers_by_mode() -> None:
    from envace.policy.checkpointing import checkpoint_layers

    config = LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    work = Workload(micro_batch_tokens=1000, scored_tokens=0)
    plain = estimate(LlamaForCausalLM(config), work, mixed=True).parts["activations"]
    for mode, share, full, selective, light in (("full", 0.5, 2, 0, 0), ("selective", 1.0, 0, 4, 0),
                                                ("light", 0.5, 0, 0, 2)):
        model = LlamaForCausalLM(config)
        checkpoint_layers(model, share, mode)
        got = estimate(model, work, mixed=True).parts["activations"]
        assert got == 1000 * activation_bytes_per_token(config, True, full, selective, light) < plain


def test_the_estimate_adds_weights_gradients_optimizer_activations_logits_and_caches() -> None:
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    model = LlamaForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    work = Workload(micro_batch_tokens=1000, scored_tokens=300, generation_rows=4, generation_tokens=50,
                    store_tokens=500)
    got = estimate(model, work, mixed=True)
    kv = kv_bytes_per_token(config, 2)
    assert got.parts == {
        "process": PROCESS_BYTES, "weights": 4 * n + 2 * n, "gradients": 4 * n, "optimizer": 8 * n,
        "activations": 1000 * activation_bytes_per_token(config, True), "logits": 300 * 100 * 8,
        "engine_cache": 4 * 50 * kv, "prefix_store": 500 * kv,
    }
    model.requires_grad_(False)
    frozen = estimate(model, work, mixed=False).parts
    assert frozen["gradients"] == 0 and frozen["optimizer"] == 0 and frozen["weights"] == 4 * n


def test_a_run_that_does_not_fit_names_the_key_of_its_largest_part() -> None:
    estimated = MemoryEstimate({"process": GIB, "activations": 20 * GIB, "prefix_store": 2 * GIB},
                               {"activations": "model.grpo.micro_batch_tokens", "prefix_store": "rollout.cache_tokens"})
    check_fits(estimated, 24 * GIB, "run")  # 23 GiB fits in 24
    with pytest.raises(OutOfMemoryPlan) as info:
        check_fits(estimated, 16 * GIB, "run")
    message = str(info.value)
    assert "\n" not in message and "lower model.grpo.micro_batch_tokens" in message and "23.0 GiB" in message


def test_envace_fit_stops_before_its_first_step_when_the_estimate_exceeds_the_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["fit", "--config", str(ROOT / "lit_configs" / "tiny_sft.yaml"), f"--trainer.default_root_dir={out}",
            "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--model.init_args.memory_limit_gb=0.5"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("envace: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "exceeds the 0.5 GiB available; lower " in errors[0]
    assert not list(out.rglob("*.ckpt"))  # no step was taken, nothing was written as trained


def test_the_memory_benchmark_writes_a_long_response_task_set_the_loader_accepts(tmp_path: Path) -> None:
    from envace.builtin.task_sets import load_task_set

    bench = memory_benchmark()
    path = bench.long_tasks(tmp_path / "long.jsonl", n=5)
    tasks = load_task_set(path)
    responses = [m["content"] for t in tasks for m in t.reference if m["role"] == "tool"]
    assert len(tasks) == 5 and responses and all('"statement"' in r for r in responses)
    root = tmp_path / "rl-long-16-0"  # a case's root does not exist yet: the trainer makes it later
    args = bench.case_args("rl", "long", 16, "0", 3, root)
    assert "--data.batch_size=16" in args and "--model.grpo.micro_batch_tokens=0" in args
    # both budget-off cases run the path before the budget: no token budget, no checkpointing, no memory check
    trimmed = bench.case_args("sft", "bank", 4, "0+trim", 3, tmp_path / "sft-bank-4-0+trim")
    assert {"--model.init_args.micro_batch_tokens=0", "--model.init_args.policy.init_args.gradient_checkpointing=false",
            "--model.init_args.memory_limit_gb=0"} <= set(trimmed)
    assert f"--data.train_tasks={root / 'long.jsonl'}" in args and (root / "long.jsonl").read_text() != ""


def test_the_growth_compares_the_windows_ceilings_and_floors_not_two_readings() -> None:
    bench = memory_benchmark()
    warm = [2.0, 2.5]  # the steps before the first validation are not compared
    swing = [3.0, 5.0, 3.0, 5.0]  # trimmed floor and ceiling: a swing, not growth
    growth, windows = bench.growth_per_100(warm + swing[:2] + swing[2:] + [3.0, 5.0], 2)
    assert growth == 0.0 and windows == ((3.0, 5.0), (3.0, 5.0))
    # a ceiling 0.4 GB higher 4 steps later (windows start at steps 3 and 7): 10 GB per 100 steps
    growth, _ = bench.growth_per_100(warm + [3.0, 5.0, 3.0, 5.0, 3.0, 5.4], 2)
    assert growth == pytest.approx(0.4 * 100 / 4)
    # a floor that rises while the ceiling stays: growth too
    growth, _ = bench.growth_per_100(warm + [3.0, 5.0, 3.0, 5.0, 3.2, 5.0], 2)
    assert growth == pytest.approx(0.2 * 100 / 4)
    with pytest.raises(ValueError, match="at least 6 steps"):
        bench.growth_per_100([1.0] * 5, 2)


def test_the_memory_benchmarks_validation_case_is_the_sft_config_validating_one_batch(tmp_path: Path) -> None:
    import sys
    from unittest import mock

    from envace.cli.lightning import ConfigCheckCLI, cli_main

    bench = memory_benchmark()
    args = bench.validation_args("library", 64, tmp_path / "validate", 16)
    assert args[0] == "validate"
    with mock.patch.object(sys, "argv", ["envace"]):
        cli = cli_main(args[1:], run=False, cli_class=ConfigCheckCLI)
    assert cli.datamodule.eval_batch_size == 64 and cli.model.rollout.generate_batch_size == 16
    assert cli.model.best is None and cli.model.export_dir is None  # a validation case writes no weights
    default = bench.validation_args("bank", 8, tmp_path / "validate", None)
    assert not any("generate_batch_size" in a for a in default)  # the config's own


def memory_benchmark():  # noqa: ANN201 - the loaded module
    """``benchmarks/memory.py``, loaded as a module (benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_bench", ROOT / "benchmarks" / "memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench
