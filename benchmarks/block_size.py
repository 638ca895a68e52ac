"""The block-size trade-off of a block drafter: a bigger block B costs more per drafter forward
and accepts less per position; which B serves best at a light and a heavy load?

Scenario: ``configs/standard.toml`` (8 × TP8 Llama-3.1-70B on H100, the Azure conversation trace)
with its drafter replaced by a block drafter: ``[draft] kind = "block"``, ``draft.preset`` and
the drafter model preset of the same name, ``acceptance.model = "curve"`` (the preset's
confidence-head curve, sim/block.py; its last value repeats past the preset's own block):

- ``DSpark-block-7``: 0.80 at position 1 falling 0.03 a position (0.62 from position 7 on);
- ``DFlash-block-16``: 0.82 at position 1 falling 0.02 a position (0.52 at 16).

For every preset, every B in ``--blocks`` (default 4..16, set as ``draft.block_size``) and two
loads (``--light`` and ``--heavy`` load scales of the trace), the controller is fixed k = B (every
round verifies the whole block, so B alone moves), one seed (``--seed``). Per B it prints:

- ``draft_s_b1`` / ``draft_s_b32``: seconds of one drafter forward per round from the latency
  model (``Cluster.draft_phase_s``) at 1 and 32 drafting rows, 1024 context tokens a row;
- ``acc_len``: mean accepted length (tokens per round, the bonus token included);
- ``tput``: throughput, tokens/s; ``goodput``: tokens/s of requests meeting both SLOs;
  ``slo``: SLO attainment; ``tpot_ms``: mean TPOT (``sim.api.simulate`` summaries).

The best B per preset and load is the highest goodput; within 0.5 % of it, the lowest mean TPOT.

    nice -n 10 .venv/bin/python benchmarks/block_size.py [--requests 1000] [--seed 0]
        [--light 1.0] [--heavy 6.0] [--blocks 4,5,...,16]

Last line: ``block_size_best_light=… block_size_best_heavy=…`` (for each load, the best B of
each preset as ``DSpark-block-7:B/DFlash-block-16:B``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.api import simulate  # noqa: E402
from sim.block import BLOCK_PRESETS  # noqa: E402
from sim.cluster import Cluster  # noqa: E402
from sim.config import load_scenario  # noqa: E402

CONTEXT = 1024.0  # context tokens per drafting row at which the forward is priced
TIE = 0.005  # goodput within this fraction of the best counts as a tie (TPOT decides)


def scenario(preset: str, block: int, requests: int):
    return load_scenario(
        ROOT / "configs" / "standard.toml",
        {
            "draft.kind": "block",
            "draft.preset": preset,
            "drafter.preset": preset,
            "acceptance.model": "curve",
            "draft.block_size": block,
            "workload.num_requests": requests,
        },
    )


def row(preset: str, block: int, load: float, args: argparse.Namespace) -> dict:
    scn = scenario(preset, block, args.requests)
    cl = Cluster(scn)
    s = simulate(
        scn,
        "fixed",
        controller_config={"k": block},
        seed=args.seed,
        baseline=False,
        load_scale=load,
    ).summary
    return {
        "B": block,
        "draft_s_b1": cl.draft_phase_s(1, block, CONTEXT),
        "draft_s_b32": cl.draft_phase_s(32, block, 32 * CONTEXT),
        "acc_len": s["mean_accepted_length"],
        "tput": s["throughput_tokens_per_s"],
        "goodput": s["goodput_tokens_per_s"],
        "slo": s["slo_attainment"],
        "tpot_ms": 1e3 * s["mean_tpot_s"],
    }


def best(rows: list[dict]) -> int:
    top = max(r["goodput"] for r in rows)
    near = [r for r in rows if r["goodput"] >= (1 - TIE) * top]
    return int(min(near, key=lambda r: (r["tpot_ms"], r["B"]))["B"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--light", type=float, default=1.0, help="light load scale of the trace")
    ap.add_argument("--heavy", type=float, default=6.0, help="heavy load scale of the trace")
    ap.add_argument("--blocks", default=",".join(str(b) for b in range(4, 17)))
    args = ap.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    t0 = time.perf_counter()
    winners: dict[str, list[str]] = {"light": [], "heavy": []}
    for preset in BLOCK_PRESETS:
        for name, load in (("light", args.light), ("heavy", args.heavy)):
            rows = [row(preset, b, load, args) for b in blocks]
            print(f"\n{preset} (preset B = {BLOCK_PRESETS[preset][0]}), {name} load x{load:g}:")
            print(
                f"{'B':>3} {'draft_s_b1':>11} {'draft_s_b32':>11} {'acc_len':>8} "
                f"{'tput':>9} {'goodput':>9} {'slo':>6} {'tpot_ms':>8}"
            )
            for r in rows:
                print(
                    f"{r['B']:>3} {r['draft_s_b1']:>11.6f} {r['draft_s_b32']:>11.6f} "
                    f"{r['acc_len']:>8.3f} {r['tput']:>9.1f} {r['goodput']:>9.1f} "
                    f"{r['slo']:>6.3f} {r['tpot_ms']:>8.3f}"
                )
            b = best(rows)
            print(f"best B ({preset}, {name}): {b}")
            winners[name].append(f"{preset}:{b}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    print(
        f"block_size_best_light={'/'.join(winners['light'])} "
        f"block_size_best_heavy={'/'.join(winners['heavy'])}"
    )


if __name__ == "__main__":
    main()
