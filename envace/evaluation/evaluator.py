"""Greedy evaluation of a policy on task lists, shared by every envace LightningModule.

For each batch of evaluation tasks it runs greedy episodes in the evaluation world (``RealWorld`` to measure real
success), optionally a second set in the policy's own rehearsed world (the "imagined" success, logged next to the
real one: a rising imagined success with a flat real one is the signature of a gamed world model; the imagined
episodes are also replayed in the real environment, giving their free-running fidelity horizon and sim-to-real gap,
``envace.world_model.audit``), and optionally
the teacher-forced rehearsal fidelity of the tasks' reference calls. Means are torchmetrics metrics, so they are
summed over ranks and logged once per epoch. In ``test``, success can also be reported per value of one
``Task.metadata`` key (``GroupedSuccess``).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric, MetricCollection, SumMetric

from envace.engines.base import HFEngine, SamplingParams
from envace.engines.kv_engine import CachedEngine
from envace.evaluation.metrics import COUNT_METRICS, ROLLOUT_METRICS, rollout_metrics
from envace.policy.hf import adapter_context
from envace.rewards.base import Reward
from envace.rewards.scoring import score_episodes
from envace.rollout.config import RolloutConfig
from envace.rollout.private_rehearsal import PrivateRehearsal, Selector, check_selector
from envace.rollout.rehearsing import RehearsingRunner
from envace.rollout.runner import EpisodeRunner
from envace.runtime.distributed import chain_contexts, full_params_context
from envace.types import Episode, Task, canonical_json
from envace.world_model.audit import replay, sim_to_real
from envace.world_model.fidelity import RehearsalFidelity, reference_probes, rehearse_probes
from envace.worlds.base import World
from envace.worlds.rehearse import RehearseWorld
from envace.worlds.users import UserSimulator

SPLITS = ("val", "test")
REPLAY_METRICS = ("imagined_horizon", "imagined_departed_rate", "sim2real_gap")
"""Logged from the real replay of the imagined episodes (with ``imagined``)."""
NO_VALUE = "none"
"""The group of the tasks whose metadata lacks the grouping key (or holds null there)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def metric_name_part(text: str) -> str:
    """``text`` as a part of a metric name: each run of characters other than ``[A-Za-z0-9_.-]`` becomes ``_``.

    An empty text reads ``empty``.
    """
    return _UNSAFE.sub("_", text) or "empty"


def group_value(task: Task, key: str) -> str:
    """The group of ``task`` by ``task.metadata[key]``, sanitised for a metric name (``NO_VALUE`` when unset).

    A string is taken as it is, any other value as its canonical JSON (``3.0`` reads ``3``, ``true`` ``true``).
    """
    value = task.metadata.get(key)
    if value is None:
        return NO_VALUE
    return metric_name_part(value if isinstance(value, str) else canonical_json(value))


class GroupedSuccess:
    """Success per value of one metadata key: ``success_act/KEY=VALUE`` and ``tasks/KEY=VALUE``.

    ``success_act`` is the mean success of the group's episodes that did not fail (as ``rollout_metrics``'s
    ``success_act``: 0 when all failed), ``tasks`` the number of its episodes (one per task in evaluation).

    Args:
        key: the ``Task.metadata`` key to group by.
    """

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("the metadata key to group test success by must be a non-empty string")
        self.key = key
        self.counts: dict[str, list[int]] = {}  # group -> [episodes, scored episodes, successes]

    def update(self, episodes: list[Episode]) -> None:
        """Count ``episodes`` into their groups."""
        for episode in episodes:
            counts = self.counts.setdefault(group_value(episode.task, self.key), [0, 0, 0])
            counts[0] += 1
            if not episode.stats.failed:
                counts[1] += 1
                counts[2] += int(episode.success)

    def merge(self, others: list[dict[str, list[int]]]) -> dict[str, list[int]]:
        """The counts of several ranks (``self.counts`` of each), summed per group."""
        total: dict[str, list[int]] = {}
        for counts in others:
            for group, values in counts.items():
                total[group] = [a + b for a, b in zip(total.get(group, [0, 0, 0]), values)]
        return total

    def compute(self, counts: dict[str, list[int]] | None = None) -> dict[str, float]:
        """The metrics (without the split prefix) of ``counts`` (default: this rank's), groups in sorted order."""
        counts = self.counts if counts is None else counts
        key = metric_name_part(self.key)
        metrics: dict[str, float] = {}
        for group in sorted(counts):
            episodes, scored, successes = counts[group]
            metrics[f"success_act/{key}={group}"] = successes / scored if scored else 0.0
            metrics[f"tasks/{key}={group}"] = float(episodes)
        return metrics

    def reset(self) -> None:
        """Forget the counts (after they are logged)."""
        self.counts = {}


def policy_engine(module: L.LightningModule, model: nn.Module, tokenizer: Any, rollout: RolloutConfig,
                  adapter: str | None = None) -> Any:
    """An engine that generates with ``model`` (through LoRA adapter ``adapter`` when given), as ``rollout.engine``."""
    trainer = module._trainer
    common: dict[str, Any] = {
        "pad_id": tokenizer.pad_token_id,
        "stop_ids": [tokenizer.eos_token_id],
        "max_batch_size": rollout.generate_batch_size,
        "synced_gpus": trainer.world_size > 1 if trainer is not None else False,
        "adapter_context": chain_contexts(
            full_params_context(trainer.strategy) if trainer is not None else None,  # strategy: fsdp
            (lambda: adapter_context(model, adapter)) if adapter else None,
        ),
    }
    if rollout.engine == "vllm":
        engine = shared_vllm_engine(module, model, tokenizer, rollout)
        return engine.adapter(adapter) if adapter else engine
    if rollout.engine == "cached":
        return CachedEngine(model, cache_entries=rollout.cache_entries, cache_tokens=rollout.cache_tokens, **common)
    return HFEngine(model, **common)


def shared_vllm_engine(module: L.LightningModule, model: nn.Module, tokenizer: Any, rollout: RolloutConfig) -> Any:
    """The module's one vLLM engine (the act and rehearse roles share it), started on first use.

    It starts from the policy's checkpoint directory when there is one (``model.policy.init_args.name_or_path``),
    else from the policy's current weights written to a temporary directory; either way the module gives it the
    policy's weights before the first rollout (``EnvACEModule.sync_engine``). With per-role LoRA adapters
    (``model.role_adapters``) it holds the base weights and serves each role's adapter through vLLM's LoRA support.
    """
    from envace.engines.vllm_engine import VLLMEngine

    engine = getattr(module, "_vllm_engine", None)
    if engine is not None:
        return engine
    policy = getattr(module, "policy", None)
    source = getattr(policy, "name_or_path", None)
    stop_ids = [tokenizer.eos_token_id]
    rank = _adapter_rank(model) if getattr(module, "role_adapters", None) else None
    if isinstance(source, str) and Path(source, "config.json").is_file():
        engine = VLLMEngine.from_options(source, stop_ids, rollout.vllm, max_lora_rank=rank)
    else:
        with tempfile.TemporaryDirectory(prefix="envace-vllm-") as tmp:
            write_checkpoint(model, tokenizer, Path(tmp), merge_lora=rank is None)
            engine = VLLMEngine.from_options(tmp, stop_ids, rollout.vllm, max_lora_rank=rank)
    module._vllm_engine = engine
    return engine


def _adapter_rank(model: nn.Module) -> int:
    """The largest rank of the model's LoRA adapters (what the engine must be able to serve)."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        raise ValueError("model.role_adapters needs a LoRA policy with those adapters (model.policy.init_args.lora "
                         "and adapters)")
    return max(int(c.r) for c in configs.values())


def write_checkpoint(model: nn.Module, tokenizer: Any, out: Path, merge_lora: bool = True) -> None:
    """The policy's config, tokenizer and current weights as a directory a serving engine loads.

    ``merge_lora``: the active LoRA adapter's update is added to the base weights; False writes the base alone
    (an engine that applies the adapters itself).
    """
    from safetensors.torch import save_file

    from envace.engines.weights import base_weights, policy_weights

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    named = policy_weights(model) if merge_lora else base_weights(model)
    weights = {name: t.contiguous().clone() for name, t in named if not (tied and name == "lm_head.weight")}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def _any_active(module: L.LightningModule) -> Any:
    """``active -> any rank active`` (ranks keep generating in lockstep until all are done)."""

    def any_active(active: bool) -> bool:
        return bool(module.trainer.strategy.reduce_boolean_decision(active, all=False))

    return any_active


class PolicyEvaluator(nn.Module):
    """Real success, imagined success and rehearsal fidelity of a policy on evaluation tasks.

    An ``nn.Module`` only so that its torchmetrics states move with the LightningModule and sync across ranks.

    Args:
        world: answers the act role's calls (``RealWorld`` for real success).
        prompter: the policy's own rehearse world: renders fidelity probes and, with ``imagined``, answers the calls
            of the imagined episodes.
        rewards: scores the episodes.
        rollout: budgets; sampling is made greedy here.
        fidelity: measure the rehearsal fidelity of the reference calls.
        imagined: also run every task in the policy's own rehearsed world and log ``imagined_success``.
        user: the simulated user of tasks with ``Task.user``.
        rehearsal: private rehearsal before committed act turns in ``test`` (``envace.rollout.private_rehearsal``); None
        or
            a zero budget acts plainly.
        selector: what a rehearsal commits (default: the act role writes the turn with the rehearsal memory).
        group_by: in ``test``, also log success per value of this ``Task.metadata`` key (``GroupedSuccess``).
    """

    def __init__(self, world: World, prompter: RehearseWorld, rewards: list[Reward], rollout: RolloutConfig,
                 fidelity: bool = True, imagined: bool = True, user: UserSimulator | None = None,
                 rehearsal: PrivateRehearsal | None = None, selector: Selector | None = None,
                 group_by: str | None = None) -> None:
        super().__init__()
        self.grouped = GroupedSuccess(group_by) if group_by is not None else None
        if rehearsal is not None:
            check_selector(selector, rehearsal)  # at configuration, not at the first test episode
        self.rehearsal, self.selector = rehearsal, selector
        self.world, self.prompter, self.rewards, self.user = world, prompter, rewards, user
        self.rollout = replace(rollout, act_temperature=0.0, rehearse_temperature=0.0)
        self.with_fidelity, self.with_imagined = fidelity, imagined
        self.means = nn.ModuleDict(
            {split: MetricCollection({k: SumMetric() if k in COUNT_METRICS else MeanMetric() for k in ROLLOUT_METRICS})
             for split in SPLITS}
        )
        self.imagined = nn.ModuleDict({split: MeanMetric() for split in SPLITS})
        self.replayed = nn.ModuleDict(
            {split: MetricCollection({k: MeanMetric() for k in REPLAY_METRICS}) for split in SPLITS}
        )
        self.fidelity = nn.ModuleDict({split: RehearsalFidelity() for split in SPLITS})
        self.last_episodes: list[Episode] = []

    def _runner(self, tokenizer: Any, prefix: str) -> EpisodeRunner:
        """The plain runner, or in ``test`` with a rehearsal budget the rehearsing one."""
        if prefix == "test" and self.rehearsal is not None and self.rehearsal.rehearsals > 0:
            return RehearsingRunner(tokenizer, self.rollout, self.rehearsal, self.prompter, self.selector)
        return EpisodeRunner(tokenizer, self.rollout)

    def evaluate(self, module: L.LightningModule, tasks: list[Task], prefix: str, act: HFEngine,
                 rehearse: HFEngine, tokenizer: Any) -> None:
        """Evaluate ``tasks`` and log the running means under ``prefix/`` (epoch-level)."""
        runner = self._runner(tokenizer, prefix)
        any_active = _any_active(module) if module.trainer.world_size > 1 else None
        indices = list(range(len(tasks)))
        with torch.no_grad():
            episodes = runner.run(tasks, indices, act, self.world, rehearse, any_active=any_active, user=self.user)
            score_episodes(episodes, self.rewards)
            self.last_episodes = episodes
            if prefix == "test" and self.grouped is not None:
                self.grouped.update(episodes)
            means = self.means[prefix]
            for key, value in rollout_metrics(episodes).items():
                if key in COUNT_METRICS:  # a count: summed over the batches and ranks
                    means[key].update(torch.tensor(value))
                else:
                    means[key].update(torch.tensor(value), weight=len(episodes))  # weight 0 on an empty batch
                module.log(f"{prefix}/{key}", means[key], on_step=False, on_epoch=True)
            if self.with_imagined:
                imagined = EpisodeRunner(tokenizer, self.rollout).run(tasks, indices, act, self.prompter, rehearse,
                                                                      any_active=any_active, user=self.user)
                score_episodes(imagined, self.rewards)
                success = sum(float(e.success) for e in imagined) / len(imagined) if imagined else 0.0
                self.imagined[prefix].update(torch.tensor(success), weight=len(imagined))
                module.log(f"{prefix}/imagined_success", self.imagined[prefix], on_step=False, on_epoch=True)
                self._replay(module, imagined, prefix)
            if self.with_fidelity:
                self._fidelity(module, tasks, prefix, rehearse, tokenizer)

    def _replay(self, module: L.LightningModule, imagined: list[Episode], prefix: str) -> None:
        """Replay the imagined episodes' actions in the real environment: fidelity horizon and sim-to-real gap."""
        audited = [e for e in imagined if e.task.environment is not None and e.rehearsals]
        for episode in audited:
            replay(episode)
        gaps = [sim_to_real(e, self.rewards) for e in audited]
        values = {
            "imagined_horizon": [float(e.audit.horizon) for e in audited],
            "imagined_departed_rate": [float(e.audit.departed) for e in audited],
            "sim2real_gap": gaps,
        }
        metrics = self.replayed[prefix]
        for key, vals in values.items():
            mean = sum(vals) / len(vals) if vals else 0.0
            metrics[key].update(torch.tensor(mean), weight=len(vals))  # weight 0: no episode to replay
            module.log(f"{prefix}/{key}", metrics[key], on_step=False, on_epoch=True)

    def _fidelity(self, module: L.LightningModule, tasks: list[Task], prefix: str, rehearse: HFEngine,
                  tokenizer: Any) -> None:
        """Teacher-forced fidelity: each reference call rehearsed with the real history before it."""
        probes = reference_probes(tasks)
        if probes:
            scores = rehearse_probes(probes, self.prompter, rehearse, self.rollout.rehearse_max_new_tokens)
            self.fidelity[prefix].update(scores)
        elif module.trainer.world_size > 1:  # stay in lockstep with ranks that do generate
            rehearse.generate([[tokenizer.pad_token_id]], SamplingParams(max_new_tokens=1))

    def log_epoch(self, module: L.LightningModule, prefix: str) -> None:
        """Log the epoch's fidelity means and test success per group (call from ``on_{validation,test}_epoch_end``)."""
        if prefix == "test" and self.grouped is not None:
            self._log_groups(module, self.grouped)
        if not self.with_fidelity:
            return
        values = self.fidelity[prefix].compute()  # summed over ranks
        self.fidelity[prefix].reset()
        if values["probes"] > 0:
            # already summed over ranks by the metric: the reduction of equal values is a no-op that keeps
            # Lightning from warning about unsynced epoch-level logs
            module.log_dict({f"{prefix}/fidelity_{k}": v.float() for k, v in values.items() if k != "probes"},
                            sync_dist=True)

    def _log_groups(self, module: L.LightningModule, grouped: GroupedSuccess) -> None:
        """Log ``test/success_act/KEY=VALUE`` and ``test/tasks/KEY=VALUE`` over every rank's episodes, then reset."""
        counts = grouped.counts
        if module.trainer.world_size > 1:  # every rank gets every group, so all log the same keys
            gathered: list[Any] = [None] * module.trainer.world_size
            torch.distributed.all_gather_object(gathered, counts)
            counts = grouped.merge(gathered)
        grouped.reset()
        metrics = grouped.compute(counts)
        if metrics:
            # equal on every rank: the reduction is a no-op that keeps Lightning from warning about unsynced logs
            module.log_dict({f"test/{k}": v for k, v in metrics.items()}, sync_dist=True)
