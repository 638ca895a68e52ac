"""The noise floor of saved batch-1 validation runs: what a simulator exact on every true value
would score on their real repeats (``validate.metrics.noise_floor``; new runs print it
and keep it in ``summary.json``; the batched part's comes with ``dspark validate --reanalyze``).

    .venv/bin/python benchmarks/noise_floor.py RUN_DIR [RUN_DIR ...] [--target 10] [--latency-target 5]

Reads each folder's ``requests.csv`` and ``rounds.csv`` (one row per request / round, with
controller, workload and repeat), recomputes every repeat's metrics with the validation's own
``metrics.compute`` and prints, per folder, the predictive headline's floor (throughput and
mean accepted length) and the latency-only one (throughput), then per workload the controller pairs
the repeats tell apart by throughput (``metrics.resolved_pairs``) and whether each variant's
prediction orders them so, and last the run's round offset (:func:`round_offset`): a bias that
more repeats of the same run do not average out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark.cmd_validate import noise_line, told_apart_text  # noqa: E402
from validate import metrics as M  # noqa: E402


def real_of(run: Path) -> dict:
    """``(controller, workload) -> [metrics of each repeat]`` from a run folder."""
    keys = ["controller", "workload", "repeat"]
    rounds = dict(iter(pd.read_csv(run / "rounds.csv").groupby(keys)))
    out: dict = {}
    for (c, w, r), q in pd.read_csv(run / "requests.csv").groupby(keys):
        g = rounds[c, w, r]
        m = M.compute(g.accepted, g.drafted, q.output_tokens, q.seconds, q.decode_s)
        out.setdefault((c, w), []).append(m)
    return out


def round_offset(check: dict) -> tuple[float, int]:
    """The held-out rounds' measured / tabled draft + verify time over all k with at least
    ``min_rounds`` rounds (``summary.json``'s ``latency_check_by_k``): the geometric mean of the
    per-k ratios, weighted by rounds; and how many k it pools."""
    rows = [v for v in check["by_k"].values() if v["rounds"] >= check["min_rounds"]]
    n = np.array([v["rounds"] for v in rows], float)
    r = np.array([v["round_ratio"] for v in rows], float)
    return float(np.exp((n * np.log(r)).sum() / n.sum())), len(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--target", type=float, default=10.0)
    ap.add_argument("--latency-target", type=float, default=5.0)
    a = ap.parse_args(argv)
    for run in map(Path, a.runs):
        real = real_of(run)
        rng = np.random.default_rng(0)  # as dspark validate's own figures
        pred = M.noise_floor_of(real, dict.fromkeys(M.HEADLINE, a.target), rng)
        lat = M.noise_floor_of(real, dict.fromkeys(M.LATENCY_ONLY, a.latency_target), rng)
        print(f"# {run}")
        for f, what in ((pred, "predicted"), (lat, "latency-only")):
            print(noise_line(f, what) if f else f"noise floor ({what}): fewer than 2 repeats")
        for name, what in (("errors.csv", "predicted"), ("errors_replay.csv", "latency-only")):
            err = pd.read_csv(run / name)
            for w in sorted(err.workload.unique()):
                tp = err[(err.workload == w) & (err.metric == M.RANK_METRIC_BATCH1)]
                t = M.told_apart(tp, M.repeats_of(real, tp.controller, w, M.RANK_METRIC_BATCH1))
                print(f"{what} {w}: {told_apart_text(t)}")
        summary = run / "summary.json"
        if summary.is_file() and "latency_check_by_k" in (s := json.loads(summary.read_text())):
            off, nk = round_offset(s["latency_check_by_k"])
            print(
                f"round offset: held-out rounds ran {off:.4f}x the corrected table (draft + "
                f"verify, geometric mean over {nk} k, weighted by rounds)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
