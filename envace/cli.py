"""The ``envace`` command: LightningCLI over envace's LightningModules and ``RolloutDataModule``.

``envace fit --config lit_configs/tiny.yaml --trainer.max_steps=3``; every constructor argument is a config key.
The model defaults to ``EnvACEModule`` (a config's ``model:`` section holds its arguments directly); a config picks
another module with ``model: {class_path: envace.sft.SFTModule, init_args: ...}``.
``envace fit --model.help EnvACEModule`` lists the arguments with their docstrings.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
from jsonargparse import set_parsing_settings  # noqa: E402
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.plugins.io import CheckpointIO  # noqa: E402

from envace.checkpoint import AtomicCheckpointIO  # noqa: E402


class EnvaceCLI(LightningCLI):
    """LightningCLI with envace's subcommands: ``fit``, ``validate`` and ``test`` (an agent has nothing to predict)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The Trainer methods exposed as subcommands."""
        commands = dict(LightningCLI.subcommands())
        del commands["predict"]
        return commands

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Default classes, so a config's ``model:`` and ``data:`` sections can hold plain arguments."""
        parser.set_defaults(
            {
                "model": {"class_path": "envace.module.EnvACEModule"},
                "data": {"class_path": "envace.data.datamodule.RolloutDataModule"},
            }
        )


    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
        """The Trainer, writing checkpoints atomically unless the config brings its own checkpoint plugin."""
        return super()._instantiate_trainer({**config, "plugins": with_atomic_checkpoints(config.get("plugins"))},
                                            callbacks)


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
        self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")


def main(args: ArgsType = None) -> None:
    """Entry point of the ``envace`` console script (``envace export ...``: ``envace.export``)."""
    import sys

    argv = sys.argv[1:] if args is None else list(args) if isinstance(args, list | tuple) else []
    if argv and argv[0] == "export":
        from envace.export import main as export

        export([str(a) for a in argv[1:]])
        return
    cli_main(args)


def cli_main(args: ArgsType = None, run: bool = True, cli_class: type[EnvaceCLI] = EnvaceCLI) -> EnvaceCLI:
    """Build (and by default run) the CLI; returns it, so tests and notebooks can reach the trainer and model.

    Args:
        args: command-line arguments (default: ``sys.argv``).
        run: run the subcommand; False only parses and instantiates.
        cli_class: ``ConfigCheckCLI`` validates a config without building a Trainer.
    """
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    return cli_class(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main()
