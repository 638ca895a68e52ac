"""What does the scheduler buy over a fixed draft length? A condition matrix, side by side.

Scenario: ``configs/tiny.toml`` (Llama-3.1-8B on one H100-SXM with a Llama-3.2-1B drafter),
with output lengths of a chat workload. Conditions = acceptance regimes × loads:

- capacity mode: every request at t = 0, ``max_batch`` = B for B in 1, 16, 64, 128, 256
  (max(3·B, 32) requests, so batches refill); metric: throughput (tokens/s), higher is better;
- open loop at B ≤ 64: light (0.25×), heavy (1.0×) and swing (sinusoidal, mean 0.6×, ±90%) of
  the k = 0 capacity measured at the start; metric: mean TPOT (lower is better; p99 reported).

Per cell every fixed k in 0..8 runs, plus ``dspark`` (tuned, from ``--tuned``), ``dspark``
with untuned defaults, and the two references (clairvoyant one round ahead, rate oracle),
on ≥ 2 seeds (mean over seeds; a cell with few requests runs more seeds, so that every cell
sees ≥ ``--min-requests`` requests: a 32-request cell at batch 1 on 2 seeds moves by ±3-4% from
seed to seed, more than the differences the targets are about). Ratios are "value relative to the reference, 1 = as good,
> 1 = better" for both metrics (TPOT ratios are inverted). The best single global fixed k is
the k with the best geometric mean of its ratios to the per-cell best.

    .venv/bin/python benchmarks/controller_value.py [--seeds 0,1] [--tuned configs/dspark_tuned.toml]
        [--workers N]   # the cells' runs on N processes; the cells are the same as with 1
        [--regimes beta-0.75 --loads B=128 --seeds 0,1,...,39]   # one cell on more seeds

Beside each cell's tuned/best ratio: its standard error over seeds (paired: the same seeds for
every controller), and the count of cells whose ratio is below 0.99 by more than two of them;
the same for untuned ``dspark`` against each peer's documented defaults.

Last line: ``ctrl_vs_best_fixed_min=… ctrl_vs_global_fixed_geo=… ctrl_vs_clairvoyant_geo=…
ctrl_default_vs_tuned_geo=…`` (plus the k = 0 minimum).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.registry import make_config  # noqa: E402
from sim.api import simulate  # noqa: E402
from sim.config import load_scenario  # noqa: E402
from sim.sweep import pool_map, summary_of  # noqa: E402
from tuning.export import load_best_config  # noqa: E402

FIXED_K = tuple(range(9))
#: the policies users deploy, at their documented defaults (control/peer_*.py)
PEERS = ("vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification", "sglang-adaptive")
BATCHES = (1, 16, 64, 128, 256)
OPEN_LOADS = {"light": ("poisson", 0.25), "heavy": ("poisson", 1.0), "swing": ("sinusoid", 0.6)}
OPEN_BATCH = 64
OUTPUT = {
    "workload.output.dist": "lognormal",
    "workload.output.mean_tokens": 256.0,
    "workload.output.sigma": 0.6,
    "workload.output.max_tokens": 1024,
    # the matrix asks the throughput question (tokens/s in capacity mode, mean TPOT in open
    # loop): no SLO is told, so dspark plans for throughput; benchmarks/slo_value.py asks the
    # SLO question (capacity at SLO, SLO goodput) on the scenario's own [slo]
    "slo.ttft_s": math.inf,
    "slo.tpot_s": math.inf,
}

#: Acceptance regimes (none of them is used by the tuning study, configs/tune_load.toml).
REGIMES: dict[str, dict] = {
    "iid-0.75": {"acceptance.model": "iid", "acceptance.rate": 0.75},
    "decay": {"acceptance.model": "decay", "acceptance.rate": 0.92, "acceptance.decay": 0.9},
    "markov": {"acceptance.model": "markov"},
    "beta-0.75": {
        "acceptance.model": "beta",
        "acceptance.beta_mean": 0.75,
        "acceptance.beta_concentration": 10.0,
    },
    "beta-wide": {
        "acceptance.model": "beta",
        "acceptance.beta_mean": 0.6,
        "acceptance.beta_concentration": 2.0,
    },
    "mix-code-chat": {
        "acceptance.model": "mixture",
        "acceptance.mixture_rates": (0.85, 0.5),
        "acceptance.mixture_weights": (0.5, 0.5),
    },
}


def conditions(cap_rps: float) -> list[tuple[str, str, dict, str]]:
    """(regime, load, overrides, metric) for every cell."""
    out = []
    for reg, acc in REGIMES.items():
        for B in BATCHES:
            ov = {
                **OUTPUT,
                **acc,
                "deployment.max_batch": B,
                "workload.arrival": "capacity",
                "workload.num_requests": max(3 * B, 32),
            }
            out.append((reg, f"B={B}", ov, "throughput"))
        for name, (arrival, scale) in OPEN_LOADS.items():
            ov = {
                **OUTPUT,
                **acc,
                "deployment.max_batch": OPEN_BATCH,
                "workload.arrival": arrival,
                "workload.rate_rps": cap_rps * scale,
                "workload.num_requests": 600,
                "workload.swing_period_s": 30.0,
            }
            out.append((reg, name, ov, "tpot"))
    return out


def k0_capacity_rps(base) -> float:
    """Requests/s that k = 0 sustains at the open-loop batch size (iid regime)."""
    scn = base.with_overrides(
        {
            **OUTPUT,
            **REGIMES["iid-0.75"],
            "deployment.max_batch": OPEN_BATCH,
            "workload.arrival": "capacity",
            "workload.num_requests": 3 * OPEN_BATCH,
        }
    )
    s = simulate(scn, "fixed", {"k": 0}, seed=99, baseline=False).summary
    return s["throughput_tokens_per_s"] / OUTPUT["workload.output.mean_tokens"]


def cell_seeds(seeds: list[int], ov: dict, min_requests: int) -> list[int]:
    """``seeds``, extended by the next integers until the cell sees ``min_requests``."""
    more = math.ceil(min_requests / ov["workload.num_requests"]) - len(seeds)
    return seeds + list(range(max(seeds) + 1, max(seeds) + 1 + max(0, more)))


def cell_tasks(base, ov: dict, entries: dict, seeds: list[int]) -> list[tuple]:
    """The cell's runs as :func:`sim.sweep.summary_of` tasks: every entry on every seed."""
    scn = base.with_overrides(ov)
    return [(scn, name, cfg, s) for name, cfg in entries.values() for s in seeds]


def cell_values(metric: str, entries: dict, seeds: list[int], summaries: list) -> dict[str, dict]:
    """Per entry: its mean metric over the seeds, mean p99 TPOT and per-seed values, from the
    summaries of :func:`cell_tasks` (in its order)."""
    out: dict[str, dict] = {}
    for i, label in enumerate(entries):
        vals, p99 = [], []
        for r in summaries[i * len(seeds) : (i + 1) * len(seeds)]:
            vals.append(
                r["throughput_tokens_per_s"] if metric == "throughput" else r["mean_tpot_s"]
            )
            p99.append(r["tpot_p99_s"])
        out[label] = {
            "value": float(np.mean(vals)),
            "tpot_p99_s": float(np.mean(p99)),
            "seed_values": ";".join(repr(float(v)) for v in vals),
        }
    return out


def ratio(a: float, b: float, metric: str) -> float:
    """How much better ``a`` is than ``b`` (1 = equal, > 1 = better)."""
    return a / b if metric == "throughput" else b / a


def geo(x) -> float:
    x = [v for v in x if v > 0 and math.isfinite(v)]
    return float(np.exp(np.mean(np.log(x)))) if x else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--min-requests", type=int, default=768, help="per cell, over its seeds")
    ap.add_argument("--tuned", default=str(ROOT / "configs" / "dspark_tuned.toml"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "controller_value"))
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument(
        "--loads",
        default=None,
        help="only these loads of each regime (e.g. B=128,heavy): one cell on more seeds",
    )
    ap.add_argument(
        "--from-cells", default=None, help="summarise a saved cells.csv instead of running"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that run the cells' simulations (the cells are the same as with 1)",
    )
    a = ap.parse_args(argv)
    if a.from_cells:
        summarize(pd.read_csv(a.from_cells))
        return 0
    seeds = [int(x) for x in a.seeds.split(",")]
    base = load_scenario(ROOT / "configs" / "tiny.toml")
    tuned_name, tuned_cfg = load_best_config(a.tuned)
    entries = {f"fixed:k={k}": ("fixed", make_config("fixed", {"k": k})) for k in FIXED_K}
    entries.update(
        {
            "dspark-tuned": (tuned_name, tuned_cfg),
            "dspark-default": ("dspark", make_config("dspark")),
            "clairvoyant": ("clairvoyant", make_config("clairvoyant")),
            "rate-oracle": ("rate-oracle", make_config("rate-oracle")),
            **{p: (p, make_config(p)) for p in PEERS},
        }
    )
    regimes = a.regimes.split(",")
    loads = None if a.loads is None else a.loads.split(",")

    def chosen(cell: tuple) -> bool:
        return cell[0] in regimes and (loads is None or cell[1] in loads)

    if not any(chosen(c) for c in conditions(1.0)):
        print(f"error: no cell has a regime in {a.regimes!r} and a load in {a.loads!r}")
        return 2
    t0 = time.perf_counter()
    cap = k0_capacity_rps(base)
    print(f"k = 0 capacity at batch {OPEN_BATCH}: {cap:.2f} requests/s (open-loop loads scale it)")
    cells = [c for c in conditions(cap) if chosen(c)]
    df = pd.DataFrame(run_cells(base, cells, entries, seeds, a.min_requests, a.workers, t0))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(a.out) / "cells.csv", index=False)
    best_fixed_k_table(df).to_csv(Path(a.out) / "best_fixed_k.csv", index=False)
    print(f"tables: {a.out}/cells.csv, {a.out}/best_fixed_k.csv")
    summarize(df)
    return 0


def run_cells(
    base, cells: list, entries: dict, seeds: list[int], min_requests: int, workers: int, t0: float
) -> list[dict]:
    """Every cell's rows (regime, load, metric, controller, values), its runs on ``workers``
    processes; a line as each cell's last run ends."""
    tasks, spans = [], []
    for _, _, ov, _ in cells:
        cs = cell_seeds(seeds, ov, min_requests)
        spans.append((len(tasks), cs))
        tasks += cell_tasks(base, ov, entries, cs)
    left = [len(entries) * len(cs) for _, cs in spans]
    cell_of = [j for j, n in enumerate(left) for _ in range(n)]

    def tick(i: int) -> None:
        j = cell_of[i]
        left[j] -= 1
        if not left[j]:
            reg, load = cells[j][:2]
            print(f"  {reg:14s} {load:7s} done ({time.perf_counter() - t0:.0f} s)", flush=True)

    summaries = pool_map(summary_of, tasks, workers, tick)
    rows = []
    for (reg, load, _, metric), (start, cs) in zip(cells, spans):
        got = summaries[start : start + len(entries) * len(cs)]
        for label, v in cell_values(metric, entries, cs, got).items():
            rows.append({"regime": reg, "load": load, "metric": metric, "controller": label, **v})
    return rows


def cells_of(df: pd.DataFrame) -> list[dict]:
    """Per condition: its metric, every controller's value, the fixed k's values and the best
    fixed k (hindsight), and the tuned dspark's paired standard error against that k."""
    cells = []
    for (reg, load), g in df.groupby(["regime", "load"], sort=False):
        metric = g["metric"].iloc[0]
        v = dict(zip(g["controller"], g["value"]))
        fixed = {k: v[f"fixed:k={k}"] for k in FIXED_K}
        best_k = max(fixed, key=lambda k: ratio(fixed[k], fixed[0], metric))
        per_seed = dict(zip(g["controller"], g.get("seed_values", [np.nan] * len(g))))
        cells.append(
            {
                "regime": reg,
                "load": load,
                "metric": metric,
                "best_k": best_k,
                "best": fixed[best_k],
                "fixed": fixed,
                "v": v,
                "se": paired_se(per_seed, "dspark-tuned", f"fixed:k={best_k}", metric),
                "per_seed": per_seed,
            }
        )
    return cells


def best_fixed_k_table(df: pd.DataFrame) -> pd.DataFrame:
    """The best fixed k of every condition (hindsight) and every fixed k's value relative to it."""
    rows = []
    for c in cells_of(df):
        row = {
            "regime": c["regime"],
            "load": c["load"],
            "metric": c["metric"],
            "best_k": c["best_k"],
            "best_value": c["best"],
        }
        row.update(
            {f"k{k}_vs_best": ratio(x, c["best"], c["metric"]) for k, x in c["fixed"].items()}
        )
        rows.append(row)
    return pd.DataFrame(rows)


def paired_se(per_seed: dict, a: str, b: str, metric: str) -> float:
    """Standard error of ``a``'s ratio to ``b`` over the seeds they share (NaN with < 2)."""
    try:
        x = np.array([float(v) for v in str(per_seed[a]).split(";")])
        y = np.array([float(v) for v in str(per_seed[b]).split(";")])
    except (KeyError, ValueError):
        return float("nan")
    r = ratio(x, y, metric)
    return float(np.std(r, ddof=1) / np.sqrt(len(r))) if len(r) > 1 else float("nan")


def peers_line(cells: list[dict]) -> None:
    """Untuned ``dspark`` against each peer at its documented defaults, over the cells that ran
    it: the minimum and geometric mean of the ratios, the cells where the peer is ahead by
    more than 1% (each with the ratio's paired standard error over the cell's seeds), and how
    many of those are ahead by more than two standard errors."""
    for p in PEERS:
        got = [c for c in cells if p in c["v"]]
        if not got:
            continue
        r = [ratio(c["v"]["dspark-default"], c["v"][p], c["metric"]) for c in got]
        behind = [(c, x) for c, x in zip(got, r) if x < 0.99]
        se = [paired_se(c.get("per_seed", {}), "dspark-default", p, c["metric"]) for c, _ in behind]
        sig = sum(x + 2 * e < 0.99 for (_, x), e in zip(behind, se))
        where = ", ".join(
            f"{c['regime']} {c['load']} {x:.4f} ± {e:.4f}" for (c, x), e in zip(behind, se)
        )
        print(
            f"dspark (untuned) / {p}: min {min(r):.3f}, geo {geo(r):.3f}; below 0.99 in "
            f"{len(behind)} of {len(got)} cells"
            + (f" ({where})" if behind else "")
            + (f", by more than two standard errors in {sig}" if behind else "")
        )


def summarize(df: pd.DataFrame) -> None:
    cells = cells_of(df)
    # the best single global fixed k: best geometric mean of its ratios to each cell's best
    glob = max(
        FIXED_K, key=lambda k: geo(ratio(c["fixed"][k], c["best"], c["metric"]) for c in cells)
    )
    ceiling = geo(ratio(c["best"], c["fixed"][glob], c["metric"]) for c in cells)
    print(
        f"\nbest single global fixed k = {glob}; the per-cell best fixed k (hindsight) is "
        f"{ceiling:.3f} of it (geo): what matching the best fixed k in every cell would give\n"
    )
    hdr = (
        f"{'regime':14s} {'load':7s} {'best k':>6s} {'tuned/best':>10s} {'± se':>6s} {'dflt/best':>9s} "
        f"{'tuned/glob':>10s} {'tuned/k0':>8s} {'tuned/clv':>9s} {'tuned/rate':>10s}"
    )
    print(hdr)
    out = {k: [] for k in ("best", "glob", "clv", "dflt", "k0")}
    for c in cells:
        m, v = c["metric"], c["v"]
        t = v["dspark-tuned"]
        r = {
            "best": ratio(t, c["best"], m),
            "glob": ratio(t, c["fixed"][glob], m),
            "clv": ratio(t, v["clairvoyant"], m),
            "dflt": ratio(v["dspark-default"], t, m),
            "k0": ratio(t, c["fixed"][0], m),
        }
        for k in out:
            out[k].append(r[k])
        print(
            f"{c['regime']:14s} {c['load']:7s} {c['best_k']:6d} {r['best']:10.3f} {c['se']:6.3f} "
            f"{ratio(v['dspark-default'], c['best'], m):9.3f} {r['glob']:10.3f} "
            f"{r['k0']:8.3f} {r['clv']:9.3f} {ratio(t, v['rate-oracle'], m):10.3f}"
        )
    b256 = [
        ratio(c["v"]["dspark-tuned"], c["fixed"][glob], c["metric"])
        for c in cells
        if c["load"] == "B=256"
    ]
    print(f"\ntuned vs global fixed k at B = 256 (geo): {geo(b256):.3f}")
    low = [c for c, b in zip(cells, out["best"]) if b < 0.99]
    sig = [c for c, b in zip(cells, out["best"]) if b + 2 * c["se"] < 0.99]
    unknown = sum(not math.isfinite(c["se"]) for c in cells)
    if unknown:
        print(f"(no per-seed values for {unknown} cells: their standard error is unknown)")
    print(
        f"cells below 0.99 of their best fixed k: {len(low)} of {len(cells)}; by more than two "
        f"standard errors: {len(sig)} ({', '.join(c['regime'] + ' ' + c['load'] for c in sig)})"
    )
    headroom(cells, glob)
    peers_line(cells)
    print(
        f"ctrl_vs_best_fixed_min={min(out['best']):.4f} "
        f"ctrl_vs_global_fixed_geo={geo(out['glob']):.4f} "
        f"ctrl_vs_clairvoyant_geo={geo(out['clv']):.4f} "
        f"ctrl_default_vs_tuned_geo={geo(out['dflt']):.4f} "
        f"ctrl_vs_k0_min={min(out['k0']):.4f}"
    )


def headroom(cells: list[dict], glob: int) -> None:
    """Geometric means of the controllers and references against each other, and how close a
    causal controller can come to the clairvoyant. Under i.i.d. acceptance the run length is
    independent of all a causal controller sees, and with per-request Beta rates it is so given
    the request's rate: at batch 1 the best causal choice is then a fixed k per request, what the
    best fixed k (i.i.d.) and the rate oracle (Beta) do. Each such cell is put at the best
    measured causal value (best fixed k, rate oracle or ``dspark``), every other cell at the
    clairvoyant: first for the i.i.d. cells and the Beta cells at batch 1, then for every i.i.d.
    and Beta cell (at batch > 1 the best measured is not a proven optimum)."""

    def vs(who, ref) -> float:
        return geo(ratio(pick(c, who), pick(c, ref), c["metric"]) for c in cells)

    def pick(c, who) -> float:
        if who == "best":
            return c["best"]
        return c["fixed"][glob] if who == "global" else c["v"][who]

    print("\ngeometric means, row against column:")
    print(f"{'':22s} {'global fixed k':>14s} {'cell best k':>11s} {'clairvoyant':>11s}")
    rows = ("dspark-tuned", "dspark-default", "rate-oracle", "best", "clairvoyant")
    for who in rows:
        cols = [vs(who, ref) for ref in ("global", "best", "clairvoyant")]
        label = "cell best fixed k" if who == "best" else who
        print(f"{label:22s} {cols[0]:14.4f} {cols[1]:11.4f} {cols[2]:11.4f}")

    def best_causal(c) -> float:
        return ratio(_best_causal(c), c["v"]["clairvoyant"], c["metric"])

    iid = [c for c in cells if c["regime"].startswith("iid")]
    beta = [c for c in cells if c["regime"].startswith("beta")]
    cap1 = [best_causal(c) for c in iid] + [best_causal(c) for c in beta if c["load"] == "B=1"]
    cap2 = [best_causal(c) for c in iid + beta]
    n = len(cells)
    print(
        f"cap on the geometric mean against the clairvoyant ({len(cap1)} i.i.d. and Beta-at-B=1 "
        f"cells at their best measured causal value, the other {n - len(cap1)} at the "
        f"clairvoyant): {math.exp(sum(map(math.log, cap1)) / n):.4f}; with all {len(cap2)} "
        f"i.i.d. and Beta cells so: {math.exp(sum(map(math.log, cap2)) / n):.4f}"
    )
    b256_bound(cells, glob)


#: the issue's target at batch 256: dspark ≥ 1.09 of the best single global fixed k (geo)
B256_TARGET = 1.09


def b256_bound(cells: list[dict], glob: int) -> None:
    """Prints what the B = 256 target asks of the clairvoyant cells (:func:`b256_needed_share`),
    with the i.i.d. cell, then also the Beta cells, at their best measured causal value."""
    b = [c for c in cells if c["load"] == "B=256"]
    if not b:
        return
    clv = [_vs_glob(c, c["v"]["clairvoyant"], glob) for c in b]
    print(
        f"B = 256: the clairvoyant is {geo(clv):.4f} of the global fixed k (geo; "
        f"target for dspark {B256_TARGET})"
    )
    for prefixes in (("iid",), ("iid", "beta")):
        held = [c for c in b if c["regime"].startswith(prefixes)]
        share = b256_needed_share(cells, glob, prefixes)
        if share is None:
            continue
        vals = ", ".join(f"{c['regime']} {_causal_vs_glob(c, glob):.4f}" for c in held)
        print(
            f"  with {vals} (their best measured causal value), the other {len(b) - len(held)} "
            f"cells need {share:.4f} of the clairvoyant (geo)"
        )


def _vs_glob(c: dict, x: float, glob: int) -> float:
    return ratio(x, c["fixed"][glob], c["metric"])


def _best_causal(c: dict) -> float:
    """The best measured causal value of a cell: best fixed k, rate oracle or tuned ``dspark``
    (the highest throughput or the lowest TPOT)."""
    v = c["v"]
    return max(
        (c["best"], v["rate-oracle"], v["dspark-tuned"]), key=lambda x: ratio(x, 1.0, c["metric"])
    )


def _causal_vs_glob(c: dict, glob: int) -> float:
    return _vs_glob(c, _best_causal(c), glob)


def b256_needed_share(cells: list[dict], glob: int, prefixes: tuple[str, ...]) -> float | None:
    """With the B = 256 cells whose regime starts with ``prefixes`` at their best measured
    causal value, the geometric-mean share of the clairvoyant that every other B = 256 cell must
    reach for the mean over all of them to be ``B256_TARGET`` of the global fixed k (above 1:
    not even the clairvoyant gets there). None when either group is empty."""
    b = [c for c in cells if c["load"] == "B=256"]
    held = [c for c in b if c["regime"].startswith(prefixes)]
    rest = [c for c in b if c not in held]
    if not held or not rest:
        return None
    need = B256_TARGET ** len(b) / math.prod(_causal_vs_glob(c, glob) for c in held)
    clv = math.prod(_vs_glob(c, c["v"]["clairvoyant"], glob) for c in rest)
    return (need / clv) ** (1 / len(rest))


if __name__ == "__main__":
    raise SystemExit(main())
