"""BFCL's execution of decoded calls, reproduced without ``eval`` (``envace.benchmarks.bfcl_exec``).

Each observation is compared with bfcl-eval's own executor (``execute_multi_turn_func_call``, which ``eval``s the
call text) on fresh instances of the same entry.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("bfcl_eval")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envace.benchmarks import bfcl_check, bfcl_data, bfcl_env, bfcl_exec  # noqa: E402
from envace.benchmarks import official as official_code  # noqa: E402
from envace.benchmarks.bfcl_loop import UNDEFINED_CALL, checker_call  # noqa: E402
from envace.types import ToolCall  # noqa: E402

ENTRY = "multi_turn_base_0"  # GorillaFileSystem, TwitterAPI


def entry() -> bfcl_data.BFCLEntry:
    (found,) = bfcl_data.load_multi_turn("multi_turn_base", ids=[ENTRY])
    return found


def official(name: object, arguments: dict) -> str:
    """bfcl-eval's observation of one decoded call, on fresh instances named as in its inference."""
    official_code.bfcl_runner()  # imports bfcl-eval's handlers with the model SDKs stubbed
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.model_handler.utils import convert_to_function_call

    e = entry()
    model = bfcl_exec.INFERENCE_MODEL  # the instance names envace gives (string values may hold them: ``cd(x)``)
    try:
        (text,) = convert_to_function_call([{name: arguments}])
        (result,), _ = multi_turn_utils.execute_multi_turn_func_call(
            [text], e.raw["initial_config"], e.involved_classes, model, e.id)
        return result
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model)]:
            del vars(multi_turn_utils)[key]


def ours(name: str, arguments: dict) -> str:
    return bfcl_env.BFCLEnvironment(entry()).execute_decoded(name, arguments)


@pytest.mark.parametrize(("name", "arguments", "expected"), [
    (" cd", {"folder": "document"}, None),
    ("cd ", {"folder ": "document"}, None),
    ("cd", {"folder": math.inf}, "Error during execution: name 'inf' is not defined"),
    ("cd", {"folder": [1, -math.inf]}, "Error during execution: name 'inf' is not defined"),
    ("cd", {"folder": math.nan}, "Error during execution: name 'nan' is not defined"),
    ("nope", {"a": math.nan}, "Error during execution: name 'nope' is not defined"),
    ("kill", {}, "Error during execution: Function call kill is not allowed."),
    ("5", {}, "Error during execution: 'int' object is not callable"),
    ("cd", {"folder='document',x": 1}, None),
    ("cd", {"a": 1, " a": 2}, None),
    ("\tcd", {"folder": "document"}, None),
    ("cd\n", {"folder": "document"}, None),
])
def test_hand_picked_calls_observe_what_bfcl_observes(name: str, arguments: dict, expected: str | None) -> None:
    got = ours(name, arguments)
    assert got == official(name, arguments)
    if expected is not None:
        assert got == expected


def test_a_spaced_name_runs_the_bare_method() -> None:
    assert "No such directory" not in ours(" cd", {"folder": "document"})
    assert ours(" cd", {"folder": "document"}) == ours("cd", {"folder": "document"})


@pytest.mark.parametrize("name", ["print", "open", "__import__", "json", "copy",
                                  "Qwen_Qwen3_8B_multi_turn_base_0_GorillaFileSystem_instance.cd"])
def test_text_that_would_run_more_than_a_call_is_not_run(name: str) -> None:
    observation = ours(name, {"file": "x"})
    assert observation.startswith("Error during execution: name is not defined (envace does not run")
    methods, instances = bfcl_check._call_names(tuple(entry().involved_classes))
    assert checker_call(ToolCall(name, {"file": "x"}), methods, instances) == UNDEFINED_CALL


def test_an_argument_that_calls_is_not_run() -> None:
    methods, instances = bfcl_check._call_names(tuple(entry().involved_classes))
    text = bfcl_exec.official_text("cd", {"folder=open('x'),y": 1})
    assert bfcl_exec.checker_text(text, methods, instances) is None
    assert ours("cd", {"folder=open('x'),y": 1}).startswith("Error during execution: name is not defined")


SPACES = st.sampled_from(["", " ", "\t", "\n", "  ", "\x0c", "\r", "\u00a0"])
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=8), st.sampled_from(["\ud800", "document", "temp", "ls(", "cd(x)"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["cd", "ls", "mkdir", "echo", "post_tweet", "nope", "kill", "mv"]),
       before=SPACES, after=SPACES,
       keys=st.lists(st.tuples(SPACES, st.sampled_from(["folder", "dir_name", "content", "file_name", "a"]), SPACES),
                     max_size=3),
       values=st.lists(VALUES, min_size=3, max_size=3))
def test_generated_calls_observe_what_bfcl_observes(name: str, before: str, after: str, keys: list,
                                                    values: list) -> None:
    arguments = {f"{a}{k}{b}": v for (a, k, b), v in zip(keys, values, strict=False)}
    spaced = before + name + after
    got = ours(spaced, arguments)
    if got.startswith("Error during execution: name is not defined (envace"):
        return  # refused: BFCL would eval something other than a call of literals
    assert got == official(spaced, arguments)
