"""Forward-pass latency: roofline model, interpolated measured table, or constants (for tests).

Every backend answers ``seconds(batch, new_tokens, context_sum)`` for one forward pass of
``batch`` sequences that together bring ``new_tokens`` new tokens over ``context_sum`` cached
tokens. The roofline model also gives the bytes each GPU reads (used for the bandwidth
utilisation metric whatever the backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from control.configio import param
from control.errors import DSparkError
from sim.hardware import Hardware
from sim.models import ModelDims
from sim.tables import read_table


@dataclass(frozen=True)
class LatencyConfig:
    # the analytic model needs no measurements.
    backend: str = param("roofline", choices=("roofline", "table", "constant"),
                         doc="latency backend")
    # None unless backend = 'table'; relative to the scenario file.
    table_path: str | None = param(None, doc="latency.csv written by `dspark real profile`")
    # the name `dspark real profile` gives the target.
    target_name: str = param("target", doc="model name of the target in the table")
    # the name `dspark real profile` gives the drafter.
    drafter_name: str = param("drafter", doc="model name of the drafter in the table")
    # ~one 70B TP8 decode step; only for backend = 'constant'.
    constant_target_s: float = param(0.01, lo=0.0, hi=100.0, doc="target forward, s (constant)")
    # c = 0.05 against the default target step.
    constant_drafter_s: float = param(5e-4, lo=0.0, hi=100.0, doc="drafter step, s (constant)")
    # prefill as one target forward by default.
    constant_prefill_s: float = param(0.01, lo=0.0, hi=100.0, doc="prefill pass, s (constant)")
    # 0: GPU serving stacks overlap their scheduling with the GPU; a measured engine sets it
    # (the `round-overhead` row of latency.csv from `dspark real profile`).
    round_overhead_s: float = param(0.0, lo=0.0, hi=10.0,
                                    doc="fixed engine time per round outside draft and verify, s")


class Roofline:
    """Per layer ``max(flops / (peak·eff), bytes / (bw·eff))`` on each of ``tp`` GPUs, plus two
    all-reduces per layer when ``tp > 1`` (latency + ring traffic over NVLink), plus the lm_head
    and a fixed launch overhead."""

    def __init__(self, model: ModelDims, hw: Hardware, tp: int) -> None:
        self.m, self.hw, self.tp = model, hw, tp
        b = model.dtype_bytes
        self.flops_s = hw.peak_flops[model.dtype] * hw.compute_efficiency
        self.bytes_s = hw.bandwidth_bytes_s * hw.bw_efficiency
        self.layer_w_bytes = model.layer_params * b / tp
        self.head_w_bytes = model.head_params * b / tp
        self.kv_layer_bytes = 2 * model.kv_heads * model.head_dim * b / tp  # per token per layer
        self.attn_flops = 4 * model.heads * model.head_dim / tp  # QK^T and AV per (new, ctx) pair
        self.layer_flops = 2 * model.layer_params / tp
        self.head_flops = 2 * model.head_params / tp
        self.msg_bytes = model.d_model * b * 2 * (tp - 1) / tp  # ring all-reduce, per token

    def bytes_per_gpu(self, batch: int, new_tokens: int, context_sum: float) -> float:
        m = self.m
        return m.layers * (self.layer_w_bytes + context_sum * self.kv_layer_bytes) + self.head_w_bytes

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        m, hw = self.m, self.hw
        per_seq_new = new_tokens / max(batch, 1)
        flops = self.layer_flops * new_tokens + self.attn_flops * context_sum * per_seq_new
        byts = self.layer_w_bytes + context_sum * self.kv_layer_bytes
        layer = max(flops / self.flops_s, byts / self.bytes_s)
        if self.tp > 1:
            layer += 2 * (hw.allreduce_latency_s + new_tokens * self.msg_bytes / hw.nvlink_bytes_s)
        head = max(self.head_flops * new_tokens / self.flops_s, self.head_w_bytes / self.bytes_s)
        return m.layers * layer + head + hw.launch_overhead_s

    def ridge_tokens(self) -> float:
        """New tokens at which a batch-1 forward turns compute-bound (weights only)."""
        return self.flops_s * self.m.dtype_bytes / (2 * self.bytes_s)


class Constant:
    def __init__(self, forward_s: float, prefill_s: float) -> None:
        self.forward_s, self.prefill_s = forward_s, prefill_s

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        return self.forward_s


TABLE_COLUMNS = ("model", "batch", "new_tokens", "context_tokens", "seconds")


class Table:
    """Multilinear interpolation of a measured grid ``(batch, new_tokens, context_tokens)``;
    queries outside the grid are clamped to its edge. Axes measured at a single value are
    constant in that direction."""

    def __init__(self, path: str | Path, model_name: str) -> None:
        import pandas as pd
        p = Path(path)
        if not p.is_file():
            raise DSparkError(f"{p}: latency table not found")
        df = read_table(p, "latency table", TABLE_COLUMNS)
        df = df[df["model"].astype(str) == model_name]
        if df.empty:
            raise DSparkError(f"{p}: latency table has no rows for model '{model_name}'")
        for c in TABLE_COLUMNS[1:]:
            v = pd.to_numeric(df[c], errors="coerce")
            if v.isna().any() or (v < 0).any():
                raise DSparkError(f"{p}: column '{c}' has a missing or garbled value for "
                                  f"model '{model_name}'")
            df[c] = v
        g = df.groupby(["batch", "new_tokens", "context_tokens"])["seconds"].median()
        self.axes = [np.array(sorted(set(g.index.get_level_values(i))), dtype=float)
                     for i in range(3)]
        grid = np.full([len(a) for a in self.axes], np.nan)
        for (b, n, c), s in g.items():
            grid[tuple(int(np.searchsorted(a, v)) for a, v in zip(self.axes, (b, n, c)))] = s
        if np.isnan(grid).any():
            raise DSparkError(f"{p}: latency table for model '{model_name}' is not a full grid "
                              f"over batch x new_tokens x context_tokens "
                              f"({int(np.isnan(grid).sum())} combinations missing)")
        self.grid = grid

    def _w(self, axis: np.ndarray, v: float) -> tuple[int, int, float]:
        if len(axis) == 1 or v <= axis[0]:
            return 0, 0, 0.0
        if v >= axis[-1]:
            return len(axis) - 1, len(axis) - 1, 0.0
        j = int(np.searchsorted(axis, v))
        return j - 1, j, (v - axis[j - 1]) / (axis[j] - axis[j - 1])

    def lookup(self, batch: float, new_per_seq: float, context: float) -> float:
        idx = [self._w(a, v) for a, v in zip(self.axes, (batch, new_per_seq, context))]
        out = 0.0
        for bi in (0, 1):
            for ni in (0, 1):
                for ci in (0, 1):
                    w = ((idx[0][2] if bi else 1 - idx[0][2]) * (idx[1][2] if ni else 1 - idx[1][2])
                         * (idx[2][2] if ci else 1 - idx[2][2]))
                    if w:
                        out += w * self.grid[idx[0][bi], idx[1][ni], idx[2][ci]]
        return out

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        b = max(batch, 1)
        return self.lookup(b, new_tokens / b, context_sum / b)
