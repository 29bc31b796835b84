"""What envace's LightningModules share: the DataModule's sampler connection, one optimiser, the HF export."""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from peft import PeftModel
from torch import Tensor

from envace.evaluation.evaluator import PolicyEvaluator
from envace.policy.checkpointing import recomputed_in_full
from envace.policy.logprobs import PrefixCarry
from envace.rollout.collate import RolloutBatch
from envace.runtime.checkpoint import upgrade_class_paths
from envace.training.best import CHECKPOINT_KEY, BestWeights
from envace.training.datamodule import RolloutDataModule
from envace.training.export import save_policy
from envace.training.memory import GIB, FreedMemory, Workload, available_memory, check_fits, estimate
from envace.training.step_metrics import log_server_counts
from envace.training.update import MicroBatch, computed_tokens, prefix_carry
from envace.types import Task
from envace.world_model.alignment import warn_long_responses
from envace.worlds.rehearse import check_rehearse_format


class PolicyModule(L.LightningModule):
    """Base class: subclasses build ``self.model`` in ``configure_model`` and set ``self.optimizer_factory``.

    Subclasses call ``configure_export`` from their constructor: at the end of ``fit`` the policy is saved in Hugging
    Face format (the last weights, or those of the best validation), loadable with ``HFPolicy(name_or_path=...)``.
    """

    model: torch.nn.Module | None
    tokenizer: Any
    optimizer_factory: OptimizerCallable
    scheduler_factory: LRSchedulerCallable | None = None
    export_dir: str | None = None
    best: BestWeights | None = None
    """With ``export_best``: the best validation's score, step and weights file."""
    evaluator: PolicyEvaluator | None  # set by subclasses (an nn.Module: no class-level default, it would shadow it)
    memory_limit_gb: float | None = None
    freed_memory: FreedMemory | None = None
    """When freed host memory goes back to the system (CPU; created on first use)."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``, also for a checkpoint written before envace's layout moved.

        Such a checkpoint names its module's class and its components' classes by their old modules: each moved
        class path among its hyperparameters is passed renamed (``envace.runtime.checkpoint.upgrade_class_paths``),
        as an override of the stored value. Arguments as Lightning's; ``weights_only`` is True unless asked otherwise.
        """
        weights_only = True if weights_only is None else weights_only
        start = checkpoint_path.tell() if hasattr(checkpoint_path, "tell") else None
        stored = torch.load(checkpoint_path, map_location="cpu", weights_only=weights_only,
                            mmap=start is None).get("hyper_parameters", {})  # mmap: the weights are not read here
        if start is not None:
            checkpoint_path.seek(start)
        moved = {key: value for key, value in upgrade_class_paths(stored).items() if value != stored.get(key)}
        return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict, weights_only,
                                            **{**moved, **kwargs})

    def configure_export(self, export_dir: str | None, export_best: str | None) -> None:
        """Where to export the policy at the end of ``fit``, and which weights.

        Args:
            export_dir: directory for the model and tokenizer in Hugging Face format; None exports nothing.
                ``{root}`` in it stands for the Trainer's ``default_root_dir`` (the configs export to
                ``{root}/policy``, so ``--trainer.default_root_dir`` moves the export with the logs and checkpoints).
            export_best: a logged metric to maximise (e.g. ``"val/success_act"``): write the weights of its best
                validation to a file in the run's root directory (``envace.training.best``, not kept in memory) and
                export those instead of the last ones. Of tied validations the latest wins (a later checkpoint of
                equal score has trained longer). Needs ``export_dir``.

        Raises:
            ValueError: ``export_best`` without ``export_dir``.
        """
        if export_best is not None and export_dir is None:
            raise ValueError("export_best needs export_dir (where to export the best weights)")
        self.export_dir = export_dir
        self.best = BestWeights(export_best) if export_best is not None else None

    def setup(self, stage: str) -> None:
        """Hand the DataModule this module as its sampler (``sample_rollouts``)."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if isinstance(datamodule, RolloutDataModule):
            datamodule.connect(self)

    def configure_optimizers(self) -> Any:
        """One optimiser over every trainable parameter (with a shared policy, both roles' heads share it).

        With a ``scheduler_factory`` the schedule is stepped once per optimiser step.
        """
        assert self.model is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters")
        optimizer = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def step_optimizer(self, optimizer: Any, grad_clip: float) -> None:
        """One optimiser step on the accumulated gradients (manual optimisation).

        Clips their norm to ``grad_clip`` (0: no clipping), steps, steps the schedule, zeroes the gradients.
        """
        if grad_clip > 0:
            self.clip_gradients(optimizer, gradient_clip_val=grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        self.return_freed_memory("step")

    def over_budget(self, micro: MicroBatch, lengths: list[int], budget: int) -> AbstractContextManager[int]:
        """A context for ``micro``'s forward: ``full`` checkpointing where it is over ``budget``.

        Where ``micro`` computes more tokens than ``budget`` (a row longer than it runs alone), its ``selective``
        layers run as ``full`` ones (``envace.policy.checkpointing.recomputed_in_full``), so its activations stay near
        one budget's worth; elsewhere (or with no budget, 0) nothing changes.
        """
        assert self.model is not None
        return recomputed_in_full(self.model, budget > 0 and computed_tokens(micro, lengths) > budget)

    def prefix_carry(self, batch: RolloutBatch, plan: list[MicroBatch]) -> PrefixCarry | None:
        """A ``PrefixCarry`` for a step's micro-batches (``envace.training.update.prefix_carry``), or None.

        A shared prefix whose rows span several micro-batches is then computed once. None where nothing spans, and
        on several ranks, where a split group recomputes its prefix in each micro-batch: a carried prefix's forward
        and backward fall in different passes, which distributed strategies (FSDP's per-module gathers) do not
        expect.
        """
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1:
            return None
        scaler = getattr(trainer.precision_plugin, "scaler", None) if trainer is not None else None
        return prefix_carry(batch, plan, float(scaler.get_scale()) if scaler is not None else 1.0)

    @staticmethod
    def with_carry(loss: Tensor, carry: PrefixCarry | None) -> Tensor:
        """``loss`` plus the gradient of the carried prefixes its micro-batch read last (``PrefixCarry.term``)."""
        term = carry.term() if carry is not None else None
        return loss if term is None else loss + term

    def return_freed_memory(self, when: Literal["between_steps", "rollout", "micro_batch", "step"] = "between_steps"
                            ) -> None:
        """On CPU, give freed host memory back to the system (``envace.training.memory.FreedMemory``).

        ``between_steps`` (after a validation): always, and the working set is measured again. ``rollout`` (after a
        step's rollouts, whose engine freed its keys and values), ``micro_batch`` (after a micro-batch's backward) and
        ``step`` (after an optimiser step): only when the allocator holds more than the micro-batches need, since freed
        blocks of other sizes fragment its heap and the peak would grow, while returning memory costs the page faults
        of taking it back (after every rollout, that cost SmolLM2 RL a seventh of its step: docs/performance.md,
        "Memory").
        """
        if self.device.type != "cpu":
            return
        if self.freed_memory is None:
            self.freed_memory = FreedMemory()
        if when == "between_steps":
            self.freed_memory.restart()
        else:
            self.freed_memory.check(step_end=when != "micro_batch")

    def before_micro_batch(self, length: int) -> None:
        """On CPU, before a micro-batch of rows ``length`` tokens long: return freed host memory first if need be.

        That is where its rows are longer than the ones since the last return (``FreedMemory.before``).
        """
        if self.device.type == "cpu" and self.freed_memory is not None:
            self.freed_memory.before(length)

    def _evaluate(self, tasks: list[Task], prefix: str) -> None:
        """Evaluate one batch of tasks and log under ``prefix/`` (subclasses implement)."""
        raise NotImplementedError

    def validation_step(self, tasks: list[Task], batch_idx: int) -> None:
        """Evaluate a batch of validation tasks (logged under ``val/``)."""
        self._evaluate(tasks, "val")

    def test_step(self, tasks: list[Task], batch_idx: int) -> None:
        """As ``validation_step``, logged under ``test/``."""
        self._evaluate(tasks, "test")

    def on_validation_epoch_end(self) -> None:
        """Log the epoch's rehearsal fidelity."""
        if self.evaluator is not None:
            self.evaluator.log_epoch(self, "val")

    def on_test_epoch_end(self) -> None:
        """Log the epoch's rehearsal fidelity."""
        if self.evaluator is not None:
            self.evaluator.log_epoch(self, "test")

    def on_fit_start(self) -> None:
        """Refuse, before any training, an export this strategy cannot do; warn of responses over the budget."""
        if self.export_dir is not None and self._device_mesh is not None:
            raise ValueError(
                "export_dir is not supported with ModelParallelStrategy (FSDP2): the weights are sharded; "
                "use a ModelCheckpoint callback and export from the checkpoint"
            )
        budget = self.rehearse_budget()
        if budget is not None and self.trainer.is_global_zero:
            train = getattr(self.trainer.datamodule, "tasks", {}).get("train") or []
            prompter = getattr(self, "prompter", None)
            warn_long_responses(train, self.tokenizer, budget, think=bool(getattr(prompter, "think", False)))

    def check_memory(self, work: Workload) -> None:
        """Before the first step: stop with one line naming the key to lower when the estimated peak does not fit.

        The estimate (``envace.training.memory.estimate``) is checked against ``memory_limit_gb`` when set, else against
        the memory this rank has (the GPU's, or the machine's that other processes leave free); ``memory_limit_gb: 0``
        skips the check.
        """
        if self.memory_limit_gb == 0 or self.model is None:
            return
        limit = self.memory_limit_gb
        available = int(limit * GIB) if limit is not None else available_memory(self.device)
        mixed = str(self.trainer.precision).endswith("-mixed") if self._trainer is not None else False
        estimated = estimate(self.model, work, mixed=mixed, reference=getattr(self, "reference", None))
        rank_zero_info(f"memory: estimated peak {estimated.summary()}, {available / GIB:.1f} GiB available")
        check_fits(estimated, available, f"{type(self).__name__} on {self.device}")

    def rehearse_budget(self) -> int | None:
        """Most tokens one rehearsed tool response may take (``rollout.rehearse_max_new_tokens``); None: no rehearsal.

        Subclasses that rehearse return it: ``on_fit_start`` then warns once when recorded tool responses of the
        training tasks are longer (``envace.world_model.alignment.warn_long_responses``).
        """
        return None

    def on_validation_end(self) -> None:
        """With ``export_best``, write the weights of a best validation; then give the memory it freed back (CPU).

        The weights are written before resident memory's floor is taken, so what the write allocates counts in it. A
        validation that ties the best so far replaces it: of equal scores the latest weights are exported. The
        file of the best before is removed, so a run keeps one.
        """
        self._keep_best()
        log_server_counts(self)  # validation's real calls ran on them
        self.return_freed_memory()

    def _keep_best(self) -> None:
        if self.best is None or self.trainer.sanity_checking or self.trainer.state.fn != "fit":
            return
        value = self.trainer.callback_metrics.get(self.best.metric)
        if value is None:
            logged = sorted(self.trainer.callback_metrics)
            raise KeyError(f"export_best={self.best.metric!r} is not a logged metric; logged: {logged}")
        if self.best.better(float(value)):
            assert self.model is not None
            self.best.keep(float(value), int(self.global_step), self.model.state_dict(), self.trainer.default_root_dir,
                           write=self.trainer.is_global_zero)
            rank_zero_info(f"{self.best.metric} = {float(value):.4f} at step {self.global_step}: best so far, "
                           f"written to {self.best.path}")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the best validation's score and file (``export_best``) across resumes."""
        if self.best is not None:
            checkpoint[CHECKPOINT_KEY] = self.best.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore what ``on_save_checkpoint`` kept."""
        if self.best is not None and CHECKPOINT_KEY in checkpoint:
            self.best.load_state_dict(checkpoint[CHECKPOINT_KEY], checkpoint.get("global_step"))

    def on_train_end(self) -> None:
        """Export the policy in Hugging Face format (global rank 0 only)."""
        if self.export_dir is None or not self.trainer.is_global_zero:
            return
        assert self.model is not None
        # The best weights or a merged LoRA model are exported from a copy: the trained module stays as it is.
        model = self.model
        best = self.best if self.best is not None and self.best.path is not None else None
        if best is not None or isinstance(model, PeftModel):
            model = copy.deepcopy(model)
        if best is not None:
            model.load_state_dict(best.load())
        if isinstance(model, PeftModel):
            model = model.merge_and_unload()
        where = self.export_path()
        # with the rehearse prompt format it learned: a later stage is checked against it
        save_policy(model, self.tokenizer, where, getattr(self, "prompter", None))
        which = f" (the best {best.metric}, step {best.step})" if best is not None else ""
        rank_zero_info(f"exported the policy to {where}{which}")
        if best is not None:
            best.remove()

    def check_policy_format(self) -> None:
        """Refuse, before building it, a policy whose exported record names other rehearse prompt settings.

        The settings compared are this module's ``prompter``'s (``envace.worlds.rehearse.check_rehearse_format``).
        """
        check_rehearse_format(self.prompter, getattr(self.policy, "name_or_path", None))

    def export_path(self) -> str | None:
        """``export_dir`` with ``{root}`` replaced by the Trainer's ``default_root_dir`` (None: no export)."""
        if self.export_dir is None:
            return None
        root = self.trainer.default_root_dir if self._trainer is not None else "."
        return self.export_dir.replace("{root}", str(root))

