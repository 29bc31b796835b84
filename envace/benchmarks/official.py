"""The official runners, run on scripted outputs: bfcl-eval's ``evaluate_task`` and tau^2's Orchestrator.

``bfcl_official_verdicts`` writes result-file entries (``bfcl_loop.result_entry`` or ``{"id", "result"}``) the way
BFCL's inference saves them and scores them with the pinned ``bfcl_eval.eval_checker.eval_runner.evaluate_task``,
decoded by ``QwenFCHandler`` (the decoder of the model family envace's templates write), then reads the verdicts back
from the score file (each evaluation starts from fresh API instances, as a run that evaluates an entry once does).
``tau2_official_run`` runs ``tau2.run.run_task`` (its ``LLMSoloAgent`` or ``LLMAgent``, its ``DummyUser`` or
``UserSimulator``, its Orchestrator and ``evaluate_simulation``) with the one model call, ``generate``, answered from
the scripts.

Both packages import every model SDK they could call at import time (bfcl-eval's model table imports each handler;
tau^2 imports litellm). None of them is called here: the checkers, the runner, the decoder, the Orchestrator and the
evaluators are the packages' own code. ``official_imports`` lets the named SDKs (``SDK_STUBS``) resolve to inert
stand-ins while the official modules import, and only when the real package is absent; the stand-ins are removed
from ``sys.modules`` afterwards, so a later ``import openai`` fails as it would have.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import tempfile
import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from envace.benchmarks import bfcl_data, tau2

SDK_STUBS = (
    "anthropic", "boto3", "cohere", "datamodel_code_generator", "google.genai", "httpx", "litellm", "mistralai",
    "openai", "qwen_agent", "tenacity", "tree_sitter", "tree_sitter_java", "tree_sitter_javascript", "writerai",
)
"""Modules bfcl-eval and tau^2 import only to call models (API clients, retry decorators, the tree-sitter parsers of
prompting models' Java/JavaScript output, litellm). QwenFCHandler's decoder and every checker use none of them."""

BFCL_HANDLER = "Qwen/Qwen3-8B-FC"
"""The ``MODEL_CONFIG_MAPPING`` key whose handler decodes envace's output: ``QwenFCHandler`` (``<tool_call>`` blocks
of JSON, the form envace's Hermes-style templates write)."""

BFCL_MODEL_DIR = BFCL_HANDLER.replace("/", "_")
"""The model's directory name, as ``runner`` hands it to ``evaluate_task`` (the AST checker looks its config up)."""


# ---------------------------------------------------------------------------------------------------------------------
# Importing the official code
# ---------------------------------------------------------------------------------------------------------------------


class _StubMeta(type):
    """Classes whose every attribute is another stand-in class, combining with ``|`` (tenacity's conditions)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


class _Stub(metaclass=_StubMeta):
    """An inert object: constructs from anything, calls to another stand-in, has every attribute."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Stub()

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __iter__(self) -> Iterator[Any]:
        return iter(())


def _stub(name: str) -> type:
    """A stand-in class named ``name``.

    ``...Error`` and ``...Exception`` names get an exception class (``except`` clauses and
    ``retry_if_exception_type`` need one).
    """
    if name.endswith(("Error", "Exception")):
        return type(name, (Exception,), {})
    return _StubMeta(name, (_Stub,), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)


class _SDKStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: answers only the ``SDK_STUBS`` modules no real finder found."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not any(name == stub or name.startswith(stub + ".") for stub in SDK_STUBS):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name, "envace: an inert stand-in for a model SDK the official runner never calls")

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


@contextlib.contextmanager
def official_imports() -> Iterator[None]:
    """While inside, absent ``SDK_STUBS`` modules import as stand-ins.

    Afterwards they are gone from ``sys.modules`` (the modules that imported them keep their references).
    """
    finder = _SDKStubFinder()
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _StubModule)]:
            del sys.modules[name]


@cache
def bfcl_runner() -> types.ModuleType:
    """bfcl-eval's ``eval_checker.eval_runner``."""
    bfcl_data.require_bfcl()
    with official_imports(), contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module("bfcl_eval.eval_checker.eval_runner")


@cache
def tau2_official() -> types.SimpleNamespace:
    """tau^2's Orchestrator, evaluator, registry, agents, users and message types."""
    tau2.require_tau2()
    with official_imports(), contextlib.redirect_stdout(io.StringIO()):
        names = {
            "orchestrator": "tau2.orchestrator.orchestrator", "evaluator": "tau2.evaluator.evaluator",
            "registry": "tau2.registry", "llm_agent": "tau2.agent.llm_agent", "agent_base": "tau2.agent.base",
            "user_simulator": "tau2.user.user_simulator", "user_base": "tau2.user.base",
            "message": "tau2.data_model.message", "simulation": "tau2.data_model.simulation", "run": "tau2.run",
        }
        return types.SimpleNamespace(**{key: importlib.import_module(module) for key, module in names.items()})


# ---------------------------------------------------------------------------------------------------------------------
# BFCL
# ---------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _fresh_instances() -> Iterator[None]:
    """Every evaluation inside starts from each entry's initial state, as in a fresh run.

    The multi-turn checker keeps each entry's API instances in ``multi_turn_utils``' globals, keyed by model name
    and entry id, for the rest of the process (a real run evaluates an entry once); the ones an evaluation creates
    are dropped after it.
    """
    namespace = vars(importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"))
    before = set(namespace)
    try:
        yield
    finally:
        for name in set(namespace) - before:
            del namespace[name]


class ScriptExhausted(RuntimeError):
    """A script ran out: the case is malformed (not an episode the official runner would score)."""


class _ScriptedQuery:
    """Stands in for ``OSSHandler._query_prompting``, the one call to a model in BFCL's inference loop.

    Answers each query with the script's next raw generation, as the Completions API returns it
    (``choices[0].text``), with zero tokens and latency.
    """

    def __init__(self, outputs: list[str]) -> None:
        self.outputs = list(outputs)
        self.used = 0
        self.exhausted = False

    def __call__(self, inference_data: dict[str, Any]) -> tuple[Any, float]:
        if self.used >= len(self.outputs):
            self.exhausted = True
            raise ScriptExhausted(f"the BFCL model script ran out after {self.used} generations")
        text = self.outputs[self.used]
        self.used += 1
        choice = types.SimpleNamespace(text=text, finish_reason="stop")
        usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
        return types.SimpleNamespace(choices=[choice], usage=usage), 0.0


@cache
def _bfcl_entries(category: str) -> dict[str, dict[str, Any]]:
    """bfcl-eval's own test entries of ``category`` (``utils.load_dataset_entry``, as its generation loads them)."""
    bfcl_runner()
    with official_imports(), contextlib.redirect_stdout(io.StringIO()):
        utils = importlib.import_module("bfcl_eval.utils")
        return {entry["id"]: entry for entry in utils.load_dataset_entry(category)}


@cache
def _bfcl_generation() -> types.ModuleType:
    """bfcl-eval's ``_llm_response_generation`` (its ``multi_threaded_inference`` runs one entry)."""
    bfcl_runner()
    with official_imports(), contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module("bfcl_eval._llm_response_generation")


def bfcl_official_result(category: str, entry_id: str, outputs: list[str]) -> dict[str, Any]:
    """One entry through bfcl-eval's own inference loop, the model answering from ``outputs`` (raw generations).

    ``multi_threaded_inference`` with ``QwenFCHandler`` (``BFCL_HANDLER``): its decoder reads each raw generation,
    its loop executes the decoded calls on BFCL's own API instances, ends turns and force-quits as shipped; only
    ``_query_prompting`` (the Completions request to a served model) is scripted. An inference that raises is
    recorded as the runner records it (``"Error during inference: ..."``).

    Returns:
        The result-file entry the runner would write: ``{"id", "result", ...metadata}``.

    Raises:
        ScriptExhausted: the loop asked for more generations than ``outputs`` holds.
    """
    entry = copy.deepcopy(_bfcl_entries(category)[entry_id])
    handler = bfcl_runner().get_handler(BFCL_HANDLER)
    query = _ScriptedQuery(outputs)
    handler._query_prompting = query  # the instance attribute shadows the method: the one model call
    generation = _bfcl_generation()
    with _fresh_instances(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = generation.multi_threaded_inference(handler, entry, include_input_log=False, exclude_state_log=True)
    if query.exhausted:
        raise ScriptExhausted(f"bfcl_official_result: {entry_id}: the script ran out after {query.used} generations")
    return result


def bfcl_official_verdicts(category: str, results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """bfcl-eval's verdict on each result-file entry of one category.

    Args:
        category: a BFCL test category (``multi_turn_base``, ``simple_python``, ``irrelevance``, ...).
        results: result-file entries, ``{"id", "result"}``, at most one per id.

    Returns:
        Per entry id, ``{"valid": bool, "error_type": str, "crash": str}`` (``error_type`` empty for a valid entry),
        read from the score file ``evaluate_task`` writes. ``crash`` is empty unless the runner crashed writing that
        file: it writes UTF-8 with ``ensure_ascii=False``, so a lone surrogate (from a ``\\udXXX`` escape in the
        model's JSON) in a failure record raises ``UnicodeEncodeError``. The verdicts are then those its checkers
        computed, read back from the same evaluation with the score file written ASCII-escaped, and ``crash`` says
        why the official runner itself reports none.

    Raises:
        ValueError: an id appears twice, or the score file does not account for every entry.
    """
    ids = [r["id"] for r in results]
    if len(set(ids)) != len(ids):
        raise ValueError(f"bfcl_official_verdicts: duplicate ids in the results for {category}")
    try:
        return _verdicts(category, results, ids, ascii_scores=False)
    except UnicodeEncodeError as exc:
        crash = f"bfcl-eval cannot write its score file ({exc.reason}: {exc.object[exc.start:exc.end]!a})"
        verdicts = _verdicts(category, results, ids, ascii_scores=True)
        return {entry_id: {**verdict, "crash": crash} for entry_id, verdict in verdicts.items()}


@contextlib.contextmanager
def _ascii_score_file(enabled: bool) -> Iterator[None]:
    """While inside (``enabled``), ``evaluate_task`` writes its score file with ``ensure_ascii=True``."""
    helper = importlib.import_module("bfcl_eval.eval_checker.eval_runner_helper")
    serializable = importlib.import_module("bfcl_eval.utils").make_json_serializable
    original = helper.write_list_of_dicts_to_file

    def ascii_write(filename: str, data: list[dict[str, Any]], subdir: str | None = None, **kwargs: Any) -> None:
        path = Path(subdir, Path(filename).name) if subdir else Path(filename)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(serializable(e)) + "\n" for e in data), encoding="ascii")

    if enabled:
        helper.write_list_of_dicts_to_file = ascii_write
    try:
        yield
    finally:
        helper.write_list_of_dicts_to_file = original


def _verdicts(category: str, results: list[dict[str, Any]], ids: list[str],
              ascii_scores: bool) -> dict[str, dict[str, Any]]:
    runner = bfcl_runner()
    with tempfile.TemporaryDirectory(prefix="envace-bfcl-official-") as tmp:
        result_file = Path(tmp) / "result" / BFCL_MODEL_DIR / f"BFCL_v4_{category}_result.json"
        result_file.parent.mkdir(parents=True)
        result_file.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
        model_result = runner.load_file(result_file, sort_by_id=True)  # as ``runner`` reads a result file
        score_dir = Path(tmp) / "score"
        with _fresh_instances(), _ascii_score_file(ascii_scores), contextlib.redirect_stdout(io.StringIO()):
            runner.evaluate_task(category, result_file.parent.parent, score_dir, model_result, BFCL_MODEL_DIR,
                                 runner.get_handler(BFCL_HANDLER), {}, allow_missing=True)
        (score_file,) = score_dir.rglob(f"*_{category}_score.json")
        lines = [json.loads(line) for line in score_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    header, failures = lines[0], lines[1:]
    verdicts = {entry_id: {"valid": True, "error_type": "", "crash": ""} for entry_id in ids}
    for failure in failures:
        error = failure.get("error")
        error_type = failure.get("error_type") or (error.get("error_type", "") if isinstance(error, dict) else "")
        verdicts[failure["id"]] = {"valid": False, "error_type": error_type, "crash": ""}
    if header["total_count"] != len(ids) or header["correct_count"] != len(ids) - len(failures):
        raise ValueError(f"bfcl_official_verdicts: the score file for {category} counts {header} for {len(ids)} "
                         f"entries with {len(failures)} failures")
    return verdicts
