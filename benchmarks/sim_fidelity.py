"""Issue 13's before/after check: TTFT p50, TPOT p99 and speedup on configs/azure_conv.toml and
on the long-context case (benchmarks/long_context_trace.py run on azure_conv's cluster).

    .venv/bin/python benchmarks/sim_fidelity.py [--cases azure,long] [--set KEY=VALUE ...]

One line per case x controller x load. Runs on any checkout whose ``sim.compare`` exists (the
speedup-over-resident-drafter column is printed when the summary has it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTROLLERS = [
    ("fixed", {"k": 0}, "fixed:k=0"),
    ("fixed", {"k": 4}, "fixed:k=4"),
    ("dspark", None, "dspark"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="azure,long")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--requests", type=int, default=2000, help="azure_conv requests")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from long_context_trace import make_trace

    from sim import compare, load_scenario

    overrides = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        overrides[k] = tomllib.loads(f"x = {v}")["x"]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "long.csv").write_text(make_trace())
    cases = {
        "azure": ({"workload.num_requests": args.requests}, (1.0,)),
        "long": (
            {"workload.trace_path": str(tmp / "long.csv"), "workload.num_requests": 400},
            (0.25, 0.5, 1.0),
        ),
    }
    for case in args.cases.split(","):
        over, loads = cases[case]
        scn = load_scenario(ROOT / "configs" / "azure_conv.toml", {**over, **overrides})
        t0 = time.process_time()
        df = compare(scn, CONTROLLERS, seed=0, load_scales=loads)
        dt = time.process_time() - t0
        for _, r in df.iterrows():
            extra = ""
            for key in ("speedup_resident", "preemptions", "requests_rejected"):
                if key in r:
                    extra += (
                        f" {key}={r[key]:.3g}" if isinstance(r[key], float) else f" {key}={r[key]}"
                    )
            print(
                f"{case} load={r['load_scale']:g} {r['controller']:10s} "
                f"ttft_p50={r['ttft_p50_s']:.3f} ttft_p99={r['ttft_p99_s']:.3f} "
                f"tpot_p50={r['tpot_p50_s']:.4f} tpot_p99={r['tpot_p99_s']:.4f} "
                f"speedup={r['speedup']:.3f}{extra} unfinished={r['requests_unfinished']}",
                flush=True,
            )
        print(f"# {case}: {dt:.1f} CPU-s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
