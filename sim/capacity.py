"""Capacity at SLO: the highest load scale at which SLO attainment reaches a target.

DistServe's measure (OSDI 2024): the highest request rate at which at least ``attainment`` of
the requests meet both SLOs (TTFT ≤ ``slo.ttft_s`` and their own TPOT ≤ ``slo.tpot_s``). The
load is swept on *identical* arrivals: one seed fixes arrivals, lengths and per-request
acceptance, and a load scale ``x`` divides every arrival time by ``x`` (a trace is compressed,
a Poisson rate multiplied), so the probes of one seed differ only in the load.

Search, per controller and seed: probe the ``start`` scale; double (or halve) until attainment
crosses the target inside ``[lo, hi]``; then bisect on the log scale between the highest load
that met the target and the lowest that missed it, until they are within ``rel_tol``. The
capacity is the highest probed load that met the target. A range that never crosses (the
target met at ``hi``, or missed at ``lo``) is reported as not crossed; the command refuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from control.configio import param
from control.errors import ConfigError
from sim.api import check_load_scale, check_seed, resolve_controller_config, simulate
from sim.config import SimConfig

#: summary keys kept for every probe (probes.csv)
PROBE_KEYS = (
    "controller",
    "seed",
    "load_scale",
    "offered_rps",
    "slo_attainment",
    "goodput_tokens_per_s",
    "throughput_tokens_per_s",
    "ttft_p99_s",
    "tpot_p99_s",
    "mean_tpot_s",
    "mean_accepted_length",
)


@dataclass(frozen=True)
class CapacityConfig:
    # DistServe's 90%: nine requests in ten meet both SLOs.
    attainment: float = param(
        0.9, lo=1e-9, hi=1.0, doc="SLO attainment the capacity must reach, in (0, 1]"
    )
    # the scenario's own load first: most scenarios are written near their knee.
    start: float = param(1.0, lo=1e-6, doc="first load scale probed")
    # a 20x window either side of the scenario's load: wider searches cost two probes per 2x.
    lo: float = param(0.05, lo=1e-6, doc="smallest load scale searched")
    hi: float = param(20.0, lo=1e-6, doc="largest load scale searched")
    # 2%: finer than the seed-to-seed spread of the standard scenario's capacity.
    rel_tol: float = param(0.02, lo=1e-6, hi=1.0, doc="bisection stops when hi/lo − 1 ≤ this")

    def __post_init__(self) -> None:
        if not 0.0 < self.attainment <= 1.0:
            raise ConfigError(f"attainment = {self.attainment!r} is out of range; allowed (0, 1]")
        if not self.lo <= self.start <= self.hi:
            raise ConfigError(
                f"capacity search: start = {self.start!r} is outside the load range "
                f"[{self.lo!r}, {self.hi!r}]"
            )


@dataclass
class CapacityResult:
    """One controller on one seed: the capacity, and every probe on the way."""

    controller: str
    seed: int
    capacity: float  # highest probed load scale meeting the target (nan: none in range)
    missed: float  # lowest probed load scale missing it (nan: none in range)
    crossed: bool
    offered_rps: float  # at the capacity
    probes: list[dict] = field(default_factory=list)


def _probe(scn: SimConfig, name: str, cfg: Any, label: str, seed: int, x: float) -> dict:
    s = simulate(scn, name, cfg, seed=seed, baseline=False, load_scale=x, label=label).summary
    return {k: s[k] for k in PROBE_KEYS}


def search(
    scn: SimConfig, name: str, cfg: Any, label: str, seed: int, cc: CapacityConfig
) -> CapacityResult:
    """The capacity of one controller on one seed (module docstring)."""
    seed = check_seed(seed)
    probes: list[dict] = []

    def attain(x: float) -> float:
        row = _probe(scn, name, cfg, label, seed, x)
        probes.append(row)
        a = row["slo_attainment"]
        return -1.0 if a != a else a  # nothing measured counts as a miss

    good, bad = math.nan, math.nan
    x = check_load_scale(cc.start)
    if attain(x) >= cc.attainment:
        good = x
        while math.isnan(bad) and good < cc.hi:
            x = min(good * 2.0, cc.hi)
            if attain(x) >= cc.attainment:
                good = x
            else:
                bad = x
    else:
        bad = x
        while math.isnan(good) and bad > cc.lo:
            x = max(bad / 2.0, cc.lo)
            if attain(x) >= cc.attainment:
                good = x
            else:
                bad = x
    crossed = not (math.isnan(good) or math.isnan(bad))
    while crossed and bad / good - 1.0 > cc.rel_tol:
        x = math.sqrt(good * bad)
        if attain(x) >= cc.attainment:
            good = x
        else:
            bad = x
    at = [p for p in probes if p["load_scale"] == good]
    return CapacityResult(
        label, seed, good, bad, crossed, at[0]["offered_rps"] if at else math.nan, probes
    )


def capacity(
    scn: SimConfig,
    controllers: list[tuple[str, Any, str]],
    seeds: list[int],
    cc: CapacityConfig,
    workers: int = 1,
) -> list[CapacityResult]:
    """Capacity of every ``(name, config, label)`` on every seed, in controller-major order;
    ``workers`` > 1 runs the searches on a process pool (same results as serial)."""
    jobs: list[tuple] = []
    for name, cfg, label in controllers:
        cfg_obj = resolve_controller_config(scn, name, cfg)
        jobs.extend((scn, name, cfg_obj, label, check_seed(s), cc) for s in seeds)
    from sim.sweep import pool_map

    return pool_map(search, jobs, workers)


def summarize_capacity(results: list[CapacityResult]) -> list[dict]:
    """Per controller: capacity over seeds (median, min, max, spread = (max − min) / median)."""
    out: list[dict] = []
    for label in dict.fromkeys(r.controller for r in results):
        caps = np.array([r.capacity for r in results if r.controller == label], dtype=float)
        rps = np.array([r.offered_rps for r in results if r.controller == label], dtype=float)
        ok = all(r.crossed for r in results if r.controller == label)
        med = float(np.median(caps)) if ok else math.nan
        out.append(
            {
                "controller": label,
                "seeds": len(caps),
                "capacity_load_scale": med,
                "capacity_min": float(caps.min()) if ok else math.nan,
                "capacity_max": float(caps.max()) if ok else math.nan,
                "capacity_spread": float((caps.max() - caps.min()) / med) if ok else math.nan,
                "capacity_rps": float(np.median(rps)) if ok else math.nan,
                "crossed": ok,
            }
        )
    return out


def write_capacity_folder(
    out: Any, scn: SimConfig, seeds: list[int], cc: CapacityConfig, results, rows
) -> Any:
    """The run folder of a capacity search (docs/results-format.md): capacity.csv (one row
    per controller × seed), probes.csv (every probe), summary.json (``kind = "capacity"``,
    the per-controller rows) and config.toml; written only once every search is done."""
    import dataclasses
    import json
    from pathlib import Path

    import pandas as pd

    from control.configio import to_toml
    from control.metrics import json_safe

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_seed = pd.DataFrame(
        [
            {
                "controller": r.controller,
                "seed": r.seed,
                "capacity_load_scale": r.capacity,
                "missed_load_scale": r.missed,
                "capacity_rps": r.offered_rps,
                "probes": len(r.probes),
            }
            for r in results
        ]
    )
    per_seed.to_csv(out / "capacity.csv", index=False)
    pd.DataFrame([p for r in results for p in r.probes], columns=list(PROBE_KEYS)).to_csv(
        out / "probes.csv", index=False
    )
    (out / "config.toml").write_text(to_toml(scn))
    (out / "summary.json").write_text(
        json.dumps(
            {
                "kind": "capacity",
                "scenario": scn.name,
                "seeds": list(seeds),
                "slo": {"ttft_s": scn.slo.ttft_s, "tpot_s": scn.slo.tpot_s},
                "search": dataclasses.asdict(cc),
                "rows": [{k: json_safe(v) for k, v in r.items()} for r in rows],
            },
            indent=1,
        )
    )
    return out
