"""The ``envace`` command: LightningCLI over ``EnvACEModule`` and ``RolloutDataModule``.

``envace fit --config lit_configs/tiny.yaml --trainer.max_steps=3``; every constructor argument is a config key
(``envace fit --help`` lists them with their docstrings).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from jsonargparse import set_parsing_settings  # noqa: E402
from lightning.pytorch.cli import ArgsType, LightningCLI  # noqa: E402

from envace.data.datamodule import RolloutDataModule  # noqa: E402
from envace.module import EnvACEModule  # noqa: E402


class EnvaceCLI(LightningCLI):
    """LightningCLI with envace's defaults."""


def main(args: ArgsType = None, run: bool = True) -> EnvaceCLI:
    """Entry point of the ``envace`` console script."""
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    return EnvaceCLI(
        EnvACEModule,
        RolloutDataModule,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main()
