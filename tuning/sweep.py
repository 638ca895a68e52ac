"""A ``simulate`` sweep as an Optuna study: its points as queued slots on a shared storage.

The study is a grid over the sweep's points (:mod:`sim.sweep`): one WAITING trial per point,
user attribute ``slot`` = the point's index and ``point`` = what it runs. Workers claim slots the
way ``dspark tune`` workers do (:func:`tuning.study.work_queue`): popping a WAITING trial is
atomic, a claim whose slot an earlier trial holds is failed unrun, a dead worker's trial is failed
and re-queued (on this host at once, elsewhere by its heartbeat on RDB storages). So every point
runs to completion exactly once, however many commands join and whichever are killed.

The study's name is a fingerprint of the sweep (:meth:`sim.sweep.Sweep.digest`): the same
command on another machine, or run again after a crash, joins the same study. A finished point
leaves its result in the study (compressed text in study user attributes
``result:<trial>:<chunk>``, at most ``RESULT_CHUNK`` characters each, the count in the trial's
``chunks``), so a command that sees every point finished reads them back and writes the run
folder exactly as a serial run would, without running them again.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from control.errors import ConfigError, DSparkError
from sim.sweep import PointResult, Sweep, decode_point, encode_point, run_point
from tuning.objective import DuplicateSlot, NoSlot, slot_holder
from tuning.storage import make_storage, recover, redact, shareable, worker_tag
from tuning.study import (
    DONE,
    _die_with_parent,
    _slots,
    quiet,
    tag_trials,
    work_queue,
)

#: characters per stored chunk of a point's result: a MySQL TEXT column holds 65,535 bytes.
RESULT_CHUNK = 60_000
POLL_S = 0.5  # how often the command that started workers looks at the study


class _SkipPointErrors(logging.Filter):
    """Optuna logs a failed trial with its traceback; a point's own error (a DSparkError) is
    reported once, in one line, when the sweep ends (:func:`_check_complete`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, DSparkError):
            self.last = record.getMessage().split(" failed", 1)[0]
            return False
        last = getattr(self, "last", None)
        return not (last and record.getMessage().startswith(f"{last} failed with value"))


_FILTER = _SkipPointErrors()


def _quiet() -> None:
    quiet()
    log = logging.getLogger("optuna.study._optimize")
    if _FILTER not in log.filters:
        log.addFilter(_FILTER)


def study_name(sweep: Sweep) -> str:
    return f"sweep-{sweep.scn.name}-{sweep.digest()[:16]}"


def _sampler() -> optuna.samplers.BaseSampler:
    # no parameter is sampled: the sampler only tags each claim with its worker
    return tag_trials(optuna.samplers.RandomSampler(seed=0))


def prepare(sweep: Sweep, url: str, storage: Any = None) -> optuna.Study:
    """Create the sweep's study, or open it, and queue every point no trial holds."""
    _quiet()
    storage = storage or make_storage(url)
    study = optuna.create_study(
        study_name=study_name(sweep),
        storage=storage,
        load_if_exists=True,
        direction="minimize",
        sampler=_sampler(),
    )
    recover(study)  # trials of dead workers: failed and re-queued before slots are counted
    have = _slots(study)
    for i, p in enumerate(sweep.points()):
        if i not in have:
            study.enqueue_trial({}, user_attrs={"slot": i, "point": p.describe()})
    return study


class PointObjective:
    """Runs the point of the claimed slot and stores its result in the study."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep

    def __call__(self, trial: optuna.Trial) -> float:
        slot = trial.user_attrs.get("slot")
        if slot is None:
            raise NoSlot(f"trial {trial.number} is not a queued point")
        holder = slot_holder(trial)
        if holder is not None:
            trial.set_user_attr("stray", True)
            trial.set_user_attr("duplicate_of", holder)
            raise DuplicateSlot(f"trial {trial.number}: point {slot} is run by trial {holder}")
        if "worker" not in trial.user_attrs:
            trial.set_user_attr("worker", worker_tag())
        try:
            text = encode_point(run_point(self.sweep, int(slot)))
        except DSparkError as e:
            trial.set_user_attr("error", " ".join(str(e).split()))
            raise
        chunks = [text[i : i + RESULT_CHUNK] for i in range(0, len(text), RESULT_CHUNK)]
        for j, chunk in enumerate(chunks):
            trial.study.set_user_attr(f"result:{trial.number}:{j}", chunk)
        trial.set_user_attr("chunks", len(chunks))
        return 0.0


def _finished(study: optuna.Study) -> dict[int, optuna.trial.FrozenTrial]:
    """slot -> the trial that finished it (the earliest, should two have)."""
    out: dict[int, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=DONE):
        slot = t.user_attrs.get("slot")
        if slot is not None and (slot not in out or t.number < out[slot].number):
            out[slot] = t
    return out


def done_points(study: optuna.Study) -> int:
    return len(_finished(study))


def run_worker(sweep: Sweep, url: str, storage: Any = None, callbacks: list | None = None) -> int:
    """Run queued points until every point is finished or none is left to this worker;
    returns the points this worker finished."""
    _quiet()
    storage = storage or make_storage(url)
    study = optuna.load_study(study_name=study_name(sweep), storage=storage, sampler=_sampler())
    return work_queue(
        study,
        PointObjective(sweep),
        len(sweep.points()),
        callbacks,
        catch=(DSparkError,),
        done_count=done_points,
    )


def _worker_main(sweep: Sweep, url: str, parent: int) -> None:
    _die_with_parent(parent)
    run_worker(sweep, url)


def check_storage(url: str, workers: int) -> str:
    """``url``, refused in one line when ``workers`` processes cannot share it."""
    if workers > 1 and not shareable(url):
        raise ConfigError(
            f"--workers {workers} with --storage needs a shared storage (journal or "
            "database), not 'memory'"
        )
    return url


def run_sweep(sweep: Sweep, url: str, workers: int = 1, progress: Any = None) -> list[PointResult]:
    """Queue the sweep's points on ``url`` and run them with ``workers`` processes (1: in this
    one) until all are finished, by these workers or any other command on the same study; the
    points' results in point order. ``progress.update(1)`` per finished controller run.
    Ending short of every point is a one-line DSparkError (the same command continues it)."""
    storage = make_storage(check_storage(url, workers))
    study = prepare(sweep, url, storage)
    points = sweep.points()
    ticked: set[int] = set()

    def tick(*_: Any) -> None:
        if progress is None:
            return
        for slot in set(_finished(study)) - ticked:
            ticked.add(slot)
            if not points[slot].is_baseline:
                progress.update(1)

    tick()
    procs: list = []
    try:
        if workers <= 1:
            run_worker(sweep, url, storage=storage, callbacks=[tick])
        else:
            ctx = mp.get_context("spawn")  # the workers' parent is this process
            procs = [
                ctx.Process(
                    target=_worker_main, args=(sweep, url, os.getpid()), name=f"sweep-worker-{i}"
                )
                for i in range(workers)
            ]
            for p in procs:
                p.start()
            while any(p.is_alive() for p in procs):
                time.sleep(POLL_S)
                tick()
            for p in procs:
                p.join()
    finally:
        for p in procs:  # an interrupted run leaves no worker behind
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    recover(study)
    tick()
    _check_complete(study, sweep, [p.exitcode for p in procs if p.exitcode != 0], url)
    return load_results(study, sweep)


def load_results(study: optuna.Study, sweep: Sweep) -> list[PointResult]:
    """Every point's result, read back from the study, in point order."""
    done = _finished(study)
    attrs = study.user_attrs
    out = []
    for i in range(len(sweep.points())):
        t = done[i]
        text = "".join(attrs[f"result:{t.number}:{j}"] for j in range(t.user_attrs["chunks"]))
        out.append(decode_point(sweep, i, text))
    return out


def _check_complete(study: optuna.Study, sweep: Sweep, bad_exits: Sequence, url: str) -> None:
    """Short of every point: the first point's own error, or one line of how far it got."""
    n = len(sweep.points())
    done = done_points(study)
    if done >= n:
        return
    trials = study.get_trials(deepcopy=False)
    finished = _finished(study)
    errors = [
        t
        for t in trials
        if t.state == TrialState.FAIL
        and "error" in t.user_attrs
        and t.user_attrs["slot"] not in finished
    ]
    if errors:
        t = min(errors, key=lambda t: t.user_attrs["slot"])
        raise DSparkError(t.user_attrs["error"])
    running = sum(t.state == TrialState.RUNNING for t in trials)
    why = []
    if bad_exits:
        why.append(f"worker(s) exited with codes {list(bad_exits)}")
    if running:
        why.append(
            f"{running} point(s) still RUNNING (a worker elsewhere, or one whose "
            "heartbeat has not yet expired)"
        )
    raise DSparkError(
        f"sweep study '{study.study_name}' on {redact(url)} ended with {done} of {n} points "
        "finished" + (f" ({'; '.join(why)})" if why else "") + "; run the same command again "
        "to continue it"
    )
