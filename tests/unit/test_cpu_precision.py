"""bf16 on a CPU without bf16 matmul kernels falls back to float32, measured and said once; elsewhere kept."""

from __future__ import annotations

import logging

import pytest

from envace.cli.lightning import cli_main
from envace.runtime import cpu_precision
from envace.runtime.cpu_precision import FALLBACK, SLOWDOWN_LIMIT, is_bf16, on_cpu, resolve_cpu_precision


def _no_measure() -> float:
    raise AssertionError("the matmul timing must not run here")


@pytest.mark.parametrize(("precision", "expected"), [("bf16-mixed", True), ("bf16-true", True), ("bf16", True),
                                                     ("32-true", False), ("16-mixed", False), (32, False)])
def test_is_bf16(precision: object, expected: bool) -> None:
    assert is_bf16(precision) is expected


def test_slow_bf16_on_the_cpu_falls_back_with_one_warning(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.delenv(cpu_precision.KEEP_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="envace.runtime.cpu_precision"):
        assert resolve_cpu_precision("bf16-mixed", "cpu", slowdown=30.0) == FALLBACK == "32-true"
    (record,) = caplog.records
    assert "precision bf16-mixed -> 32-true" in record.getMessage() and "30.0x" in record.getMessage()


def test_fast_bf16_and_other_devices_are_kept(monkeypatch) -> None:
    monkeypatch.setattr(cpu_precision, "bf16_matmul_slowdown", _no_measure)
    assert resolve_cpu_precision("bf16-mixed", "cpu", slowdown=0.5) == "bf16-mixed"  # AMX: faster
    assert resolve_cpu_precision("bf16-mixed", "cpu", slowdown=SLOWDOWN_LIMIT) == "bf16-mixed"
    assert resolve_cpu_precision("bf16-mixed", "gpu") == "bf16-mixed"  # no timing: not on the CPU
    assert resolve_cpu_precision("32-true", "cpu") == "32-true"  # no timing: not bf16


def test_bf16_slower_than_float32_falls_back_even_with_avx512_bf16(monkeypatch) -> None:
    """AVX512-BF16 without AMX measured 1.5x float32's matmul time: slower, so float32 (no kernel is enough)."""
    monkeypatch.delenv(cpu_precision.KEEP_ENV, raising=False)
    assert resolve_cpu_precision("bf16-mixed", "cpu", slowdown=1.5) == FALLBACK


def test_keep_env_keeps_bf16(monkeypatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(cpu_precision.KEEP_ENV, "keep")
    with caplog.at_level(logging.WARNING, logger="envace.runtime.cpu_precision"):
        assert resolve_cpu_precision("bf16-true", "cpu", slowdown=30.0) == "bf16-true"
    assert "kept" in caplog.text


def test_on_cpu() -> None:
    from lightning.pytorch.accelerators import CPUAccelerator

    assert on_cpu("cpu") and on_cpu("CPU") and on_cpu(CPUAccelerator())
    assert not on_cpu("gpu") and not on_cpu("cuda")


def test_the_measurement_is_a_positive_ratio() -> None:
    ratio = cpu_precision.bf16_matmul_slowdown(size=64, repeats=1)
    assert ratio > 0.0


def test_the_cli_trainer_gets_the_fallback(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cpu_precision, "bf16_matmul_slowdown", lambda: 30.0)
    monkeypatch.delenv(cpu_precision.KEEP_ENV, raising=False)
    cli = cli_main(["--config", "lit_configs/tiny.yaml", "--trainer.precision=bf16-mixed",
                    f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.trainer.precision == "32-true"
    monkeypatch.setattr(cpu_precision, "bf16_matmul_slowdown", lambda: 0.5)
    cli = cli_main(["--config", "lit_configs/tiny.yaml", "--trainer.precision=bf16-mixed",
                    f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.trainer.precision == "bf16-mixed"


def test_cpu_dtype_follows_the_measurement(monkeypatch) -> None:
    monkeypatch.setattr(cpu_precision, "bf16_matmul_slowdown", lambda: 30.0)
    assert cpu_precision.cpu_dtype() == "float32"
    monkeypatch.setattr(cpu_precision, "bf16_matmul_slowdown", lambda: 0.5)
    assert cpu_precision.cpu_dtype() == "bfloat16"
