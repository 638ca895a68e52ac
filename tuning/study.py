"""Create, resume and run a study with N worker processes on one storage.

Exactly ``n_trials`` trials, whatever the number of workers: the study is a queue of *slots*.
:func:`prepare_study` enqueues one WAITING trial per missing slot (user attribute ``slot``):
first the start points (the seed's α = 0.8, β = 0.85 and the untuned defaults), then empty
ones the sampler fills in when a worker pops them. Popping a WAITING trial is atomic in every
Optuna storage, so two workers never run the same slot; a worker stops when the queue is
empty (``MaxTrialsCallback`` over COMPLETE and PRUNED trials is kept as a second guard).

A worker that dies leaves its RUNNING trial behind. RDB storages fail it by heartbeat and
``RetryHeartbeatStaleTrialCallback`` re-queues it; journal files (no heartbeat in this Optuna)
use :func:`tuning.storage.recover_dead_trials` when a worker opens the study. Either way the
slot is run again and every finished trial is kept.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from control.errors import ConfigError, DSparkError
from tuning.config import TuningConfig
from tuning.objective import NATIVE_CONSTRAINTS, NoSlot, Objective, constraint_of, directions
from tuning.space import start_points
from tuning.storage import (
    is_journal,
    make_storage,
    recover_dead_trials,
    redact,
    shareable,
    worker_tag,
)

DONE = (TrialState.COMPLETE, TrialState.PRUNED)


def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # CMA-ES and random ignore constraints; choose_best still applies them.
    warnings.filterwarnings("ignore", message="Constraints have been set")


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
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n0, constraints_func=cf,
                                          multivariate=True, group=True, constant_liar=True)
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
            raise ConfigError("sampler 'cmaes' needs the 'cmaes' package (pip install cmaes)") \
                from None
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=n0, warn_independent_sampling=False)
    raise ConfigError(f"unknown sampler '{name}'")  # pragma: no cover - checked by the config


def make_pruner(cfg: TuningConfig) -> optuna.pruners.BasePruner:
    if cfg.multi_objective or cfg.tune.pruner == "none":
        return optuna.pruners.NopPruner()
    if cfg.tune.pruner == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=1)
    return optuna.pruners.MedianPruner(n_startup_trials=max(5, cfg.tune.n_startup_trials // 2),
                                       n_warmup_steps=0)


def _slots(study: optuna.Study) -> set[int]:
    return {t.user_attrs["slot"] for t in study.get_trials(
        deepcopy=False, states=(*DONE, TrialState.RUNNING, TrialState.WAITING))
        if "slot" in t.user_attrs}


def prepare_study(cfg: TuningConfig, url: str, n_trials: int | None = None,
                  resume: bool = False, storage: Any = None) -> optuna.Study:
    """Create the study (or load it when ``resume``) and queue the missing slots."""
    quiet()
    storage = storage or make_storage(url)
    name = cfg.study_name()
    n = n_trials or cfg.tune.n_trials
    exists = name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if exists and not resume:
        raise ConfigError(f"study '{name}' already exists in {redact(url)}; pass --resume to "
                          "continue it, or use another --out/--storage")
    if not exists and resume and url == "memory":
        raise ConfigError("--resume needs a persistent storage (journal or database)")
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                directions=directions(cfg.tune.objective),
                                sampler=make_sampler(cfg), pruner=make_pruner(cfg))
    if exists:
        want = directions(cfg.tune.objective)
        have = [d.name.lower() for d in study.directions]
        if have != want:
            raise ConfigError(f"study '{name}' optimises {have}, but objective "
                              f"'{cfg.tune.objective}' needs {want}")
    if is_journal(url):
        recover_dead_trials(study)
    have = _slots(study)
    starts = start_points(cfg.tune.controller, cfg.pinned()) if not exists else []
    for slot in range(n):
        if slot in have:
            continue
        params = starts[slot] if slot < len(starts) else {}
        study.enqueue_trial(params, user_attrs={"slot": slot}, skip_if_exists=False)
    study.set_user_attr("n_trials", n)
    return study


def _stop_when_dry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.stop()


def run_worker(cfg: TuningConfig, url: str, worker: int = 0, n_trials: int | None = None,
               simulate: Callable[..., dict] | None = None, storage: Any = None,
               callbacks: list | None = None) -> int:
    """Run queued slots of the study until none is left; returns trials this worker finished."""
    quiet()
    storage = storage or make_storage(url)
    study = optuna.load_study(study_name=cfg.study_name(), storage=storage,
                              sampler=make_sampler(cfg, worker), pruner=make_pruner(cfg))
    if is_journal(url):
        recover_dead_trials(study)
    n = n_trials or int(study.user_attrs.get("n_trials", cfg.tune.n_trials))
    objective = Objective(cfg, simulate=simulate, require_slot=True)
    done = 0
    cbs = [optuna.study.MaxTrialsCallback(n, states=DONE), *(callbacks or [])]
    if is_journal(url):   # a worker that died while others run: re-queue its trial now
        cbs.insert(0, lambda st, tr: recover_dead_trials(st))
    cbs.append(_stop_when_dry)

    def count(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal done
        done += trial.state in DONE

    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            study.optimize(objective, callbacks=[count, *cbs], gc_after_trial=False)
        except NoSlot:
            break
        if len(study.get_trials(deepcopy=False, states=DONE)) >= n:
            break
    return done


def _worker_main(cfg: TuningConfig, url: str, worker: int, n_trials: int | None,
                 simulate: Callable[..., dict] | None) -> None:
    run_worker(cfg, url, worker, n_trials, simulate)


def count_done(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=DONE))


def run_study(cfg: TuningConfig, url: str, workers: int = 1, n_trials: int | None = None,
              resume: bool = False, simulate: Callable[..., dict] | None = None,
              progress: bool = False) -> optuna.Study:
    """Prepare the study and run it with ``workers`` processes (1 = in this process)."""
    n = n_trials or cfg.tune.n_trials
    if workers > 1 and not shareable(url):
        raise ConfigError(f"--workers {workers} needs a shared storage (journal or database), "
                          "not 'memory'")
    storage = make_storage(url)
    study = prepare_study(cfg, url, n, resume, storage=storage)
    bar = _bar(n, count_done(study), progress)
    try:
        if workers <= 1:
            def tick(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
                if bar is not None and trial.state in DONE:
                    bar.update(1)
            run_worker(cfg, url, 0, n, simulate, storage=storage, callbacks=[tick])
        else:
            ctx = mp.get_context("fork")
            procs = [ctx.Process(target=_worker_main, args=(cfg, url, i, n, simulate),
                                 name=f"tune-worker-{i}") for i in range(workers)]
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
            bad = [p.exitcode for p in procs if p.exitcode != 0]
            if bad and count_done(study) < n:
                raise DSparkError(f"tuning worker(s) exited with codes {bad} after "
                                  f"{count_done(study)} of {n} trials; rerun with --resume "
                                  "to continue the study")
            if bar is not None and count_done(study) > last:
                bar.update(count_done(study) - last)
    finally:
        if bar is not None:
            bar.close()
    return study


def _bar(total: int, initial: int, on: bool) -> Any:
    if not on:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc="trials", unit="trial", dynamic_ncols=True)
