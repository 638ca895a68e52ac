"""``dspark`` entry point.

Each subcommand lives in its own module ``dspark/cmd_<name>.py`` exposing
``add_parser(subparsers)`` and ``run(args) -> int``; heavy libraries are imported inside
``run`` so that ``dspark --help`` stays fast. A :class:`control.DSparkError` (bad config, bad
file, impossible cluster) becomes one line on stderr and exit status 2, never a traceback; an
unknown name gets a "did you mean" when one is close. Output into a closed pipe (``| head``)
ends quietly. Help text shows docstrings without their reST markup.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from typing import Any, NoReturn

from control.errors import DSparkError

# subcommand -> module; one that cannot be imported is an error (never a silently missing command).
SUBCOMMANDS = {
    "simulate": "dspark.cmd_simulate",
    "capacity": "dspark.cmd_capacity",
    "tune": "dspark.cmd_tune",
    "real": "dspark.cmd_real",
    "validate": "dspark.cmd_validate",
    "report": "dspark.cmd_report",
    "demo": "dspark.cmd_demo",
    "replay": "dspark.cmd_replay",
    "export": "dspark.cmd_export",
    "calibrate": "dspark.cmd_calibrate",
}


def plain(text: str) -> str:
    """reST markup of a docstring as plain text: ``x`` -> x, :func:`f` -> f."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def did_you_mean(name: str, allowed: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed names, else ""."""
    close = difflib.get_close_matches(name, allowed, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


UNKNOWN = re.compile(r"unknown [\w .-]+? '([^']+)'; allowed: ([^;()]+)")


def suggest(message: str) -> str:
    """A one-line error about an unknown name ("unknown controller 'dsprak'; allowed: a, b")
    with the closest allowed name appended."""
    m = UNKNOWN.search(message)
    if not m or "did you mean" in message:
        return message
    allowed = [a.strip().strip("'\"`") for a in m.group(2).split(",")]
    return message.rstrip(".") + did_you_mean(m.group(1), allowed)


class Parser(argparse.ArgumentParser):
    """argparse with plain-text help and "did you mean" for a mistyped choice."""

    def format_help(self) -> str:
        return plain(super().format_help())

    def format_usage(self) -> str:
        return plain(super().format_usage())

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            allowed = [c.strip().strip("'") for c in m.group(2).split(",")]
            message += did_you_mean(m.group(1), allowed)
        super().error(message)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v("dspark-lab")
    except PackageNotFoundError:  # pragma: no cover  (run from a checkout without install)
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dspark", description="DSpark Lab: simulate, tune and validate speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"dspark {version()}")
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
            raise DSparkError(
                f"subcommand '{name}': module {mod_name} cannot be imported: {e}"
            ) from e
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
    print(f"dspark: error: {suggest(' '.join(str(e).split()))}", file=sys.stderr)
    return 2


def _closed_pipe() -> int:
    """stdout's reader went away (``dspark ... | head``): stop quietly, as a Unix tool does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
    except (OSError, ValueError):
        pass
    return 0


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
        rc = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except DSparkError as e:
        return _error(e)
    except KeyboardInterrupt:
        print("dspark: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
