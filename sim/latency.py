"""Forward-pass latency: roofline model, interpolated measured table, or constants (for tests).

Every backend answers ``seconds(batch, new_tokens, context_sum)`` for one forward pass of
``batch`` sequences that together bring ``new_tokens`` new tokens over ``context_sum`` cached
tokens, and ``pass_seconds`` for a pass that also carries prompt chunks (chunked prefill). The roofline model also gives the bytes each GPU reads (used for the bandwidth
utilisation metric whatever the backend).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from control.configio import param
from control.errors import DSparkError
from control.latency_rows import BLOCK_MARKER, DRAFT_PHASE, DRAFTER, TARGET
from sim.hardware import WEIGHT_READ_GROWTH_TOKENS, Hardware
from sim.models import ModelDims
from sim.tables import read_table


@dataclass(frozen=True)
class LatencyConfig:
    # the analytic model needs no measurements.
    backend: str = param(
        "roofline", choices=("roofline", "table", "constant"), doc="latency backend"
    )
    # None unless backend = 'table'; relative to the scenario file.
    table_path: str | None = param(None, doc="latency.csv written by `dspark real profile`")
    # the name `dspark real profile` gives the target.
    target_name: str = param(TARGET, doc="model name of the target in the table")
    # the name `dspark real profile` gives the drafter.
    drafter_name: str = param(DRAFTER, doc="model name of the drafter in the table")
    # the name `dspark real profile` gives its draft-phase rows; a table without them (an
    # older profile, a hand-made one) prices a phase as k drafter steps.
    draft_phase_name: str = param(
        DRAFT_PHASE,
        doc="model name of the table's draft-phase rows (a whole phase of k steps, its "
        "fixed cost included)",
    )
    # ~one 70B TP8 decode step; only for backend = 'constant'.
    constant_target_s: float = param(0.01, lo=0.0, hi=100.0, doc="target forward, s (constant)")
    # c = 0.05 against the default target step.
    constant_drafter_s: float = param(5e-4, lo=0.0, hi=100.0, doc="drafter step, s (constant)")
    # prefill as one target forward by default.
    constant_prefill_s: float = param(0.01, lo=0.0, hi=100.0, doc="prefill pass, s (constant)")
    # 0: GPU serving stacks overlap their scheduling with the GPU; a measured engine sets it
    # (the `round-overhead` row of latency.csv from `dspark real profile`).
    round_overhead_s: float = param(
        0.0, lo=0.0, hi=10.0, doc="fixed engine time per round outside draft and verify, s"
    )


class LatencyBackend(Protocol):
    """What the serving loop asks a latency backend (:class:`Roofline`, :class:`Table`,
    :class:`Constant`)."""

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float: ...

    def pass_seconds(
        self,
        batch: int,
        new_tokens: int,
        context_sum: float,
        chunks: int,
        chunk_tokens: int,
        chunk_pairs: float,
        chunk_prefix: float,
    ) -> float: ...


def causal_pairs(chunk: int, prefix: int) -> int:
    """Query-key pairs of a prompt chunk of ``chunk`` tokens after ``prefix`` cached ones under
    a causal mask: token j of the chunk attends to ``prefix + j + 1`` keys."""
    return chunk * prefix + chunk * (chunk + 1) // 2


class Roofline:
    """One forward on each of ``tp`` GPUs, per layer: the linear part
    ``max(flops / (peak·eff), weight bytes · growth / (bw·eff))`` (weight reads grow with the
    forward's tokens, ``weight_read_growth`` at 64 and more), attention
    ``max(QK/AV flops / (peak·eff), KV bytes read / (bw·eff), attention_floor_s)``, two
    all-reduces when ``tp > 1`` (latency + ring traffic over NVLink at ``nvlink_efficiency``)
    and ``layer_overhead_s``; plus the lm_head over the tokens that need logits and a fixed
    launch overhead.

    :meth:`seconds` prices a decode/verify pass (each sequence's new tokens attend to its
    context); :meth:`pass_seconds` a pass that also carries prompt chunks (each chunk attends
    causally to its prefix, whose KV it reads)."""

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
        self.growth = hw.weight_read_growth / (WEIGHT_READ_GROWTH_TOKENS - 1)
        self.attn_floor = hw.attention_floor_s
        # per layer: the fixed part (2 all-reduce latencies + overhead) and the per-token traffic
        self.layer_fixed = hw.layer_overhead_s + (2 * hw.allreduce_latency_s if tp > 1 else 0.0)
        self.comm_per_token = (
            2 * self.msg_bytes / (hw.nvlink_bytes_s * hw.nvlink_efficiency) if tp > 1 else 0.0
        )

    def weight_read_factor(self, tokens: float) -> float:
        """Weight-read time of a forward of ``tokens`` relative to one token."""
        return 1.0 + self.growth * min(max(tokens - 1.0, 0.0), WEIGHT_READ_GROWTH_TOKENS - 1.0)

    def layer_nonattention_seconds(self, tokens: float) -> float:
        """One layer without attention: linear part, all-reduces, overhead."""
        lin = max(
            self.layer_flops * tokens / self.flops_s,
            self.layer_w_bytes * self.weight_read_factor(tokens) / self.bytes_s,
        )
        return lin + self.layer_fixed + tokens * self.comm_per_token

    def nonattention_seconds(self, tokens: float) -> float:
        """Every layer of a forward of ``tokens`` without attention, lm_head and launch cost:
        what Vidur's profiled non-attention step times hold (``benchmarks/calibrate_vidur.py``)."""
        return self.m.layers * self.layer_nonattention_seconds(tokens)

    def layer_attention_seconds(self, pairs: float, kv_tokens: float) -> float:
        """One layer's attention over ``pairs`` query-key pairs reading ``kv_tokens`` cached
        tokens' K and V (0 when there is no attention at all)."""
        if pairs <= 0 and kv_tokens <= 0:
            return 0.0
        return max(
            self.attn_flops * pairs / self.flops_s,
            kv_tokens * self.kv_layer_bytes / self.bytes_s,
            self.attn_floor,
        )

    def head_seconds(self, logit_tokens: float) -> float:
        return max(self.head_flops * logit_tokens / self.flops_s, self.head_w_bytes / self.bytes_s)

    def forward_seconds(
        self, tokens: float, pairs: float, kv_tokens: float, logit_tokens: float
    ) -> float:
        """A forward of ``tokens`` new tokens with ``pairs`` attention pairs over ``kv_tokens``
        cached tokens, logits for ``logit_tokens`` of them."""
        return (
            self.m.layers
            * (
                self.layer_nonattention_seconds(tokens)
                + self.layer_attention_seconds(pairs, kv_tokens)
            )
            + self.head_seconds(logit_tokens)
            + self.hw.launch_overhead_s
        )

    def bytes_per_gpu(self, batch: int, new_tokens: int, context_sum: float) -> float:
        m = self.m
        return (
            m.layers * (self.layer_w_bytes + context_sum * self.kv_layer_bytes) + self.head_w_bytes
        )

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        """A decode/verify pass: ``batch`` sequences bring ``new_tokens`` (all get logits) over
        ``context_sum`` cached tokens; each new token attends to its sequence's context."""
        pairs = context_sum * new_tokens / max(batch, 1)
        return self.forward_seconds(new_tokens, pairs, context_sum, new_tokens)

    def pass_seconds(
        self,
        batch: int,
        new_tokens: int,
        context_sum: float,
        chunks: int,
        chunk_tokens: int,
        chunk_pairs: float,
        chunk_prefix: float,
    ) -> float:
        """A mixed pass: the decode/verify rows of :meth:`seconds` (``batch`` may be 0) and
        ``chunks`` prompt chunks of ``chunk_tokens`` in all, with ``chunk_pairs`` causal pairs
        (:func:`causal_pairs`) over ``chunk_prefix`` cached prefix tokens; one logit row per
        chunk."""
        pairs = context_sum * new_tokens / max(batch, 1) if batch else 0.0
        return self.forward_seconds(
            new_tokens + chunk_tokens,
            pairs + chunk_pairs,
            context_sum + chunk_prefix,
            new_tokens + chunks,
        )

    def ridge_tokens(self) -> float:
        """New tokens at which a batch-1 forward turns compute-bound (weights only, before the
        weight-read growth)."""
        return self.flops_s * self.m.dtype_bytes / (2 * self.bytes_s)


class Constant:
    """A decode/verify pass costs ``forward_s``, a pass that carries prompt chunks adds
    ``prefill_s`` (a pure prefill pass costs ``prefill_s``)."""

    def __init__(self, forward_s: float, prefill_s: float) -> None:
        self.forward_s, self.prefill_s = forward_s, prefill_s

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        return self.forward_s

    def pass_seconds(
        self,
        batch: int,
        new_tokens: int,
        context_sum: float,
        chunks: int,
        chunk_tokens: int,
        chunk_pairs: float,
        chunk_prefix: float,
    ) -> float:
        return (self.forward_s if batch else 0.0) + (self.prefill_s if chunks else 0.0)


TABLE_COLUMNS = ("model", "batch", "new_tokens", "context_tokens", "seconds")


def latency_table(path: str | Path):
    """A latency table's rows (checked by :func:`sim.tables.read_table`), read once per file
    version: a cluster reads its target, drafter, draft-phase and block rows from one file.
    Callers filter it into new frames and never write to it."""
    try:
        st = os.stat(path)
    except OSError:  # read_table names the file in its one-line error
        return read_table(path, "latency table", TABLE_COLUMNS)
    return _latency_table(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _latency_table(path: str, mtime_ns: int, size: int):
    return read_table(path, "latency table", TABLE_COLUMNS)


def table_models(path: str | Path) -> set[str]:
    """The model names a latency table holds rows for."""
    return set(latency_table(path)["model"].astype(str))


def table_block_size(path: str | Path) -> int:
    """The block size B of the block drafter whose profile a latency table is (its
    :data:`BLOCK_MARKER` row), 0 when it profiled an autoregressive drafter."""
    df = latency_table(path)
    rows = df[df["model"].astype(str) == BLOCK_MARKER]
    if not len(rows):
        return 0
    sizes = {int(v) for v in rows["new_tokens"]}
    if len(sizes) != 1 or min(sizes) < 1:
        raise DSparkError(
            f"{path}: latency table's '{BLOCK_MARKER}' rows name block sizes {sorted(sizes)}"
            f"; one block size >= 1 expected"
        )
    return sizes.pop()


def phase_seconds(
    phase: Table | None, drafter: LatencyBackend, drafting: int, steps: int, context_sum: float
) -> float:
    """A draft phase of ``steps`` drafter steps over ``drafting`` rows (no prompt chunk, no
    catch-up): a measured table's ``draft-phase`` rows (``phase``) where it has them, else
    ``steps`` drafter steps."""
    if phase is not None:
        return phase.seconds(drafting, drafting * steps, context_sum)
    return steps * drafter.seconds(drafting, drafting, context_sum)


class Table:
    """Multilinear interpolation of a measured grid ``(batch, new_tokens, context_tokens)``;
    queries outside the grid are clamped to its edge. Axes measured at a single value are
    constant in that direction."""

    def __init__(self, path: str | Path, model_name: str) -> None:
        import pandas as pd

        p = Path(path)
        if not p.is_file():
            raise DSparkError(f"{p}: latency table not found")
        df = latency_table(p)
        df = df[df["model"].astype(str) == model_name].copy()
        if df.empty:
            raise DSparkError(f"{p}: latency table has no rows for model '{model_name}'")
        for c in TABLE_COLUMNS[1:]:
            v = pd.to_numeric(df[c], errors="coerce")
            if v.isna().any() or (v < 0).any():
                raise DSparkError(
                    f"{p}: column '{c}' has a missing or garbled value for model '{model_name}'"
                )
            df[c] = v
        g = df.groupby(["batch", "new_tokens", "context_tokens"])["seconds"].median()
        self.axes = [
            np.array(sorted(set(g.index.get_level_values(i))), dtype=float) for i in range(3)
        ]
        grid = np.full([len(a) for a in self.axes], np.nan)
        for (b, n, c), s in g.items():
            grid[tuple(int(np.searchsorted(a, v)) for a, v in zip(self.axes, (b, n, c)))] = s
        if np.isnan(grid).any():
            raise DSparkError(
                f"{p}: latency table for model '{model_name}' is not a full grid "
                f"over batch x new_tokens x context_tokens "
                f"({int(np.isnan(grid).sum())} combinations missing)"
            )
        self.grid = grid

    def _w(self, axis: np.ndarray, v: float) -> tuple[int, int, float]:
        if len(axis) == 1 or v <= axis[0]:
            return 0, 0, 0.0
        if v >= axis[-1]:
            return len(axis) - 1, len(axis) - 1, 0.0
        j = int(np.searchsorted(axis, v))
        return j - 1, j, (v - axis[j - 1]) / (axis[j] - axis[j - 1])

    def lookup(self, batch: float, new_per_seq: float, context: float) -> float:
        (b0, b1, wb), (n0, n1, wn), (c0, c1, wc) = (
            self._w(a, v) for a, v in zip(self.axes, (batch, new_per_seq, context))
        )
        out = 0.0
        for bi, b in ((0, b0), (1, b1)):
            for ni, n in ((0, n0), (1, n1)):
                for ci, c in ((0, c0), (1, c1)):
                    w = (wb if bi else 1 - wb) * (wn if ni else 1 - wn) * (wc if ci else 1 - wc)
                    if w:
                        out += w * float(self.grid[b, n, c])
        return out

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        b = max(batch, 1)
        return self.lookup(b, new_tokens / b, context_sum / b)

    def pass_seconds(
        self,
        batch: int,
        new_tokens: int,
        context_sum: float,
        chunks: int,
        chunk_tokens: int,
        chunk_pairs: float,
        chunk_prefix: float,
    ) -> float:
        """The measured grid has no mixed passes: the decode rows' pass plus one prefill pass
        of the chunks (``chunks`` sequences of ``chunk_tokens`` over their mean prefix); an
        upper bound, the weights are read twice."""
        out = self.seconds(batch, new_tokens, context_sum) if batch else 0.0
        if chunks:
            out += self.seconds(chunks, chunk_tokens, chunk_prefix)
        return out
