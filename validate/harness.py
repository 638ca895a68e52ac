"""What every validation part shares to run: the engine of a config, the progress log, and the
round and position traces written as CSV."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from control.types import PositionRecord, records_to_columns
from validate.config import ValidateConfig


def build_engine(cfg: ValidateConfig, engine_cfg=None):
    """The engine of ``cfg.models`` with ``engine_cfg`` (default ``cfg.engine``)."""
    ecfg = cfg.engine if engine_cfg is None else engine_cfg
    if cfg.models.source == "tiny":
        from real.tiny import tiny_engine

        return tiny_engine(cfg.models.tiny, ecfg)
    from real.runtime import build_engine as build

    return build(ecfg, cfg.models.checkpoints or None)


def log_fn(quiet: bool) -> Callable[[str], None]:
    """A progress log on stderr, each line stamped with the seconds since this call (silent
    when ``quiet``)."""
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if not quiet:
            print(f"[validate {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def write_rounds(path: Path, records) -> None:
    """``RoundRecord``s as a CSV of ``RECORD_COLUMNS``."""
    import pandas as pd

    pd.DataFrame(records_to_columns(records)).to_csv(path, index=False)


def write_positions(path: Path, positions: list[list[PositionRecord]]) -> None:
    """Per-prompt lists of ``PositionRecord``s as one CSV of ``POSITION_COLUMNS``."""
    import pandas as pd

    flat = [r for recs in positions for r in recs]
    pd.DataFrame(records_to_columns(flat, PositionRecord)).to_csv(path, index=False)
