"""Generation contexts for sharded strategies: which strategy gets one, and how they compose."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy

from envace.runtime.distributed import chain_contexts, full_params_context


def test_only_strategy_fsdp_gathers_weights_to_generate() -> None:
    assert full_params_context(SingleDeviceStrategy("cpu")) is None
    assert full_params_context(DDPStrategy()) is None
    gathered = full_params_context(FSDPStrategy())
    assert gathered is not None
    assert isinstance(gathered(), nullcontext)  # nothing wrapped yet: nothing to gather


def test_chain_contexts_enters_in_order_and_exits_in_reverse() -> None:
    events: list[str] = []

    def factory(name: str):
        @contextmanager
        def context():
            events.append(f"enter {name}")
            yield
            events.append(f"exit {name}")

        return context

    assert chain_contexts(None, None) is None
    chained = chain_contexts(factory("gather"), None, factory("adapter"))
    assert chained is not None
    with chained():
        events.append("generate")
    assert events == ["enter gather", "enter adapter", "generate", "exit adapter", "exit gather"]
