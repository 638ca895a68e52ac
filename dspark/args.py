"""Small argument helpers shared by several subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from control.configio import parse_sets
from control.errors import DSparkError

__all__ = ["add_out_args", "command_parser", "parse_sets", "run_folder"]


def command_parser(subparsers: Any, name: str, help: str, doc: str) -> argparse.ArgumentParser:
    """Subcommand ``name``'s parser: ``help`` in the command list, the first paragraph of its
    module docstring ``doc`` as the description."""
    return subparsers.add_parser(name, help=help, description=doc.split("\n\n")[0])


def run_folder(out: str | None, overwrite: bool, stem: str) -> str:
    """The run folder to write: ``out`` (refused when it already holds a run, unless
    ``overwrite``), else a new ``runs/<stem>-<date>-<time>`` that does not exist yet."""
    import time
    from pathlib import Path

    if out is not None:
        if (Path(out) / "summary.json").exists() and not overwrite:
            raise DSparkError(
                f"--out {out}: already holds a run (summary.json); pass "
                "--overwrite to replace it, or name another folder"
            )
        return out
    base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    p, i = base, 2
    while p.exists():
        p, i = base.with_name(f"{base.name}-{i}"), i + 1
    return str(p)


def add_out_args(p, stem: str) -> None:
    """``--out`` (default: a new ``runs/<stem>-<date>-<time>``) and ``--overwrite``."""
    p.add_argument(
        "--out",
        default=None,
        help=f"run folder (default: a new runs/{stem}-<date>-<time>); an existing run folder "
        "is refused unless --overwrite",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run folder --out names if it holds a run",
    )
