"""A synthetic long-context conversation trace in the Azure CSV format (issue 13's case).

The issue ran a public long-context conversation trace (inputs averaging ~14k tokens, up to
121k, arriving in bursts) converted to ``TIMESTAMP,ContextTokens,GeneratedTokens``. That file is
not in this repository; this script writes a seeded stand-in with the same shape: lognormal
inputs (mean ~14k, clipped to 121k), lognormal outputs (mean ~340), gamma arrivals with CV 2.5
(bursts) at ``--rate`` requests/s. Deterministic for a given seed.

    .venv/bin/python benchmarks/long_context_trace.py --out runs/long_context.csv
    .venv/bin/dspark simulate configs/azure_conv.toml --set workload.trace_path=... \
        --controller fixed:k=0 --controller fixed:k=4 --loads 0.25,1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def make_trace(n: int = 400, rate_rps: float = 3.0, seed: int = 13) -> str:
    rng = np.random.default_rng(seed)
    cv = 2.5
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), n)
    t = np.cumsum(gaps) - gaps[0]
    sigma_in, mean_in = 1.0, 14_000.0
    prompt = rng.lognormal(np.log(mean_in) - sigma_in**2 / 2, sigma_in, n)
    prompt = np.clip(np.rint(prompt), 64, 121_000).astype(np.int64)
    sigma_out, mean_out = 0.8, 340.0
    out = rng.lognormal(np.log(mean_out) - sigma_out**2 / 2, sigma_out, n)
    out = np.clip(np.rint(out), 1, 4096).astype(np.int64)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    base = np.datetime64("2024-01-01T00:00:00.000000")
    for ti, p, o in zip(t, prompt, out):
        stamp = base + np.timedelta64(round(ti * 1e6), "us")
        lines.append(f"{str(stamp).replace('T', ' ')},{p},{o}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/long_context.csv")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rate", type=float, default=3.0, help="mean arrival rate, requests/s")
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args(argv)
    p = Path(args.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(make_trace(args.n, args.rate, args.seed))
    print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
