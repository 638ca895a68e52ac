"""Create, resume and run a study with N worker processes on one storage.

Exactly ``n_trials`` trials, whatever the number of workers: the study is a queue of *slots*.
:func:`prepare_study` enqueues one WAITING trial per missing slot (user attribute ``slot``):
first the start points (the seed's α = 0.8, β = 0.85 and the untuned defaults), then empty
ones the sampler fills in when a worker pops them. Popping a WAITING trial is atomic in every
Optuna storage, so two workers never run the same slot; a worker stops when the queue is
empty (``MaxTrialsCallback`` over COMPLETE and PRUNED trials is kept as a second guard).

A worker that dies leaves its RUNNING trial behind. :func:`tuning.storage.recover` fails and
re-queues it (a dead process on this host at once; on RDB storages any worker whose heartbeat
stopped): when the study is prepared or resumed, when a worker opens it, after every trial, and
while a worker whose queue is empty waits for the trials still running. So the slot is run again,
every finished trial is kept, and a run ends with exactly N finished trials or says in one line
(non-zero exit) how far it got.

Slot claims are exact however many commands and workers join: popping a WAITING trial is atomic
(a database transaction on PostgreSQL and MySQL, the study's lock on SQLite, whose transactions
do not lock the row they read, the journal's lock on files); a worker takes only queued slots
(:func:`queue_only`: with none left it stops, it never creates a trial outside the queue); and
every slot is queued under the study's lock (:func:`tuning.locks.study_lock`: creating the study
and queueing its slots in :func:`prepare_study`, re-queueing a retry in
:func:`tuning.storage.requeue`), never twice. So two commands started together on one study
leave no failed record behind: without ``--resume`` one of them runs it and the other is refused
in one line; with it, the second finds every slot queued and joins as more workers. A trial
whose slot an earlier one holds (a study queued by an older version) is still failed unrun,
tagged ``stray`` and ``duplicate_of`` (:func:`tuning.objective.slot_holder`); a failed trial
never counts, and ``best_config`` never reads one. Workers die with the process that started
them: ``PR_SET_PDEATHSIG`` armed in the child right after the fork (:func:`dying_with_this_process`),
else a thread that watches the parent.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from control.errors import ConfigError, DSparkError
from sim.procs import _die_with_parent, dying_with_this_process
from tuning.config import TuningConfig
from tuning.locks import claim_lock, study_lock
from tuning.objective import (
    NATIVE_CONSTRAINTS,
    DuplicateSlot,
    NoSlot,
    Objective,
    constraint_of,
    directions,
    metric_names,
)
from tuning.space import start_points
from tuning.start import start_from_params
from tuning.storage import (
    alive_elsewhere,
    make_storage,
    recover,
    redact,
    shareable,
    worker_tag,
)

DONE = (TrialState.COMPLETE, TrialState.PRUNED)
WAIT_POLL_S = 0.5  # how often a worker with an empty queue looks at the running trials


class _SkipSlotNoise(logging.Filter):
    """Optuna logs a failed trial with its traceback; a stray or duplicate slot claim is not an
    error of the study, so its two lines are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (NoSlot, DuplicateSlot)):
            self.last = record.getMessage().split(" failed", 1)[0]
            return False
        msg = record.getMessage()
        return not (
            getattr(self, "last", None) and msg.startswith(f"{self.last} failed with value")
        )


_FILTER = _SkipSlotNoise()


def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # CMA-ES and random ignore constraints; choose_best still applies them.
    warnings.filterwarnings("ignore", message="Constraints have been set")
    log = logging.getLogger("optuna.study._optimize")
    if _FILTER not in log.filters:
        log.addFilter(_FILTER)


def sampler_name(cfg: TuningConfig) -> str:
    s = cfg.tune.sampler
    if s == "auto":
        return "nsga2" if cfg.multi_objective else "tpe"
    return s


def make_sampler(cfg: TuningConfig, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The configured sampler, seeded ``seed + worker`` (workers must not draw alike), tagging
    each trial it starts with its worker (see :func:`tag_trials`)."""
    return tag_trials(_sampler(cfg, worker))


def tag_trials(sampler: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
    """Record ``worker = host:pid`` on a trial the moment it is claimed (the sampler's
    ``before_trial`` runs right after the claim), so a dead worker's trial can be recovered."""
    inner = sampler.before_trial

    def before_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        study._storage.set_trial_user_attr(trial._trial_id, "worker", worker_tag())
        inner(study, trial)

    sampler.before_trial = before_trial
    return sampler


def _sampler(cfg: TuningConfig, worker: int) -> optuna.samplers.BaseSampler:
    name = sampler_name(cfg)
    seed = cfg.tune.seed + worker
    constrained = cfg.tune.objective != "throughput-quality"
    cf = constraint_of if constrained and not NATIVE_CONSTRAINTS else None
    n0 = cfg.tune.n_startup_trials
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=n0,
            constraints_func=cf,
            multivariate=True,
            group=True,
            constant_liar=True,
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=cf)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n0, constraints_func=cf)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ConfigError(
                "sampler 'cmaes' needs the 'cmaes' package (pip install cmaes)"
            ) from None
        return optuna.samplers.CmaEsSampler(
            seed=seed, n_startup_trials=n0, warn_independent_sampling=False
        )
    raise ConfigError(f"unknown sampler '{name}'")  # pragma: no cover - checked by the config


def make_pruner(cfg: TuningConfig) -> optuna.pruners.BasePruner:
    if cfg.multi_objective or cfg.tune.pruner == "none":
        return optuna.pruners.NopPruner()
    if cfg.tune.pruner == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=1)
    return optuna.pruners.MedianPruner(
        n_startup_trials=max(5, cfg.tune.n_startup_trials // 2), n_warmup_steps=0
    )


def _slots(study: optuna.Study) -> set[int]:
    return {
        t.user_attrs["slot"]
        for t in study.get_trials(
            deepcopy=False, states=(*DONE, TrialState.RUNNING, TrialState.WAITING)
        )
        if "slot" in t.user_attrs
    }


def prepare_study(
    cfg: TuningConfig,
    url: str,
    n_trials: int | None = None,
    resume: bool = False,
    storage: Any = None,
) -> optuna.Study:
    """Create the study (or load it when ``resume``) and queue the missing slots, all under the
    study's lock (:func:`tuning.locks.study_lock`): of two commands creating the same study at
    once, one creates it and the other is refused (or, with ``resume``, finds every slot
    queued), on every storage."""
    quiet()
    storage = storage or make_storage(url)
    name = cfg.study_name()
    with study_lock(storage, name):
        return _prepare_locked(cfg, url, n_trials or cfg.tune.n_trials, resume, storage)


def _prepare_locked(
    cfg: TuningConfig, url: str, n: int, resume: bool, storage: Any
) -> optuna.Study:
    name = cfg.study_name()
    exists = name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    refusal = (
        f"study '{name}' already exists in {redact(url)}; pass --resume to "
        "continue it, or use another --out/--storage"
    )
    if exists and not resume:
        raise ConfigError(refusal)
    if not exists and resume and url == "memory":
        raise ConfigError("--resume needs a persistent storage (journal or database)")
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            load_if_exists=resume,
            directions=directions(cfg.tune.objective),
            sampler=make_sampler(cfg),
            pruner=make_pruner(cfg),
        )
    except optuna.exceptions.DuplicatedStudyError:  # created elsewhere without this lock
        raise ConfigError(refusal) from None
    if not study.metric_names:  # optuna-dashboard shows these instead of "Objective 0"
        study.set_metric_names(metric_names(cfg.tune.objective))
    if exists:
        want = directions(cfg.tune.objective)
        have = [d.name.lower() for d in study.directions]
        if have != want:
            raise ConfigError(
                f"study '{name}' optimises {have}, but objective "
                f"'{cfg.tune.objective}' needs {want}"
            )
    recover(study)  # trials of dead workers: failed and re-queued before slots are counted
    held = _slots(study)
    starts = start_points(cfg.tune.controller, cfg.pinned()) if not exists else []
    if not exists:
        given = start_from_params(cfg.tune.controller, cfg.tune.start_from, cfg.pinned())
        starts += [p for i, p in enumerate(given) if p not in starts and p not in given[:i]]
    for slot in range(n):
        if slot in held:
            continue
        params = starts[slot] if slot < len(starts) else {}
        study.enqueue_trial(params, user_attrs={"slot": slot}, skip_if_exists=False)
    study.set_user_attr("n_trials", n)
    return study


def drop_duplicates(study: optuna.Study) -> list[int]:
    """Fail, unrun, every WAITING trial whose slot an earlier live trial holds (the rule of
    :func:`tuning.objective.slot_holder`), so none is left queued once the study is done.
    A trial another worker claims first is left to it. Returns the numbers dropped."""
    live = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING, *DONE))
    first: dict = {}
    for t in live:
        slot = t.user_attrs.get("slot")
        if slot is not None and t.number < first.get(slot, (1 << 62, None))[0]:
            first[slot] = (t.number, t)
    dropped = []
    st = study._storage
    for t in live:
        slot = t.user_attrs.get("slot")
        if t.state != TrialState.WAITING or slot is None or first[slot][0] == t.number:
            continue
        try:
            with claim_lock(st, study.study_name):
                claimed = st.set_trial_state_values(t._trial_id, state=TrialState.RUNNING)
            if not claimed:
                continue  # claimed by a worker: it drops it itself
            st.set_trial_user_attr(t._trial_id, "stray", True)
            st.set_trial_user_attr(t._trial_id, "duplicate_of", first[slot][0])
            st.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        dropped.append(t.number)
    return dropped


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _heartbeat(study: optuna.Study) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(study._storage)


def queue_only(study: optuna.Study) -> optuna.Study:
    """Make ``study.ask`` (and so ``study.optimize``) take only queued slots: with none
    WAITING it raises :class:`NoSlot` instead of creating a trial outside the queue, which a
    worker would have to fail (a race for the last slot). Returns ``study``."""
    pop = study._pop_waiting_trial_id
    if getattr(pop, "queue_only", False):
        return study

    def pop_or_stop() -> int:
        with claim_lock(study._storage, study.study_name):
            trial_id = pop()
        if trial_id is None:
            raise NoSlot("no queued slot left")
        return trial_id

    pop_or_stop.queue_only = True  # type: ignore[attr-defined]
    study._pop_waiting_trial_id = pop_or_stop  # type: ignore[method-assign]
    return study


def _stop_when_dry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.stop()


def run_worker(
    cfg: TuningConfig,
    url: str,
    worker: int = 0,
    n_trials: int | None = None,
    simulate: Callable[..., dict] | None = None,
    storage: Any = None,
    callbacks: list | None = None,
) -> int:
    """Run queued slots of the study until none is left; returns trials this worker finished."""
    quiet()
    storage = storage or make_storage(url)
    study = optuna.load_study(
        study_name=cfg.study_name(),
        storage=storage,
        sampler=make_sampler(cfg, worker),
        pruner=make_pruner(cfg),
    )
    n = n_trials or int(study.user_attrs.get("n_trials", cfg.tune.n_trials))
    objective = Objective(cfg, simulate=simulate, require_slot=True)
    return work_queue(study, objective, n, callbacks)


def work_queue(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], Any],
    n: int,
    callbacks: list | None = None,
    catch: tuple = (),
    done_count: Callable[[optuna.Study], int] | None = None,
) -> int:
    """Run the study's queued slots with ``objective`` until ``n`` are finished, or none is
    queued and none runs that may still finish or come back; returns trials run here.
    ``catch``: exceptions that fail a trial without stopping the worker (beside duplicates);
    ``done_count``: how many are finished (default: COMPLETE and PRUNED trials)."""
    done = 0
    done_count = done_count or count_done
    queue_only(study)
    # a worker that died while others run: its trial is re-queued after the next trial ends
    cbs = [
        lambda st, tr: recover(st),
        optuna.study.MaxTrialsCallback(n, states=DONE),
        *(callbacks or []),
        _stop_when_dry,
    ]
    heartbeat = _heartbeat(study)

    def count(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal done
        done += trial.state in DONE

    while True:
        recover(study)
        drop_duplicates(study)
        if done_count(study) >= n:
            break
        if _waiting(study):
            try:
                study.optimize(
                    objective,
                    callbacks=[count, *cbs],
                    gc_after_trial=False,
                    catch=(DuplicateSlot, *catch),
                )
            except NoSlot:  # the queue ran dry under a race: look again
                pass
            continue
        # nothing queued: wait while trials run that may finish, or fail and come back
        if not alive_elsewhere(study, heartbeat):
            break
        time.sleep(WAIT_POLL_S)
    return done


def _worker_main(
    cfg: TuningConfig,
    url: str,
    worker: int,
    n_trials: int | None,
    simulate: Callable[..., dict] | None,
    parent: int | None = None,
) -> None:
    if parent is not None:
        _die_with_parent(parent)
    run_worker(cfg, url, worker, n_trials, simulate)


def count_done(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=DONE))


def run_study(
    cfg: TuningConfig,
    url: str,
    workers: int = 1,
    n_trials: int | None = None,
    resume: bool = False,
    simulate: Callable[..., dict] | None = None,
    progress: bool = False,
) -> optuna.Study:
    """Prepare the study and run it with ``workers`` processes (1 = in this process)."""
    n = n_trials or cfg.tune.n_trials
    if workers > 1 and not shareable(url):
        raise ConfigError(
            f"--workers {workers} needs a shared storage (journal or database), not 'memory'"
        )
    storage = make_storage(url)
    study = prepare_study(cfg, url, n, resume, storage=storage)
    bar = _bar(n, count_done(study), progress)
    procs: list = []
    try:
        if workers <= 1:

            def tick(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
                if bar is not None and trial.state in DONE:
                    bar.update(1)

            run_worker(cfg, url, 0, n, simulate, storage=storage, callbacks=[tick])
        else:
            ctx = mp.get_context("fork")
            procs = [
                ctx.Process(
                    target=_worker_main,
                    args=(cfg, url, i, n, simulate, os.getpid()),
                    name=f"tune-worker-{i}",
                )
                for i in range(workers)
            ]
            with dying_with_this_process():
                for p in procs:
                    p.start()
            last = count_done(study)
            while any(p.is_alive() for p in procs):
                time.sleep(0.5)
                now = count_done(study)
                if bar is not None and now > last:
                    bar.update(now - last)
                last = now
            for p in procs:
                p.join()
            if bar is not None and count_done(study) > last:
                bar.update(count_done(study) - last)
    finally:
        for p in procs:  # an interrupted run leaves no worker behind
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        if bar is not None:
            bar.close()
    recover(study)
    _check_complete(study, n, [p.exitcode for p in procs if p.exitcode != 0])
    return study


def _check_complete(study: optuna.Study, n: int, bad_exits: list) -> None:
    """A run that ends short of N finished trials is a one-line error (exit 2), never exit 0."""
    done = count_done(study)
    if done >= n:
        return
    trials = study.get_trials(deepcopy=False)
    running = sum(t.state == TrialState.RUNNING for t in trials)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    why = []
    if bad_exits:
        why.append(f"worker(s) exited with codes {bad_exits}")
    if running:
        why.append(
            f"{running} trial(s) still RUNNING (a worker elsewhere, or one whose "
            "heartbeat has not yet expired)"
        )
    if waiting:
        why.append(f"{waiting} slot(s) still queued")
    failed = sum(t.state == TrialState.FAIL and not t.user_attrs.get("stray") for t in trials)
    if failed:
        why.append(f"{failed} trial(s) failed")
    raise DSparkError(
        f"study '{study.study_name}' ended with {done} of {n} trials finished"
        + (f" ({'; '.join(why)})" if why else "")
        + "; rerun with --resume to continue it"
    )


def _bar(total: int, initial: int, on: bool) -> Any:
    if not on:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="trials", unit="trial", dynamic_ncols=True)
