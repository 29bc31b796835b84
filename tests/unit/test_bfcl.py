"""BFCL-v4 multi-turn: safe call parsing, the executor against BFCL's own, and gold replays through BFCL's checker."""

from __future__ import annotations

import pytest

from envace.benchmarks.bfcl_check import check_multi_turn, gold_calls
from envace.benchmarks.bfcl_data import MULTI_TURN, load_multi_turn
from envace.benchmarks.bfcl_env import BFCLEnvironment, PyCall, UnsafeCallError, canonical_call, parse_calls


def test_parse_calls_reads_bfcl_syntax() -> None:
    assert parse_calls("[cd(folder='document'), sort('final_report.pdf')]") == [
        PyCall("cd", (), (("folder", "document"),)), PyCall("sort", ("final_report.pdf",), ())]
    assert parse_calls("f(x=[1, 2.5], y={'a': None}, z=-3)") == [
        PyCall("f", (), (("x", [1, 2.5]), ("y", {"a": None}), ("z", -3)))]
    call = parse_calls("mv(source='a b.pdf', destination='temp')")[0]
    assert canonical_call(call) == "mv(source='a b.pdf', destination='temp')"
    assert parse_calls(canonical_call(call)) == [call]  # canonical form round-trips


@pytest.mark.parametrize("text", [
    "__import__('os').system('echo pwned')",  # an attribute call
    "os.system('x')",
    "f(x=g())",  # a call in an argument
    "f(x=open('/etc/passwd').read())",
    "f(**{'a': 1})",
    "f(*[1])",
    "f(x=y)",  # a name, not a literal
    "lambda: 0",
    "f(",
])
def test_parse_calls_refuses_anything_but_literal_calls(text: str) -> None:
    with pytest.raises(UnsafeCallError):
        parse_calls(text)


def test_unknown_categories_and_ids_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: multi_turn_base, multi_turn_miss_func"):
        load_multi_turn("multi_turn_composite")
    with pytest.raises(ValueError, match="'web_search' is not run: it queries a live search API"):
        load_multi_turn("web_search")
    with pytest.raises(ValueError, match=r"unknown multi_turn_base id\(s\) \['multi_turn_base_999'\].*_199"):
        load_multi_turn("multi_turn_base", ids=["multi_turn_base_999"])


@pytest.mark.parametrize(("category", "reason"), [
    ("memory_kv", "prerequisite conversations"),
    ("memory_rec_sum", "prerequisite conversations"),
    ("memory_vector", "downloads a sentence-embedding model"),
    ("format_sensitivity", "only for prompting models"),
])
def test_categories_envace_does_not_run_are_refused_with_the_reason_everywhere(category: str, reason: str) -> None:
    """Before, the memory categories with offline backends and format_sensitivity were "unknown BFCL category"."""
    from envace.benchmarks.bfcl_ast import load_single_turn
    from envace.benchmarks.suite import split_bfcl_categories

    for load in (load_multi_turn, load_single_turn):
        with pytest.raises(ValueError, match=f"'{category}' is not run: .*{reason}.*left out of the offline score"):
            load(category)
    with pytest.raises(ValueError, match=f"bfcl_categories: BFCL category '{category}' is not run: .*{reason}"):
        split_bfcl_categories(["multi_turn_base", category])


@pytest.mark.parametrize("category", MULTI_TURN)
def test_gold_replay_is_valid_for_bfcls_checker(category: str) -> None:
    entries = load_multi_turn(category, limit=10)
    assert len(entries) == 10
    for entry in entries:
        assert check_multi_turn(entry, gold_calls(entry))["valid"], entry.id


def test_checker_rejects_a_rollout_missing_a_call() -> None:
    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_0"])
    calls = gold_calls(entry)
    calls[0][0] = calls[0][0][1:]  # skip the first gold call (cd into 'document')
    verdict = check_multi_turn(entry, calls)
    assert not verdict["valid"] and verdict["error_type"].startswith("multi_turn:")
    calls = gold_calls(entry)
    calls[1] = []  # no call at all in a turn that needs some
    assert check_multi_turn(entry, calls)["error_type"] == "multi_turn:empty_turn_model_response"


def test_a_call_in_a_turn_with_empty_ground_truth_gets_the_official_runners_verdict() -> None:
    # bfcl_eval's runner scores multi-turn entries with multi_turn_checker alone; its irrelevance checker, which
    # fails any call in a turn the ground truth leaves empty, is imported but never called there
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as official

    judged = 0
    for entry in load_multi_turn("multi_turn_miss_func", limit=30):
        empty = [i for i, turn in enumerate(entry.ground_truth) if not turn]
        if not empty or "GorillaFileSystem" not in entry.raw.get("involved_classes", []):
            continue
        calls = gold_calls(entry)
        calls[empty[0]] = [parse_calls("pwd()")]  # a read-only call where the function is held back
        decoded = [[[canonical_call(c) for c in step] for step in turn] for turn in calls]
        truth = [list(turn) for turn in entry.ground_truth]
        assert not official.multi_turn_irrelevance_checker(decoded, truth)["valid"]  # the rule envace used to apply
        expected = official.multi_turn_checker(decoded, truth, entry.raw, entry.category, f"official_{entry.id}")
        assert check_multi_turn(entry, calls)["valid"] == expected["valid"], entry.id
        judged += 1
    assert judged >= 3


def test_executor_matches_bfcls_on_gold_calls_and_instances_are_fresh() -> None:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    for category in MULTI_TURN:
        for entry in load_multi_turn(category, limit=5):
            ours = BFCLEnvironment(entry)
            name = f"envace_test_{entry.id}"
            for turn in entry.ground_truth:  # the gold strings are trusted data: BFCL's eval executor may run them
                theirs, _ = execute_multi_turn_func_call(list(turn), entry.raw["initial_config"],
                                                         entry.involved_classes, name, entry.id,
                                                         long_context=entry.long_context)
                assert [ours.execute(c) for text in turn for c in parse_calls(text)] == theirs, entry.id
    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_0"])
    first, second = BFCLEnvironment(entry), BFCLEnvironment(entry)
    assert first.execute(PyCall("cd", (), (("folder", "document"),))) == '{"current_working_directory": "document"}'
    assert second.execute(PyCall("pwd")) != first.execute(PyCall("pwd"))  # one rollout never moves another
    assert first.execute(PyCall("foo", (), (("x", 1),))) == "Error during execution: name 'foo' is not defined"


# -- policies through the rollout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("category", MULTI_TURN)
def test_the_gold_policy_scores_100_percent_through_the_rollout(category: str, tiny_tokenizer) -> None:
    from envace.benchmarks.bfcl import GoldPolicy, evaluate_multi_turn

    entries = load_multi_turn(category, limit=3)
    if category == "multi_turn_base":  # 147: the environment keeps a list argument and mutates it later;
        entries += load_multi_turn(category, ids=["multi_turn_base_147", "multi_turn_base_173"])  # 173: off-schema
    if category == "multi_turn_miss_func":  # 49: BFCL's gold calls 'tail' a turn before the entry provides it
        entries += load_multi_turn(category, ids=["multi_turn_miss_func_49"])
    for entry in entries:
        result = evaluate_multi_turn([entry], GoldPolicy(entry, tiny_tokenizer), tiny_tokenizer)
        assert result["accuracy"] == 1.0, entry.id
        episode = result["episodes"][0]
        assert episode.stats.user_turns == len(entry.turns) and episode.stats.invalid_arguments == 0


def test_tool_schemas_are_json_schema_and_leave_out_excluded_functions() -> None:
    from jsonschema import Draft202012Validator

    from envace.benchmarks.bfcl import to_task, tool_schemas

    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_0"])
    schemas = tool_schemas(entry)
    names = {s["function"]["name"] for s in schemas}
    assert "mv" in names and "post_tweet" in names and "cp" not in names  # cp is this entry's excluded function
    for schema in schemas:
        Draft202012Validator.check_schema(schema["function"]["parameters"])
        assert schema["function"]["parameters"]["type"] == "object"
    task = to_task(entry)
    assert len(task.user_turns) == len(entry.turns) - 1 and task.messages[1] == entry.turns[0][0]
    (missing,) = load_multi_turn("multi_turn_miss_func", limit=1)  # 'sort' arrives with turn 3
    late = to_task(missing)
    assert late.tool_unlocks == ((), (), ("sort",), ()) and "sort" not in {t["function"]["name"]
                                                                            for t in late.visible_tools()}
    assert '"name": "sort"' in late.user_turns[2][-1]["content"]  # BFCL's prompt for added functions, with the doc


@pytest.mark.slow
def test_a_tiny_random_policy_runs_end_to_end_deterministically(tiny_tokenizer) -> None:
    import torch

    from envace.benchmarks.bfcl import evaluate_multi_turn
    from envace.engines.base import HFEngine
    from envace.policy.tiny import build_model
    from envace.rollout.config import RolloutConfig

    model = build_model(tiny_tokenizer, hidden=32, layers=1, seed=0, max_positions=16384)
    engine = HFEngine(model, pad_id=tiny_tokenizer.pad_token_id, stop_ids=[tiny_tokenizer.eos_token_id])
    entries = load_multi_turn("multi_turn_base", limit=2)
    config = RolloutConfig(act_max_new_tokens=8, act_temperature=1.0, max_turns=40, max_tool_calls=40,
                           max_context_tokens=16384, max_steps_per_user_turn=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        result = evaluate_multi_turn(entries, engine, tiny_tokenizer, config)
        runs.append((result["valid"], [e.act.token_ids for e in result["episodes"]]))
        assert 0.0 <= result["accuracy"] <= 1.0
    assert runs[0] == runs[1]  # the same seed: the same rollouts and the same verdicts


# -- training tasks (the train split) ----------------------------------------------------------------------------------


def test_split_holds_out_a_quarter_and_training_refuses_it() -> None:
    from envace.benchmarks.bfcl import training_task
    from envace.benchmarks.bfcl_data import split_ids

    train, held_out = split_ids("multi_turn_base")
    assert len(train) == 150 and len(held_out) == 50 and not set(train) & set(held_out)
    assert "multi_turn_base_0" in held_out and "multi_turn_base_1" in train
    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_4"])
    with pytest.raises(ValueError, match="multi_turn_base_4 is held out for evaluation"):
        training_task(entry)


def test_exported_training_tasks_load_train_and_run_in_the_real_world(tmp_path, tiny_tokenizer) -> None:
    from envace.benchmarks.bfcl import GoldPolicy, export_training_tasks
    from envace.benchmarks.bfcl_check import score_episode
    from envace.benchmarks.bfcl_data import split_ids
    from envace.data.tasks import load_tasks
    from envace.rollout.config import RolloutConfig
    from envace.rollout.runner import EpisodeRunner
    from envace.world_model.alignment import AlignmentRows, DemonstrationRows
    from envace.worlds import RealWorld, RehearseWorld

    path = tmp_path / "bfcl_train.jsonl"
    counts = export_training_tasks(["multi_turn_base"], path)
    assert counts["written"] + counts["skipped_schema"] == 150 and counts["written"] >= 145
    tasks = {t.id: t for t in load_tasks(path)}
    assert not set(tasks) & set(split_ids("multi_turn_base")[1])  # no held-out entry
    task = tasks["multi_turn_base_1"]
    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_1"])
    world = RealWorld()  # the task's own environment: envace.benchmarks.bfcl.BFCLToolbox
    world.bind(tiny_tokenizer, model=None)
    config = RolloutConfig(act_temperature=0.0, max_turns=40, max_tool_calls=80, max_context_tokens=32768,
                           check_render=True)
    (episode,) = EpisodeRunner(tiny_tokenizer, config).run([task], [0], GoldPolicy(entry, tiny_tokenizer), world)
    assert score_episode(entry, episode)["valid"]
    assert episode.stats.real_calls == len(episode.calls) and episode.stats.invalid_arguments == 0
    # the reference (gold calls, real responses, later user turns) feeds the warm start and the alignment term
    prompter = RehearseWorld()
    prompter.bind(tiny_tokenizer, model=None)
    rows = AlignmentRows(tiny_tokenizer, prompter, max_per_task=100).rows([task])
    assert len(rows) == len(episode.calls)
    (demo,) = DemonstrationRows(tiny_tokenizer).rows([task])
    assert sum(demo.loss_mask) > 0


def test_miss_func_training_tasks_carry_the_added_function_prompt_in_their_reference(tmp_path) -> None:
    from envace.benchmarks.bfcl import export_training_tasks
    from envace.data.tasks import load_tasks

    path = tmp_path / "miss_func.jsonl"
    counts = export_training_tasks(["multi_turn_miss_func"], path)
    assert counts == {"written": 149, "skipped_schema": 1}  # measured; the one skipped calls a tool before it arrives
    task = {t.id: t for t in load_tasks(path)}["multi_turn_miss_func_1"]
    assert task.tool_unlocks and any(task.tool_unlocks)
    arrived = [n for names in task.tool_unlocks for n in names]
    users = [m["content"] for m in task.reference if m["role"] == "user"]
    assert any(f'"name": "{arrived[0]}"' in text for text in users)  # the same prompt to_task delivers
    assert [m for turn in task.user_turns for m in turn if m["role"] == "user"] == [
        m for m in task.reference if m["role"] == "user"]


def test_load_split_scores_a_trained_policy_on_the_held_out_ids_only() -> None:
    from envace.benchmarks.bfcl_data import load_split, split_ids

    held_out = load_split("multi_turn_base", "eval")
    assert [e.id for e in held_out] == split_ids("multi_turn_base")[1] and len(held_out) == 50
    assert [e.id for e in load_split("multi_turn_base", "eval", limit=2)] == ["multi_turn_base_0", "multi_turn_base_4"]
    assert len(load_split("multi_turn_base", "train")) == 150 and len(load_split("multi_turn_base")) == 200
    with pytest.raises(ValueError, match="unknown BFCL split 'test'; valid: all, train, eval"):
        load_split("multi_turn_base", "test")


# -- BFCL's inference loop: step limit, executed calls, its decoder ---------------------------------------------------


def _run_script(entry_id: str, outputs: list[str], tokenizer) -> dict:
    from envace.benchmarks.bfcl import evaluate_multi_turn
    from envace.benchmarks.scripted import ScriptedPolicy

    (entry,) = load_multi_turn("multi_turn_base", ids=[entry_id])
    return evaluate_multi_turn([entry], ScriptedPolicy(tokenizer, outputs), tokenizer)


def _gold_steps(entry_id: str) -> list[str]:
    from envace.benchmarks.parity import multi_turn_scripts

    (entry,) = load_multi_turn("multi_turn_base", ids=[entry_id])
    return list(multi_turn_scripts(entry)["gold"])  # per turn: one step with the turn's gold calls, then "Done."


def test_a_turn_past_bfcls_step_limit_force_terminates_the_entry_unless_it_is_the_last(tiny_tokenizer) -> None:
    """BFCL's inference force-quits an entry once a turn's 21st step has run; its runner then fails the entry
    (``multi_turn:force_terminated``) unless that was the last turn. Before, envace moved on to the next turn after
    its own 20 steps and scored the rest."""
    from envace.benchmarks.bfcl_loop import FORCE_TERMINATED
    from envace.benchmarks.parity import block

    gold = _gold_steps("multi_turn_base_0")  # 4 turns: [calls, "Done."] each
    pwd = block("pwd", {})  # changes nothing
    twenty = _run_script("multi_turn_base_0", [gold[0], *[pwd] * 19, *gold[1:]], tiny_tokenizer)
    assert twenty["valid"] == {"multi_turn_base_0": True}
    over = _run_script("multi_turn_base_0", [gold[0], *[pwd] * 20, *gold[1:]], tiny_tokenizer)
    (episode,) = over["episodes"]
    assert over["errors"] == {"multi_turn_base_0": FORCE_TERMINATED} and episode.stats.stop_reason == FORCE_TERMINATED
    assert episode.stats.user_turns == 1 and len(episode.call_steps) == 21
    assert over["results"][0]["result"] == [[gold[0], *[pwd] * 20]]  # the official result file: one turn reached
    last = _run_script("multi_turn_base_0", [*gold[:-1], *[pwd] * 20, "Done."], tiny_tokenizer)
    assert last["valid"] == {"multi_turn_base_0": True}  # force-quit in the last turn: every turn answered


def test_a_call_to_an_excluded_function_runs_as_in_bfcl(tiny_tokenizer) -> None:
    """multi_turn_base_0 leaves ``cp`` out of the tools, but BFCL executes a call to it: the copy changes the file
    system and the entry fails. Before, envace refused the call as an unknown tool and the entry passed."""
    from envace.benchmarks.parity import block

    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_0"])
    assert entry.raw["excluded_function"] == ["cp"]
    gold = _gold_steps("multi_turn_base_0")
    copy = block("cp", {"source": "previous_report.pdf", "destination": "archive_copy.pdf"})
    result = _run_script("multi_turn_base_0", [gold[0], copy, *gold[1:]], tiny_tokenizer)
    (episode,) = result["episodes"]
    responses = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert "archive_copy.pdf" in responses[3]  # the copy ran (after the gold turn's three calls)
    assert result["errors"] == {"multi_turn_base_0": "multi_turn:instance_state_mismatch"}
    unknown = _run_script("multi_turn_base_0", [block("envace_nothing", {}), *gold], tiny_tokenizer)
    assert unknown["valid"] == {"multi_turn_base_0": True}  # an unknown name is an execution error, nothing more


@pytest.mark.parametrize(("kind", "valid"), [
    ("off_format_no_newlines", False),  # not a block for BFCL's decoder: the turn ends without calls
    ("off_format_json_list", False),  # a list in one block: undecodable, the turn ends
    ("off_format_valid_then_malformed", True),  # the malformed block is skipped, the valid call runs
])
def test_multi_turn_output_is_decoded_as_bfcls_decoder_decodes_it(kind: str, valid: bool, tiny_tokenizer) -> None:
    """Before, envace's tolerant parser executed the first two and answered the third's bad block with an error."""
    from envace.benchmarks.parity import multi_turn_scripts

    (entry,) = load_multi_turn("multi_turn_base", ids=["multi_turn_base_0"])
    result = _run_script("multi_turn_base_0", list(multi_turn_scripts(entry)[kind]), tiny_tokenizer)
    assert result["valid"] == {"multi_turn_base_0": valid}
    (episode,) = result["episodes"]
    assert episode.stats.unknown_tools == 0 and all(m.get("name") != "error" for m in episode.messages)
