"""The learned prompt-token value (``dspark``'s default) against the fixed one, side by side.

A displaced prompt token is worth ``prompt_token_value`` output tokens under
``prompt_value_source = "fixed"``, or the workload's own output per prompt token under
``"observed"`` (the default; ``control/dspark_planner.py``). Runs ``dspark`` both ways, with
defaults otherwise, on the capacity cells of ``benchmarks/controller_value.py`` where the value
acts (batch 128 and 256: the prompt backlog while a big batch fills; ``--batches``), every
acceptance regime, the same seeds and request counts as that matrix. Prints each cell's
observed / fixed throughput ratio; last line
``prompt_value_observed_vs_fixed_geo=<x> prompt_value_observed_vs_fixed_min=<y>``.

    .venv/bin/python benchmarks/prompt_value.py [--batches 128,256] [--seeds 0,1] [--workers 2]
        [--prior-tokens 1024]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import controller_value as cv  # noqa: E402

from control.registry import make_config  # noqa: E402

#: the two ways, with defaults otherwise
ENTRIES = {
    "fixed": ("dspark", make_config("dspark", {"prompt_value_source": "fixed"})),
    "observed": ("dspark", make_config("dspark")),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--workers", type=int, default=1, help="processes for the cells' runs")
    ap.add_argument(
        "--prior-tokens",
        type=float,
        default=None,
        help="also run the observed value with this prompt_value_prior_tokens (a third column, "
        "its ratio to the default observed one)",
    )
    a = ap.parse_args(argv)
    batches = {f"B={b}" for b in a.batches.split(",")}
    seeds = [int(x) for x in a.seeds.split(",")]
    base = cv.load_scenario(ROOT / "configs" / "tiny.toml")
    entries = dict(ENTRIES)
    if a.prior_tokens is not None:
        entries["prior"] = (
            "dspark",
            make_config("dspark", {"prompt_value_prior_tokens": a.prior_tokens}),
        )
    cells = [c for c in cv.conditions(cv.k0_capacity_rps(base)) if c[1] in batches]
    cells = [(reg, load, ov, "throughput") for reg, load, ov, _ in cells]
    rows = cv.run_cells(base, cells, entries, seeds, 768, a.workers, time.perf_counter())
    value = {(r["regime"], r["load"], r["controller"]): r["value"] for r in rows}
    ratios, prior = [], []
    for reg, load, _, _ in cells:
        fixed, observed = value[(reg, load, "fixed")], value[(reg, load, "observed")]
        ratios.append(observed / fixed)
        line = (
            f"{reg:14s} {load:6s} fixed {fixed:9.1f} observed {observed:9.1f} tok/s  "
            f"ratio {ratios[-1]:.3f}"
        )
        if a.prior_tokens is not None:
            prior.append(value[(reg, load, "prior")] / observed)
            line += (
                f"  prior {a.prior_tokens:g}: {value[(reg, load, 'prior')]:9.1f} ({prior[-1]:.3f})"
            )
        print(line, flush=True)
    if prior:
        print(
            f"prior {a.prior_tokens:g} / default observed: geo {cv.geo(prior):.4f} min {min(prior):.4f}"
        )
    print(
        f"prompt_value_observed_vs_fixed_geo={cv.geo(ratios):.4f} "
        f"prompt_value_observed_vs_fixed_min={min(ratios):.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
