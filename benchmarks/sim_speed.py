"""Simulator speed: the standard scenario at 0.1 M, 1 M and 10 M output tokens.

Prints tokens per CPU-second (``time.process_time``, one core) for each size and, as the last
line, ``sim_tokens_per_cpu_s=<number>`` for the 1 M run. The request count is scaled to reach
the token target (the Azure conversation trace is cycled with its arrival pattern repeated when
more requests are needed than it holds). ``--controller`` picks the controller (default dspark; ``NAME:key=value,...`` as ``dspark simulate``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sized(scn, size: float):
    """``scn`` with enough requests for ``size`` million output tokens, and their count (the
    trace cycled with its arrival pattern repeated when it holds too few)."""
    import numpy as np

    from sim.workload import read_trace

    t, _, gen = read_trace(scn.workload.trace_path)
    mean_out = float(gen.mean())
    target = size * 1e6
    cum = np.cumsum(gen)
    n = (
        int(np.searchsorted(cum, target)) + 1
        if target <= cum[-1]
        else max(1, round(target / mean_out))
    )
    over = {"workload.num_requests": n}
    if n > len(t):  # more requests than the trace: replicate it end to end
        over["workload.arrival"] = "gamma"  # keeps the trace's burstiness and rate
        over["workload.rate_rps"] = (len(t) - 1) / (t[-1] * scn.workload.time_scale)
        gaps = np.diff(t)
        over["workload.gamma_cv"] = float(gaps.std() / gaps.mean())
        over["workload.prompt"] = {
            "dist": "empirical",
            "path": scn.workload.trace_path,
            "column": "ContextTokens",
        }
        over["workload.output"] = {
            "dist": "empirical",
            "path": scn.workload.trace_path,
            "column": "GeneratedTokens",
        }
    return scn.with_overrides(over), n


def warm(scn, name: str, cfg) -> None:
    """A 50-request run first: imports and caches are not what is measured."""
    from sim import simulate

    simulate(scn.with_overrides({"workload.num_requests": 50}), name, cfg, baseline=False)


def measure(scn, name: str, cfg, size: float) -> dict:
    """One run of ``size`` million output tokens: tokens per CPU-second (``time.process_time``)
    and what it ran."""
    from sim import simulate

    s, n = sized(scn, size)
    t0 = time.process_time()
    res = simulate(s, name, cfg, baseline=False)
    dt = time.process_time() - t0
    tok = res.summary["output_tokens"]
    return {
        "rate": tok / dt,
        "tokens": tok,
        "requests": n,
        "cpu_s": dt,
        "mean_accepted_length": res.summary["mean_accepted_length"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--controller", default="dspark")
    ap.add_argument("--sizes", default="0.1,1,10", help="million output tokens per run")
    ap.add_argument("--scenario", default=str(ROOT / "configs" / "standard.toml"))
    args = ap.parse_args(argv)
    from control.errors import DSparkError
    from dspark.cmd_simulate import parse_controller_spec
    from sim import load_scenario

    try:  # NAME or NAME:key=value,... as `dspark simulate --controller` takes it
        spec = parse_controller_spec(args.controller)
        name, cfg = (spec, None) if isinstance(spec, str) else spec[:2]
        load_scenario(args.scenario)
        from control.registry import make_config

        make_config(name, cfg, source="--controller")
    except DSparkError as e:
        print(f"sim_speed: {e}", file=sys.stderr)
        return 2

    scn = load_scenario(args.scenario)
    result_1m = None
    warm(scn, name, cfg)
    for size in (float(x) for x in args.sizes.split(",")):
        m = measure(scn, name, cfg, size)
        print(
            f"{size:g}M: {m['tokens']} output tokens, {m['requests']} requests, "
            f"{m['cpu_s']:.2f} CPU-s, {m['rate']:,.0f} tokens/CPU-s ({args.controller}, mean "
            f"accepted length {m['mean_accepted_length']:.2f})",
            flush=True,
        )
        if size == 1:
            result_1m = m["rate"]
    if result_1m is not None:
        print(f"sim_tokens_per_cpu_s={result_1m:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
