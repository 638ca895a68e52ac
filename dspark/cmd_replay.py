"""``dspark replay TRACE.csv``: feed a recorded round trace through a controller.

Each row's observation is replayed in order (``decide(row.now_s)`` then ``observe``), one
controller per request (reset between requests), and a compact table shows what the
controller would have decided. Replays are deterministic: the same trace and config give the
same table anywhere.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from control.errors import DSparkError
from dspark.args import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(subparsers, "replay", "replay a round trace through a controller", __doc__)
    p.add_argument("trace", help="round trace CSV (RoundRecord columns)")
    p.add_argument("--controller", default="dspark", help="controller name (default: dspark)")
    p.add_argument("--config", default=None, help="TOML file with a [controller.<name>] table")
    p.add_argument(
        "--every",
        type=int,
        default=1,
        help="print every N-th round (block ends are always printed)",
    )
    return p


def load_trace(path: str) -> list:
    """RoundRecords of a CSV trace; a missing file or column is a one-line DSparkError."""
    import pandas as pd

    from control.types import records_from_rows

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise DSparkError(f"{path}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise DSparkError(f"{path}: cannot read trace: {str(e).splitlines()[0]}") from None
    import dataclasses

    from control.types import RoundRecord

    for f in dataclasses.fields(RoundRecord):
        if f.default is dataclasses.MISSING and f.name not in df.columns:
            raise DSparkError(f"{path}: missing column {f.name!r}")
    if df.empty:
        raise DSparkError(f"{path}: trace has no rounds")
    check_columns(df, path)
    try:
        return records_from_rows(df.to_dict("records"))
    except (TypeError, ValueError) as e:
        raise DSparkError(f"{path}: bad value: {str(e).splitlines()[0]}") from None


_TRUE, _FALSE = ("true", "1", "1.0", "yes"), ("false", "0", "0.0", "no")


def check_columns(df, path: str) -> None:
    """Every cell of a RoundRecord column has its field's type: integer columns hold whole
    numbers (counts >= 0), float columns finite numbers, ``block_end`` true or false. The first
    bad cell is a one-line DSparkError naming the row (file line) and column."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from control.types import RoundRecord

    def bad(mask, col: str, allowed: str) -> None:
        rows = np.flatnonzero(np.asarray(mask))
        if len(rows):
            i = int(rows[0])
            cell = df[col].iloc[i]
            cell = cell.item() if hasattr(cell, "item") else cell
            raise DSparkError(f"{path}: row {i + 2}: bad value {col} = {cell!r}; allowed {allowed}")

    for f in dataclasses.fields(RoundRecord):
        if f.name not in df.columns:
            continue
        col, kind = df[f.name], str(f.type)
        if kind in ("int", "float"):
            v = pd.to_numeric(col, errors="coerce").astype(float)
            finite = np.isfinite(v.to_numpy())
            if kind == "float":
                bad(~finite, f.name, "a finite number")
                if f.name == "now_s":
                    bad(v < 0, f.name, "a time >= 0 s")
            else:
                whole = finite & (v.to_numpy() == np.round(v.to_numpy()))
                lo = -1 if f.name == "emitted" else 0
                bad(
                    ~whole | (v.to_numpy() < lo) | (np.abs(v.to_numpy()) >= 2**62),
                    f.name,
                    f"a whole number >= {lo}",
                )
        elif kind == "bool":
            text = col.map(lambda x: str(x).strip().lower())
            bad(~text.isin(_TRUE + _FALSE), f.name, "true or false")


def controller_config(name: str, path: str | None) -> Any:
    """The config of ``name`` from the ``[controller.<name>]`` table of ``path`` (defaults if
    no file)."""
    from control.configio import read_toml
    from control.registry import make_config

    if path is None:
        return make_config(name)
    data = read_toml(path)
    table = data.get("controller", {})
    if not isinstance(table, dict) or not isinstance(table.get(name, {}), dict):
        raise DSparkError(f"{path}: [controller.{name}] must be a table")
    return make_config(name, table.get(name, {}), source=path)


def replay(records: list, name: str, config: Any) -> list[dict]:
    """One row per round: the recorded round and the controller's decision and state."""
    from control.registry import make_controller

    ctrl = make_controller(name, config)
    rows = []
    current = None
    for i, rec in enumerate(records):
        if rec.request_id != current:
            ctrl.reset()
            current = rec.request_id
        try:
            obs = rec.observation()
        except ValueError as e:
            raise DSparkError(f"trace row {i + 1}: {e}") from None
        if ctrl.needs_future:
            ctrl.set_future(rec.accepted)
        d = ctrl.decide(rec.now_s)
        st = ctrl.state()
        rows.append(
            {
                "request": rec.request_id,
                "round": rec.round,
                "k_obs": rec.k,
                "n_obs": rec.accepted,
                "k": d.k,
                "mode": d.mode,
                "beta": d.beta,
                "tau": d.tau,
                "alpha": st.get("alpha"),
                "a_hat": st.get("a_hat"),
                "block_end": d.block_end,
            }
        )
        ctrl.observe(obs)
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


#: the replay table's columns: what was observed (k drafted, n accepted), then what dspark decided
TABLE_COLUMNS = (
    "request",
    "round",
    "k_obs",
    "n_obs",
    "k",
    "mode",
    "beta",
    "alpha",
    "a_hat",
    "block_end",
)


def format_table(rows: list[dict], every: int = 1) -> str:
    cols = TABLE_COLUMNS
    shown = [r for i, r in enumerate(rows) if i % every == 0 or r["block_end"]]
    cells = [[_fmt(r[c]) for c in cols] for r in shown]
    widths = [
        max(len(c), *(len(x[j]) for x in cells)) if cells else len(c) for j, c in enumerate(cols)
    ]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.every < 1:
        raise DSparkError(f"--every must be >= 1, got {args.every}")
    from control.registry import controller_names

    if args.controller not in controller_names():
        raise DSparkError(
            f"unknown controller '{args.controller}'; allowed: {', '.join(controller_names())}"
        )
    config = controller_config(args.controller, args.config)
    records = load_trace(args.trace)
    rows = replay(records, args.controller, config)
    print(format_table(rows, args.every))
    blocks = sum(1 for r in rows if r["block_end"])
    print(
        f"{len(rows)} rounds replayed through {args.controller}; {blocks} block ends",
        file=sys.stdout,
    )
    return 0
