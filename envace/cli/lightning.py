"""``envace fit|validate|test``: LightningCLI over envace's LightningModules and ``RolloutDataModule``.

``envace fit --config lit_configs/tiny.yaml --trainer.max_steps=3``; every constructor argument is a config key.
The model defaults to ``EnvACEModule`` (a config's ``model:`` section holds its arguments directly); a config picks
another module with ``model: {class_path: envace.training.sft.SFTModule, init_args: ...}``.
``envace fit --model.help EnvACEModule`` lists the arguments with their docstrings. The ``envace`` command itself
(``envace.cli.command``) adds ``export`` and reports user mistakes in one line.

Every output of a run lives under ``trainer.default_root_dir``: Lightning's default TensorBoard logger writes there
(``<root>/lightning_logs/version_N``, checkpoints in its ``checkpoints/``), and a module's ``export_dir`` may say
``{root}`` for it. Each Trainer also gets ``envace.runtime.progress.ProgressLines`` (a line at least every 30 s, also
when output is redirected) unless the config lists its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from jsonargparse import set_parsing_settings  # noqa: E402
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.plugins.io import CheckpointIO  # noqa: E402
from lightning.pytorch.utilities import rank_zero_info  # noqa: E402

from envace.errors import ConfigError, parser_reason  # noqa: E402
from envace.runtime.checkpoint import (  # noqa: E402
    AtomicCheckpointIO,
    CheckpointError,
    damaged_message,
    upgrade_class_paths,
)
from envace.runtime.cpu_precision import resolve_cpu_precision  # noqa: E402
from envace.runtime.noise import quiet  # noqa: E402
from envace.runtime.progress import ProgressLines  # noqa: E402

EXPORT_HELP = "Write a checkpoint's policy as a Hugging Face model (and a LoRA policy's adapter)."
"""``envace export`` is run by ``envace.cli.command``; the CLI lists it among the subcommands."""
RECORD_HELP = "Record reference tool responses from each task's real environment (an MCP server or a class)."
PREPARE_HELP = "Turn a GGUF checkpoint (e.g. the packaged SmolLM2-135M-Instruct) into a Hugging Face directory, once."


class EnvaceCLI(LightningCLI):
    """LightningCLI with envace's subcommands: ``fit``, ``validate`` and ``test`` (an agent has nothing to predict)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The Trainer methods exposed as subcommands."""
        commands = dict(LightningCLI.subcommands())
        del commands["predict"]
        return commands

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """Lightning's subcommands, and ``export``, ``prepare-model`` and ``record`` beside them (with ``--help``)."""
        super()._add_subcommands(parser, **kwargs)
        export = LightningArgumentParser(description=EXPORT_HELP)
        export.add_argument("--config", help="the config the policy was trained with")
        export.add_argument("--ckpt_path", help="a Lightning checkpoint file (e.g. last.ckpt)")
        export.add_argument("--out", help="output folder")
        parser._subcommands_action.add_subcommand("export", export, help=EXPORT_HELP)
        prepare = LightningArgumentParser(description=PREPARE_HELP)
        prepare.add_argument("name", nargs="?", help="a packaged model (envace prepare-model --list)")
        parser._subcommands_action.add_subcommand("prepare-model", prepare, help=PREPARE_HELP)
        record = LightningArgumentParser(description=RECORD_HELP)  # run by envace.cli.record (same arguments)
        record.add_argument("--tasks", help="the task file (JSONL): references hold the calls to run")
        record.add_argument("--out", help="the recorded task file to write (not with --check)")
        record.add_argument("--check", action="store_true", help="replay the file's calls and compare the responses")
        parser._subcommands_action.add_subcommand("record", record, help=RECORD_HELP)

    def _parse_ckpt_path(self) -> None:
        """A ``--ckpt_path`` file's hyperparameters join the config, as in Lightning, with moved class paths renamed.

        A checkpoint written before envace's layout moved names its classes by their old modules
        (``envace.runtime.checkpoint.upgrade_class_paths``); a damaged file is named.
        """
        if not self.config.get("subcommand"):
            return
        path = self.config[self.config.subcommand].get("ckpt_path")
        if not path or not Path(path).is_file():
            return
        try:
            checkpoint = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - torch's readers raise anything on damaged bytes
            raise CheckpointError(damaged_message(path, err)) from err
        hparams = upgrade_class_paths(checkpoint.get("hyper_parameters", {}))
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({self.config.subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write(f"Parsing of the hyperparameters of --ckpt_path {path} failed!\n")
            raise

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """The subcommand's arguments, with ``ckpt_path="last"`` resolved under ``trainer.default_root_dir``."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if kwargs.get("ckpt_path") == "last":
            found = latest_last_checkpoint(self.trainer.default_root_dir)
            if found is not None:
                rank_zero_info(f"--ckpt_path=last: resuming from {found}")
                kwargs["ckpt_path"] = str(found)
        return kwargs

    def instantiate_classes(self) -> None:
        """Lightning's instantiation; a constructor that refuses a config value raises ``ConfigError`` naming it."""
        with _config_errors(self):
            super().instantiate_classes()

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Default classes, so a config's ``model:`` and ``data:`` sections can hold plain arguments."""
        parser.set_defaults(
            {
                "model": {"class_path": "envace.training.module.EnvACEModule"},
                "data": {"class_path": "envace.training.datamodule.RolloutDataModule"},
            }
        )


    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
        """The Trainer, with atomic checkpoints and progress lines unless the config brings its own of each.

        A bf16 precision on a CPU without bf16 matmul kernels becomes ``32-true`` (``envace.runtime.cpu_precision``).
        """
        given = config.get("callbacks") or []
        if not any(isinstance(c, ProgressLines) for c in [*callbacks, *given]):
            callbacks = [*callbacks, ProgressLines()]
        precision = resolve_cpu_precision(config.get("precision"), config.get("accelerator", "auto"))
        return super()._instantiate_trainer(
            {**config, "precision": precision, "plugins": with_atomic_checkpoints(config.get("plugins"))}, callbacks)


@contextlib.contextmanager
def _config_errors(cli: LightningCLI) -> Iterator[None]:
    """Re-raise a constructor's ``ValueError`` as a ``ConfigError`` that names the config files and the reason."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        config = cli.config.get(cli.subcommand, cli.config) if cli.subcommand else cli.config
        files = ", ".join(str(f) for f in (config.get("config") or [])) or "the command line"
        raise ConfigError(f"{files}: {parser_reason(str(exc))}") from exc


def latest_last_checkpoint(root: str | Path) -> Path | None:
    """The newest ``last.ckpt`` (or ``last-v<N>.ckpt``) under ``root``, or None.

    Lightning looks for ``last`` only in the new run's own checkpoint folder, and every run of the default logger
    gets a new ``version_N`` folder; a run resumed with ``--ckpt_path=last`` would start from scratch. envace takes
    the newest one written under the run's root instead (with none there, Lightning's warning and a fresh start).
    """
    candidates = [p for p in Path(root).rglob("last*.ckpt") if p.is_file() and _is_last(p.name)]
    return max(candidates, key=lambda p: p.stat().st_mtime_ns, default=None)


def _is_last(name: str) -> bool:
    return name == "last.ckpt" or (name.startswith("last-v") and name[6:-5].isdigit() and name.endswith(".ckpt"))


def with_atomic_checkpoints(plugins: Any) -> list[Any]:
    """``plugins`` (None, one, or a list) with an ``AtomicCheckpointIO`` added when none is a ``CheckpointIO``."""
    given = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in given):
        given.append(AtomicCheckpointIO())
    return given


class ConfigCheckCLI(EnvaceCLI):
    """Parses a config and instantiates everything but the Trainer (no accelerator needed): config validation."""

    def instantiate_classes(self) -> None:
        """Instantiate the model, the DataModule and every class_path in the config, but build no Trainer."""
        with _config_errors(self):
            self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")


def cli_main(args: ArgsType = None, run: bool = True, cli_class: type[EnvaceCLI] = EnvaceCLI) -> EnvaceCLI:
    """Build (and by default run) the CLI; returns it, so tests and notebooks can reach the trainer and model.

    Args:
        args: command-line arguments (default: ``sys.argv``).
        run: run the subcommand; False only parses and instantiates.
        cli_class: ``ConfigCheckCLI`` validates a config without building a Trainer.
    """
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    quiet()  # again: a test runner may have reset the warning filters since import
    return cli_class(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        parser_kwargs={"exit_on_error": False},  # errors reach envace.cli.command, which names the file and key
    )
