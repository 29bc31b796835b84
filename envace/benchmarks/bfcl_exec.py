"""BFCL's execution of a decoded call, reproduced without ``eval``.

bfcl-eval runs a decoded multi-turn call as Python text (``execute_multi_turn_func_call``):

1. ``convert_to_function_call`` writes ``f"{name}({','.join(f'{key}={value!r}' ...)})"``;
2. ``_process_method_calls`` prefixes every word followed by ``(`` that names a method of an involved class with its
   instance (``inst.cd(``), wherever it stands, inside string literals too;
3. a name before the first ``(`` (after the first ``.``) of ``kill``, ``exit``, ``quit``, ``remove``, ``unlink``,
   ``popen``, ``Popen`` or ``run`` is refused;
4. the text is ``eval``-ed; whatever it raises becomes the observation ``Error during execution: <message>``.

So a name or key with spaces around it (``" cd"``, ``"folder "``) runs as the bare name, a key like ``"a=1,b"``
passes two arguments, ``inf`` and ``nan`` (``repr`` of an out-of-range or non-finite number) are undefined names,
and a text Python cannot parse is a syntax error. ``official_text`` builds the same text and ``run_text`` gives the
same observation by parsing it as ``eval`` does (``ast``, leading spaces and tabs stripped) and interpreting only
what a call of literal arguments holds: an involved method (or an undefined name, or a literal called), literal
arguments, undefined names. Text that would do anything else under ``eval`` (look up a Python builtin or a module
of BFCL's executor, call within an argument, subscript, operate) is not run (``Refused``): envace never evaluates
model output, and such a call is answered as an undefined name (``REFUSED``, docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

FORBIDDEN_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
"""Function names BFCL's executor refuses (``execute_multi_turn_func_call``)."""

INFERENCE_MODEL = "Qwen_Qwen3_8B"
"""``model_name_underline_replaced`` of the official handler (``QwenFCHandler`` for ``Qwen/Qwen3-8B-FC``): its
inference names each entry's instances ``<model>_<entry id>_<class>_instance`` (the prefix step 2 writes)."""

_METHOD = re.compile(r"\b([a-zA-Z_]\w*)\s*(?=\()")  # _process_method_calls' pattern


class Refused(ValueError):
    """Call text ``eval`` would run beyond a call of literal arguments (envace does not run it)."""


def official_text(name: Any, arguments: Mapping[Any, Any]) -> str:
    """``convert_to_function_call``'s text of one decoded call."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def instance_name(entry_id: str, class_name: str, model: str = INFERENCE_MODEL) -> str:
    """The global name BFCL's executor gives an entry's instance of ``class_name``."""
    return re.sub(r"[-./:]", "_", f"{model}_{entry_id}_{class_name}_instance")


def with_instances(text: str, methods: Mapping[str, str]) -> str:
    """``_process_method_calls``: every ``word(`` naming a method becomes ``<instance>.word(`` (spaces dropped)."""
    return _METHOD.sub(lambda m: f"{methods[m.group(1)]}.{m.group(1)}" if m.group(1) in methods else m.group(1),
                       text)


def forbidden(text: str) -> str:
    """The refused name the executor finds in the processed text, or ""."""
    head = text.split("(")[0] if "(" in text else text
    if "." in head:
        head = head.split(".")[1]
    return head if head in FORBIDDEN_NAMES else ""


@functools.cache
def _executor_names() -> frozenset[str]:
    """Names ``eval`` resolves in BFCL's executor module besides the instances: its globals and the builtins."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return frozenset(vars(multi_turn_utils)) | frozenset(dir(builtins))


def parse_text(text: str, instances: Mapping[str, Any]) -> ast.Call:
    """The processed call text as ``eval`` parses it, checked to be a call of literal arguments.

    The text is compiled (not run) first, so the errors ``eval`` raises before running anything (a syntax error, a
    repeated keyword) are raised here too, with the same message.

    Raises:
        SyntaxError: Python cannot compile it (``eval`` raises the same, with the same message).
        Refused: it holds more than a call of literal arguments.
    """
    source = text.lstrip(" \t")  # eval strips leading spaces and tabs
    with warnings.catch_warnings():  # the compiler's hints ("perhaps you missed a comma?") are not observations
        warnings.simplefilter("ignore", SyntaxWarning)
        compile(source, "<string>", "eval", dont_inherit=True)  # compiled, never run: eval's compile-time errors
    call = ast.parse(source, filename="<string>", mode="eval").body
    if not isinstance(call, ast.Call):
        raise Refused(f"not a call: {ast.unparse(call)[:80]}")
    func = call.func
    method = (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in instances)
    if not (method or isinstance(func, ast.Constant | ast.Name)):
        raise Refused(f"not a plain function name: {ast.unparse(func)[:80]}")
    if isinstance(func, ast.Name):
        _check_name(func.id, instances)
    for node in [*call.args, *(k.value for k in call.keywords)]:
        _check_literal(node, instances)
    if any(k.arg is None for k in call.keywords):
        raise Refused("** arguments")
    return call


def _check_name(name: str, instances: Mapping[str, Any]) -> None:
    if name in instances or name in _executor_names() or name.endswith("_instance"):  # any entry's instance
        raise Refused(f"the name {name!r} resolves in BFCL's executor")


def _check_literal(node: ast.expr, instances: Mapping[str, Any]) -> None:
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            _check_name(child.id, instances)
        elif isinstance(child, ast.UnaryOp):
            if not isinstance(child.op, ast.USub | ast.UAdd):
                raise Refused(f"operator {type(child.op).__name__}")
        elif isinstance(child, ast.Dict):
            if any(key is None for key in child.keys):
                raise Refused("** in a dict")
        elif not isinstance(child, ast.Constant | ast.List | ast.Tuple | ast.Set | ast.Load | ast.USub | ast.UAdd):
            raise Refused(f"{type(child).__name__} in an argument")


def _value(node: ast.expr) -> Any:
    """A checked literal, evaluated in Python's order (an undefined name raises ``NameError``)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        raise NameError(f"name '{node.id}' is not defined")
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Set):
        return {_value(e) for e in node.elts}
    pairs = []
    for key, value in zip(node.keys, node.values, strict=True):  # ast.Dict: key, then value, pair by pair
        pairs.append((_value(key), _value(value)))
    return dict(pairs)


def serialise(value: Any) -> str:
    """BFCL's serialisation of a result: strings as they are, dicts as JSON (``str`` if not JSON), else ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # noqa: BLE001 - BFCL's bare except: str() of anything json cannot write
            return str(value)
    return str(value)


def run_text(text: str, instances: Mapping[str, Any], methods: Mapping[str, str]) -> str:
    """The observation BFCL's executor gives for one call text (``official_text``), without ``eval``.

    Args:
        text: the call text, before the instance prefixes.
        instances: instance name -> live instance (``instance_name``).
        methods: method name -> instance name (every public method of the involved classes; later classes win).

    Raises:
        Refused: the text holds more than a call of literal arguments.
    """
    processed = with_instances(text, methods)
    try:
        refused = forbidden(processed)
        if refused:
            raise Exception(f"Function call {refused} is not allowed.")  # noqa: TRY002 - BFCL's own exception
        call = parse_text(processed, instances)
        return serialise(_invoke(call, instances))
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - every error is an observation, as in BFCL
        return f"Error during execution: {exc}"


def _invoke(call: ast.Call, instances: Mapping[str, Any]) -> Any:
    func = call.func
    target: Callable[..., Any]
    if isinstance(func, ast.Attribute):
        target = getattr(instances[func.value.id], func.attr)  # type: ignore[union-attr]
    elif isinstance(func, ast.Name):
        raise NameError(f"name '{func.id}' is not defined")
    else:
        target = func.value  # type: ignore[union-attr]  # a literal called: Python's TypeError
    args = [_value(a) for a in call.args]
    kwargs = {k.arg: _value(k.value) for k in call.keywords}
    return target(*args, **kwargs)


def checker_text(text: str, methods: Mapping[str, str], instances: Mapping[str, Any]) -> str | None:
    """``text`` if BFCL's checker may ``eval`` it (a call of literal arguments, as ``run_text`` runs), else None."""
    try:
        parse_text(with_instances(text, methods), instances)
    except SyntaxError:
        return text  # eval raises the same SyntaxError: nothing runs
    except Refused:
        return None
    return text


def refused_observation(exc: Refused) -> str:
    """The observation of call text envace does not run: BFCL's error for an undefined name, with the reason."""
    return f"Error during execution: name is not defined (envace does not run this call text: {exc})"
