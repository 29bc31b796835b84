"""envace prepare-model (the GGUF -> Hugging Face directory cache) and packaged or user chat templates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envace.cli.command import main as envace
from envace.policy import HFPolicy
from envace.policy.packaged import MARKER, PrepareError, packaged_gguf, prepare
from envace.policy.templates import ChatTemplateError, load_chat_template


def test_a_prepared_directory_is_reused_not_rewritten(smollm2_dir: str) -> None:
    weights = Path(smollm2_dir) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert prepare(packaged_gguf("smollm2-135m-instruct"), Path(smollm2_dir)) == Path(smollm2_dir)
    assert weights.stat().st_mtime_ns == before


def test_a_directory_envace_did_not_write_is_never_overwritten(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(PrepareError, match="was not written by envace prepare-model"):
        prepare(packaged_gguf("smollm2-135m-instruct"), mine)
    assert (mine / "notes.txt").read_text() == "keep me" and not (mine / MARKER).exists()


def test_bad_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="no packaged model named 'nope'; packaged: smollm2-135m-instruct"):
        packaged_gguf("nope")
    with pytest.raises(PrepareError, match="--gguf .*missing.gguf: no such file"):
        prepare(tmp_path / "missing.gguf", tmp_path / "out")
    with pytest.raises(PrepareError, match="--dtype must be one of float32, bfloat16"):
        prepare(tmp_path / "missing.gguf", tmp_path / "out", dtype="int8")


def test_the_command_lists_packaged_models_and_reports_mistakes_in_one_line(capsys) -> None:
    envace(["prepare-model", "--list"])
    assert capsys.readouterr().out.startswith("smollm2-135m-instruct: SmolLM2-135M-Instruct")
    with pytest.raises(SystemExit) as done:
        envace(["prepare-model", "nope"])
    assert done.value.code == 2 and "envace: error: no packaged model named 'nope'" in capsys.readouterr().err


def test_a_missing_packaged_directory_says_how_to_make_it(tmp_path: Path) -> None:
    path = str(tmp_path / "models" / "smollm2-135m-instruct")
    with pytest.raises(FileNotFoundError, match=f"envace prepare-model smollm2-135m-instruct --out {path}"):
        HFPolicy(path).build()


def test_chat_templates_by_name_or_file(tmp_path: Path, smollm2_dir: str) -> None:
    assert "<tool_call>" in load_chat_template("chatml-tools")
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}")
    assert load_chat_template(str(jinja)).startswith("{% for m")
    with pytest.raises(ChatTemplateError, match="'nope.jinja': not a packaged template .*chatml-tools.* no such file"):
        load_chat_template("nope.jinja")
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ChatTemplateError, match="empty.jinja: the file is empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))
    tok = HFPolicy(smollm2_dir, chat_template=str(jinja))._load_tokenizer()
    assert tok.chat_template == jinja.read_text()
    own = HFPolicy(smollm2_dir)._load_tokenizer().chat_template
    assert "tools" not in own and os.path.isdir(smollm2_dir)  # SmolLM2's own ChatML ignores tools
