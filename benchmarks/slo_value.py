"""What does the scheduler buy at the user's SLOs? Capacity at SLO and SLO goodput, side by side.

Scenario: ``configs/standard.toml`` (8 × TP8 Llama-3.1-70B on H100 with a Llama-3.1-8B drafter,
``[slo]`` TTFT 2 s, TPOT 50 ms), on two Azure traces:

- ``conv``: the conversation trace at the scenario's time scale (0.08);
- ``code``: the code trace (long prompts) at ``--code-time-scale`` (default 0.8), chosen so that
  fixed k = 0 attains ≥ 90% at load 1 (the benchmark prints k = 0's attainment at load 1 for
  both workloads, so the claim is checked each run).

For every controller (default: fixed k = 0..4, untuned ``dspark``, ``dspark`` with the
throughput objective, the peers with their documented defaults, and ``dspark`` tuned from
``--tuned`` when given) and every seed (default 1, 2, 3: seeds no study tuned on):

- capacity at SLO: the highest load scale with attainment ≥ 0.9 (sim/capacity.py, bisection to
  ``--rel-tol`` on identical arrivals), the median over seeds and its range; ``dspark``'s over
  the best fixed k's with a 90% interval from resampling the seeds (paired);
- SLO goodput (tokens/s of requests meeting both SLOs) at loads 0.5, 1, 1.5, 2, mean over seeds;
  ``dspark``'s over the best fixed k's at each load with a 90% interval from resampling the
  seeds (paired: both ran the same arrivals).

    .venv/bin/python benchmarks/slo_value.py [--seeds 1,2,3] [--requests 4000] [--workers 2]
        [--tuned best_config.toml] [--controllers SPEC,SPEC,...] [--references]

Controller specs are separated by ``,``, or by ``;`` when a spec holds commas of its own
(``"fixed:k=1;dspark:slo_calibrate=true,slo_spread=0.1"``).

``--references`` adds the clairvoyant and the rate oracle (``control/references.py``): told what
no engine knows, they show what a draft-length schedule could buy on the scenario; the line
before the last gives their capacity over the best fixed k's (geometric mean over workloads).

Last line: ``slo_capacity_dspark_vs_best_fixed_min=… slo_capacity_dspark_vs_best_fixed_geo=…
slo_goodput_dspark_vs_best_fixed_min=… slo_default_vs_tuned=…`` (capacity ratios per workload
of the medians; goodput the minimum over workloads × loads of dspark / the best fixed k at that
load; default vs tuned the geometric mean of capacity ratios, ``nan`` without ``--tuned``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from control.errors import DSparkError  # noqa: E402
from sim.api import simulate  # noqa: E402
from sim.capacity import CapacityConfig, capacity, summarize_capacity  # noqa: E402
from sim.config import load_scenario  # noqa: E402
from sim.sweep import pool_map  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "azure-llm-2023"
FIXED = tuple(f"fixed:k={k}" for k in range(5))
PEERS = ("vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification", "sglang-adaptive")
DEFAULT = (*FIXED, "dspark", "dspark:objective=throughput", *PEERS)
#: --references: what knowing more than any engine knows buys (control/references.py): the
#: clairvoyant (every sequence's run length one round ahead) and the rate oracle (``dspark``'s
#: planner told each request's true acceptance rate)
REFERENCES = ("clairvoyant", "rate-oracle")
LOADS = (0.5, 1.0, 1.5, 2.0)


def workloads(requests: int, code_time_scale: float) -> dict:
    scn = ROOT / "configs" / "standard.toml"
    base = {"workload.num_requests": requests}
    return {
        "conv": load_scenario(scn, base),
        "code": load_scenario(
            scn,
            {
                **base,
                "workload.trace_path": str(TRACES / "AzureLLMInferenceTrace_code.csv"),
                "workload.time_scale": code_time_scale,
            },
        ),
    }


def split_specs(text: str) -> list[str]:
    """``--controllers``: specs separated by ``;`` when the text has one, else by ``,``."""
    return [s for s in text.split(";" if ";" in text else ",") if s]


def parse_spec(spec: str, tuned: str | None) -> tuple[str, object, str]:
    from dspark.cmd_simulate import parse_controller_spec

    if spec == "dspark-tuned":
        from tuning.export import load_best_config

        name, cfg = load_best_config(tuned, "dspark")
        return (name, cfg, "dspark-tuned")
    p = parse_controller_spec(spec)
    return (p, None, p) if isinstance(p, str) else p


def parse_specs(specs: list[str], tuned: str | None) -> list[tuple[str, object, str]]:
    """Every spec parsed and its config checked before any run: a bad one raises
    ``DSparkError`` naming the spec (the benchmarks print it as one line)."""
    from control.registry import make_config

    items = []
    for spec in specs:
        try:
            name, cfg, label = parse_spec(spec, tuned)
            make_config(name, cfg)
        except DSparkError as e:
            raise DSparkError(f"controller {spec!r}: {e}") from None
        items.append((name, cfg, label))
    return items


def paired_line(mine: dict, theirs: dict) -> str:
    """Seed by seed (the same arrivals), one controller's capacity over another's: the ratios
    and on how many seeds it is below, level and above (level: equal capacities, the same
    step of the bisection's grid)."""
    r = [mine[s] / theirs[s] for s in mine if s in theirs and theirs[s] > 0]
    below, level = sum(x < 1.0 for x in r), sum(x == 1.0 for x in r)
    return (
        "by seed "
        + " ".join(f"{x:.3f}" for x in r)
        + f" (below on {below}, level on {level}, above on {len(r) - below - level} of {len(r)})"
    )


def paired_ratio(
    mine: dict, theirs: dict, center: str = "mean", draws: int = 2000
) -> tuple[float, float, float]:
    """One controller's figure over another's, seeds paired (``{seed: value}`` each; the
    same arrivals): the ratio of their ``center`` (``"mean"``: SLO goodput at a load, whose
    table shows means; ``"median"``: capacity at SLO, whose table shows medians) over the
    seeds both ran, and its 90% percentile bootstrap interval (seeds drawn with replacement,
    ``draws`` times, seeded). The interval is the ratio itself with fewer than two seeds; all
    three are nan where the other's center is not positive."""
    stat = {"mean": np.mean, "median": np.median}[center]
    seeds = [s for s in mine if s in theirs]
    a = np.array([mine[s] for s in seeds], dtype=float)
    b = np.array([theirs[s] for s in seeds], dtype=float)
    if not len(seeds) or not stat(b) > 0:
        return math.nan, math.nan, math.nan
    ratio = float(stat(a) / stat(b))
    if len(seeds) < 2:
        return ratio, ratio, ratio
    pick = np.random.default_rng(0).integers(0, len(seeds), (draws, len(seeds)))
    den = stat(b[pick], axis=1)
    r = stat(a[pick], axis=1)[den > 0] / den[den > 0]
    lo, hi = np.percentile(r, [5.0, 95.0])
    return ratio, float(lo), float(hi)


def goodput_point(scn, name, cfg, label, seed, load) -> tuple:
    s = simulate(scn, name, cfg, seed=seed, baseline=False, load_scale=load, label=label).summary
    return (label, seed, load, s["goodput_tokens_per_s"], s["slo_attainment"])


def run_workload(wl, scn, items, seeds, cc, workers) -> tuple[list[dict], dict]:
    results = capacity(scn, items, seeds, cc, workers)
    caps = summarize_capacity(results)
    for r in caps:  # each seed's capacity, for --by-seed
        r["by_seed"] = {x.seed: x.capacity for x in results if x.controller == r["controller"]}
    tasks = [(scn, n, c, lab, s, ld) for n, c, lab in items for s in seeds for ld in LOADS]
    good: dict = {}  # (label, load) -> {seed: SLO goodput}
    for lab, seed, ld, g, _a in pool_map(goodput_point, tasks, workers):
        good.setdefault((lab, ld), {})[seed] = g
    return caps, good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--code-time-scale", type=float, default=0.8)
    ap.add_argument("--rel-tol", type=float, default=0.02)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tuned", default=None, help="best_config.toml with a [controller.dspark]")
    ap.add_argument("--controllers", default=",".join(DEFAULT))
    ap.add_argument("--workloads", default="conv,code", help="which of conv, code to run")
    ap.add_argument("--by-seed", action="store_true", help="also print each seed's capacity")
    ap.add_argument(
        "--references", action="store_true", help="also run " + " and ".join(REFERENCES)
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    specs = split_specs(args.controllers)
    if args.references:
        specs += [r for r in REFERENCES if r not in specs]
    if args.tuned:
        specs.append("dspark-tuned")
    specs = list(dict.fromkeys(specs))  # a controller named twice runs once
    try:
        items = parse_specs(specs, args.tuned)
    except DSparkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cc = CapacityConfig(rel_tol=args.rel_tol)
    t0 = time.time()
    cap_ratio, good_ratio, tuned_ratio = [], [], []
    ref_ratio: dict[str, list[float]] = {r: [] for r in REFERENCES}
    wanted = [w for w in args.workloads.split(",") if w]
    for wl, scn in workloads(args.requests, args.code_time_scale).items():
        if wl not in wanted:
            continue
        k0 = [
            simulate(scn, "fixed", {"k": 0}, seed=s, baseline=False).summary["slo_attainment"]
            for s in seeds
        ]
        print(
            f"\n== {wl}: time scale {scn.workload.time_scale:g}, {args.requests} requests, "
            f"seeds {args.seeds}; fixed k = 0 attains {min(k0):.3f}-{max(k0):.3f} at load 1"
        )
        caps, good_by_seed = run_workload(wl, scn, items, seeds, cc, args.workers)
        good = {k: float(np.mean(list(v.values()))) for k, v in good_by_seed.items()}
        by = {r["controller"]: r for r in caps}
        # (none when no fixed k was asked for: then no ratio to it is printed)
        best_fixed = max(
            (by[f] for f in FIXED if f in by), key=lambda r: r["capacity_load_scale"], default=None
        )
        print(
            f"{'controller':<30}{'capacity':>10}{'range':>18}  "
            + "".join(f"{'goodput@' + format(ld, 'g'):>13}" for ld in LOADS)
        )
        for r in sorted(caps, key=lambda r: -r["capacity_load_scale"]):
            lab = r["controller"]
            print(
                f"{lab:<30}{r['capacity_load_scale']:>10.3f}"
                f"{'[' + format(r['capacity_min'], '.3f') + ', ' + format(r['capacity_max'], '.3f') + ']':>18}  "
                + "".join(f"{good[(lab, ld)]:>13,.0f}" for ld in LOADS)
                + (
                    "  by seed " + " ".join(f"{c:.3f}" for c in r["by_seed"].values())
                    if args.by_seed
                    else ""
                )
            )
        if best_fixed is None:
            continue
        for ref in REFERENCES:
            if ref in by:
                r = by[ref]["capacity_load_scale"] / best_fixed["capacity_load_scale"]
                ref_ratio[ref].append(r)
                print(f"{ref} / best fixed ({best_fixed['controller']}): capacity {r:.3f}")
        if "dspark" in by:
            ratio = by["dspark"]["capacity_load_scale"] / best_fixed["capacity_load_scale"]
            cap_ratio.append(ratio)
            mine, theirs = by["dspark"]["by_seed"], best_fixed["by_seed"]
            _, lo, hi = paired_ratio(mine, theirs, "median")
            print(
                f"dspark / best fixed ({best_fixed['controller']}): capacity {ratio:.3f} "
                f"[{lo:.3f}, {hi:.3f}] (medians, 90% interval, seeds resampled); "
                + paired_line(mine, theirs)
            )
            paired = []
            for ld in LOADS:
                best = max((f for f in FIXED if (f, ld) in good), key=lambda f: good[(f, ld)])
                g, lo, hi = paired_ratio(good_by_seed[("dspark", ld)], good_by_seed[(best, ld)])
                good_ratio.append(g)
                paired.append(f"{ld:g} {g:.3f} [{lo:.3f}, {hi:.3f}] ({best})")
            print(
                "dspark / best fixed at each load: SLO goodput (90% interval, seeds "
                "resampled): " + "; ".join(paired)
            )
            if "dspark-tuned" in by:
                tuned_ratio.append(
                    by["dspark"]["capacity_load_scale"] / by["dspark-tuned"]["capacity_load_scale"]
                )
    print(f"\n{time.time() - t0:.0f} s")

    def geo(x):
        return float(np.exp(np.mean(np.log(x)))) if x else math.nan

    if any(ref_ratio.values()):  # the headroom of any draft-length schedule, by reference
        print(
            " ".join(
                f"slo_capacity_{r.replace('-', '_')}_vs_best_fixed_geo={geo(v):.3f}"
                for r, v in ref_ratio.items()
                if v
            )
        )
    print(
        f"slo_capacity_dspark_vs_best_fixed_min={min(cap_ratio, default=math.nan):.3f} "
        f"slo_capacity_dspark_vs_best_fixed_geo={geo(cap_ratio):.3f} "
        f"slo_goodput_dspark_vs_best_fixed_min={min(good_ratio, default=math.nan):.3f} "
        f"slo_default_vs_tuned={geo(tuned_ratio):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
