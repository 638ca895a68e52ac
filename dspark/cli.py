"""``dspark`` entry point.

Each subcommand lives in its own module ``dspark/cmd_<name>.py`` exposing
``add_parser(subparsers)`` and ``run(args) -> int``; heavy libraries are imported inside
``run`` so that ``dspark --help`` stays fast. A :class:`control.DSparkError` (bad config, bad
file, impossible cluster) becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from control.errors import DSparkError

# subcommand -> module; one that cannot be imported is an error (never a silently missing command).
SUBCOMMANDS = {
    "simulate": "dspark.cmd_simulate",
    "tune": "dspark.cmd_tune",
    "real": "dspark.cmd_real",
    "validate": "dspark.cmd_validate",
    "report": "dspark.cmd_report",
    "demo": "dspark.cmd_demo",
    "replay": "dspark.cmd_replay",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark", description="DSpark Lab: simulate, tune and validate speculative decoding.")
    add_subcommands(parser.add_subparsers(dest="command", metavar="COMMAND"), SUBCOMMANDS, "_run")
    return parser


def add_subcommands(sub: Any, table: dict[str, str], run_attr: str) -> None:
    """Add each module's parser to ``sub``; its ``run`` is stored as ``args.<run_attr>``.
    A module that cannot be imported is a :class:`DSparkError` naming it (a broken or missing
    subcommand module is a bug to see, not a command to leave out)."""
    for name, mod_name in table.items():
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise DSparkError(f"subcommand '{name}': module {mod_name} cannot be imported: "
                              f"{e}") from e
        mod.add_parser(sub).set_defaults(**{run_attr: mod.run})


OUR_PACKAGES = ("control", "sim", "real", "tuning", "reports", "dspark")


def _one_line_warnings() -> Any:
    """Warnings raised by the lab's own packages (e.g. ``sim.api.SimWarning``) print as one line
    ``dspark: warning: <message>``; others keep Python's format."""
    import warnings
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.split(".", 1)[0] in OUR_PACKAGES:
            text = " ".join(str(message).split())
            print(f"dspark: warning: {text}", file=file or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    return previous


def _error(e: DSparkError) -> int:
    """One line on stderr, exit status 2."""
    print(f"dspark: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except DSparkError as e:
        return _error(e)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    import warnings
    previous = _one_line_warnings()
    try:
        return int(args._run(args) or 0)
    except DSparkError as e:
        return _error(e)
    except KeyboardInterrupt:
        print("dspark: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
