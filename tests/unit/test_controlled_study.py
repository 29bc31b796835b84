"""The controlled study's pure parts: lever parsing, the job plan and the report (hand-computed numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_levers_keep_their_order_and_a_repeated_name_adds_overrides(study_settings):
    levers = study_settings.parse_levers(["wm:--data.demonstrations=2000", "g8:--model.grpo.group_size=8",
                                          "wm:--model.grpo.align_weight=2.0"])
    assert levers == (("wm", ("--data.demonstrations=2000", "--model.grpo.align_weight=2.0")),
                      ("g8", ("--model.grpo.group_size=8",)))


@pytest.mark.parametrize("spec", ["--model.grpo.group_size=8", "g8:group_size=8", "g 8:--x=1", "../x:--x=1"])
def test_bad_lever_specs_are_refused_by_name(study_settings, spec):
    with pytest.raises(ValueError, match="--lever"):
        study_settings.parse_levers([spec])


def test_plan_adds_each_lever_per_seed_after_the_main_arms(study_settings, study_plan):
    settings = study_settings.Settings("out", 10, 20, levers=(("g8", ("--model.grpo.group_size=8",)),))
    keys = [job.key for job in study_plan.plan(settings, [0, 1])]
    assert keys[-4:] == ["s0-L-g8", "s0-eval-L-g8", "s1-L-g8", "s1-eval-L-g8"]
    lever_job = next(job for job in study_plan.plan(settings, [0, 1]) if job.key == "s1-L-g8")
    assert lever_job.needs == ("s1-warm",) and lever_job.args[2] == "L-g8"


def _results(success: dict[str, list[float]]) -> dict[str, dict]:
    results = {}
    for arm, values in success.items():
        for seed, value in enumerate(values):
            split = {"success_act": value, "imagined_success": 0.5, "fidelity_exact_match": 0.25,
                     "fidelity_leaf_f1": 0.5}
            results[f"s{seed}-eval-{arm}"] = {"test": split, "heldout": dict(split, success_act=0.0)}
            key = "warm" if arm == "d" else arm
            results[f"s{seed}-{key}"] = {"seconds": 100.0, "real_calls": 7.0 if arm == "b" else 0.0,
                                         "val_success_best": 0.8, "steps": 1000}
    return results


def test_report_summary_and_paired_lever_gains(study_settings, study_report):
    success = {"a": [0.9, 0.8], "b": [0.9, 0.9], "c": [0.7, 0.7], "d": [0.6, 0.8], "e": [0.7, 0.7],
               "L-g8": [0.8, 1.0]}
    settings = study_settings.Settings("out", 10, 20, levers=(("g8", ("--model.grpo.group_size=8",)),))
    text = study_report.report(_results(success), [0, 1], settings, "cmd")
    # gain = mean(a) - max(mean(d), mean(e)) = 0.85 - 0.7; std = largest of std(a), std(d), std(e) = 0.1 * sqrt(2)
    assert text.splitlines()[-1] == "SUMMARY gain=0.150 std=0.141 real_calls_rl=0"
    lever_row = next(line for line in text.splitlines() if line.startswith("| g8:"))
    cells = [cell.strip() for cell in lever_row.split("|")[1:-1]]
    # paired over (d): +0.2, +0.2 -> +0.200 +- 0; over (a): -0.1, +0.2 -> +0.050 +- 0.212
    assert cells[2] == "+0.200 ± 0.000" and cells[3] == "+0.050 ± 0.212"
    assert cells[1].startswith("0.900 ± 0.141")
    assert "| (b) RL against the real tools |" in text and "| 14 |" in text  # real calls summed over seeds


def test_report_without_levers_has_no_lever_table(study_settings, study_report):
    success = {arm: [0.5, 0.6] for arm in "abcde"}
    text = study_report.report(_results(success), [0, 1], study_settings.Settings("out", 10, 20), "cmd")
    assert "Levers" not in text


def test_write_section_replaces_its_own_section_and_keeps_the_rest(study_report, tmp_path):
    path = tmp_path / "results.md"
    study_report.write_section(str(path), "one", "first")
    study_report.write_section(str(path), "two", "second")
    study_report.write_section(str(path), "one", "FIRST\nagain")
    assert path.read_text() == ("<!-- BEGIN one -->\nFIRST\nagain\n<!-- END one -->\n\n"
                                "<!-- BEGIN two -->\nsecond\n<!-- END two -->\n")


@pytest.fixture(scope="module")
def ablation(study):
    spec = importlib.util.spec_from_file_location("alignment_ablation", ROOT / "benchmarks" / "alignment_ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ablation_plan_runs_every_variant_per_seed_from_its_warm_start(ablation, study_settings):
    settings = study_settings.Settings("out", 10, 20)
    jobs = {job.key: job for job in ablation.plan(settings, [0, 1], "--model.init_args.world={}", 5, 0.25)}
    assert len(jobs) == 2 + 4 * 2 * 2  # warm starts, then train + test per variant and seed
    assert jobs["abl-s1-ApSm"].needs == ("s1-warm",) and jobs["abl-s1-ApSm"].args[2] == "A+S-"
    assert jobs["abl-s1-ApSm-test"].needs == ("abl-s1-ApSm",)
    assert ablation.VARIANTS["A-S+"] == ("--model.init_args.grpo.align_weight=0.0",
                                        "--model.init_args.shaping.init_args.coef=0.5")
    world = ablation.hybrid_world(0.2, 0.1, 0.7)
    assert world.startswith("--model.init_args.world=") and '"real": 0.2' in world


def test_ablation_report_pools_shaping_and_reads_the_curves(ablation, study_settings):
    fidelity = {"A+S+": [0.4, 0.6], "A+S-": [0.3, 0.5], "A-S+": [0.2, 0.2], "A-S-": [0.1, 0.3]}
    success = {"A+S+": [0.9, 0.9], "A+S-": [0.8, 1.0], "A-S+": [0.7, 0.9], "A-S-": [0.8, 0.8]}
    results = {}
    for variant in ablation.VARIANTS:
        for seed in (0, 1):
            key = ablation.variant_key(seed, variant)
            results[f"{key}-test"] = {"success_act": success[variant][seed],
                                      "fidelity_exact_match": fidelity[variant][seed], "fidelity_leaf_f1": 0.5}
            results[key] = {"seconds": 60.0, "real_calls": 10.0, "real_calls_saved": 30.0, "curves": {
                "val/fidelity_exact_match": [(5, 0.1 * (seed + 1)), (10, 0.2 * (seed + 1))],
                "train/fidelity/exact_match": [(0, 0.0), (1, 1.0), (5, 0.5)],
                "train/fidelity_horizon": [(9, 1.5)], "train/sim2real_gap": [(9, 0.0)]}}
    text, summary = ablation.report(results, [0, 1], study_settings.Settings("out", 10, 20), "cmd", 5)
    # on: (0.4 + 0.6 + 0.3 + 0.5) / 4 = 0.45; off: (0.2 + 0.2 + 0.1 + 0.3) / 4 = 0.2
    # success on: (0.9 + 0.9 + 0.8 + 1.0) / 4 = 0.9; off: (0.7 + 0.9 + 0.8 + 0.8) / 4 = 0.8
    assert summary == "SUMMARY fidelity_on=0.450 fidelity_off=0.200 success_on=0.900 success_off=0.800"
    row = next(line for line in text.splitlines() if line.startswith("| A+S- |") and "±" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1:3] == ["on", "off"] and cells[3].startswith("0.900 ± 0.141") and cells[6:8] == ["20", "60"]
    # val curve at steps 5 and 10: means over seeds (0.1 + 0.2) / 2 and (0.2 + 0.4) / 2
    assert "| A-S- | 0.150 | 0.300 |" in text
    # live EM by quarters of 10 steps (windows of 2): steps 0-1 -> mean(0, 1) = 0.5; 4-5 -> 0.5; horizon 1.5
    assert "| A+S+ | 0.500 | nan | 0.500 | nan | 1.500 | 0.000 |" in text
    # paired (on - off) per (shaping, seed): A+S+ - A-S+ = +0.2, +0.4; A+S- - A-S- = +0.2, +0.2 -> +0.25 +- 0.1
    assert "| fidelity EM | +0.250 ± 0.100 | 4 of 4 |" in text
    # success: 0.9-0.7, 0.9-0.9, 0.8-0.8, 1.0-0.8 = +0.2, 0, 0, +0.2 -> +0.1 +- 0.115, 2 positive
    assert "| real success | +0.100 ± 0.115 | 2 of 4 |" in text


# -- the real-model study: scopes, the results file, the scoped report ---------------------------------------------


def test_a_scope_prefixes_its_keys_and_directories_and_uses_its_presets_configs(study_settings, study_plan):
    desk = study_settings.Settings("out", 10, 20, policy="smollm2", domain="desk")
    keys = [job.key for job in study_plan.plan(desk, [0])]
    assert keys[:4] == ["smollm2-desk-s0-warm", "smollm2-desk-s0-eval-d", "smollm2-desk-s0-rehearsal-d",
                        "smollm2-desk-s0-a"]
    arm_e = next(j for j in study_plan.plan(desk, [0]) if j.key == "smollm2-desk-s0-e")
    assert arm_e.needs == ("smollm2-desk-s0-warm", "smollm2-desk-s0-a") and arm_e.reads() == ("smollm2-desk-s0-warm",)
    assert desk.root(1) == "out/smollm2-desk-seed1"
    assert (desk.sft_config, desk.rl_config) == ("lit_configs/smollm2_sft.yaml", "lit_configs/smollm2_rl.yaml")
    assert desk.splits() == {"test": "builtin:desk-test", "heldout": "builtin:desk-heldout"}
    assert "--data.train_tasks=builtin:desk:500" in desk.on_domain(desk.sft_config)
    original = study_settings.Settings("out", 10, 20)  # the tiny study on the bank keeps its keys and directories
    assert [j.key for j in study_plan.plan(original, [0])][:2] == ["s0-warm", "s0-eval-d"]
    assert original.root(0) == "out/seed0"
    with pytest.raises(ValueError, match="--policy 'gpt'"):
        _ = study_settings.Settings("out", 10, 20, policy="gpt").sft_config


def test_the_results_file_skips_recorded_jobs_and_retrains_a_missing_checkpoint(study_plan, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the worker processes import the module by name
    record = tmp_path / "record.json"
    warm = str(tmp_path / "warm")  # recorded, but its checkpoint directory is gone (a fresh clone)
    study_plan.add_to_record(str(record), "s0-warm", {"policy": warm, "seconds": 5.0})
    study_plan.add_to_record(str(record), "s0-eval-d", {"test": {"success_act": 0.5}})
    jobs = [study_plan.Job("s0-warm", dict, ([("policy", warm), ("seconds", 7.0)],)),
            study_plan.Job("s0-eval-d", dict, ([("test", "rerun")],), ("s0-warm",)),
            study_plan.Job("s0-a", dict, ([("policy", "a"), ("seconds", 3.0)],), ("s0-warm",))]
    out = tmp_path / "out"
    out.mkdir()
    results = study_plan.run_all(jobs, str(out), workers=1, record=str(record))
    assert results["s0-warm"]["seconds"] == 7.0  # trained again, since s0-a needs it
    assert results["s0-eval-d"] == {"test": {"success_act": 0.5}}  # recorded: not run again
    saved = study_plan.read_record(str(record))
    assert saved["s0-warm"] == {"policy": warm, "seconds": 5.0}  # the recorded result is kept
    assert saved["s0-a"] == {"policy": "a", "seconds": 3.0}


@pytest.mark.parametrize(("val_steps", "unvalidated"), [([8], True), ([4, 8], False), (None, False)])
def test_a_warm_start_that_validated_only_after_its_last_step_is_trained_again_without_validating(
        study_plan, tmp_path, monkeypatch, val_steps, unvalidated):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    record = str(tmp_path / "record.json")
    recorded = {"policy": str(tmp_path / "gone"), "steps": 8, "seconds": 5.0}
    if val_steps is not None:
        recorded["val_steps"] = val_steps
    study_plan.add_to_record(record, "s0-warm", recorded)
    jobs = [study_plan.Job("s0-warm", dict.fromkeys, (["unvalidated", "val_steps"],),
                           again=study_plan._again_unvalidated),
            study_plan.Job("s0-a", dict, ([("seconds", 3.0)],), ("s0-warm",))]
    results = study_plan.run_all(jobs, str(tmp_path), workers=1, record=record)
    assert results["s0-warm"] == {"unvalidated": unvalidated, "val_steps": unvalidated}  # what it was called with
    # the record keeps its own result and gains only the fields it lacked
    assert study_plan.read_record(record)["s0-warm"] == {**recorded, "unvalidated": unvalidated,
                                                         "val_steps": val_steps if val_steps else unvalidated}


def test_warm_start_unvalidated_turns_validation_and_the_best_export_off(study_settings, study_jobs, monkeypatch,
                                                                        tmp_path):
    from envace.cli import demo

    seen = []

    def fake_fit(config, export, root, overrides):
        seen.append(overrides)
        Path(export).mkdir(parents=True)
        Path(export, "model.safetensors").write_bytes(b"w")
        return demo.StageResult(export_dir=export, seconds=1.0, steps=8, metrics={})

    monkeypatch.setattr(demo, "fit", fake_fit)
    scope = study_settings.Settings(str(tmp_path), 10, 8, policy="smollm2", domain="bank")
    assert study_jobs.warm_start(scope, 0)["val_steps"] == []  # nothing logged by the fake
    study_jobs.warm_start(scope, 1, unvalidated=True)
    quiet = ["--trainer.limit_val_batches=0", "--model.init_args.export_best=null"]
    assert not set(quiet) & set(seen[0]) and seen[1][-2:] == quiet  # last: they override the config's


def test_max_jobs_runs_one_job_and_stops(study_plan, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    record = str(tmp_path / "record.json")
    jobs = [study_plan.Job(f"s0-{k}", dict, ([("seconds", 1.0)],)) for k in ("warm", "a")]
    results = study_plan.run_all(jobs, str(tmp_path), workers=2, record=record, max_jobs=1)
    assert list(results) == ["s0-warm"] and list(study_plan.read_record(record)) == ["s0-warm"]
    # the next call: the next job
    results = study_plan.run_all(jobs, str(tmp_path), workers=2, record=record, max_jobs=1)
    assert sorted(study_plan.read_record(record)) == ["s0-a", "s0-warm"]


def test_a_broken_results_file_is_named(study_plan, tmp_path):
    bad = tmp_path / "record.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="record.json: expected a JSON object"):
        study_plan.read_record(str(bad))
    bad.write_text("{")
    with pytest.raises(ValueError, match="record.json: not valid JSON"):
        study_plan.read_record(str(bad))


def test_the_scoped_report_pairs_per_seed_and_marks_pending_arms(study_settings, study_report):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    success = {"a": [0.75, 0.5], "b": [0.5, 0.5], "d": [0.25, 0.5]}  # c and e not run yet
    results = {}
    for arm, values in success.items():
        for seed, value in enumerate(values):
            results[scope.key(seed, f"eval-{arm}")] = {"test": {"success_act": value}, "heldout": {"success_act": 0.0}}
            job = scope.key(seed, "warm" if arm == "d" else arm)
            results[job] = {"seconds": 60.0, "real_calls": 4.0 * (arm == "b")}
    text = study_report.scoped_report(results, [0, 1], [scope], "cmd")
    row = {line.split("|")[1].strip()[:3]: [c.strip() for c in line.split("|")[1:-1]]
           for line in text.splitlines() if line.startswith("| (")}
    # (a) - (d) per seed: +0.5, 0.0 -> mean +0.25, std 0.354; (a) - (b): +0.25, 0.0 -> +0.125
    assert row["(a)"][3] == "+0.250 ± 0.354 (+0.500 / +0.000)" and row["(a)"][4] == "+0.125 ± 0.177 (+0.250 / +0.000)"
    assert row["(a)"][1] == "0.625 ± 0.177 (0.750 / 0.500)" and row["(a)"][2] == "0.030"  # sqrt(.625*.375/256)
    assert row["(b)"][8] == "8" and row["(d)"][3] == "–"
    assert row["(c)"][1] == "pending" and row["(e)"][9] == "pending"
    assert text.splitlines()[-1] == ("SUMMARY gain=0.250 std=0.354 gain_vs_real=0.125 real_calls_rl=0 "
                                     "rehearsal_gain_envace=nan rehearsal_gain_base=nan")


def test_one_seed_shows_no_spread_and_an_unrun_arm_a_spends_no_known_calls(study_settings, study_report):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    results = {scope.key(0, f"eval-{arm}"): {"test": {"success_act": v}, "heldout": {"success_act": 0.0}}
               for arm, v in (("a", 0.75), ("d", 0.5))}
    results[scope.key(0, "rehearsal-d")] = {"rows": [{"mode": "parallel", "budget": 0, "success": 0.5}]}
    text = study_report.scoped_report(results, [0, 1], [scope], "cmd")
    assert "| (a) EnvACE: RL in the rehearsed world | 0.750 (0.750 / –) | 0.027 | +0.250 (+0.250 / –) |" in text
    assert "| bank | base (d) | parallel | 0.500 (1 seed) | pending | pending |" in text
    # one paired gain has no std; arm (a)'s training job is not recorded, so its real calls are unknown, not 0
    assert text.splitlines()[-1] == ("SUMMARY gain=0.250 std=nan gain_vs_real=nan real_calls_rl=nan "
                                     "rehearsal_gain_envace=nan rehearsal_gain_base=nan")
    results[scope.key(0, "a")] = {"seconds": 60.0, "real_calls": 0.0}
    assert study_report.scoped_report(results, [0, 1], [scope], "cmd").splitlines()[-1].startswith(
        "SUMMARY gain=0.250 std=nan gain_vs_real=nan real_calls_rl=0 ")


def test_evaluations_report_success_by_template_and_the_report_tables_it(study_settings, study_jobs, study_report,
                                                                        monkeypatch):
    import envace.cli.demo

    seen = []
    monkeypatch.setattr(envace.cli.demo, "evaluate", lambda config, policy, tasks, root, overrides=(): seen.append(
        list(overrides)) or {})
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    study_jobs.evaluate(scope, 0, "a", "p")
    assert all("--model.init_args.test_group_by=template" in overrides for overrides in seen)
    results = {scope.key(0, "eval-a"): {"test": {"success_act/template=balance": 1.0, "tasks/template=balance": 37.0,
                                                 "success_act/template=transfer_both": 0.0},
                                        "heldout": {"success_act/template=transfer_chain_both": 0.25}},
               scope.key(1, "eval-a"): {"test": {"success_act/template=balance": 0.5}},
               scope.key(0, "eval-d"): {"test": {"success_act": 0.5}}}  # recorded before templates were reported
    rows = [line for line in study_report.template_table(results, [0, 1], [scope]) if line.startswith("| ")]
    assert rows[0] == "| bank: split | template | tasks | calls | (a) | (b) | (c) | (d) | (e) |"
    # test rows first, by name; (a) is the mean over the seeds that reported the template, then each seed's value;
    # calls from the task files
    assert rows[1:] == ["| test | balance | 37 | 1 | 0.750 (1.000 / 0.500) | – | – | – | – |",
                        "| test | transfer_both | – | 3 | 0.000 (0.000 / –) | – | – | – | – |",
                        "| heldout | transfer_chain_both | – | 4 | 0.250 (0.250 / –) | – | – | – | – |"]
    one_seed = [line for line in study_report.template_table(results, [0], [scope])
                if line.startswith("| test | balance")]
    assert one_seed == ["| test | balance | 37 | 1 | 1.000 | – | – | – | – |"]  # one seed: its value alone
    assert study_report.template_table({scope.key(0, "eval-d"): {"test": {"success_act": 0.5}}}, [0], [scope]) == []


def test_the_printed_command_leaves_out_the_pacing(study):
    assert study._without_pacing(["--policy", "smollm2", "--max-jobs", "1", "--seeds", "0", "1"]) == [
        "--policy", "smollm2", "--seeds", "0", "1"]
    assert study._without_pacing(["--max-jobs=2", "--rl-steps", "40"]) == ["--rl-steps", "40"]
    assert study._without_pacing(["--only", "smollm2-bank-s0-*a", "--only=x", "--rl-steps", "40"]) == [
        "--rl-steps", "40"]
    assert study._without_pacing(["--accept-rebuilt", "--seeds", "0", "1"]) == ["--seeds", "0", "1"]


def test_only_selects_a_block_with_the_jobs_it_needs_in_plan_order(study_settings, study_plan):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    jobs = study_plan.plan(scope, [0, 1])
    keys = [job.key for job in study_plan.select(jobs, ["smollm2-bank-s0-a", "smollm2-bank-s0-*-a"])]
    assert keys == ["smollm2-bank-s0-warm", "smollm2-bank-s0-a", "smollm2-bank-s0-eval-a",
                    "smollm2-bank-s0-rehearsal-a"]
    # (e) needs (a)'s result (its wall-clock) as well as the warm start
    keys = [job.key for job in study_plan.select(jobs, ["smollm2-bank-s1-eval-e"])]
    assert keys == ["smollm2-bank-s1-warm", "smollm2-bank-s1-a", "smollm2-bank-s1-e", "smollm2-bank-s1-eval-e"]
    with pytest.raises(ValueError, match="--only smollm2-desk-"):
        study_plan.select(jobs, ["smollm2-desk-*"])


def test_max_jobs_zero_only_rebuilds_the_report_from_the_record(study, study_plan, tmp_path, capsys, monkeypatch):
    record, report = tmp_path / "smollm2.json", tmp_path / "results.md"
    study_plan.add_to_record(str(record), "smollm2-bank-s0-eval-d", {"test": {"success_act": 0.5},
                                                                    "heldout": {"success_act": 0.0}})

    def never(*args, **kwargs):
        raise AssertionError("nothing may run with --max-jobs 0")

    monkeypatch.setattr(study, "run_all", never)
    study.main(["--policy", "smollm2", "--seeds", "0", "1", "--record", str(record), "--report", str(report),
                "--out", str(tmp_path / "runs"), "--max-jobs", "0"])
    text = report.read_text()
    assert "<!-- BEGIN controlled_study_smollm2 -->" in text and "--max-jobs" not in text
    assert "| (d) no RL (the warm start) | 0.500 (0.500 / –) |" in text  # one seed: no spread shown
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("SUMMARY gain=nan std=nan gain_vs_real=nan")


def test_a_named_section_keeps_the_other_studies_of_the_policy(study, study_plan, tmp_path, monkeypatch):
    record, report = tmp_path / "library.json", tmp_path / "results.md"
    tiny = "| (a) EnvACE | 0.917 ± 0.019 (0.900 / 0.934) | 0.000 ± 0.000 (0.000 / 0.000) |"
    report.write_text(f"<!-- BEGIN controlled_study -->\n{tiny}\n<!-- END controlled_study -->\n"
                      "<!-- BEGIN controlled_study_smollm2 -->\nbank and desk\n<!-- END controlled_study_smollm2 -->\n")
    study_plan.add_to_record(str(record), "smollm2-library-s0-eval-d", {"test": {"success_act": 0.25},
                                                                       "heldout": {"success_act": 0.0}})
    monkeypatch.setattr(study, "run_all", lambda *a, **k: None)
    study.main(["--policy", "smollm2", "--domains", "library", "--seeds", "0", "1", "--record", str(record),
                "--report", str(report), "--out", str(tmp_path / "runs"), "--max-jobs", "0",
                "--section", "controlled_study_smollm2_library"])
    text = report.read_text()
    assert "<!-- BEGIN controlled_study_smollm2 -->\nbank and desk\n<!-- END controlled_study_smollm2 -->" in text
    library = text[text.index("<!-- BEGIN controlled_study_smollm2_library -->"):]
    assert "| (d) no RL (the warm start) | 0.250 (0.250 / –) |" in library and "--section" in library
    assert "Scale: the tiny policy" not in library  # the tiny study is on the bank, not this study's domain


def test_a_real_model_scope_plans_test_time_rehearsal_of_a_and_d(study_settings, study_plan):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    jobs = {job.key: job for job in study_plan.plan(scope, [0])}
    assert jobs["smollm2-bank-s0-rehearsal-a"].needs == ("smollm2-bank-s0-a",)
    assert jobs["smollm2-bank-s0-rehearsal-d"].needs == ("smollm2-bank-s0-warm",)
    assert not any("rehearsal" in job.key for job in study_plan.plan(study_settings.Settings("out", 10, 20), [0]))


def test_the_rehearsal_table_and_its_gains(study_settings, study_report):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")

    def record(success: dict[tuple[str, int], float]) -> dict:
        return {"rows": [{"mode": m, "budget": b, "success": v} for (m, b), v in success.items()]}

    results = {}
    for seed, shift in ((0, 0.0), (1, 0.1)):
        results[scope.key(seed, "rehearsal-a")] = record({("parallel", 0): 0.5 + shift, ("parallel", 2): 0.6 + shift,
                                                          ("parallel", 4): 0.55, ("sequential", 2): 0.7 + shift,
                                                          ("sequential", 4): 0.4})
    text = "\n".join(study_report.rehearsal_table(results, [0, 1], [scope]))
    assert "| bank | envace (a) | sequential | pending | 0.750 ± 0.071 | 0.400 ± 0.000 |" in text
    assert "| bank | base (d) | parallel | pending | pending | pending |" in text
    # best of budget > 0: sequential 2 at mean 0.75; budget 0 (parallel) at mean 0.55 -> +0.200
    assert study_report.rehearsal_gain(results, [0, 1], [scope], "a") == "0.200"
    assert study_report.rehearsal_gain(results, [0, 1], [scope], "d") == "nan"
    # only seed 0 recorded: its own best (sequential 2, 0.7) minus its budget 0 (0.5)
    del results[scope.key(1, "rehearsal-a")]
    assert study_report.rehearsal_gain(results, [0, 1], [scope], "a") == "0.200"
    rows = results[scope.key(0, "rehearsal-a")]["rows"]  # parallel 0, 2, 4, then sequential 2, 4
    rows[1]["success"], rows[2]["success"], rows[3]["success"] = 0.1, 0.45, 0.3  # now every budget loses
    assert study_report.rehearsal_gain(results, [0, 1], [scope], "a") == "-0.050"  # parallel 4, the least loss


def test_the_scale_table_reads_the_tiny_studys_own_rows(study, study_settings, study_report):
    tiny = (ROOT / "docs" / "results.md").read_text()
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    results = {scope.key(s, "eval-a"): {"test": {"success_act": v}, "heldout": {"success_act": 0.0}}
               for s, v in ((0, 0.5), (1, 0.7))}
    lines = study_report.scale_table(results, [0, 1], [scope], study_report._section(tiny, study.SECTION))
    row = next(line for line in lines if line.startswith("| (a)"))
    # the tiny row as docs/results.md has it (0.917 ± 0.019 on test, 0.000 ± 0.000 held out), SmolLM2's beside it
    assert row.endswith("| 0.917 ± 0.019 | 0.000 ± 0.000 | 0.600 ± 0.141 | 0.000 ± 0.000 |")
    assert next(line for line in lines if line.startswith("| (c)")).endswith("| pending | pending |")
    assert study_report.scale_table(results, [0, 1], [scope], "") == []


def test_the_curve_table_averages_each_step_over_seeds(study_settings, study_report):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="desk")
    results = {scope.key(0, "a"): {"curve": {"fidelity_exact_match": [[10, 0.25], [20, 0.5]]}},
               scope.key(1, "a"): {"curve": {"fidelity_exact_match": [[10, 0.75], [20, 0.5]]}}}
    lines = study_report.curve_table(results, [0, 1], [scope])
    assert "| desk: arm | step 10 | step 20 |" in lines and "| (a) | 0.500 | 0.500 |" in lines
    assert "| (b) | – | – |" in lines and study_report.curve_table({}, [0, 1], [scope]) == []


def test_an_evaluation_tests_the_split_it_names_on_the_scopes_domain(study_settings, study_jobs, monkeypatch):
    import envace.cli.demo

    calls = []
    monkeypatch.setattr(envace.cli.demo, "evaluate", lambda config, policy, tasks, root, overrides=(): calls.append(
        (config, tasks, list(overrides))) or {"success_act": 1.0})
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="desk", eval_tasks=64,
                                    extra_eval=("--model.rollout.engine=vllm",))
    assert study_jobs.evaluate(scope, 0, "a", "p") == {"test": {"success_act": 1.0}, "heldout": {"success_act": 1.0}}
    assert [c[1] for c in calls] == ["builtin:desk-test:64", "builtin:desk-heldout:64"]
    for config, _, overrides in calls:
        assert config == "lit_configs/smollm2_rl.yaml" and overrides[-1] == "--model.rollout.engine=vllm"
        assert not any(o.startswith("--data.test_tasks=") for o in overrides)  # the split named above wins
        assert any(o.startswith("--data.train_tasks=builtin:desk") for o in overrides)


@pytest.fixture
def stages(study_jobs, monkeypatch) -> list[tuple[str, str, list[str]]]:
    """``(config, root, overrides)`` of every ``fit`` the study's jobs call, in order; nothing is trained."""
    import envace.cli.demo

    seen: list[tuple[str, str, list[str]]] = []

    def fit(config, export_dir, root, overrides=()):
        seen.append((config, root, list(overrides)))
        return envace.cli.demo.StageResult(export_dir, 1.0, 3, {"train/real_calls_total": 0.0})

    monkeypatch.setattr(envace.cli.demo, "fit", fit)
    monkeypatch.setattr(study_jobs, "_validations", lambda root: {3: 0.5})
    monkeypatch.setattr(study_jobs, "weights_digest", lambda policy: "0" * 64)
    return seen


def test_demos_tie_the_warm_starts_demonstrations_to_the_rl_arms_references(study_settings, study_jobs, stages):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="desk", demos=64)
    study_jobs.warm_start(scope, 0)
    result = study_jobs.rl_arm(scope, 0, "a")
    assert result["world"] == {"class_path": "envace.worlds.RehearseWorld", "init_args": {"think": True}}  # recorded
    seen = {config: overrides for config, _, overrides in stages}
    sft, rl = seen["lit_configs/smollm2_sft.yaml"], seen["lit_configs/smollm2_rl.yaml"]
    assert "--data.train_tasks=builtin:desk:64" in sft and sft.index("--data.train_tasks=builtin:desk:64") > max(
        i for i, o in enumerate(sft) if o.startswith("--data.train_tasks=builtin:desk:500"))  # the later one wins
    assert "--data.demonstrations=64" in rl
    assert '--model.world={"class_path": "envace.worlds.RehearseWorld", "init_args": {"think": true}}' in rl
    assert not any("policy.init_args.seed" in o for o in sft)  # a pretrained policy has its weights


def test_a_pretrained_policys_seed_orders_its_training_tasks_and_a_built_ones_seeds_its_weights(study_settings,
                                                                                                 study_jobs, stages):
    """SmolLM2's seed-1 warm start came out bit-identical to seed 0's when the seed reached only ``seed_everything``."""
    real = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank", world_steps=5)
    study_jobs.warm_start(real, 1)
    study_jobs.rl_arm(real, 1, "b")
    study_jobs.sft_continued(real, 1, 60.0)
    assert [root.rsplit("/", 1)[1] for _, root, _ in stages] == ["world", "warm", "b", "e"]
    for _, _, overrides in stages:  # every stage of seed 1: the world and act stages, an RL arm, continued SFT
        assert "--seed_everything=1" in overrides and "--data.seed=1" in overrides
    stages.clear()
    study_jobs.warm_start(study_settings.Settings("out", 10, 20), 1)
    ((_, _, tiny),) = stages
    assert "--model.init_args.policy.init_args.seed=1" in tiny and not any(o.startswith("--data.seed") for o in tiny)


def test_every_rl_arm_rehearses_in_the_format_of_the_configs_world(study_settings, study_jobs, tmp_path):
    """A warm start whose rehearse role thinks must keep thinking in every arm: in (b) for its alignment rows, probes
    and imagined episodes (``RealWorld.rehearse``), in (c) for the frozen simulator's answers. The first run of (b)
    trained plain-prompt alignment rows on such a warm start (loss 0.2-0.3 against (a)'s 0.01-0.03)."""
    worlds = {arm: study_jobs._world_spec("lit_configs/smollm2_rl.yaml", world)
              for arm, world in study_settings.WORLDS.items()}
    assert worlds == {
        "a": {"class_path": "envace.worlds.RehearseWorld", "init_args": {"think": True}},
        "b": {"class_path": "envace.worlds.RealWorld",
              "init_args": {"rehearse": {"class_path": "envace.worlds.RehearseWorld", "init_args": {"think": True}}}},
        "c": {"class_path": "envace.worlds.FrozenWorld", "init_args": {"think": True}},
    }
    assert study_jobs._rehearse_settings("lit_configs/tiny_rl.yaml") == {}  # the tiny policy's plain prompts
    config = tmp_path / "real.yaml"
    config.write_text("model:\n  world: envace.worlds.RealWorld\n")
    with pytest.raises(ValueError, match=r"real\.yaml: model\.world is 'envace\.worlds\.RealWorld'"):
        study_jobs._world_spec(str(config), study_settings.WORLDS["c"])


def test_a_real_model_study_keeps_each_seeds_jobs_together_and_tests_each_checkpoint_at_once(study_settings,
                                                                                              study_plan):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank", levers=(("g8", ("--x=1",)),))
    keys = [job.key.removeprefix("smollm2-bank-") for job in study_plan.plan(scope, [0, 1])]
    seed0 = ["s0-warm", "s0-eval-d", "s0-rehearsal-d", "s0-a", "s0-eval-a", "s0-rehearsal-a", "s0-e", "s0-eval-e",
             "s0-b", "s0-eval-b", "s0-c", "s0-eval-c"]
    assert keys == [*seed0, *(k.replace("s0-", "s1-") for k in seed0), "s0-L-g8", "s0-eval-L-g8", "s1-L-g8",
                    "s1-eval-L-g8"]
    tiny = [job.key for job in study_plan.plan(study_settings.Settings("out", 10, 20), [0, 1])]
    assert tiny[:2] == ["s0-warm", "s1-warm"]  # the tiny study, in parallel, starts every warm start first


def test_a_retrained_checkpoint_must_match_the_recorded_fingerprint(study_plan, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    record = str(tmp_path / "record.json")
    gone = str(tmp_path / "gone")  # the recorded warm start's checkpoint is not on disk
    study_plan.add_to_record(record, "s0-warm", {"policy": gone, "weights_sha256": "aa" * 32})
    same = [study_plan.Job("s0-warm", dict, ([("policy", gone), ("weights_sha256", "aa" * 32)],)),
            study_plan.Job("s0-a", dict, ([("policy", "a")],), ("s0-warm",))]
    study_plan.run_all(same, str(tmp_path), workers=1, record=record, max_jobs=1)  # retrained, identical: accepted
    other = [study_plan.Job("s0-warm", dict, ([("policy", gone), ("weights_sha256", "bb" * 32)],)), same[1]]
    (tmp_path / "again").mkdir()  # a fresh output directory: the warm start is trained again
    with pytest.raises(RuntimeError, match=r"s0-warm: trained again .* differ .*record.json .*bbbbbbbbbbbb"):
        study_plan.run_all(other, str(tmp_path / "again"), workers=1, record=record, max_jobs=1)
    assert study_plan.read_record(record)["s0-warm"]["weights_sha256"] == "aa" * 32
    assert "s0-a" not in study_plan.read_record(record)  # nothing ran from the different warm start


def test_an_accepted_rebuild_trains_the_rest_from_it_and_tests_its_own_d_again(study_plan, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    record = str(tmp_path / "record.json")
    gone = str(tmp_path / "gone")
    study_plan.add_to_record(record, "s0-warm", {"policy": gone, "weights_sha256": "aa" * 32})
    study_plan.add_to_record(record, "s0-eval-d", {"test": {"success_act": 0.5}})
    study_plan.add_to_record(record, "s0-b", {"policy": "b", "starts_from": {"s0-warm": "aa" * 32}})
    jobs = [study_plan.Job("s0-warm", dict, ([("policy", gone), ("weights_sha256", "bb" * 32)],)),
            study_plan.Job("s0-eval-d", dict, ([("test", "rebuilt")],), ("s0-warm",), retest=True),
            study_plan.Job("s0-b", dict, ([("policy", "b")],), ("s0-warm",)),
            study_plan.Job("s0-e", dict, ([("policy", "e")],), ("s0-warm",))]
    out = tmp_path / "out"
    out.mkdir()
    chosen = study_plan.select(jobs, ["s0-e"])  # a selection without the test of (d): the plan's is used
    study_plan.run_all(chosen, str(out), workers=1, record=record, accept_rebuilt=True, retests=jobs)
    saved = study_plan.read_record(record)
    assert saved["s0-warm"]["weights_sha256"] == "aa" * 32  # the recorded warm start stays what the record says
    assert saved["s0-e"] == {"policy": "e", "starts_from": {"s0-warm": "bb" * 32}}
    assert saved["s0-eval-d@bbbbbbbbbbbb"] == {"test": "rebuilt", "starts_from": {"s0-warm": "bb" * 32}}
    assert saved["s0-eval-d"] == {"test": {"success_act": 0.5}}  # the recorded (d) is kept for the recorded arms


def test_a_rebuild_saved_by_an_earlier_run_is_refused_too(study_plan, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    record = str(tmp_path / "record.json")
    warm = tmp_path / "warm"
    (warm / "config.json").parent.mkdir()
    (warm / "config.json").write_text("{}")  # its checkpoint is on disk: nothing is trained again
    study_plan.add_to_record(record, "s0-warm", {"policy": str(warm), "weights_sha256": "aa" * 32})
    # an earlier run trained it again unlike the record, stopped, and left its result in --out
    (tmp_path / "s0-warm.json").write_text(f'{{"policy": "{warm}", "weights_sha256": "{"bb" * 32}"}}')
    jobs = [study_plan.Job("s0-warm", dict, ([("policy", str(warm))],)),
            study_plan.Job("s0-a", dict, ([("policy", "a")],), ("s0-warm",))]
    with pytest.raises(RuntimeError, match="s0-warm: trained again .*--accept-rebuilt"):
        study_plan.run_all(jobs, str(tmp_path), workers=1, record=record)
    assert "s0-a" not in study_plan.read_record(record)


def test_an_arm_from_a_rebuilt_warm_start_pairs_with_that_rebuilds_own_test(study_settings, study_report):
    scope = study_settings.Settings("out", 10, 20, policy="smollm2", domain="bank")
    results = {scope.key(0, "warm"): {"weights_sha256": "aa" * 32, "seconds": 1.0}}
    for arm, value in (("a", 0.75), ("d", 0.5), ("e", 0.625), ("d@bbbbbbbbbbbb", 0.25)):
        results[scope.key(0, f"eval-{arm}")] = {"test": {"success_act": value}, "heldout": {"success_act": 0.0}}
    results[scope.key(0, "a")] = {"seconds": 9.0, "real_calls": 0.0, "starts_from": {scope.key(0, "warm"): "aa" * 32}}
    results[scope.key(0, "e")] = {"seconds": 9.0, "real_calls": 0.0, "starts_from": {scope.key(0, "warm"): "bb" * 32}}
    text = study_report.scoped_report(results, [0, 1], [scope], "cmd")
    row = {line.split("|")[1].strip()[:3]: [c.strip() for c in line.split("|")[1:-1]]
           for line in text.splitlines() if line.startswith("| (")}
    assert row["(a)"][3] == "+0.250 (+0.250 / –)"  # 0.75 - 0.5: (a) started from the recorded warm start
    assert row["(e)"][3] == "+0.375 (+0.375 / –)"  # 0.625 - 0.25: (e) from the rebuild, against the rebuild's test
    assert ("seed 0 (e), paired with that rebuild's own test (d@bbbbbbbbbbbb: 0.250; the recorded (d): 0.500)"
            in text)


@pytest.mark.parametrize(("machine", "flags", "pinned"), [("x86_64", "fpu avx2 sse2", True),
                                                           ("x86_64", "fpu sse2", False), ("aarch64", "avx2", False)])
def test_portable_numerics_pin_avx2_kernels_only_where_the_cpu_has_them(study, monkeypatch, tmp_path, machine,
                                                                        flags, pinned):
    for name in study.PORTABLE_NUMERICS:  # set, then deleted: teardown restores what was there, set or not
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(study.platform, "machine", lambda: machine)
    (tmp_path / "cpuinfo").write_text(f"flags\t\t: {flags}\n")
    study.portable_numerics(str(tmp_path / "cpuinfo"))
    expected = study.PORTABLE_NUMERICS if pinned else {}
    assert {name: study.os.environ[name] for name in study.PORTABLE_NUMERICS if name in study.os.environ} == expected
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # what the user set is kept
    study.portable_numerics(str(tmp_path / "cpuinfo"))
    assert study.os.environ["MKL_CBWR"] == "COMPATIBLE"


def test_the_weights_fingerprint_covers_every_weight_file_by_name_and_content(study_jobs, tmp_path):
    import hashlib

    (tmp_path / "model-00002.safetensors").write_bytes(b"second")
    (tmp_path / "model-00001.safetensors").write_bytes(b"first")
    (tmp_path / "config.json").write_text("{}")  # not a weight: outside the fingerprint
    expected = hashlib.sha256(b"model-00001.safetensorsfirstmodel-00002.safetensorssecond").hexdigest()
    assert study_jobs.weights_digest(str(tmp_path)) == expected
    (tmp_path / "model-00002.safetensors").write_bytes(b"changed")
    assert study_jobs.weights_digest(str(tmp_path)) != expected
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        study_jobs.weights_digest(str(tmp_path / "config.json"))


def test_test_time_rehearsal_runs_on_the_tasks_it_is_given(study_settings, study_jobs, study_report, monkeypatch):
    import types

    import envace.cli.lightning

    seen = {}

    def cli_main(args):
        seen["args"] = args
        ablation = type("RehearsalBudgetAblation", (), {"history": [{"rows": []}]})()
        return types.SimpleNamespace(trainer=types.SimpleNamespace(callbacks=[ablation]))

    monkeypatch.setattr(envace.cli.lightning, "cli_main", cli_main)
    import json

    def limit(scope):
        study_jobs.rehearse_at_test(scope, 0, "a", "out/a/policy")
        (callbacks,) = [a for a in seen["args"] if a.startswith("--trainer.callbacks=")]
        return json.loads(callbacks.split("=", 1)[1])[0]["init_args"]["limit"]

    base = dict(policy="smollm2", domain="bank", eval_tasks=128)
    assert limit(study_settings.Settings("out", 10, 20, **base)) == 128
    assert limit(study_settings.Settings("out", 10, 20, **base, rehearsal_tasks=64)) == 64
    scope = study_settings.Settings("out", 10, 20, **base, rehearsal_tasks=64)
    text = "\n".join(study_report.rehearsal_table({}, [0, 1], [scope]))
    assert "Real success on the first 64 test tasks with" in text


def test_a_world_stage_trains_the_rehearse_role_alone_before_the_warm_start(study_settings, study_jobs, monkeypatch):
    import envace.cli.demo

    seen = []

    def fit(config, export_dir, root, overrides=()):
        seen.append((root, list(overrides)))
        return envace.cli.demo.StageResult(export_dir, 10.0 * len(seen), 25 if len(seen) == 1 else 8, {})

    monkeypatch.setattr(envace.cli.demo, "fit", fit)
    monkeypatch.setattr(study_jobs, "_validations", lambda root: {3: 0.5})
    monkeypatch.setattr(study_jobs, "weights_digest", lambda policy: "0" * 64)
    scope = study_settings.Settings("out", 24, 8, policy="smollm2", domain="bank", demos=8, world_steps=25,
                                    extra_warm=("--trainer.val_check_interval=8",))
    result = study_jobs.warm_start(scope, 1)
    (world_root, world), (warm_root, warm) = seen
    assert world_root == "out/smollm2-bank-seed1/world" and warm_root == "out/smollm2-bank-seed1/warm"
    assert "--model.init_args.act_weight=0" in world and "--trainer.max_steps=25" in world
    assert not any(o.startswith("--data.train_tasks=") for o in world)  # the config's 500: the world data
    assert "--trainer.val_check_interval=8" not in world and "--trainer.val_check_interval=8" in warm
    assert "--model.init_args.policy.init_args.name_or_path=out/smollm2-bank-seed1/world/policy" in warm
    assert "--data.train_tasks=builtin:bank:8" in warm  # the act role's 8 demonstrations
    assert result["seconds"] == 30.0 and result["world_seconds"] == 10.0 and result["world_steps"] == 25
    assert scope.demo_args("rl") == []  # the RL arms keep the world data's references (the config's 500)
    acting = study_settings.Settings("out", 24, 8, policy="smollm2", demos=8)
    assert acting.demo_args("rl") == ["--data.demonstrations=8"]


def test_a_base_model_replaces_the_presets_model_in_the_first_sft_stage_only(study_settings, study_jobs, monkeypatch):
    import envace.cli.demo

    seen = []

    def fit(config, export_dir, root, overrides=()):
        seen.append(list(overrides))
        return envace.cli.demo.StageResult(export_dir, 1.0, 8, {})

    monkeypatch.setattr(envace.cli.demo, "fit", fit)
    monkeypatch.setattr(study_jobs, "_validations", lambda root: {3: 0.5})
    monkeypatch.setattr(study_jobs, "weights_digest", lambda policy: "0" * 64)
    base = "--model.init_args.policy.init_args.name_or_path=/models/Qwen3-1.7B"
    study_jobs.warm_start(study_settings.Settings("out", 24, 8, policy="smollm2", base_model="/models/Qwen3-1.7B"), 0)
    assert base in seen[-1]
    study_jobs.warm_start(study_settings.Settings("out", 24, 8, policy="smollm2", base_model="/models/Qwen3-1.7B",
                                                  world_steps=25), 0)
    world, warm = seen[-2:]
    assert base in world and base not in warm  # the act stage starts from the world stage's export


def test_a_base_model_names_its_own_keys_record_and_report_section(study, study_settings, tmp_path, monkeypatch):
    scope = study_settings.Settings("out", 24, 8, policy="smollm2", domain="desk", base_model="/models/Qwen3-1.7B/")
    assert scope.label == "qwen3-1.7b" and scope.key(0, "a") == "qwen3-1.7b-desk-s0-a"
    assert scope.root(1) == "out/qwen3-1.7b-desk-seed1"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    study.main(["--policy", "smollm2", "--base-model", "/models/Qwen3-1.7B", "--seeds", "0", "1", "--max-jobs", "0"])
    text = (tmp_path / "docs" / "results.md").read_text()
    assert "<!-- BEGIN controlled_study_qwen3-1.7b -->" in text and "real language model: qwen3-1.7b" in text
    with pytest.raises(SystemExit):
        study.main(["--policy", "smollm2", "--base-model", "/", "--seeds", "0", "1", "--max-jobs", "0"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's prctl")
def test_a_study_killed_with_sigkill_takes_its_running_job_with_it(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import time

    (tmp_path / "sleepy.py").write_text(
        "import os, time\n"
        "def job(path):\n"
        "    open(path, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "    return {}\n")
    pid_file = tmp_path / "worker.pid"
    script = ("import study_plan, sleepy\n"
              f"study_plan.run_all([study_plan.Job('s0-sleep', sleepy.job, ({str(pid_file)!r},))], "
              f"{str(tmp_path)!r}, workers=1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "benchmarks"), str(ROOT)])}
    study = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and study.poll() is None, "the job never started"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        study.send_signal(signal.SIGKILL)
        study.wait()
        deadline = time.monotonic() + 10
        while _alive(worker):
            assert time.monotonic() < deadline, f"the study's worker {worker} outlived it"
            time.sleep(0.1)
    finally:
        study.kill()
        if pid_file.is_file() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # nothing left behind, even when the test fails


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped by init) is not running
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:  # gone between the two looks
        return False
