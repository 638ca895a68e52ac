"""Who misses the SLO? Attainment by each request's own acceptance rate, side by side.

At one load of the SLO benchmark's workloads (benchmarks/slo_value.py: the standard scenario on
the Azure conversation or code trace), every controller runs on the same arrivals and the same
per-request acceptance draws (one seed); the table gives, per band of the request's own
per-token acceptance rate (the requests table's ``acceptance_rate``), the share of requests that
meet both SLOs, and why the others miss (TTFT, TPOT).

    .venv/bin/python benchmarks/slo_by_acceptance.py [--workload conv] [--load 1.24] [--seed 1]
        [--controllers "fixed:k=1;fixed:k=2;dspark;dspark:k_max=1,k_min=1"] [--workers 2]

Controller specs are ``dspark simulate --controllers`` specs separated by ``;`` or ``,`` between
controllers (a spec's own ``key=value`` pairs follow its ``:``; use ``;`` when they hold commas).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from slo_value import parse_spec, parse_specs, split_specs, workloads  # noqa: E402

from control.errors import DSparkError  # noqa: E402
from sim.api import simulate  # noqa: E402
from sim.sweep import pool_map  # noqa: E402

BANDS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def run_one(wl: str, requests: int, code_ts: float, spec: str, seed: int, load: float):
    scn = workloads(requests, code_ts)[wl]
    name, cfg, label = parse_spec(spec, None)
    r = simulate(scn, name, cfg, seed=seed, baseline=False, load_scale=load, label=label)
    slo = scn.slo
    q = r.requests
    ttft_ok = q["ttft_s"] <= slo.ttft_s
    tpot_ok = q["tpot_s"] <= slo.tpot_s
    return label, pd.DataFrame(
        {
            "rate": q["acceptance_rate"].to_numpy(),
            "ok": (ttft_ok & tpot_ok & q["finished"]).to_numpy(),
            "ttft_miss": (~ttft_ok).to_numpy(),
            "tpot_miss": (~tpot_ok).to_numpy(),
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="conv", choices=("conv", "code"))
    ap.add_argument("--load", type=float, default=1.24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--code-time-scale", type=float, default=0.8)
    ap.add_argument("--controllers", default="fixed:k=1;fixed:k=2;dspark;dspark:k_max=1,k_min=1")
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    specs = split_specs(a.controllers)
    try:
        labels = [label for _, _, label in parse_specs(specs, None)]
    except DSparkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tasks = [(a.workload, a.requests, a.code_time_scale, s, a.seed, a.load) for s in specs]
    runs = dict(pool_map(run_one, tasks, a.workers))
    any_df = runs[labels[0]]
    band = pd.cut(any_df["rate"], BANDS)
    table = pd.DataFrame(
        {lab: runs[lab]["ok"].groupby(band, observed=False).mean() for lab in labels}
    )
    table["requests"] = any_df.groupby(band, observed=False).size()
    table.index = [f"{iv.left:.1f}-{iv.right:.1f}" for iv in table.index]
    table.loc["all"] = [runs[lab]["ok"].mean() for lab in labels] + [len(any_df)]
    print(
        f"{a.workload} trace, load {a.load:g}, seed {a.seed}, {a.requests} requests: share of "
        "requests meeting both SLOs, by the request's own acceptance rate"
    )
    print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    print("\nmisses by cause (share of all requests)")
    for lab in labels:
        d = runs[lab]
        print(
            f"  {lab:<34} TTFT {d['ttft_miss'].mean():.4f}  TPOT {d['tpot_miss'].mean():.4f}  "
            f"attainment {d['ok'].mean():.4f}"
        )
    rates = any_df["rate"].to_numpy()
    print(f"\nacceptance rate mean {np.nanmean(rates):.3f}, spread (sd) {np.nanstd(rates):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
