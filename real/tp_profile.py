"""``dspark real profile --tp N``: the collectives of the sharded target, timed alone.

Written to ``collectives.csv`` beside ``latency.csv`` (``sim.collectives`` reads it), one row per
(kind, tokens), every message the size the target's all-reduces carry (``tokens × d_model``
values of the target's dtype; ``tokens`` = batch × new tokens of the profiled grid):

- ``all_reduce``: ``torch.distributed.all_reduce`` of that tensor (the collective alone);
- ``sharded``: one decoder layer's four projections (q/k/v, out, gate/up, down) through the
  sharded modules (``parallelize_module``: DTensor dispatch and the layer's two all-reduces);
- ``local``: the same local shard matmuls as plain tensors (same shapes, no DTensor, no
  communication);
- ``layer``: ``sharded - local``, what tensor parallelism adds to one layer: the all-reduce "as
  seen by a layer", which the simulator's TP model charges per layer;
- ``broadcast``: a broadcast of three float64 values from rank 0 (``real.tp.agree``: the engine's
  agreed time readings, two or three per round), the same at every ``tokens``;
- ``replicated``: the four projections at full width as plain tensors, every rank at once (no
  communication): over :func:`time_projections` (one process alone) it is what running N ranks
  side by side costs the same compute (shared memory bandwidth and caches on one CPU; ~1 on
  GPUs with their own memory).

:func:`time_projections` times the four projections at full width on one process (TP = 1), the
part of a TP = 1 forward that sharding replaces by ``sharded``.

Every rank runs the same loop (collectives); repeats are interleaved over the sizes, the first
``warmup`` discarded; medians, means and p10/p90 are written (rank 0's clock). The mean is what a
run pays: gloo's all-reduce on a shared CPU has a heavy tail (p90 several times the median).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

COLUMNS = (
    "kind",
    "tp",
    "tokens",
    "elements",
    "bytes",
    "seconds",
    "seconds_mean",
    "seconds_p10",
    "seconds_p90",
)


def _layer_pair(layer, x: torch.Tensor, d_local: int) -> torch.Tensor:
    """A layer's four projections (attention's qkv -> out, MLP gate/up -> down), no attention,
    with the block's data dependencies: the MLP reads the residual stream after attention's
    output projection, the next layer reads this one's output. A sharded projection's
    all-reduce is asynchronous (DTensor waits where the result is first read); without these
    dependencies the first all-reduce of a layer ran under the MLP's matmuls and the last one
    under the next layer's, which the engine's forward never allows."""
    x = x + layer.o(layer.qkv(x)[:, :d_local])
    g, u = layer.gate_up(x).chunk(2, dim=-1)
    return x + layer.down(F.silu(g) * u)


def _local_pair(ws: list[torch.Tensor], x: torch.Tensor, d_local: int) -> torch.Tensor:
    """:func:`_layer_pair` on plain weight tensors (no DTensor, no communication)."""
    qkv, o, gate_up, down = ws
    x = x + F.linear(F.linear(x, qkv)[:, :d_local], o)
    g, u = F.linear(x, gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, down)


def _chain(pair, weights: list, x: torch.Tensor, d_local: int, n: int) -> torch.Tensor:
    """``n`` layer pairs back to back, each reading the last one's output, layer ``i mod L`` at
    step i: each layer's own weights in a forward's order (one layer's weights run ``n`` times
    would stay in the caches, which a forward streaming every layer's does not)."""
    for i in range(n):
        x = pair(weights[i % len(weights)], x, d_local)
    return x


def _timed(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def profile_collectives(engine, tokens: list[int], repeats: int = 20, warmup: int = 3):
    """Rows (``COLUMNS``) for the sharded ``engine`` (``real.tp.shard_engine`` done)."""
    return collective_rows(engine, tokens, time_collectives(engine, tokens, repeats, warmup))


def time_collectives(
    engine,
    tokens: list[int],
    repeats: int,
    warmup: int = 0,
    times: dict | None = None,
    chain: int = 1,
) -> dict:
    """Seconds of each (kind, tokens) over ``repeats`` passes after ``warmup`` untimed ones,
    appended to ``times`` (passes can run in chunks between other work). ``chain``: the
    projections kinds run that many layers back to back after one barrier (each layer's own
    weights in a forward's order, :func:`_chain`) and count their mean, as a forward's layers
    do (the ranks drift apart between all-reduces as they do there; one call after a barrier
    starts them together)."""
    import torch.distributed as dist

    from real.engine_types import sync
    from real.tp import current

    ctx = current()
    if ctx is None:
        raise RuntimeError("time_collectives needs an active tensor-parallel context")
    layers = list(engine.target.layers)
    d, dt, dev = engine.target.cfg.d_model, engine.dtype, engine.device
    d_local = layers[0].h * layers[0].hd
    names = ("qkv", "o", "gate_up", "down")
    ws = [[getattr(ly, n).weight.to_local().contiguous() for n in names] for ly in layers]
    full = [
        [w.repeat(*((ctx.size, 1) if i in (0, 2) else (1, ctx.size))) for i, w in enumerate(lw)]
        for lw in ws
    ]
    three = torch.zeros(3, dtype=torch.float64, device=dev)
    times = {} if times is None else times
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for t in tokens:
                x = torch.randn(t, d, dtype=dt, device=dev)
                msg = x.clone()
                ops = {
                    "all_reduce": (lambda m=msg: dist.all_reduce(m), 1),
                    "broadcast": (lambda: dist.broadcast(three, 0), 1),
                    "sharded": (lambda x=x: _chain(_layer_pair, layers, x, d_local, chain), chain),
                    "local": (lambda x=x: _chain(_local_pair, ws, x, d_local, chain), chain),
                    "replicated": (lambda x=x: _chain(_local_pair, full, x, d, chain), chain),
                }
                for kind, (fn, n) in ops.items():
                    dist.barrier()
                    s = _timed(fn, lambda: sync(dev))
                    if r >= warmup:
                        times.setdefault((kind, t), []).append(s / n)
    return times


def collective_rows(engine, tokens: list[int], times: dict):
    """The ``COLUMNS`` table of :func:`time_collectives`' ``times``."""
    import pandas as pd

    from real.tp import current

    ctx = current()
    if ctx is None:
        raise RuntimeError("collective_rows needs an active tensor-parallel context")
    d, dt = engine.target.cfg.d_model, engine.dtype
    rows = []
    size = torch.tensor([], dtype=dt).element_size()
    for t in tokens:
        sh, lo = np.array(times[("sharded", t)]), np.array(times[("local", t)])
        kinds = [(k, np.array(times[(k, t)])) for k in ("all_reduce", "broadcast", "replicated")]
        for kind, xs in kinds + [("sharded", sh), ("local", lo), ("layer", sh - lo)]:
            rows.append(
                {
                    "kind": kind,
                    "tp": ctx.size,
                    "tokens": t,
                    "elements": t * d,
                    "bytes": t * d * size,
                    "seconds": float(np.median(xs)),
                    "seconds_mean": float(np.mean(xs)),
                    "seconds_p10": float(np.percentile(xs, 10)),
                    "seconds_p90": float(np.percentile(xs, 90)),
                }
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def powers_to(n: int) -> list[int]:
    """1, 2, 4, .. below ``n``, and ``n`` itself."""
    return sorted({1, n} | {2**i for i in range(1, n.bit_length()) if 2**i < n})


def message_tokens(batches, k_max: int) -> list[int]:
    """Tokens per forward the target's all-reduces carry over a profile grid: batch × new
    tokens for new tokens 1, 2, 4, .. up to k_max + 1."""
    return sorted({b * n for b in batches for n in powers_to(k_max + 1)})


def time_projections(
    engine,
    tokens: list[int],
    repeats: int = 20,
    warmup: int = 3,
    times: dict | None = None,
    chain: int = 1,
) -> dict:
    """Mean seconds of one layer's four projections at full width (one process), by tokens;
    with ``times`` (tokens -> list), the samples are appended there and the means are over all
    of them (passes can run in chunks between other work). ``chain``: each sample is that many
    layers back to back (each layer's own weights, in a forward's order: :func:`_chain`), per
    layer, as :func:`time_collectives` times the sharded ones."""
    from real.engine_types import sync

    d, dt, dev = engine.target.cfg.d_model, engine.dtype, engine.device
    names = ("qkv", "o", "gate_up", "down")
    ws = [[getattr(ly, n).weight for n in names] for ly in engine.target.layers]
    times = {} if times is None else times
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for t in tokens:
                x = torch.randn(t, d, dtype=dt, device=dev)
                s = _timed(lambda x=x: _chain(_local_pair, ws, x, d, chain), lambda: sync(dev))
                if r >= warmup:
                    times.setdefault(t, []).append(s / chain)
    return {t: float(np.mean(times[t])) for t in tokens}


def drafter_draft_lengths(k_max: int) -> list[int]:
    """Draft lengths whose draft phase :func:`time_drafter` times: 1, 2, 4, .. and k_max."""
    return powers_to(k_max)


def time_drafter(
    engine,
    context: int,
    ks: list[int],
    repeats: int,
    warmup: int = 0,
    times: dict | None = None,
    barrier=None,
) -> dict:
    """Seconds of the drafter's draft phase (``propose`` of k tokens, batch 1, ``context``
    tokens cached) by k, appended to ``times`` (k -> list) after ``warmup`` untimed passes.
    On one process alone this is what the TP = 1 table holds; on every rank of a TP group at
    once (``barrier``: called before each timing so the ranks start together) it is what the
    replicated drafter costs when N ranks run it side by side (a shared CPU's memory bandwidth
    and caches; ~the same on GPUs with their own memory). Means by k are returned."""
    from real.profile import ProfileConfig, RegionTimer

    tm = RegionTimer(engine, ProfileConfig())  # fills the buffers with the same seeded tokens
    times = {} if times is None else times
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for k in ks:
                if barrier is not None:
                    barrier()
                s = tm.propose(1, k, context)
                if r >= warmup:
                    times.setdefault(k, []).append(s)
    return {k: float(np.mean(times[k])) for k in ks}


def side_by_side_factor(alone: dict, side: dict) -> float:
    """Σ_k mean side-by-side time / Σ_k mean time alone over the draft lengths both timed (1
    when none): the factor the replicated drafter's TP = 1 times take at TP = N."""
    ks = sorted(set(alone) & set(side))
    a = sum(float(np.mean(alone[k])) for k in ks)
    return sum(float(np.mean(side[k])) for k in ks) / a if a > 0 else 1.0
