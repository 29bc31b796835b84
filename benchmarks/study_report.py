"""The controlled study's report: its Markdown tables and its ``SUMMARY`` line, and its section of the report file.

``report`` is the tiny policy's bank study (arms (a) to (e), and the levers); ``scoped_report`` a real-model study's,
one table per domain with paired differences, success by task template, test-time private rehearsal, the fidelity
curve during RL and the tiny policy beside it. Every cell is read from the jobs' results (``study_plan``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from study_settings import ARMS, GROUP, LEVER_PREFIX, REHEARSED_ARMS, Settings


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _spread(values: list[float]) -> str:
    """``mean ± std`` of the seeds measured; one seed has no spread, so it is named, not shown as ``± 0.000``."""
    if not values:
        return "pending"
    mean, std = _stats(values)
    return f"{mean:.3f} ± {std:.3f}" if len(values) > 1 else f"{mean:.3f} (1 seed)"


def report(results: dict[str, dict[str, Any]], seeds: list[int], settings: Settings, command: str) -> str:
    """The Markdown report and the SUMMARY line."""
    def metric(arm: str, seed: int, split: str, key: str) -> float:
        return float(results[f"s{seed}-eval-{arm}"][split].get(key, float("nan")))

    def cell(arm: str, split: str, key: str) -> str:
        values = [metric(arm, s, split, key) for s in seeds]
        mean, std = _stats(values)
        return f"{mean:.3f} ± {std:.3f} ({' / '.join(f'{v:.3f}' for v in values)})"

    def spent(arm: str) -> str:
        if arm == "d":
            return "–"
        return str(int(sum(results[f"s{s}-{arm}"]["real_calls"] for s in seeds)))

    def seconds(arm: str) -> str:
        key = {"d": "warm"}.get(arm, arm)
        return f"{statistics.fmean(results[f's{s}-{key}']['seconds'] for s in seeds):.0f}"

    lines = [
        "| arm | real success, test (mean ± std; per seed) | real success, held-out templates | imagined success, "
        "test | fidelity EM, test | fidelity leaf F1, test | real tool calls in training (all seeds) | wall s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, title in ARMS.items():
        lines.append(
            f"| ({arm}) {title} | {cell(arm, 'test', 'success_act')} | {cell(arm, 'heldout', 'success_act')} | "
            f"{cell(arm, 'test', 'imagined_success')} | {cell(arm, 'test', 'fidelity_exact_match')} | "
            f"{cell(arm, 'test', 'fidelity_leaf_f1')} | {spent(arm)} | {seconds(arm)} |"
        )
    warm = [results[f"s{s}-warm"] for s in seeds]
    lines += [
        "",
        "Warm starts (best validation success, 128 validation tasks, at the step it was reached / steps run): "
        + ", ".join(f"seed {s}: {w['val_success_best']:.3f} / {w['steps']:.0f} steps, {w['seconds']:.0f} s"
                    for s, w in zip(seeds, warm)) + ".",
    ]
    test = {arm: [metric(arm, s, "test", "success_act") for s in seeds] for arm in ARMS}
    mean = {arm: statistics.fmean(v) for arm, v in test.items()}
    std = {arm: _stats(v)[1] for arm, v in test.items()}
    gain = mean["a"] - max(mean["d"], mean["e"])
    real_calls = int(sum(results[f"s{s}-a"]["real_calls"] for s in seeds))
    tasks = "all (256 and 128)" if settings.eval_tasks is None else f"the first {settings.eval_tasks}"
    header = [
        "# Controlled study: rehearsal-only RL on the built-in bank domain",
        "",
        f"Produced by `{command}` ({len(seeds)} seeds: {', '.join(map(str, seeds))}; {settings.rl_steps} RL steps "
        f"per arm). Real success is measured in the real environment, greedy, on {tasks} tasks of the test split "
        "and of the held-out-template split; fidelity is the teacher-forced rehearsal of the test tasks' reference "
        "calls. See docs/study.md for the protocol and the analysis.",
        "",
    ]
    summary = f"SUMMARY gain={gain:.3f} std={max(std['a'], std['d'], std['e']):.3f} real_calls_rl={real_calls}"
    return "\n".join([*header, *lines, *lever_table(settings, seeds, cell, metric, spent, seconds), "", summary])


SPLIT_SIZES = {"test": 256, "heldout": 128}
"""Tasks in each packaged split of a built-in domain (what an evaluation without ``--eval-tasks`` runs)."""


def scoped_report(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings],
                  command: str, tiny_report: str = "") -> str:
    """The real-model study's report: one table per domain, arms (a)-(e), and the SUMMARY over seeds and domains.

    Every cell is read from ``results`` (the results file); an arm not run yet shows ``pending``, and the SUMMARY
    then covers what is there (``nan`` when nothing is).
    """
    def metric(scope: Settings, arm: str, seed: int, split: str, key: str = "success_act") -> float:
        value = results.get(scope.key(seed, f"eval-{arm}"), {}).get(split, {}).get(key)
        return float("nan") if value is None else float(value)

    def known(values: list[float]) -> list[float]:
        return [v for v in values if v == v]

    def cell(values: list[float], signed: bool = False) -> str:
        have = known(values)
        if not have:
            return "pending"
        mean, std = _stats(have)
        each = " / ".join("–" if v != v else (f"{v:+.3f}" if signed else f"{v:.3f}") for v in values)
        spread = f" ± {std:.3f}" if len(have) > 1 else ""  # one seed: its value alone, the others shown as –
        return f"{mean:+.3f}{spread} ({each})" if signed else f"{mean:.3f}{spread} ({each})"

    def job(scope: Settings, arm: str, seed: int) -> dict[str, Any]:
        return results.get(scope.key(seed, {"d": "warm"}.get(arm, arm)), {})

    def pair(scope: Settings, arm: str, base: str, seed: int) -> str:
        """What ``arm`` pairs with: ``base``, or for (d) its retest on the rebuilt warm start ``arm`` started from."""
        start = job(scope, arm, seed).get("starts_from", {}).get(scope.key(seed, "warm"))
        warm = job(scope, "d", seed).get("weights_sha256")
        return f"d@{start[:12]}" if base == "d" and start and warm and start != warm else base

    def paired(scope: Settings, arm: str, base: str, split: str) -> list[float]:
        return [metric(scope, arm, s, split) - metric(scope, pair(scope, arm, base, s), s, split) for s in seeds]

    lines = [f"# Controlled study on a real language model: {scopes[0].label}", "",
             f"Produced by `{command}` (seeds {', '.join(map(str, seeds))}; {scopes[0].rl_steps} RL steps per arm). "
             "Real success: the real environment, greedy, on every test task and every held-out-template task of "
             "the domain (256 and 128) unless the command says `--eval-tasks`. Paired differences are per seed "
             "(the arms of a seed share its warm start). SE: the binomial standard error of one evaluation at that "
             "success rate. See docs/study.md for the protocol and the analysis.", ""]
    for scope in scopes:
        n = {split: scope.eval_tasks or size for split, size in SPLIT_SIZES.items()}
        lines += [f"## {scope.domain}", "",
                  "| arm | real success, test | SE | minus (d), paired | minus (b), paired | real success, held-out "
                  "| imagined success, test | fidelity EM, test | real tool calls (all seeds) | wall s / run |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for arm, title in ARMS.items():
            test = [metric(scope, arm, s, "test") for s in seeds]
            have = known(test)
            se = f"{math.sqrt(statistics.fmean(have) * (1 - statistics.fmean(have)) / n['test']):.3f}" if have else ""
            calls = [job(scope, arm, s).get("real_calls") for s in seeds]
            spent = (int(sum(c for c in calls if c is not None)) if any(c is not None for c in calls) else "pending")
            seconds = known([float(job(scope, arm, s).get("seconds", float("nan"))) for s in seeds])
            lines.append(
                f"| ({arm}) {title} | {cell(test)} | {se} | "
                f"{cell(paired(scope, arm, 'd', 'test'), True) if arm != 'd' else '–'} | "
                f"{cell(paired(scope, arm, 'b', 'test'), True) if arm != 'b' else '–'} | "
                f"{cell([metric(scope, arm, s, 'heldout') for s in seeds])} | "
                f"{cell([metric(scope, arm, s, 'test', 'imagined_success') for s in seeds])} | "
                f"{cell([metric(scope, arm, s, 'test', 'fidelity_exact_match') for s in seeds])} | "
                f"{'–' if arm == 'd' else spent} | "
                f"{f'{statistics.fmean(seconds):.0f}' if seconds else 'pending'} |")
        warm = [results.get(scope.key(s, "warm")) for s in seeds]
        lines += ["", "Warm starts (best validation success / steps / seconds): " + ", ".join(
            f"seed {s}: " + (f"{w.get('val_success_best', float('nan')):.3f} / {w.get('steps', 0):.0f} / "
                             f"{w.get('seconds', 0):.0f} s" if w else "pending") for s, w in zip(seeds, warm)) + ".",
                  ""]
        rebuilt = [(s, arm, pair(scope, arm, "d", s)) for s in seeds for arm in ARMS]
        if any(base != "d" for _, _, base in rebuilt):
            lines += ["Trained from a warm start trained again, whose weights differ from the recorded one's: "
                      + ", ".join(f"seed {s} ({arm}), paired with that rebuild's own test ({base}: "
                                  f"{metric(scope, base, s, 'test'):.3f}; the recorded (d): "
                                  f"{metric(scope, 'd', s, 'test'):.3f})" for s, arm, base in rebuilt if base != "d")
                      + ". Their differences against arms trained from the recorded warm start are not paired.", ""]
    lines += template_table(results, seeds, scopes)
    lines += rehearsal_table(results, seeds, scopes)
    lines += curve_table(results, seeds, scopes)
    lines += scale_table(results, seeds, scopes, tiny_report)
    gains = [g for scope in scopes for g in known(paired(scope, "a", "d", "test"))]
    versus_real = [g for scope in scopes for g in known(paired(scope, "a", "b", "test"))]
    arm_a = [results[scope.key(s, "a")] for scope in scopes for s in seeds if scope.key(s, "a") in results]

    def mean(values: list[float]) -> str:
        return f"{statistics.fmean(values):.3f}" if values else "nan"

    std = f"{_stats(gains)[1]:.3f}" if len(gains) > 1 else "nan"  # a spread needs two paired gains
    calls = f"{sum(float(r.get('real_calls', 0.0)) for r in arm_a):.0f}" if arm_a else "nan"  # nan: (a) not run yet
    rehearsal = {arm: rehearsal_gain(results, seeds, scopes, arm) for arm in REHEARSED_ARMS}
    lines.append(f"SUMMARY gain={mean(gains)} std={std} gain_vs_real={mean(versus_real)} "
                 f"real_calls_rl={calls} rehearsal_gain_envace={rehearsal['a']} "
                 f"rehearsal_gain_base={rehearsal['d']}")
    return "\n".join(lines)


def _rehearsal_success(results: dict[str, dict[str, Any]], scope: Settings, seed: int, arm: str, mode: str,
                       budget: int) -> float:
    rows = results.get(scope.key(seed, f"rehearsal-{arm}"), {}).get("rows", [])
    found = [r["success"] for r in rows if r["mode"] == mode and r["budget"] == budget]
    return float(found[0]) if found else float("nan")


def rehearsal_gain(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings], arm: str) -> str:
    """Best budget (> 0, either mode) minus budget 0, on means over the seeds and domains whose rehearsal of ``arm``
    is recorded (as ``gain`` covers what is recorded); ``nan`` until one is."""
    budgets = scopes[0].rehearsal_budgets
    recorded = [(scope, s) for scope in scopes for s in seeds if scope.key(s, f"rehearsal-{arm}") in results]

    def mean_at(mode: str, budget: int) -> float:
        values = [_rehearsal_success(results, scope, s, arm, mode, budget) for scope, s in recorded]
        return statistics.fmean(values) if values and all(v == v for v in values) else float("nan")

    plain = mean_at("parallel", 0)
    best = [mean_at(mode, b) for mode in ("parallel", "sequential") for b in budgets if b > 0]
    best = [b for b in best if b == b]
    return f"{max(best) - plain:.3f}" if best and plain == plain else "nan"


def rehearsal_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Test-time private rehearsal: real success per budget and mode, for EnvACE's policy (a) and its warm start (d)."""
    budgets = scopes[0].rehearsal_budgets
    limit = scopes[0].eval_tasks if scopes[0].rehearsal_tasks is None else scopes[0].rehearsal_tasks
    tasks = "every test task" if limit is None else f"the first {limit} test tasks"
    lines = ["## Private rehearsal at test time", "",
             f"Real success on {tasks} with *budget* imagined attempts before each committed act turn "
             f"(`{scopes[0].rehearsal_selector.rsplit('.', 1)[-1]}` commits), means ± std over seeds.", "",
             "| domain | policy | mode | " + " | ".join(f"budget {b}" for b in budgets) + " |",
             "|---|---|---|" + "---|" * len(budgets)]
    for scope in scopes:
        for arm, name in REHEARSED_ARMS.items():
            for mode in ("parallel", "sequential"):
                cells = []
                for b in budgets:
                    values = [_rehearsal_success(results, scope, s, arm, mode, b) for s in seeds]
                    have = [v for v in values if v == v]
                    cells.append(_spread(have))
                lines.append(f"| {scope.domain} | {name} ({arm}) | {mode} | " + " | ".join(cells) + " |")
    return lines + [""]


def _per_domain(heading: list[str], tables: list[list[str]]) -> list[str]:
    """One section of per-domain tables under ``heading``: nothing when no domain has a table yet."""
    tables = [table for table in tables if table]
    return heading + [line for table in tables for line in table] if tables else []


def template_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Real success per task template and arm (means over the seeds whose evaluation reported it), per domain."""
    prefix = f"success_act/{GROUP}="

    def table(scope: Settings) -> list[str]:
        evals = {arm: [results.get(scope.key(s, f"eval-{arm}"), {}) for s in seeds] for arm in ARMS}
        rows = sorted({(split, key[len(prefix):]) for per_seed in evals.values() for e in per_seed
                       for split, metrics in e.items() if isinstance(metrics, dict)
                       for key in metrics if key.startswith(prefix)}, key=lambda r: (r[0] != "test", r[1]))
        if not rows:
            return []
        lines = [f"| {scope.domain}: split | template | tasks | calls | " + " | ".join(f"({a})" for a in ARMS) + " |",
                 "|---|---|---|---|" + "---|" * len(ARMS)]
        calls = _template_calls(scope)
        for split, name in rows:
            tasks = next((e[split].get(f"tasks/{GROUP}={name}") for per_seed in evals.values() for e in per_seed
                          if f"tasks/{GROUP}={name}" in e.get(split, {})), None)
            cells = [_mean_and_seeds([e.get(split, {}).get(prefix + name) for e in evals[arm]]) for arm in ARMS]
            lines.append(f"| {split} | {name} | {'–' if tasks is None else f'{tasks:.0f}'} | "
                         f"{calls.get((split, name), '–')} | " + " | ".join(cells) + " |")
        return lines + [""]

    heading = ["## Real success by task template", "",
               "Each template is one kind of request; *calls*: how many calls its success requires. Means over the "
               "seeds whose evaluation reported templates, and each seed's value in brackets (– for a seed whose "
               "evaluation did not report them).", ""]
    return _per_domain(heading, [table(scope) for scope in scopes])


def _mean_and_seeds(values: list[float | None]) -> str:
    """The mean of the reported values; over several seeds also each seed's (``–`` where none was reported)."""
    have = [float(v) for v in values if v is not None]
    if not have:
        return "–"
    each = " / ".join("–" if v is None else f"{float(v):.3f}" for v in values)
    return f"{statistics.fmean(have):.3f}" + (f" ({each})" if len(values) > 1 else "")


def _template_calls(scope: Settings) -> dict[tuple[str, str], str]:
    """``{(split, template): required calls}`` of the domain's built-in splits (a range where they vary)."""
    from envace.builtin.task_sets import load_task_set

    found: dict[tuple[str, str], set[int]] = {}
    for split, spec in scope.splits().items():
        for task in load_task_set(spec):
            name = str(task.metadata.get(GROUP, ""))
            found.setdefault((split, name), set()).add(len(task.success.calls) if task.success else 0)
    return {k: "-".join(map(str, sorted({min(v), max(v)}))) for k, v in found.items()}


def curve_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings]) -> list[str]:
    """Rehearsal fidelity (exact match on validation tasks) during RL, per RL arm: means over seeds per step."""
    def table(scope: Settings) -> list[str]:
        curves = {arm: [results.get(scope.key(s, arm), {}).get("curve", {}).get("fidelity_exact_match", [])
                        for s in seeds] for arm in ("a", "b", "c")}
        steps = sorted({int(step) for per_seed in curves.values() for curve in per_seed for step, _ in curve})
        if not steps:
            return []
        lines = [f"| {scope.domain}: arm | " + " | ".join(f"step {t}" for t in steps) + " |",
                 "|---|" + "---|" * len(steps)]
        for arm, per_seed in curves.items():
            cells = []
            for step in steps:
                values = [v for curve in per_seed for t, v in curve if int(t) == step]
                cells.append(f"{statistics.fmean(values):.3f}" if values else "–")
            lines.append(f"| ({arm}) | " + " | ".join(cells) + " |")
        return lines + [""]

    heading = ["## Rehearsal fidelity during RL", "",
               "Exact match of the rehearsed responses to the reference calls of the validation tasks "
               "(`--curve-tasks`), teacher-forced, greedy, every `--curve-every` steps; means over seeds.", ""]
    return _per_domain(heading, [table(scope) for scope in scopes])


TINY_ROW = re.compile(r"^\| \(([a-e])\) [^|]+\| ([0-9.]+) ± ([0-9.]+) \([^|]*\| ([0-9.]+) ± ([0-9.]+) ", re.M)


def scale_table(results: dict[str, dict[str, Any]], seeds: list[int], scopes: list[Settings],
                tiny_report: str) -> list[str]:
    """The tiny policy's bank study (its section of the report, as it was written) beside this policy's, arm by arm."""
    tiny = {arm: (f"{m:.3f} ± {s:.3f}", f"{hm:.3f} ± {hs:.3f}") for arm, m, s, hm, hs in
            ((a, float(m), float(s), float(hm), float(hs)) for a, m, s, hm, hs in TINY_ROW.findall(tiny_report))}
    bank = next((scope for scope in scopes if scope.domain == "bank"), None)
    if not tiny or bank is None:  # the tiny study is on the bank: nothing to set beside a study of other domains
        return []
    lines = ["## Scale: the tiny policy beside this one (bank)", "",
             "The tiny policy's numbers are its controlled study's (the `controlled_study` section of this file); "
             "both are real success, greedy, on the bank test split and held-out templates, means ± std over seeds.",
             "", f"| arm | tiny, test | tiny, held-out | {scopes[0].label}, test | {scopes[0].label}, held-out |",
             "|---|---|---|---|---|"]
    for arm, title in ARMS.items():
        mine = []
        for split in ("test", "heldout"):
            values = [float(results.get(bank.key(s, f"eval-{arm}"), {}).get(split, {}).get("success_act", "nan"))
                      for s in seeds]
            have = [v for v in values if v == v]
            mine.append(_spread(have))
        small = tiny.get(arm, ("–", "–"))
        lines.append(f"| ({arm}) {title} | {small[0]} | {small[1]} | {mine[0]} | {mine[1]} |")
    return lines + [""]


def lever_table(settings: Settings, seeds: list[int], cell: Callable[[str, str, str], str],
                metric: Callable[[str, int, str, str], float], spent: Callable[[str], str],
                seconds: Callable[[str], str]) -> list[str]:
    """The levers' rows (variants of arm (a)), with each one's per-seed gain over (d) and over (a)."""
    if not settings.levers:
        return []

    def paired(arm: str, base: str) -> str:
        gains = [metric(arm, s, "test", "success_act") - metric(base, s, "test", "success_act") for s in seeds]
        mean, std = _stats(gains)
        return f"{mean:+.3f} ± {std:.3f}"

    lines = [
        "",
        "## Levers: variants of arm (a), from the same warm starts",
        "",
        "| lever (overrides on top of arm (a)) | real success, test | gain over (d), paired per seed | gain over (a), "
        "paired | imagined success, test | fidelity EM, test | real tool calls | wall s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, overrides in settings.levers:
        arm = LEVER_PREFIX + name
        lines.append(
            f"| {name}: `{' '.join(overrides)}` | {cell(arm, 'test', 'success_act')} | {paired(arm, 'd')} | "
            f"{paired(arm, 'a')} | {cell(arm, 'test', 'imagined_success')} | "
            f"{cell(arm, 'test', 'fidelity_exact_match')} | {spent(arm)} | {seconds(arm)} |"
        )
    return lines


def _section(text: str, name: str) -> str:
    """The ``name`` section of a report (between its markers), or empty."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    return text[text.index(begin) + len(begin):text.index(end)] if begin in text and end in text else ""


def write_section(path: str, name: str, text: str) -> None:
    """Replace the ``name`` section of the Markdown file ``path`` (between its markers, the rest kept), or append it.

    Each benchmark writes its own section of the shared report (``docs/results.md``).
    """
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{text}\n{end}"
    file = Path(path)
    old = file.read_text(encoding="utf-8") if file.is_file() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = (old.rstrip("\n") + "\n\n" if old else "") + block + "\n"
    file.write_text(new, encoding="utf-8")
