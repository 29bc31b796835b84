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

from envace.benchmarks import bfcl, tau2

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
    bfcl.require_bfcl()
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


def bfcl_official_verdicts(category: str, results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """bfcl-eval's verdict on each result-file entry of one category.

    Args:
        category: a BFCL test category (``multi_turn_base``, ``simple_python``, ``irrelevance``, ...).
        results: result-file entries, ``{"id", "result"}``, at most one per id.

    Returns:
        Per entry id, ``{"valid": bool, "error_type": str}`` (``error_type`` empty for a valid entry), read from the
        score file ``evaluate_task`` writes.

    Raises:
        ValueError: an id appears twice, or the score file does not account for every entry.
    """
    ids = [r["id"] for r in results]
    if len(set(ids)) != len(ids):
        raise ValueError(f"bfcl_official_verdicts: duplicate ids in the results for {category}")
    runner = bfcl_runner()
    with tempfile.TemporaryDirectory(prefix="envace-bfcl-official-") as tmp:
        result_file = Path(tmp) / "result" / BFCL_MODEL_DIR / f"BFCL_v4_{category}_result.json"
        result_file.parent.mkdir(parents=True)
        result_file.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
        model_result = runner.load_file(result_file, sort_by_id=True)  # as ``runner`` reads a result file
        score_dir = Path(tmp) / "score"
        with _fresh_instances(), contextlib.redirect_stdout(io.StringIO()):
            runner.evaluate_task(category, result_file.parent.parent, score_dir, model_result, BFCL_MODEL_DIR,
                                 runner.get_handler(BFCL_HANDLER), {}, allow_missing=True)
        (score_file,) = score_dir.rglob(f"*_{category}_score.json")
        lines = [json.loads(line) for line in score_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    header, failures = lines[0], lines[1:]
    verdicts = {entry_id: {"valid": True, "error_type": ""} for entry_id in ids}
    for failure in failures:
        error = failure.get("error")
        error_type = failure.get("error_type") or (error.get("error_type", "") if isinstance(error, dict) else "")
        verdicts[failure["id"]] = {"valid": False, "error_type": error_type}
    if header["total_count"] != len(ids) or header["correct_count"] != len(ids) - len(failures):
        raise ValueError(f"bfcl_official_verdicts: the score file for {category} counts {header} for {len(ids)} "
                         f"entries with {len(failures)} failures")
    return verdicts


# ---------------------------------------------------------------------------------------------------------------------
# tau^2
# ---------------------------------------------------------------------------------------------------------------------


AGENT_MODEL = "envace-script/agent"
USER_MODEL = "envace-script/user"
"""The model names ``run_task`` is given; ``_ScriptedModels`` answers each from its script."""


class ScriptExhausted(RuntimeError):
    """A script ran out: the case is malformed (not an episode the official runner would score)."""


class _ScriptedModels:
    """Stands in for ``tau2.utils.llm_utils.generate``, the one call to a model in the agents and the user simulator.

    Answers ``AGENT_MODEL`` and ``USER_MODEL`` requests with the scripts' next messages.
    """

    def __init__(self, agent: list[dict[str, Any]], user: list[dict[str, Any]]) -> None:
        self.scripts = {AGENT_MODEL: list(agent), USER_MODEL: list(user)}
        self.used = {AGENT_MODEL: 0, USER_MODEL: 0}

    def __call__(self, model: str, messages: list[Any], tools: list[Any] | None = None,
                 tool_choice: str | None = None, **kwargs: Any) -> Any:
        script, used = self.scripts[model], self.used[model]
        if used >= len(script):
            raise ScriptExhausted(f"tau2_official_run: the {model} script ran out after {used} messages")
        self.used[model] = used + 1
        return _assistant_message(script[used], f"{model}-{used}")


def _assistant_message(item: dict[str, Any], tag: str) -> Any:
    """A script item as ``generate`` returns a model's answer, with zero cost and usage.

    Items are ``{"calls": [{"name", "arguments"}]}`` or ``{"text": str}``.
    """
    message = tau2_official().message
    calls = [message.ToolCall(id=f"{tag}-{i}", name=c["name"], arguments=c["arguments"])
             for i, c in enumerate(item.get("calls") or [])] or None
    return message.AssistantMessage(role="assistant", content=None if calls else item["text"], tool_calls=calls,
                                    cost=0.0, usage={"completion_tokens": 0, "prompt_tokens": 0})


@contextlib.contextmanager
def _models(scripted: _ScriptedModels) -> Iterator[None]:
    """``generate`` in tau^2's agent and user-simulator modules answers from the scripts while inside."""
    official = tau2_official()
    modules = (official.llm_agent, official.user_simulator)
    saved = [module.generate for module in modules]
    for module in modules:
        module.generate = scripted
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.generate = original


def tau2_official_run(task: Any, domain: str, solo: bool, agent_script: list[dict[str, Any]],
                      user_script: list[dict[str, Any]] | None = None, max_steps: int = tau2.MAX_STEPS,
                      max_errors: int = tau2.MAX_ERRORS) -> tuple[float, str]:
    """One scripted episode through ``tau2.run.run_task``: the Orchestrator, then ``evaluate_simulation``.

    ``llm_agent_solo`` with ``dummy_user`` in solo mode, ``llm_agent`` with ``user_simulator`` in user mode, each
    model answering from its script; ``EvaluationType.ALL``, as ``run_task`` defaults.

    A run that raises is scored as ``run_tasks`` scores a failed sample (``skip_failed_samples``): reward 0,
    ``agent_error``; tau^2's ``LLMSoloAgent`` raises on a message without tool calls.

    Args:
        task: a tau^2 ``Task``.
        domain: its domain.
        solo: solo mode or user mode.
        agent_script: the agent's messages, ``{"calls": [{"name", "arguments"}]}`` or ``{"text": str}``.
        user_script: user mode: the user's messages, ``{"text": str}``.
        max_steps: the Orchestrator's ``max_steps``.
        max_errors: the Orchestrator's ``max_errors``.

    Returns:
        ``(reward, termination reason)`` as tau^2 records them.

    Raises:
        ScriptExhausted: a script ran out before the run ended.
    """
    official = tau2_official()
    scripted = _ScriptedModels(agent_script, user_script or [])
    try:
        with _models(scripted):
            simulation = official.run.run_task(
                domain=domain, task=task, agent="llm_agent_solo" if solo else "llm_agent",
                user="dummy_user" if solo else "user_simulator", llm_agent=AGENT_MODEL,
                llm_user=None if solo else USER_MODEL, max_steps=max_steps, max_errors=max_errors,
                evaluation_type=official.evaluator.EvaluationType.ALL)
    except ScriptExhausted:
        raise
    except Exception:  # noqa: BLE001 - run_tasks(skip_failed_samples=True) scores any failed run this way
        return 0.0, official.simulation.TerminationReason.AGENT_ERROR.value
    reason = simulation.termination_reason
    return float(simulation.reward_info.reward), str(getattr(reason, "value", reason))
