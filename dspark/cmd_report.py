"""``dspark report RUN_DIR [RUN_DIR ...] --out DIR``: a comparison report from saved runs."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="build a Markdown + HTML report from saved run folders",
        description="Read run folders (simulate, capacity, tune, real, validate; each holds "
        "summary.json) "
        "or parents of run folders, and write report.md, a self-contained index.html, "
        "tables/*.csv and figures/*.png. Prints 'report: <index.html>' last.",
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="a run folder, or a folder holding several"
    )
    p.add_argument(
        "--out", default="report", metavar="DIR", help="output folder (default: ./report)"
    )
    p.add_argument("--title", default="DSpark Lab report", help="report title")
    return p


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    from reports.build import build
    from reports.loader import load_runs
    from reports.render import write_report

    runs = load_runs(args.runs)
    print(
        f"reading {len(runs)} run folder(s): " + ", ".join(f"{r.name} ({r.kind})" for r in runs),
        flush=True,
    )
    report = build(runs, args.title)
    skipped = next((s for s in report.sections if s.id == "skipped"), None)
    n_skipped = sum(len(b.shown) for b in skipped.blocks if hasattr(b, "shown")) if skipped else 0
    index = write_report(report, Path(args.out))
    print(
        f"wrote {len(report.sections) - 1} section(s), skipped {n_skipped}; "
        f"markdown: {index.parent / 'report.md'}",
        flush=True,
    )
    print(f"report: {index.resolve()}")
    return 0
