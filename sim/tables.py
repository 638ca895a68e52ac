"""Reading the simulator's input tables (CSV) with one-line errors naming file and column."""

from __future__ import annotations

from pathlib import Path

from control.errors import DSparkError


def read_table(
    path: str | Path,
    what: str,
    columns: tuple[str, ...] = (),
    numeric: tuple[str, ...] = (),
    minimum: float = 0,
):
    """``pd.read_csv(path)`` checked: every name in ``columns`` present, every name in
    ``numeric`` parsed as numbers ``>= minimum`` (converted in place). Any problem is a
    :class:`DSparkError` of one line: ``<path>: <what> lacks column 'x'`` and the like."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except Exception as e:  # any parse failure is a bad file
        raise DSparkError(f"{path}: cannot read {what}: {str(e).splitlines()[0]}") from None
    for c in columns:
        if c not in df.columns:
            raise DSparkError(f"{path}: {what} lacks column '{c}' (need {', '.join(columns)})")
    for c in numeric:
        v = pd.to_numeric(df[c], errors="coerce")
        if v.isna().any() or (v < minimum).any():
            raise DSparkError(f"{path}: column '{c}' has a missing or garbled value")
        df[c] = v
    return df
