"""``compare_runs``: several controllers × load scales on identical arrivals, and the run folder.

Serial runs call :func:`sim.api.simulate`; with ``workers`` > 1 (or a ``runner``) the points go
to :mod:`sim.sweep`. Either way the tables are the same, row for row.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control.configio import to_dict, to_toml
from control.errors import ConfigError
from control.metrics import json_safe
from sim import sweep
from sim.api import (
    SPEEDUP_BASELINES,
    check_load_scale,
    check_seed,
    resolve_controller_config,
    simulate,
)
from sim.cluster import Cluster
from sim.config import SimConfig
from sim.metrics import SUMMARY_KEYS


def _items(controllers: Iterable) -> list[tuple[str, Any, str]]:
    items = []
    for c in controllers:
        if isinstance(c, str):
            items.append((c, None, None))
        elif isinstance(c, (tuple, list)) and len(c) in (2, 3) and isinstance(c[0], str):
            items.append((c[0], c[1], c[2] if len(c) == 3 else None))
        else:
            raise ConfigError(
                f"compare: controller entry {c!r} is not a name, (name, config) "
                "or (name, config, label)"
            )
    names = [n for n, _, lab in items if lab is None]
    out = []
    for i, (n, cfg, label) in enumerate(items):
        if label is None:
            seen = [m for m, _, lab in items[: i + 1] if lab is None]
            label = n if names.count(n) == 1 else f"{n}#{seen.count(n)}"
        out.append((n, cfg, label))
    return out


@dataclass
class Comparison:
    """What :func:`compare_runs` returns: one results row per controller x load scale, and
    the tables of a run folder (docs/results-format.md)."""

    results: Any  # DataFrame, columns SUMMARY_KEYS
    requests: Any  # DataFrame: every request of every run (load_scale column)
    rounds: Any = None  # DataFrame of RoundRecord columns (trace=True)
    controller_trace: Any = None  # DataFrame (trace=True)
    configs: dict = dataclasses.field(default_factory=dict)  # controller name -> its config
    names: list = dataclasses.field(default_factory=list)  # controller names, in order


def compare_runs(
    scn: SimConfig,
    controllers: Iterable = ("fixed", "dspark"),
    seed: int = 0,
    out_dir: str | Path | None = None,
    load_scales: Iterable[float] = (1.0,),
    trace: bool = False,
    baseline: bool = True,
    progress: Any = None,
    workers: int = 1,
    runner: Any = None,
) -> Comparison:
    """One row per controller × load scale, all on the same seed (identical arrivals and
    lengths), with the request (and with ``trace`` the round) tables. Writes the run folder
    (docs/results-format.md) when ``out_dir`` is given. With ``workers`` > 1 the runs are
    points of a process pool, with ``runner`` points of whatever it is (e.g. an Optuna study):
    :mod:`sim.sweep`; the tables are the same, row for row."""
    import pandas as pd

    items = _items(controllers)
    if not items:
        raise ConfigError("compare: no controllers to run")
    seed = check_seed(seed)
    load_scales = [check_load_scale(x) for x in load_scales]
    if not load_scales:
        raise ConfigError("compare: no load scales to run")
    for name, cfg, _ in items:  # every config is checked before any run starts
        resolve_controller_config(scn, name, cfg)

    pooled = sweep.check_workers(workers) > 1 or runner is not None
    if pooled:
        plan = sweep.Sweep.of(scn, seed, items, load_scales, trace, baseline)
        done = iter(sweep.run(plan, workers, progress, runner))
    cache: dict = {}
    rows, reqs, rounds, ctr, cfgs = [], [], [], [], {}
    for ls in load_scales:
        for name, cfg, label in items:
            if pooled:
                res = next(done)
            else:
                res = simulate(
                    scn,
                    name,
                    cfg,
                    seed=seed,
                    trace=trace,
                    baseline=baseline,
                    load_scale=float(ls),
                    label=label,
                    _baseline_cache=cache,
                    resident_baseline=True,
                )
            rows.append(res.summary)
            r = res.requests.copy()
            r.insert(1, "load_scale", float(ls))
            reqs.append(r)
            if trace:
                rounds.append(res.rounds.assign(load_scale=float(ls)))
                ctr.append(res.controller_trace.assign(load_scale=float(ls)))
            cfgs[name] = res.controller_config
            if progress is not None and not pooled:
                progress.update(1)
    out = Comparison(
        pd.DataFrame(rows, columns=list(SUMMARY_KEYS)),
        pd.concat(reqs, ignore_index=True),
        pd.concat(rounds, ignore_index=True) if trace else None,
        pd.concat(ctr, ignore_index=True) if trace else None,
        cfgs,
        [n for n, _, _ in items],
    )
    if out_dir is not None:
        write_run_folder(Path(out_dir), scn, seed, out)
    return out


def compare(scn: SimConfig, *args: Any, **kwargs: Any):
    """:func:`compare_runs` (same arguments), its results table alone: one row per
    controller × load scale."""
    return compare_runs(scn, *args, **kwargs).results


def provenance(scn: SimConfig, results: Any) -> dict:
    """The deployment a run folder simulated (hardware, models and their sizes, TP, GPUs):
    ``summary.json`` records it so reports need not parse configs. ``num_gpus`` is the list of
    GPU counts when the rows span several (a scaling sweep)."""
    prov = Cluster(scn).provenance()
    counts = sorted({int(g) for g in results["num_gpus"]}) if len(results) else []
    if counts and counts != [prov["num_gpus"]]:
        prov["num_gpus"] = counts
        del prov["replicas"]
    return prov


def write_run_folder(out: Path, scn: SimConfig, seed: int, comparison: Comparison) -> Path:
    c = comparison
    out.mkdir(parents=True, exist_ok=True)
    c.results.to_csv(out / "results.csv", index=False)
    rows = [{k: json_safe(v) for k, v in row.items()} for row in c.results.to_dict("records")]
    (out / "summary.json").write_text(
        json.dumps(
            {
                "kind": "simulate",
                "scenario": scn.name,
                "seed": int(seed),
                **provenance(scn, c.results),
                "speedup_baselines": SPEEDUP_BASELINES,
                "rows": rows,
            },
            indent=1,
        )
    )
    c.requests.to_csv(out / "requests.csv", index=False)
    resolved = dataclasses.replace(
        scn,
        controller={n: to_dict(x) for n, x in c.configs.items()},
        sim=dataclasses.replace(scn.sim, controllers=tuple(c.names)),
    )
    (out / "config.toml").write_text(to_toml(resolved))
    if c.rounds is not None:
        c.rounds.to_csv(out / "rounds.csv", index=False)
    if c.controller_trace is not None:
        c.controller_trace.to_csv(out / "controller_trace.csv", index=False)
    return out
