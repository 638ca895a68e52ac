"""Capacity at SLO in the tuner (docs/design.md, "The user's question: capacity at their SLOs").

- **The knee** of a workload and seed: the capacity at SLO of the tuned controller's *default*
  config (:func:`sim.capacity.search` over ``[slo.knee_lo, slo.knee_hi]`` to
  ``slo.knee_rel_tol``), found once before the study (:func:`prepare_knees`) and kept in
  :data:`KNEES`, which forked workers inherit. A workload whose search never crosses the target
  is one line naming it, its seed and the range searched, before any trial runs.
- **slo-capacity**: a trial's value on one instance is :func:`sim.capacity.search`'s capacity of
  the trial's config, started at the knee and searched within ``knee × (1 ± slo.bracket)`` to
  ``slo.rel_tol`` (:func:`bracket_config`). A config that still meets the target at the top of
  the bracket scores the top; one that misses it at the bottom scores
  ``bottom × attainment(bottom) / target``: below every config that met the target inside the
  bracket, ordered by how near it came (:func:`capacity_row`).
- **slo-knee-goodput** (one simulation per instance, for when bisection costs too much per
  trial): SLO goodput at the load scale ``knee × slo.knee_load``.
- **Held-out**: the capacity of the tuned config, the default (its held-out knee) and the best
  fixed k on every held-out workload and seed (:func:`heldout_capacity`), and
  :func:`compare`: tuned against default on one measure, with the spread over seeds.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

from control import make_config
from control.errors import ConfigError
from sim.capacity import CapacityConfig, CapacityResult, search
from tuning.config import SloSection, TuningConfig, WorkloadSpec
from tuning.scenario import with_scenario

#: (workload key, seed, controller, [slo] section) -> the default config's search
#: (``capacity``, ``missed``, ``capacity_rps``, ``probes``)
KNEES: dict[tuple, dict] = {}
#: the measure of each SLO objective's held-out comparison
CAPACITY_METRIC = "capacity_load_scale"


def fork_map(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int) -> list:
    """``[fn(j) for j in jobs]`` in order, on a pool of ``workers`` forked processes (they
    inherit :data:`KNEES` and die with this process) when ``workers`` > 1."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(j) for j in jobs]
    from sim.procs import dying_with_this_process

    with dying_with_this_process():
        pool = mp.get_context("fork").Pool(min(workers, len(jobs)))
    with pool:
        return pool.map(fn, jobs, chunksize=1)


def knee_config(slo: SloSection, start: float = 1.0) -> CapacityConfig:
    """The full search of a knee or a held-out capacity, first probe ``start`` (clipped)."""
    return CapacityConfig(
        attainment=slo.attainment,
        start=min(max(start, slo.knee_lo), slo.knee_hi),
        lo=slo.knee_lo,
        hi=slo.knee_hi,
        rel_tol=slo.knee_rel_tol,
    )


def bracket_config(slo: SloSection, knee: float) -> CapacityConfig:
    """A trial's search: from the knee, within ``knee × (1 ± slo.bracket)``, to ``rel_tol``."""
    return CapacityConfig(
        attainment=slo.attainment,
        start=knee,
        lo=knee * (1.0 - slo.bracket),
        hi=knee * (1.0 + slo.bracket),
        rel_tol=slo.rel_tol,
    )


def _key(cfg: TuningConfig, spec: WorkloadSpec, seed: int, controller: str) -> tuple:
    return (spec.key(), seed, controller, dataclasses.astuple(cfg.slo))


def _knee_job(args: tuple) -> dict:
    cfg, spec, seed, controller, search_fn = args
    from tuning.config import load_workload

    cc = knee_config(cfg.slo)
    r = (search_fn or search)(
        load_workload(spec), controller, make_config(controller), controller, seed, cc
    )
    if not r.crossed:
        at = cc.hi if math.isnan(r.missed) else cc.lo
        verb = "met" if at == cc.hi else "missed"
        raise ConfigError(
            f"{spec.scenario}: workload '{spec.name}' (seed {seed}): {controller}'s defaults "
            f"{verb} the {cc.attainment:g} attainment target at load scale {at:g}: the range "
            f"searched [{cc.lo:g}, {cc.hi:g}] never crosses it; set slo.knee_lo / slo.knee_hi "
            "or the workload's load"
        )
    return {
        "capacity": r.capacity,
        "missed": r.missed,
        "capacity_rps": r.offered_rps,
        "probes": len(r.probes),
    }


def prepare_knees(
    cfg: TuningConfig,
    pairs: Sequence[tuple[WorkloadSpec, int]],
    controller: str | None = None,
    workers: int = 1,
    search_fn: Callable[..., CapacityResult] | None = None,
) -> list[float]:
    """The knee of every ``(workload, seed)``: from :data:`KNEES`, else searched (on a fork pool
    of ``workers`` processes) and kept there."""
    c = controller or cfg.tune.controller
    todo = list(
        {_key(cfg, w, s, c): (w, s) for w, s in pairs if _key(cfg, w, s, c) not in KNEES}.values()
    )
    found = fork_map(_knee_job, [(cfg, w, s, c, search_fn) for w, s in todo], workers)
    for (w, s), k in zip(todo, found):
        KNEES[_key(cfg, w, s, c)] = k
    return [KNEES[_key(cfg, w, s, c)]["capacity"] for w, s in pairs]


def capacity_row(r: CapacityResult, cc: CapacityConfig) -> dict:
    """One instance's row of a trial's bracket search: the probe at the capacity (at the
    bracket's bottom when none met the target) and ``slo_capacity_load_scale``, the value."""
    below = math.isnan(r.capacity)
    x = cc.lo if below else r.capacity
    at = next(p for p in r.probes if p["load_scale"] == x)
    value = r.capacity
    if below:
        a = at["slo_attainment"]
        value = cc.lo * (a if a == a and a > 0 else 0.0) / cc.attainment
    return {
        **at,
        "slo_capacity_load_scale": value,
        "slo_capacity_below_bracket": float(below),
        "slo_capacity_above_bracket": float(not below and math.isnan(r.missed)),
    }


def _capacity_job(args: tuple) -> dict:
    label, controller, config, spec, seed, cc, search_fn = args
    from tuning.config import load_workload

    r = (search_fn or search)(load_workload(spec), controller, config, label, seed, cc)
    return {
        "controller": label,
        "workload": spec.name,
        "seed": seed,
        CAPACITY_METRIC: r.capacity if r.crossed else math.nan,
        "missed_load_scale": r.missed,
        "crossed": r.crossed,
        "capacity_rps": r.offered_rps if r.crossed else math.nan,
        "probes": len(r.probes),
    }


def heldout_capacity(
    cfg: TuningConfig,
    entries: Sequence[Any],
    default_label: str,
    workers: int = 1,
    search_fn: Callable[..., CapacityResult] | None = None,
) -> Any:
    """Capacity at SLO of every entry (``label, controller, config``, and the tuned scenario
    values of its ``scenario`` when it has them) on every held-out workload and seed, as a DataFrame; the default entry's is its knee there, the others'
    searches start at it. A search that does not cross the target in
    ``[slo.knee_lo, slo.knee_hi]`` has ``crossed`` false and no capacity."""
    import pandas as pd

    wls, seeds = cfg.evaluate.workloads, cfg.evaluate.sim_seeds
    pairs = [(w, s) for w in wls for s in seeds]
    knees = prepare_knees(cfg, pairs, workers=workers, search_fn=search_fn)
    found = [KNEES[_key(cfg, w, s, cfg.tune.controller)] for w, s in pairs]
    rows = [
        {
            "controller": default_label,
            "workload": w.name,
            "seed": s,
            CAPACITY_METRIC: k["capacity"],
            "missed_load_scale": k["missed"],
            "crossed": True,
            "capacity_rps": k["capacity_rps"],
            "probes": k["probes"],
        }
        for (w, s), k in zip(pairs, found)
    ]
    jobs = [
        (
            e.label,
            e.controller,
            e.config,
            with_scenario(w, getattr(e, "scenario", {})),
            s,
            knee_config(cfg.slo, k),
            search_fn,
        )
        for (w, s), k in zip(pairs, knees)
        for e in entries
        if e.label != default_label
    ]
    rows += fork_map(_capacity_job, jobs, workers)
    return pd.DataFrame(rows)


def compare(
    rows: Any,
    tuned: str,
    default: str,
    metric: str,
    *,
    maximize: bool = True,
    floor: float = 0.0,
    measure: str = "",
) -> dict:
    """``tuned`` against ``default`` on ``metric`` over the (workload, seed) pairs both have.

    A pair's gain is ``tuned / default − 1`` (``default / tuned − 1`` when lower is better);
    the gain is the mean over pairs; the spread is the mean over workloads of half the range
    of that workload's gains over its seeds, floored at ``floor`` (the measure's resolution,
    e.g. the bisection's precision). Where the gain is not above the spread, ``lines`` end with
    the sentence "tuning does not beat the default by more than the spread".
    """
    measure = measure or metric
    df = rows[rows["controller"].isin([tuned, default])]
    wide = df.pivot_table(index=["workload", "seed"], columns="controller", values=metric)
    wide = wide.reindex(columns=[tuned, default])
    total = len(wide)
    wide = wide.dropna()
    out: dict[str, Any] = {
        "measure": measure,
        "metric": metric,
        "tuned": tuned,
        "default": default,
        "pairs": len(wide),
        "left_out": total - len(wide),
    }
    if wide.empty or (wide[[tuned, default]] <= 0).any().any():
        out.update(
            within_spread=None,
            lines=[f"no held-out pair to compare {tuned} and {default} on {measure}"],
        )
        return out
    t, d = wide[tuned], wide[default]
    gain = (t / d - 1.0) if maximize else (d / t - 1.0)
    by_w = gain.groupby(level="workload", sort=False)
    half = by_w.agg(lambda g: (g.max() - g.min()) / 2.0)
    per_w = by_w.mean()
    spread = float(half.mean())
    threshold = max(spread, floor)
    mean = float(gain.mean())
    within = mean <= threshold
    lines = []
    for w in dict.fromkeys(wide.index.get_level_values("workload")):
        tw, dw = t.xs(w, level="workload"), d.xs(w, level="workload")
        lines.append(
            f"  {w}: {tuned} {tw.median():.4g} [{tw.min():.4g}, {tw.max():.4g}] vs "
            f"{default} {dw.median():.4g} [{dw.min():.4g}, {dw.max():.4g}] ({per_w[w]:+.1%})"
        )
    seeds = wide.index.get_level_values("seed").nunique()
    lines.append(
        f"{tuned} vs {default}, held-out {measure}: {mean:+.1%} over {len(wide)} workload-seed "
        f"pairs (from {float(gain.min()):+.1%} to {float(gain.max()):+.1%}; spread over "
        f"{seeds} seed{'s' if seeds != 1 else ''} ±{spread:.1%}), better on "
        f"{int((per_w > 0).sum())} of {len(per_w)} workloads"
        + (f"; {out['left_out']} pair(s) left out (no value)" if out["left_out"] else "")
    )
    if within:
        lines.append(
            f"tuning does not beat the default by more than the spread: {mean:+.1%} against "
            f"±{threshold:.1%} on held-out {measure}"
        )
    out.update(
        gain=mean,
        gain_min=float(gain.min()),
        gain_max=float(gain.max()),
        spread=spread,
        threshold=threshold,
        within_spread=within,
        workload_gains={str(k): float(v) for k, v in per_w.items()},
        lines=lines,
    )
    return out
