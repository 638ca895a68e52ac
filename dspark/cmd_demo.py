"""``dspark demo``: the embedded default main job (see :mod:`dspark.demo`).

Ends with the line ``report: <path to index.html>``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="run every part of the lab once on the embedded default, then report",
        description="Tune, simulate (every controller, the A100 claim, 8-1024 GPUs), run the "
        "real engine, validate the simulator against it, and write the report.",
    )
    p.add_argument("--out", default="runs/demo", help="folder of the run folders (runs/demo)")
    p.add_argument("--config", default=None, help="TOML with a [demo] table (optional)")
    return p


def run(args: argparse.Namespace) -> int:
    from control.configio import load
    from dspark.demo import DemoConfig, run_demo

    cfg = load(DemoConfig, args.config, section="demo") if args.config else DemoConfig()
    run_demo(args.out, cfg)
    return 0
