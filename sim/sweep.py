"""A ``compare`` sweep as independent points, run on a process pool or by any other runner.

A sweep of :func:`sim.compare.compare_runs` (controllers × load scales on one seed) is a list of
*points*, each one simulation that depends on nothing but the sweep: per load scale, every
controller's run (``baseline=False``: its speedups are filled in afterwards) and, with baselines,
the two fixed k = 0 runs behind ``speedup`` and ``speedup_resident``. Points are pure functions of
the sweep (every random draw is seeded from it), so they run in any process, in any order, and
:func:`finish` puts the runs together exactly as the serial loop does: the same rows in the same
order, the same numbers. The serial loop shares one k = 0 run between the controllers of a load
scale; here it is one point, run once.

:func:`run_pool` runs the points on a ``concurrent.futures`` process pool (forkserver context,
the simulator preloaded); ``tuning.sweep`` runs them as an Optuna study, through
:func:`encode_point` / :func:`decode_point` (JSON, compressed; exact for floats and dtypes).
Warnings a point raises are recorded where it runs and raised again here, in point order.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import os
import re
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.configio import to_dict, to_toml
from control.errors import ConfigError
from control.registry import make_config
from sim.api import (
    BASELINE,
    BASELINE_RESIDENT,
    SimResult,
    _run,
    resolve_controller_config,
    simulate,
    speedup_of,
)
from sim.config import SimConfig

#: the baseline points of a load scale: (label, drafter resident, summary key it fills)
BASELINES = ((BASELINE, False, "speedup"), (BASELINE_RESIDENT, True, "speedup_resident"))


@dataclass(frozen=True)
class Point:
    """One simulation of a sweep: controller ``name`` (its resolved ``config``) under ``label``,
    or (``name`` None) the k = 0 baseline ``label`` with the drafter resident or not."""

    load_scale: float
    label: str
    name: str | None = None
    config: Any = None
    resident: bool = False

    @property
    def is_baseline(self) -> bool:
        return self.name is None

    def describe(self) -> str:
        return f"{self.label} at load {self.load_scale:g}"


@dataclass(frozen=True)
class Sweep:
    """What :func:`sim.compare.compare_runs` runs: ``items`` = (name, resolved config, label) in
    order, on ``seed``, at every load scale."""

    scn: SimConfig
    seed: int
    items: tuple[tuple[str, Any, str], ...]
    load_scales: tuple[float, ...]
    trace: bool = False
    baseline: bool = True

    @classmethod
    def of(
        cls,
        scn: SimConfig,
        seed: int,
        items: Sequence[tuple[str, Any, str]],
        load_scales: Sequence[float],
        trace: bool = False,
        baseline: bool = True,
    ) -> Sweep:
        resolved = tuple((n, resolve_controller_config(scn, n, c), label) for n, c, label in items)
        return cls(scn, seed, resolved, tuple(float(x) for x in load_scales), trace, baseline)

    def points(self) -> list[Point]:
        """Per load scale: every controller in order, then the baselines."""
        out = []
        for ls in self.load_scales:
            out += [Point(ls, label, name, cfg) for name, cfg, label in self.items]
            if self.baseline:
                out += [Point(ls, label, resident=res) for label, res, _ in BASELINES]
        return out

    def digest(self) -> str:
        """A fingerprint of everything that decides the sweep's results (paths taken relative
        to the scenario's folder, so that the same command on another checkout agrees)."""
        spec = {
            "scenario": _portable(to_toml(self.scn), str(self.scn.base_dir)),
            "seed": self.seed,
            "items": [[n, to_dict(c), label] for n, c, label in self.items],
            "load_scales": list(self.load_scales),
            "trace": self.trace,
            "baseline": self.baseline,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _portable(text: str, base_dir: str) -> str:
    """``text`` (a resolved scenario's TOML) without its folder: absolute paths made relative
    to ``base_dir`` and the ``base_dir`` line dropped."""
    import os

    def rel(m: re.Match) -> str:
        return f'= "{os.path.relpath(m.group(1), base_dir)}"'

    lines = [ln for ln in text.splitlines() if not ln.startswith("base_dir =")]
    return re.sub(r'= "(/[^"]*)"', rel, "\n".join(lines))


@dataclass
class PointResult:
    """What a point gives: a controller run's SimResult (speedups not yet filled) or a
    baseline's mean TPOT, and the warnings it raised as (category, message)."""

    value: Any
    warnings: list = dataclasses.field(default_factory=list)


def run_point(sweep: Sweep, index: int) -> PointResult:
    """Simulate point ``index`` of ``sweep``, recording its warnings."""
    p = sweep.points()[index]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if p.is_baseline:
            s, _, _ = _run(
                sweep.scn,
                "fixed",
                make_config("fixed", {"k": 0}),
                sweep.seed,
                p.load_scale,
                False,
                p.label,
                p.resident,
            )
            value: Any = s["mean_tpot_s"]
        else:
            value = simulate(
                sweep.scn,
                str(p.name),
                p.config,
                seed=sweep.seed,
                trace=sweep.trace,
                baseline=False,
                load_scale=p.load_scale,
                label=p.label,
            )
    found = [(_category_name(w.category), str(w.message)) for w in caught]
    return PointResult(value, found)


def _category_name(cat: type) -> str:
    return f"{cat.__module__}:{cat.__qualname__}"


def _category(name: str) -> type[Warning]:
    """The warning class ``module:qualname`` names, when it is the lab's or a builtin one."""
    mod, _, qual = name.partition(":")
    if mod == "builtins" or mod.split(".", 1)[0] in ("sim", "control"):
        try:
            cat = getattr(importlib.import_module(mod), qual)
            if isinstance(cat, type) and issubclass(cat, Warning):
                return cat
        except (ImportError, AttributeError):
            pass
    return UserWarning


def finish(sweep: Sweep, results: Sequence[PointResult]) -> list[SimResult]:
    """The controller runs in the serial order (load scale, then controller), each with its
    speedups over its load scale's baselines; the points' warnings raised again in order."""
    points = sweep.points()
    if len(results) != len(points):
        raise ConfigError(f"sweep: {len(results)} results for {len(points)} points")
    for r in results:
        for cat, msg in r.warnings:
            warnings.warn(msg, _category(cat), stacklevel=2)
    base = {(p.load_scale, p.resident): r.value for p, r in zip(points, results) if p.is_baseline}
    out = []
    for p, r in zip(points, results):
        if p.is_baseline:
            continue
        res = r.value
        for _, resident, key in BASELINES if sweep.baseline else ():
            res.summary[key] = speedup_of(base[(p.load_scale, resident)], res.summary)
        out.append(res)
    return out


# ---- a process pool ------------------------------------------------------------------------


def pool_context() -> Any:
    """forkserver (workers forked from a server that has imported the simulator once), or spawn
    where there is none."""
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["sim.sweep"])
        return ctx
    return mp.get_context("spawn")


def pool_map(
    fn: Callable[..., Any],
    tasks: Sequence[tuple],
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> list:
    """``[fn(*t) for t in tasks]`` on ``workers`` processes (in this one when ``workers`` is 1),
    in task order. ``fn`` must be importable by name. ``progress(i)`` is called as task ``i``
    ends. The first task (in order) that raised re-raises here once the pool is shut down."""
    workers = check_workers(workers)
    if workers == 1 or len(tasks) <= 1:
        out = []
        for i, t in enumerate(tasks):
            out.append(fn(*t))
            if progress is not None:
                progress(i)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from sim.procs import die_with_command

    with ProcessPoolExecutor(
        min(workers, len(tasks)),
        mp_context=pool_context(),
        initializer=die_with_command,  # a killed command leaves no worker running
        initargs=(os.getpid(),),
    ) as ex:
        futures = [ex.submit(fn, *t) for t in tasks]
        index = {f: i for i, f in enumerate(futures)}
        try:
            for f in as_completed(futures):
                if f.exception() is not None:
                    break
                if progress is not None:
                    progress(index[f])
        finally:
            for f in futures:
                f.cancel()
    for f in futures:
        if not f.cancelled() and f.exception() is not None:
            raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def check_workers(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigError(f"workers {workers!r}: allowed an integer >= 1")
    return int(workers)


def run_pool(sweep: Sweep, workers: int, progress: Any = None) -> list[PointResult]:
    """Every point of ``sweep`` on ``workers`` processes, in point order; ``progress.update(1)``
    as each controller run ends."""
    points = sweep.points()

    def tick(i: int) -> None:
        if progress is not None and not points[i].is_baseline:
            progress.update(1)

    return pool_map(run_point, [(sweep, i) for i in range(len(points))], workers, tick)


def run(
    sweep: Sweep,
    workers: int = 1,
    progress: Any = None,
    runner: Callable[[Sweep], Sequence[PointResult]] | None = None,
) -> list[SimResult]:
    """The sweep's controller runs (:func:`finish`), its points run by ``runner`` (e.g. an
    Optuna study), else on a pool of ``workers`` processes."""
    results = runner(sweep) if runner is not None else run_pool(sweep, workers, progress)
    return finish(sweep, results)


def summary_of(scn: SimConfig, name: str, config: Any, seed: int, **kw: Any) -> dict:
    """``simulate(scn, name, config, seed=seed, baseline=False, **kw).summary``: a pool task."""
    return simulate(scn, name, config, seed=seed, baseline=False, **kw).summary


# ---- a point's result as text (for storages) -------------------------------------------------


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def _frame_to(df: Any) -> dict | None:
    if df is None:
        return None
    return {
        "columns": [str(c) for c in df.columns],
        "dtypes": [str(t) for t in df.dtypes],
        "data": [df[c].tolist() for c in df.columns],
    }


def _frame_from(d: dict | None) -> Any:
    if d is None:
        return None
    import pandas as pd

    return pd.DataFrame(
        {c: pd.Series(vals, dtype=t) for c, t, vals in zip(d["columns"], d["dtypes"], d["data"])},
        columns=d["columns"],
    )


def encode_point(r: PointResult) -> str:
    """A point's result as ASCII text: JSON (floats by repr, exact), zlib, base64. The
    controller config is not kept: :func:`decode_point` takes it from the sweep."""
    v = r.value
    body: dict[str, Any] = {"warnings": r.warnings}
    if isinstance(v, SimResult):
        body["summary"] = v.summary
        body["frames"] = [_frame_to(x) for x in (v.requests, v.rounds, v.controller_trace)]
    else:
        body["value"] = float(v)
    raw = json.dumps(body, default=_jsonable, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def decode_point(sweep: Sweep, index: int, text: str) -> PointResult:
    """The inverse of :func:`encode_point` for point ``index`` of ``sweep``."""
    body = json.loads(zlib.decompress(base64.b64decode(text)))
    found = [tuple(w) for w in body["warnings"]]
    if "value" in body:
        return PointResult(float(body["value"]), found)
    p = sweep.points()[index]
    req, rounds, ctrace = (_frame_from(x) for x in body["frames"])
    return PointResult(SimResult(body["summary"], req, rounds, ctrace, p.config), found)
