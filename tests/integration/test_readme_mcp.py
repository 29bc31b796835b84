"""README's "Train against your own MCP server" walkthrough, run as written: its task line, its three commands.

The set-up command runs as it is; ``envace record`` and ``envace fit`` run in this process from a directory holding
the task file and the servers' environments, the fit cut to 2 steps with a validation against the real server. No
server process outlives the test.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("mcp")

from mcp_procs import installed_server, processes_with  # noqa: E402

from envace.cli.command import run as envace  # noqa: E402
from envace.data.tasks import load_tasks  # noqa: E402
from envace.envs import mcp_pool  # noqa: E402

ROOT = Path(__file__).parents[2]
SECTION = "## Train against your own MCP server"


def walkthrough() -> tuple[dict, list[list[str]]]:
    """The section's task record and its commands (words), one per line of its bash block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no '{SECTION}' section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    assert len([line for line in section.splitlines() if line.strip()]) <= 20  # the bound
    blocks = dict(re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL))
    (line,) = blocks["json"].strip().splitlines()
    commands = [shlex.split(c) for c in blocks["bash"].replace("\\\n", " ").strip().splitlines()]
    return json.loads(line), commands


@pytest.mark.slow
def test_the_mcp_walkthrough_records_and_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record, (setup, recording, fit) = walkthrough()
    assert setup == ["bash", "scripts/setup_mcp_servers.sh"]
    subprocess.run(setup, cwd=ROOT, check=True, timeout=600)
    installed_server("sqlite", "mcp-server-sqlite")
    (tmp_path / ".venv-mcp").symlink_to(ROOT / ".venv-mcp")  # the command path is relative, as from the root
    tasks = recording[recording.index("--tasks") + 1]
    (tmp_path / tasks).write_text(json.dumps(record) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # the config's callbacks package, as from the repository root
    pools: list[str] = []
    try:
        assert recording[:2] == [".venv/bin/envace", "record"]
        assert envace(recording[1:]) == {"tasks": 1, "calls": 1, "errors": 0}
        (task,) = load_tasks(recording[recording.index("--out") + 1])
        assert [m["content"] for m in task.reference if m["role"] == "tool"] == ["[{'affected_rows': 1}]"]
        assert fit[:2] == [".venv/bin/envace", "fit"]
        args = fit[1:]
        args[args.index("--config") + 1] = str(ROOT / args[args.index("--config") + 1])
        args += ["--trainer.max_steps=2", "--trainer.num_sanity_val_steps=0", "--trainer.val_check_interval=2",
                 "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
                 f"--trainer.default_root_dir={tmp_path / 'run'}", "--model.rollout.max_turns=2",
                 "--model.rollout.act_max_new_tokens=16", "--model.grpo.group_size=2"]
        from envace.cli.lightning import cli_main

        with mock.patch.object(sys, "argv", ["envace"]):
            cli = cli_main(args)
        assert cli.trainer.global_step == 2
        assert 0.0 <= float(cli.trainer.callback_metrics["val/success_act"]) <= 1.0  # against the real server
        assert mcp_pool.pool_counts()["mcp/starts"] >= 1
        pools = [str(pool._dir) for pool in mcp_pool._POOLS.values()]
    finally:
        mcp_pool.close_pools()
    assert pools and not any(processes_with(p) for p in pools), "a server outlived its pool"
