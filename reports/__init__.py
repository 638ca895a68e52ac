"""Comparison reports from saved run folders (reads files only; see docs/results-format.md).

``make_report([run_dir, ...], out_dir)`` writes report.md, index.html (self-contained),
tables/*.csv and figures/*.png, and returns the path of index.html.
"""

from reports.build import build, make_report
from reports.claims import audit
from reports.loader import Run, load_runs

__all__ = ["Run", "audit", "build", "load_runs", "make_report"]
