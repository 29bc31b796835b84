"""BFCL's single-turn AST checker, loaded without the model SDKs its model table imports (``load_checker``).

``bfcl_eval.eval_checker.ast_eval.ast_checker`` imports ``bfcl_eval.constants.model_config``, which imports every
model SDK BFCL supports (not installed with ``--no-deps``). The checker reads one thing from it:
``MODEL_CONFIG_MAPPING[model_name.replace("_", "/")].underscore_to_dot``, which says whether the model's function
names had ``.`` turned into ``_``. ``load_checker`` imports the real module when it imports; otherwise it runs the
checker's own source file under a private module name, with a stand-in ``model_config`` (one key,
``CHECKER_MODEL_NAME``, ``underscore_to_dot=False``: envace keeps dotted names) present in ``sys.modules`` only
while that source runs. ``sys.modules`` is left as it was: the stand-in is removed (or the previous module put
back), and the ``bfcl_eval`` modules a failed real import left behind are dropped. ``envace.benchmarks.bfcl_ast``
scores the single-turn entries with it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import cache
from types import ModuleType, SimpleNamespace

from envace.benchmarks.bfcl_data import require_bfcl

CHECKER_MODEL_NAME = "Qwen_Qwen3-8B-FC"
"""The model name handed to BFCL's checker: a real ``MODEL_CONFIG_MAPPING`` key (``/`` written ``_``, as BFCL
does) whose ``underscore_to_dot`` is False, the same answer the stand-in gives."""

_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_PRIVATE_CHECKER = "_envace_bfcl_ast_checker"
_CHECKER_NEEDS = (  # the checker's real imports, loaded before trying it so a failed try never drops them
    "bfcl_eval.constants.enums",
    "bfcl_eval.constants.type_mappings",
    "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter",
    "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter",
)
_ABSENT = object()

# ---------------------------------------------------------------------------------------------------------------------
# BFCL's checker
# ---------------------------------------------------------------------------------------------------------------------


@cache
def load_checker() -> ModuleType:
    """BFCL's ``ast_checker`` module: the real one when it imports, else its source run with a stand-in config.

    Raises:
        ImportError: bfcl-eval is not installed.
    """
    require_bfcl()
    for name in _CHECKER_NEEDS:
        importlib.import_module(name)
    before = set(sys.modules)
    try:
        return importlib.import_module(_CHECKER)
    except ImportError:  # a model SDK is missing: model_config imports them all
        _drop_new_bfcl_modules(before)
    return _checker_from_source()


def _drop_new_bfcl_modules(before: set[str]) -> None:
    """Remove the ``bfcl_eval`` modules (and parent attributes) a failed import added to ``sys.modules``."""
    for name in sorted(set(sys.modules) - before, reverse=True):
        if not name.startswith("bfcl_eval."):
            continue
        module = sys.modules.pop(name)
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None and getattr(parent, child, None) is module:
            delattr(parent, child)


def _checker_from_source() -> ModuleType:
    """Run the checker's source file as a private module, with the stand-in ``model_config`` while it runs."""
    found = importlib.util.find_spec(_CHECKER)
    origin = found.origin if found is not None else None
    spec = importlib.util.spec_from_file_location(_PRIVATE_CHECKER, origin) if origin else None
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot find the source of BFCL's checker ({_CHECKER})")
    module = importlib.util.module_from_spec(spec)
    stand_in = ModuleType(_MODEL_CONFIG, "envace's stand-in: the one model config BFCL's AST checker reads")
    stand_in.MODEL_CONFIG_MAPPING = {  # type: ignore[attr-defined]
        CHECKER_MODEL_NAME.replace("_", "/"): SimpleNamespace(underscore_to_dot=False)}
    previous = sys.modules.get(_MODEL_CONFIG, _ABSENT)
    sys.modules[_MODEL_CONFIG] = stand_in
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is _ABSENT:
            del sys.modules[_MODEL_CONFIG]
        else:
            sys.modules[_MODEL_CONFIG] = previous
    return module
