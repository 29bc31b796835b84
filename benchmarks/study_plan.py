"""The controlled study's plan and its resumable run: every job of each seed and arm with its dependencies, in order,
and running them in worker processes.

Each job's result is saved as ``<key>.json`` under ``--out``; a real-model study also adds it to a results file kept
in version control (``read_record``, ``add_to_record``). A run skips what is saved or recorded, trains again a
recorded checkpoint that is gone (its weights must match the recorded fingerprint, or be accepted as a rebuild whose
tests run again), and ``select`` picks the block of jobs one session can afford.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from study_jobs import evaluate, rehearse_at_test, rl_arm, sft_continued, validation_chose_nothing, warm_start
from study_settings import LEVER_PREFIX, REHEARSED_ARMS, Settings

from envace.envs.mcp_launch import die_with_parent


@dataclass
class Job:
    """One unit of work: a stage of one seed, run after the jobs it depends on."""

    key: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...]
    needs: tuple[str, ...] = ()
    extra: Callable[[dict[str, dict[str, Any]]], tuple[Any, ...]] = field(default=lambda results: ())
    checkpoints: tuple[str, ...] | None = None
    """The needs whose checkpoints this job reads (None: every need); the others lend it only their results."""
    again: Callable[[dict[str, Any]], tuple[Any, ...]] = field(default=lambda recorded: ())
    """Extra arguments of a recorded job trained again (its checkpoint was gone), from its recorded result."""
    retest: bool = False
    """A test that runs again, as ``<key>@<first 12 hex digits>``, on a checkpoint it reads that was trained again
    with weights unlike the recorded ones (``--accept-rebuilt``): the jobs trained from that rebuild pair with it."""

    def reads(self) -> tuple[str, ...]:
        """The jobs whose checkpoints must be on disk before this one runs."""
        return self.needs if self.checkpoints is None else self.checkpoints

def plan(settings: Settings, seeds: list[int]) -> list[Job]:
    """Every job of the study, with its dependencies.

    The tiny study (workers in parallel) starts every warm start first, the longest jobs, which every arm needs. A
    real-model study runs one job at a time across sessions whose checkpoints do not survive, so it keeps each seed's
    jobs together and tests each checkpoint right after it is trained: a warm start is trained again at most once a
    session, and an RL arm never.
    """
    per_seed = [_seed_jobs(settings, s) for s in seeds]  # each starts with its warm start
    if settings.tag:
        jobs = [job for seed_jobs in per_seed for job in seed_jobs]
    else:
        jobs = [seed_jobs[0] for seed_jobs in per_seed] + [job for seed_jobs in per_seed for job in seed_jobs[1:]]
    return jobs + _lever_jobs(settings, seeds)


def _seed_jobs(settings: Settings, s: int) -> list[Job]:
    """One seed's jobs: its warm start and (d)'s test, then per RL arm its training and tests, (e) after (a)."""
    k = settings.key

    def tested(arm: str, source: str) -> list[Job]:
        jobs = [Job(k(s, f"eval-{arm}"), evaluate, (settings, s, arm), (source,),
                    lambda r: (r[source]["policy"],), retest=arm == "d")]
        if settings.tag and arm in REHEARSED_ARMS:  # the real-model study also rehearses privately at test time
            jobs.append(Job(k(s, f"rehearsal-{arm}"), rehearse_at_test, (settings, s, arm), (source,),
                            lambda r: (r[source]["policy"],)))
        return jobs

    warm = k(s, "warm")
    jobs = [Job(warm, warm_start, (settings, s), again=_again_unvalidated), *tested("d", warm)]
    for arm in ("a", "b", "c"):
        jobs += [Job(k(s, arm), rl_arm, (settings, s, arm), (warm,)), *tested(arm, k(s, arm))]
        if arm == "a":  # (e) starts from the warm start, for (a)'s training time: (a)'s checkpoint is not read
            jobs += [Job(k(s, "e"), sft_continued, (settings, s), (warm, k(s, "a")),
                         lambda r: (r[k(s, "a")].get("train_seconds", r[k(s, "a")]["seconds"]),), (warm,)),
                     *tested("e", k(s, "e"))]
    return jobs


def _again_unvalidated(recorded: dict[str, Any]) -> tuple[Any, ...]:
    return (validation_chose_nothing(recorded),)


def _lever_jobs(settings: Settings, seeds: list[int]) -> list[Job]:
    """The levers' jobs, after the main arms (the study's table comes first)."""
    k = settings.key
    jobs = []
    for name, _ in settings.levers:
        arm = LEVER_PREFIX + name
        for s in seeds:
            jobs.append(Job(k(s, arm), rl_arm, (settings, s, arm), (k(s, "warm"),)))
            jobs.append(Job(k(s, f"eval-{arm}"), evaluate, (settings, s, arm), (k(s, arm),),
                            lambda r, s=s, arm=arm: (r[k(s, arm)]["policy"],)))
    return jobs


def select(jobs: list[Job], patterns: list[str]) -> list[Job]:
    """The jobs whose keys match one of ``patterns`` (shell-style, ``fnmatch``), with every job they need, in plan
    order: a session that can afford one block (an arm's training and its tests) runs exactly that block.

    Raises:
        ValueError: a pattern matches no job, naming it.
    """
    keys = {job.key for job in jobs}
    for pattern in patterns:
        if not fnmatch.filter(keys, pattern):
            raise ValueError(f"--only {pattern}: matches no job of this study (its jobs are e.g. {min(keys)})")
    needs = {job.key: job.needs for job in jobs}
    chosen = {key for key in keys if any(fnmatch.fnmatchcase(key, p) for p in patterns)}
    frontier = list(chosen)
    while frontier:
        for need in needs[frontier.pop()]:
            if need not in chosen:
                chosen.add(need)
                frontier.append(need)
    return [job for job in jobs if job.key in chosen]


def _run(job_key: str, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], path: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.basicConfig(level=logging.WARNING)
    result = fn(*args)
    Path(path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def run_all(jobs: list[Job], out: str, workers: int, record: str | None = None,
            max_jobs: int | None = None, accept_rebuilt: bool = False,
            retests: list[Job] | None = None) -> dict[str, dict[str, Any]]:
    """Run ``jobs`` respecting their dependencies, ``workers`` at a time; reuse results saved by an earlier run.

    Args:
        jobs: the plan.
        out: where each job's result is saved as ``<key>.json`` (beside its checkpoints).
        workers: jobs in parallel.
        record: a results file kept in version control: every job recorded there counts as done, and each job that
            finishes is added to it at once, with the fingerprints of the checkpoints it read (``starts_from``). A
            recorded job whose checkpoint (its ``policy``) is gone but which a pending job needs runs again from its
            seed; its recorded result is kept.
        max_jobs: start at most this many jobs (one arm at a time: ``--max-jobs 1``); None runs all.
        accept_rebuilt: a checkpoint trained again whose weights differ from the recorded ones (another CPU's
            arithmetic) is used rather than refused; the tests marked ``retest`` run again on it, as
            ``<key>@<fingerprint>``, so that the jobs trained from it pair with a test of what they started from.
        retests: where those tests are found (default: ``jobs``; a selection may have left them out).

    Returns:
        Every result known (saved, recorded, or run now); a plan cut by ``max_jobs`` leaves jobs out.

    Raises:
        RuntimeError: a checkpoint trained again differs from the recorded one and ``accept_rebuilt`` is off.
    """
    results: dict[str, dict[str, Any]] = {}
    for job in jobs:
        saved = Path(out, f"{job.key}.json")
        if saved.is_file():
            results[job.key] = json.loads(saved.read_text(encoding="utf-8"))
    recorded = read_record(record) if record else {}
    rebuilt = {key: _rebuilt_unlike(key, recorded.get(key), result, record, accept_rebuilt)
               for key, result in results.items()}  # trained again by an earlier run into this --out
    results.update({key: value for key, value in recorded.items() if key not in results})
    pending = [j for j in jobs if j.key not in results]
    needed = {n for j in pending for n in j.reads()}
    rebuild = [j for j in jobs if j.key in needed and j.key in results and not _checkpoint_present(results[j.key])]
    for job in rebuild:  # its checkpoint is gone (a fresh clone): train it again from its seed
        del results[job.key]
    again = {job.key: job.again(recorded.get(job.key) or {}) for job in rebuild}
    tests = [j for j in (jobs if retests is None else retests) if j.retest]
    pending = _retests(tests, rebuilt, results) + [j for j in jobs if j.key not in results]
    running: dict[Future, Job] = {}
    started = 0
    context = multiprocessing.get_context("spawn")
    # a worker dies with the study (also on SIGKILL), rather than training on for an hour with nobody to record it
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=die_with_parent) as pool:
        while pending or running:
            room = workers - len(running) if max_jobs is None else min(workers - len(running), max_jobs - started)
            for job in [j for j in pending if all(n in results for n in j.needs)][: max(room, 0)]:
                pending.remove(job)
                args = job.args + job.extra(results) + again.get(job.key, ())
                running[pool.submit(_run, job.key, job.fn, args, str(Path(out, f"{job.key}.json")))] = job
                started += 1
                print(f"started {job.key}", flush=True)  # noqa: T201
            if not running:
                if max_jobs is not None and started >= max_jobs:
                    break
                raise RuntimeError(f"jobs whose dependencies failed: {[j.key for j in pending]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                results[job.key] = {**future.result(), **_starts_from(job, results)}  # a failed job stops the study
                rebuilt[job.key] = _rebuilt_unlike(job.key, recorded.get(job.key), results[job.key], record,
                                                   accept_rebuilt)
                pending[:0] = _retests(tests, {job.key: rebuilt[job.key]}, results)
                if record:  # a job trained again keeps its recorded result; it adds only what the record lacks
                    add_to_record(record, job.key, {**results[job.key], **recorded.get(job.key, {})})
                print(f"finished {job.key}", flush=True)  # noqa: T201
    return results


def _rebuilt_unlike(key: str, recorded: dict[str, Any] | None, rebuilt: dict[str, Any], record: str | None,
                    accept: bool) -> str | None:
    """A checkpoint trained again from its seed should be the recorded one, bit for bit (its weights' SHA-256), or
    the arms tested from it would not share what the record says they share.

    Returns:
        The rebuild's fingerprint where it differs from the recorded one and ``accept`` holds; None where they agree
        (or either has none).

    Raises:
        RuntimeError: the fingerprints differ and ``accept`` is off, naming the job and the record.
    """
    if not recorded or "weights_sha256" not in recorded or "weights_sha256" not in rebuilt:
        return None
    if recorded["weights_sha256"] == rebuilt["weights_sha256"]:
        return None
    if accept:
        return rebuilt["weights_sha256"]
    raise RuntimeError(
        f"{key}: trained again from its seed (its checkpoint was gone), its weights differ from those {record} "
        f"records (SHA-256 {rebuilt['weights_sha256'][:12]}... against {recorded['weights_sha256'][:12]}...): "
        "the jobs still to run would not start from the checkpoint the recorded ones did. Rerun with the same "
        "OMP_NUM_THREADS, torch and CPU as the recorded run; or pass --accept-rebuilt to train them from this one, "
        "its own (d) tested again beside them; or start this scope again with a fresh --record")


def _starts_from(job: Job, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``starts_from``: the fingerprint of each checkpoint ``job`` read (where its result has one)."""
    shas = {need: results[need]["weights_sha256"] for need in job.reads()
            if "weights_sha256" in results.get(need, {})}
    return {"starts_from": shas} if shas else {}


def _retests(tests: list[Job], rebuilt: dict[str, str | None], done: dict[str, dict[str, Any]]) -> list[Job]:
    """The ``retest`` jobs to run again, each as ``<key>@<fingerprint>``, on the checkpoints trained again unlike
    the recorded ones (``rebuilt``: key to fingerprint, None where alike); those already done are left out."""
    return [replace(job, key=variant, retest=False) for job in tests for need in job.reads()
            if rebuilt.get(need) and (variant := f"{job.key}@{rebuilt[need][:12]}") not in done]


def _checkpoint_present(result: dict[str, Any]) -> bool:
    """A result without a checkpoint (an evaluation) needs none; one with a ``policy`` needs that directory."""
    policy = result.get("policy")
    return policy is None or Path(policy, "config.json").is_file()


def read_record(path: str) -> dict[str, dict[str, Any]]:
    """The results file (``{job key: result}``); an absent file is an empty record.

    Raises:
        ValueError: the file is not a JSON object of objects, naming the file.
    """
    file = Path(path)
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object mapping job keys to result objects")
    return data


def add_to_record(path: str, key: str, result: dict[str, Any]) -> None:
    """Add one job's result to the results file, written whole to a temporary file first (never half-written)."""
    data = read_record(path)
    data[key] = result
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n", encoding="utf-8")
    tmp.replace(file)

