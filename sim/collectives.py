"""Measured collectives (``collectives.csv`` from ``dspark real profile --tp N``) for the TP model.

Rows ``kind,tp,tokens,elements,bytes,seconds,...`` (``real.tp_profile``): ``all_reduce`` is the
collective alone at a message of ``bytes``; ``layer`` is what tensor parallelism adds to one
decoder layer (two all-reduces plus the sharded modules' dispatch), per forward of ``tokens``.

:func:`fit_allreduce` turns the ``all_reduce`` rows into the two numbers the roofline's TP model
takes (``HardwareConfig.collectives_path``): a latency per all-reduce and the bandwidth at which
ring all-reduce traffic (``2 (tp - 1) / tp × bytes``, what ``sim.latency.Roofline`` charges)
moves, least squares of seconds on that traffic. :class:`LayerCost` interpolates the ``layer``
rows over tokens (clamped at the ends) for a model that prices TP per layer as measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from control.errors import DSparkError
from sim.tables import read_table

COLUMNS = ("kind", "tp", "tokens", "bytes", "seconds")


def read_collectives(path: str | Path, kind: str):
    """The ``kind`` rows of a collectives CSV (one-line errors for a bad file)."""
    p = Path(path)
    if not p.is_file():
        raise DSparkError(f"{p}: collectives table not found")
    df = read_table(p, "collectives table", COLUMNS, numeric=COLUMNS[1:])
    df = df[df["kind"].astype(str) == kind]
    if df.empty:
        raise DSparkError(f"{p}: collectives table has no '{kind}' rows")
    if df["tp"].nunique() != 1 or int(df["tp"].iloc[0]) < 2:
        raise DSparkError(f"{p}: collectives table needs one tp >= 2, got {sorted(set(df['tp']))}")
    return df.sort_values("tokens")


def fit_allreduce(path: str | Path) -> tuple[float, float]:
    """(latency per all-reduce in s, ring-traffic bandwidth in bytes/s) of the ``all_reduce``
    rows; one message size only: the latency is its time and the bandwidth infinite."""
    df = read_collectives(path, "all_reduce")
    tp = int(df["tp"].iloc[0])
    traffic = df["bytes"].to_numpy(float) * 2 * (tp - 1) / tp
    s = df["seconds"].to_numpy(float)
    if len(set(traffic)) < 2:
        return float(s.mean()), float("inf")
    slope, lat = np.polyfit(traffic, s, 1)
    lat = max(float(lat), 0.0)
    return lat, (1.0 / float(slope) if slope > 0 else float("inf"))


class LayerCost:
    """Seconds tensor parallelism adds to one layer for a forward of ``tokens`` tokens."""

    def __init__(self, path: str | Path) -> None:
        df = read_collectives(path, "layer")
        self.tp = int(df["tp"].iloc[0])
        self.tokens = df["tokens"].to_numpy(float)
        self.seconds = np.maximum(df["seconds"].to_numpy(float), 0.0)

    def __call__(self, tokens: float) -> float:
        return float(np.interp(tokens, self.tokens, self.seconds))
