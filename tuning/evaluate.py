"""Held-out evaluation: the tuned config against every baseline and the references.

Entries (rows of the matrix ``controller × workload × seed``):

- ``<controller>-tuned``: the study's best config;
- ``<controller>-seed`` / ``<controller>-default``: the seed's starting point and the untuned
  defaults (when the controller has them);
- every baseline of ``[evaluate] controllers`` with its own config: tuned by a small study on
  the *tuning* workloads when ``baseline_trials > 0``, else its defaults;
- ``fixed-best``: the best fixed k of a sweep on the tuning workloads;
- ``clairvoyant`` (told each round's run lengths, one round ahead), ``rate-oracle`` (told each
  request's true rate) and ``fixed-k0`` (no speculation), whose
  ``mean_tpot_s`` is the reference of every row's ``speedup`` on the same workload and seed.

Every entry runs on the *held-out* workloads and seeds only.

:func:`tuned_vs_default` then judges ``<controller>-tuned`` against ``<controller>-default`` on
the study's own measure, with its spread over seeds: under an SLO objective the capacity at SLO
of both (and of ``fixed-best``) on every held-out workload and seed (:mod:`tuning.slo`), else
the objective's first metric in the matrix.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from control import make_config
from control.registry import REFERENCES
from tuning.config import TuningConfig, WorkloadSpec
from tuning.objective import OBJECTIVE_METRICS, Objective, default_simulate, load_workload
from tuning.scenario import with_scenario
from tuning.space import SEED_POINT, params_to_config, start_points


@dataclass(frozen=True)
class Entry:
    label: str
    controller: str
    config: Any
    source: str  # tuned | seed | default | sweep | reference
    # the tuned scenario fields (dotted overrides) this entry runs with; the tuned entry only.
    scenario: dict = dataclasses.field(default_factory=dict)


SINGLE_OF = {"throughput-p99": "throughput", "throughput-quality": "throughput"}


def primary(objective: str) -> tuple[str, str]:
    """(single objective, metric) used for baselines and the k sweep: the first metric."""
    single = SINGLE_OF.get(objective, objective)
    return single, OBJECTIVE_METRICS[single][0][0]


def fixed_k_sweep(cfg: TuningConfig, simulate: Callable | None = None) -> tuple[int, list[dict]]:
    """Best fixed k on the tuning workloads (strict verification); and every k's score."""
    single, metric = primary(cfg.tune.objective)
    obj = Objective(cfg, simulate=simulate, controller="fixed", objective=single)
    sign = 1 if OBJECTIVE_METRICS[single][0][1] == "maximize" else -1
    rows = []
    for k in cfg.evaluate.fixed_k:
        v = obj.values(make_config("fixed", {"k": k}))[0]
        rows.append({"k": k, metric: v})
    best = max(rows, key=lambda r: sign * r[metric])
    return int(best["k"]), rows


def tune_baseline(
    cfg: TuningConfig, controller: str, n_trials: int, simulate: Callable | None = None
) -> tuple[Any, float]:
    """A small in-memory study of a baseline on the tuning workloads, same objective (its first
    metric) and quality constraint as the main study; (best feasible config, its value)."""
    from tuning.export import choose_best, objective_value
    from tuning.study import make_pruner, make_sampler, quiet

    quiet()
    single, metric = primary(cfg.tune.objective)
    bcfg = dataclasses.replace(
        cfg,
        tune=dataclasses.replace(
            cfg.tune,
            controller=controller,
            objective=single,
            mode="",
            scenario_params=(),
            sampler="tpe",
            n_startup_trials=min(cfg.tune.n_startup_trials, max(1, n_trials // 3)),
        ),
    )
    obj = Objective(bcfg, simulate=simulate, knee_controller=cfg.tune.controller)
    study = optuna.create_study(
        direction=OBJECTIVE_METRICS[single][0][1],
        sampler=make_sampler(bcfg),
        pruner=make_pruner(bcfg),
    )
    for p in start_points(controller):
        study.enqueue_trial(p)
    study.optimize(obj, n_trials=n_trials, gc_after_trial=False)
    best = choose_best(study, bcfg)
    return params_to_config(controller, best.params), objective_value(best, metric)


def _baseline_job(args: tuple) -> tuple[Any, float]:
    return tune_baseline(*args)


def entries(
    cfg: TuningConfig,
    best_config: Any,
    simulate: Callable | None = None,
    log: Callable[[str], None] = lambda s: None,
    workers: int = 1,
    scenario: dict[str, Any] | None = None,
) -> tuple[list[Entry], dict]:
    """Everything to evaluate, and a record of how the references were chosen; the baselines'
    studies run on ``workers`` processes (one study each). ``scenario``: the tuned scenario
    values, which the tuned entry alone runs with (every other entry runs each workload's
    scenario as written)."""
    from tuning.slo import fork_map

    c = cfg.tune.controller
    out = [Entry(f"{c}-tuned", c, best_config, "tuned", dict(scenario or {}))]
    info: dict[str, Any] = {}
    if c in SEED_POINT:
        out.append(Entry(f"{c}-seed", c, make_config(c, SEED_POINT[c]), "seed"))
    out.append(Entry(f"{c}-default", c, make_config(c), "default"))
    bases = [b for b in cfg.evaluate.controllers if b != c and b not in REFERENCES]
    n = cfg.evaluate.baseline_trials
    if n > 0 and bases:
        log(f"tuning baselines {', '.join(bases)} ({n} trials each)")
        found = fork_map(_baseline_job, [(cfg, b, n, simulate) for b in bases], workers)
    for i, b in enumerate(bases):
        if n > 0:
            bc, bv = found[i]
            info[f"{b}_tuned_value"] = bv
            out.append(Entry(b, b, bc, "tuned"))
        else:
            out.append(Entry(b, b, make_config(b), "default"))
    if cfg.evaluate.fixed_k:
        log("sweeping fixed k on the tuning workloads")
        k, rows = fixed_k_sweep(cfg, simulate)
        info["fixed_k_sweep"] = rows
        info["fixed_best_k"] = k
        out.append(Entry("fixed-best", "fixed", make_config("fixed", {"k": k}), "sweep"))
    for ref in REFERENCES:
        out.append(Entry(ref, ref, make_config(ref), "default"))
    out.append(Entry("fixed-k0", "fixed", make_config("fixed", {"k": 0}), "reference"))
    return out, info


_SCN: dict = {}


def _one(task: tuple) -> dict:
    entry, spec, seed, simulate = task
    spec = with_scenario(spec, entry.scenario)
    key = spec.key()
    if key not in _SCN:
        _SCN[key] = load_workload(spec)
    s = (simulate or default_simulate)(_SCN[key], entry.controller, entry.config, seed, False)
    row = {
        **s,
        "controller": entry.label,
        "workload": spec.name,
        "seed": seed,
        "controller_name": entry.controller,
        "config_source": entry.source,
    }
    return row


def evaluate(
    cfg: TuningConfig,
    entry_list: list[Entry],
    workers: int = 1,
    simulate: Callable | None = None,
    progress: bool = False,
    workloads: tuple[WorkloadSpec, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> Any:
    """The evaluation matrix as a DataFrame: ``controller, workload, seed`` + summary keys."""
    import pandas as pd

    wls = workloads if workloads is not None else cfg.evaluate.workloads
    seeds = seeds if seeds is not None else cfg.evaluate.sim_seeds
    tasks = [(e, w, s, simulate) for w in wls for s in seeds for e in entry_list]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), desc="held-out", unit="run", dynamic_ncols=True)
    rows = []
    if workers > 1 and len(tasks) > 1:
        from sim.procs import dying_with_this_process

        with dying_with_this_process():  # the pool's workers die with this process
            pool = mp.get_context("fork").Pool(workers)
        with pool:
            for r in pool.imap(_one, tasks):
                rows.append(r)
                if bar is not None:
                    bar.update(1)
    else:
        for t in tasks:
            rows.append(_one(t))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    df = pd.DataFrame(rows)
    ref = (
        df[df["controller"] == "fixed-k0"].set_index(["workload", "seed"])["mean_tpot_s"]
        if "mean_tpot_s" in df
        else None
    )
    if ref is not None and len(ref):
        base = df.set_index(["workload", "seed"]).index.map(ref.to_dict())
        df["speedup"] = [
            b / t if t and t > 0 else float("nan") for b, t in zip(base, df["mean_tpot_s"])
        ]
    first = ["controller", "workload", "seed"]
    return df[first + [c for c in df.columns if c not in first]]


def tuned_vs_default(
    cfg: TuningConfig,
    entry_list: list[Entry],
    df: Any,
    workers: int = 1,
    search_fn: Callable | None = None,
) -> tuple[dict, Any]:
    """(comparison of the tuned config with the default on the study's measure,
    held-out capacity table or None); the comparison's ``lines`` are what ``dspark tune``
    prints (:func:`tuning.slo.compare`)."""
    from tuning.config import SLO_OBJECTIVES
    from tuning.slo import CAPACITY_METRIC, compare, heldout_capacity

    c = cfg.tune.controller
    tuned, default = f"{c}-tuned", f"{c}-default"
    if cfg.tune.objective in SLO_OBJECTIVES:
        mine = [e for e in entry_list if e.label in (tuned, default, "fixed-best")]
        cap = heldout_capacity(cfg, mine, default, workers, search_fn)
        floor = cfg.slo.knee_rel_tol
        out = compare(cap, tuned, default, CAPACITY_METRIC, floor=floor, measure="capacity at SLO")
        return out, cap
    single, metric = primary(cfg.tune.objective)
    maximize = OBJECTIVE_METRICS[single][0][1] == "maximize"
    return compare(df, tuned, default, metric, maximize=maximize), None


def table(
    df: Any,
    metrics: tuple[str, ...] = (
        "throughput_tokens_per_s",
        "speedup",
        "goodput_tokens_per_s",
        "slo_attainment",
        "tpot_p99_s",
        "lossy_accept_fraction",
    ),
) -> Any:
    """Mean over held-out workloads and seeds per controller (the final table)."""
    cols = [m for m in metrics if m in df.columns]
    order = list(dict.fromkeys(df["controller"]))
    return df.groupby("controller", sort=False)[cols].mean().loc[order]
