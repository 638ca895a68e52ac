"""The learned prompt-token value (``dspark``'s default) against the fixed one, side by side.

A displaced prompt token is worth ``prompt_token_value`` output tokens under
``prompt_value_source = "fixed"``, or the workload's own output per prompt token under
``"observed"`` (the default; ``control/dspark_planner.py``). Runs ``dspark`` both ways, with
defaults otherwise, on the capacity cells of ``benchmarks/controller_value.py`` where the value
acts (batch 128 and 256: the prompt backlog while a big batch fills; ``--batches``), every
acceptance regime, the same seeds and request counts as that matrix. Prints each cell's
observed / fixed throughput ratio; last line
``prompt_value_observed_vs_fixed_geo=<x> prompt_value_observed_vs_fixed_min=<y>``.

    .venv/bin/python benchmarks/prompt_value.py [--batches 128,256] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import sys
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
    a = ap.parse_args(argv)
    cells = {f"B={b}" for b in a.batches.split(",")}
    seeds = [int(x) for x in a.seeds.split(",")]
    base = cv.load_scenario(ROOT / "configs" / "tiny.toml")
    ratios = []
    for reg, load, ov, _ in cv.conditions(cv.k0_capacity_rps(base)):
        if load not in cells:
            continue
        res = cv.run_cell(base, ov, "throughput", ENTRIES, cv.cell_seeds(seeds, ov, 768))
        fixed, observed = res["fixed"]["value"], res["observed"]["value"]
        ratios.append(observed / fixed)
        print(
            f"{reg:14s} {load:6s} fixed {fixed:9.1f} observed {observed:9.1f} tok/s  "
            f"ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(
        f"prompt_value_observed_vs_fixed_geo={cv.geo(ratios):.4f} "
        f"prompt_value_observed_vs_fixed_min={min(ratios):.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
