"""``dspark real profile``: what the engine spends per verify pass, per draft step and per round.

The simulator's table backend (``sim.latency.Table``) reads ``latency.csv``
(``model,batch,new_tokens,context_tokens,seconds`` + ``seconds_p10,seconds_p90,repeats``).
To keep the simulator from being systematically fast, every row times the engine's own code
path, not a bare forward.

Batch: every cell is timed at each batch size of ``batches`` (default 1): ``batch`` rows of the
batched engine, each bringing ``new_tokens`` new tokens over ``context_tokens`` cached ones
(per-sequence values: the table backend looks up ``(B, Σ new / B, Σ context / B)``), so the
grid is full over batch × new_tokens × context for every model. ``draft_lengths`` picks the
verify sizes (default every k = 0..k_max; a sparse set keeps a batched grid affordable).

Rows for k = 0..k_max come from engine-like rounds at context ``L``: the draft region, then the
verify region, twice, the second timed (the engine alternates the two, so each runs with the
caches the other leaves behind; timing either in isolation was measured to be off by up to 1 ms).

- ``target`` (new_tokens ``T`` = k + 1 <= k_max + 1, context ``L``): exactly the verify phase
  of :meth:`real.engine.Engine.round` (:meth:`~real.engine.Engine.verify`) — one packed target
  forward over every row's ``[last + k drafted]`` at position ``L - 1``, the greedy
  verification rule (argmax, prefix match, one host transfer), writing the next tokens, device
  sync. Rows with ``T > k_max + 1`` time the engine's packed prefill
  (:meth:`~real.engine.Engine.prefill_rows`: ``T`` tokens per row, no logits), which the
  simulator charges at context 0.
- ``draft-phase`` (new_tokens = k, the draft steps; batch = the drafting rows): the whole
  draft phase of an engine round, :meth:`ModelDrafter.propose_batch` of k steps — its fixed
  cost and a first step unlike the later ones included — per draft length (isotonic in k).
  The simulator prices a draft phase from these rows.
- ``drafter`` (new_tokens 1): one batched step — forward, softmax, max, host transfer of the
  confidences — from the slope of propose time over the draft lengths k >= 1 (least squares on
  the per-k medians); a table without ``draft-phase`` rows prices a phase as k of them. Rows
  with new_tokens ``N > 1`` time ``propose(k=1)`` that first catches the drafter's cache up by
  ``N`` tokens per row (its prefill in the engine's first drafting round), minus the measured
  ``propose(k=1)`` of one token, plus one step: a pass of N tokens, and ``row(N + 1) -
  row(1)`` what feeding N more tokens adds to a phase's first step.
- ``round-overhead`` (one row per batch size, new_tokens 0, context 0): per-round engine time
  outside the draft and verify regions (controller decide/observe, bookkeeping, records),
  measured as the median of ``(gap between consecutive round ends) - draft_s - verify_s`` over
  real engine rounds of fixed-k generations (``batch`` sequences at once, rounds of a full
  batch only). The batch-1 row comes first (``round_overhead_s``).

Repeats are interleaved over the grid (every cell once per pass) so that a change of background
load hits all cells alike; the first ``warmup`` passes are discarded. Medians and p10/p90 are
written, and a trimmed mean (``seconds_mean``, 20% cut at each end): a run's total time is a sum
of forwards, so its expectation is the sum of MEAN forward times; on a quiet machine the two
agree, under a changing background load (a shared CPU) the median sits in one load state, while
a plain mean of a few repeats follows single preemption spikes of several milliseconds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from control.configio import param
from control.costmodel import verify_seed_row
from control.errors import DSparkError
from control.latency_rows import BLOCK_MARKER, DRAFT_PHASE, DRAFTER, OVERHEAD, TARGET
from control.types import Decision
from real.engine_types import sync
from real.sampling import SamplingParams

COLUMNS = (
    "model",
    "batch",
    "new_tokens",
    "context_tokens",
    "seconds",
    "seconds_p10",
    "seconds_p90",
    "repeats",
    "seconds_mean",
)
_GREEDY = SamplingParams()
TRIM = 0.2  # fraction cut at each end for ``seconds_mean``
#: the time columns of a ``latency.csv`` (a correction scales them together)
TIME_COLUMNS = ("seconds", "seconds_mean", "seconds_p10", "seconds_p90")


@dataclass(frozen=True)
class ProfileConfig:
    # context grid: covers prompts of 32-384 tokens plus ~128 generated tokens.
    contexts: tuple[int, ...] = param(
        (32, 128, 256, 384, 512),
        lo=1,
        hi=1 << 16,
        doc="context lengths (tokens already cached) to time",
    )
    # prefill chunk sizes: the simulator charges a prompt's prefill at context 0 by interpolation.
    prefill_tokens: tuple[int, ...] = param(
        (32, 64, 128, 256, 384), lo=2, hi=1 << 16, doc="new-token counts above k_max + 1 to time"
    )
    # 2 discarded passes: first-touch allocations and caches.
    warmup: int = param(2, lo=0, hi=100, doc="discarded passes over the grid")
    # 7 timed passes: a median and a p10/p90 that mean something.
    repeats: int = param(7, lo=1, hi=1000, doc="timed passes over the grid")
    # 6 short fixed-k generations measure the per-round overhead.
    overhead_prompts: int = param(6, lo=1, hi=1000, doc="generations timed for round overhead")
    # 48 tokens each: ~20 rounds per generation.
    overhead_tokens: int = param(48, lo=2, hi=4096, doc="tokens per overhead generation")
    # k = 4 for the overhead runs: a typical round.
    overhead_k: int = param(4, lo=1, hi=64, doc="fixed k of the overhead runs")
    # seed of the random token ids written into the buffers (content does not change timing).
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of the filler tokens")
    # batch 1: the batch-1 table; (1, 2, 4, 8, 16) covers continuous batching on this CPU.
    batches: tuple[int, ...] = param(
        (1,), lo=1, hi=256, doc="batch sizes to time (the engine needs as many slots)"
    )
    # empty: every k = 0..k_max (new tokens 1..k_max+1); a batched grid uses a sparse set.
    draft_lengths: tuple[int, ...] = param(
        (), lo=0, hi=64, doc="draft lengths k whose verify (k+1) is timed"
    )


def _pct(x, q):
    return float(np.percentile(np.asarray(x, dtype=float), q))


def _row(model, new, ctx, xs, batch: int = 1):
    return {
        "model": model,
        "batch": int(batch),
        "new_tokens": int(new),
        "context_tokens": int(ctx),
        "seconds": float(np.median(xs)),
        "seconds_p10": _pct(xs, 10),
        "seconds_p90": _pct(xs, 90),
        "repeats": len(xs),
        "seconds_mean": tmean(xs),
    }


def tmean(xs, axis=None):
    """Mean after cutting the 20% highest and lowest samples: keeps the load mix of a shared
    machine (unlike the median) but not its rare multi-millisecond preemption spikes."""
    from scipy.stats import trim_mean

    return (
        trim_mean(np.asarray(xs, dtype=float), TRIM, axis=axis)
        if axis is not None
        else float(trim_mean(np.asarray(xs, dtype=float), TRIM))
    )


class RegionTimer:
    """Times the engine's regions on its own buffers, rows 0..B-1 of the slotted cache; never
    advances anything (rollback = not advancing the position, as in the engine)."""

    def __init__(self, engine, cfg: ProfileConfig) -> None:
        self.e, self.cfg = engine, cfg
        g = torch.Generator().manual_seed(cfg.seed)
        vocab = engine.target.embed_tokens.num_embeddings
        S, n = engine.seq.shape
        engine.seq[:, :n] = torch.randint(0, vocab, (S, n), generator=g).to(engine.seq.device)
        self.filler = engine.seq.clone()
        self.md = profiled_drafter(engine.drafter)

    def verify(self, B: int, T: int, ctx: int) -> float:
        e = self.e
        L, k = max(ctx, 1), T - 1
        slots = list(range(B))
        t1 = time.perf_counter()
        _, ns, _, _, _ = e.verify(
            slots, [L] * B, [k] * B, [Decision(k=k)] * B, [(k, [], None)] * B, [None] * B
        )
        t2 = time.perf_counter()
        for b, n in enumerate(ns):
            e.seq[b, L + n] = self.filler[b, L + n]
        return t2 - t1

    def chunk(self, B: int, T: int, ctx: int) -> float:
        t1 = time.perf_counter()
        self.e.prefill_rows(list(range(B)), [ctx] * B, [T] * B)
        return time.perf_counter() - t1

    def propose(self, B: int, k: int, ctx: int, catch_up: int = 1) -> float:
        """``propose(k)`` for B rows at committed length ``ctx + catch_up`` with the drafter's
        cache valid up to ``ctx`` (so its first step feeds ``catch_up`` tokens per row)."""
        e, d = self.e, self.md
        seq = e.seq
        L = ctx + catch_up
        slots = list(range(B))
        if hasattr(d, "set_valid"):  # a block drafter keeps no cache: nothing to rewind
            for s in slots:
                d.set_valid(s, ctx)
        t0 = time.perf_counter()
        props = d.propose_batch(seq, slots, [L] * B, [k] * B, [0.0] * B, _GREEDY, [None] * B)
        sync(e.device)
        t1 = time.perf_counter()
        d.accept_batch(slots, [L] * B, [p[0] for p in props], [0] * B)
        seq[:B, L : L + k + 1] = self.filler[:B, L : L + k + 1]
        return t1 - t0


def profiled_drafter(d):
    """The model drafter whose draft phase the profile times: the engine's drafter, or the
    model half of a hybrid; a model drafter rewinds its cache with ``set_valid``, a block
    drafter (``wants_hidden``, one forward a round) keeps none. None for an n-gram drafter."""
    for md in (d, getattr(d, "model", None)):
        if hasattr(md, "set_valid") or getattr(md, "wants_hidden", False):
            return md
    return None


def block_size_of(md) -> int:
    """B of a profiled block drafter (one forward a round, no cache to rewind), else 0."""
    if md is None or hasattr(md, "set_valid"):
        return 0
    return int(getattr(md, "block_size", 0) or 0)


def _check(engine, cfg: ProfileConfig) -> tuple[list[int], list[int]]:
    kmax = engine.cfg.k_max
    ctxs = sorted({int(c) for c in cfg.contexts})
    pre = sorted({int(t) for t in cfg.prefill_tokens if t > kmax + 1})
    need = max(ctxs) + max([kmax + 2] + pre) + 1
    if need > engine.length:
        raise DSparkError(
            f"profile grid needs {need} cache positions (context {max(ctxs)} + "
            f"{max([kmax + 2] + pre)} new) but the engine holds {engine.length}; "
            f"raise engine.max_len or lower profile.contexts/prefill_tokens"
        )
    if profiled_drafter(engine.drafter) is None:
        raise DSparkError(
            "dspark real profile needs a model drafter (conv, tf, feat or block), not n-gram"
        )
    if max(cfg.batches) > engine.slots:
        raise DSparkError(
            f"profile batches up to {max(cfg.batches)} need as many engine slots; "
            f"the engine has {engine.slots} (engine.slots)"
        )
    return ctxs, pre


def _draft_lengths(engine, cfg: ProfileConfig) -> list[int]:
    kmax = engine.cfg.k_max
    ks = sorted({int(k) for k in cfg.draft_lengths}) or list(range(kmax + 1))
    if ks[-1] > kmax:
        raise DSparkError(f"profile draft_lengths up to {ks[-1]} exceed engine k_max {kmax}")
    if len([k for k in ks if k >= 1]) < 2:
        raise DSparkError(
            "profile draft_lengths need at least two k >= 1 (the drafter step is a slope over k)"
        )
    return ks


class GridProfiler:
    """The grid of timed cells; passes can be run in slices (e.g. interleaved with other runs,
    so that a change of background load reaches the profile and those runs alike)."""

    def __init__(self, engine, cfg: ProfileConfig) -> None:
        self.ctxs, self.pre = _check(engine, cfg)
        self.ks = _draft_lengths(engine, cfg)
        self.batches = sorted({int(b) for b in cfg.batches})
        self.engine, self.cfg = engine, cfg
        self.kmax = engine.cfg.k_max
        self.cells: list[tuple] = []
        for b in self.batches:
            for c in [0] + self.ctxs:
                self.cells += [("r", b, k, c) for k in self.ks]
                self.cells += [("c", b, T, c) for T in self.pre]
                self.cells += [("p", b, N, c) for N in self.pre]
        self.times: dict[tuple, list[float]] = {}
        for kind, b, x, c in self.cells:
            if kind == "r":
                self.times[("v", b, x + 1, c)] = []
                if x:
                    self.times[("d", b, x, c)] = []
            else:
                self.times[(kind, b, x, c)] = []
        self.done = 0  # complete recorded passes
        self.cursor = 0

    @torch.inference_mode()
    def run_cells(self, n: int, record: bool = True) -> None:
        """Time the next ``n`` cells, continuing the round-robin over the grid where the last
        call stopped (a slice may end inside a pass)."""
        # (re)fills the buffers: other runs may have used them
        tm = RegionTimer(self.engine, self.cfg)
        for _ in range(n):
            kind, b, x, c = cell = self.cells[self.cursor]
            if kind == "r":
                # engine rounds at draft length k = x: one untimed round to reach the engine's
                # steady state (the drafter runs right after a verify pass has streamed the
                # target's weights through the caches, and vice versa), then one timed round
                for _ in range(2):
                    d = tm.propose(b, x, c) if x else 0.0
                    v = tm.verify(b, x + 1, c)
                if record:
                    self.times[("v", b, x + 1, c)].append(v)
                    if x:
                        self.times[("d", b, x, c)].append(d)
            else:
                s = tm.chunk(b, x, c) if kind == "c" else tm.propose(b, 1, c, x)
                if record:
                    self.times[cell].append(s)
            self.cursor = (self.cursor + 1) % len(self.cells)
            if self.cursor == 0:
                self.done += record

    def passes(self, n: int, record: bool = True, progress=None) -> None:
        for i in range(n):
            self.run_cells(len(self.cells), record)
            if progress is not None:
                progress(i + 1, n)

    def rows(self) -> tuple[list[dict], dict]:
        """Target and drafter rows of ``latency.csv`` plus the drafter fit (slope, intercept)
        per context (batch 1) and per ``"B<batch>/<context>"`` (batch > 1)."""
        times, pre = self.times, self.pre
        n = min(len(v) for v in times.values())  # every cell the same number of repeats
        times = {cell: v[:n] for cell, v in times.items()}
        if n == 0:
            raise DSparkError("profile: no complete pass over the grid was timed")
        rows, fit = [], {}
        ks = np.array([k for k in self.ks if k >= 1], dtype=float)
        for b in self.batches:
            for c in [0] + self.ctxs:
                for T in [k + 1 for k in self.ks] + pre:
                    cell = ("v" if T <= self.kmax + 1 else "c", b, T, c)
                    rows.append(_row(TARGET, T, c, times[cell], b))
                reps = np.array([times[("d", b, int(k), c)] for k in ks])  # [k, repeats]
                slope, icpt = np.polyfit(ks, np.median(reps, axis=1), 1)
                slope_mean, icpt_mean = np.polyfit(ks, tmean(reps, axis=1), 1)
                slopes = [float(np.polyfit(ks, reps[:, j], 1)[0]) for j in range(reps.shape[1])]
                # a time is never negative; under heavy noise a fit could say so (then 0).
                row = _row(DRAFTER, 1, c, np.maximum(slopes, 0.0), b)
                row["seconds"] = max(float(slope), 0.0)
                row["seconds_mean"] = max(float(slope_mean), 0.0)
                rows.append(row)
                fit[c if b == 1 else f"B{b}/{c}"] = {
                    "batch": b,
                    "step_s": float(slope),
                    "intercept_s": float(icpt),
                    "step_mean_s": float(slope_mean),
                    "intercept_mean_s": float(icpt_mean),
                    "draft_lengths": [int(k) for k in ks],
                    "propose_median_s_by_k": [float(x) for x in np.median(reps, axis=1)],
                    "propose_mean_s_by_k": [float(x) for x in tmean(reps, axis=1)],
                }
                rows += _phase_rows(ks, reps, c, b)
                one = reps[0]  # propose(k=1) of one token = intercept + one step, measured
                for N in pre:
                    x = np.asarray(times[("p", b, N, c)])
                    r = _row(DRAFTER, N, c, np.maximum(x - np.median(one) + row["seconds"], 0.0), b)
                    r["seconds_mean"] = max(float(tmean(x) - tmean(one) + row["seconds_mean"]), 0.0)
                    rows.append(r)
        B = block_size_of(profiled_drafter(self.engine.drafter))
        if B:
            rows.append(_row(BLOCK_MARKER, B, 0, [0.0]))
        return rows, fit


def _phase_rows(ks, reps, ctx: int, batch: int) -> list[dict]:
    """``draft-phase`` rows: the whole propose call at each draft length (its fixed cost and a
    first step unlike the others included), medians and trimmed means made non-decreasing in
    k (isotonic regression: more steps never cost less; it pools the noise of neighbouring
    cells). The line of the ``drafter`` row does not fit it: on a CPU the first step costs less
    than the line over k = 1..16 says (its intercept plus one step) and the second step more;
    the two rows of one ``dspark real profile`` side by side show it."""
    from scipy.optimize import isotonic_regression

    out = [_row(DRAFT_PHASE, int(k), ctx, reps[i], batch) for i, k in enumerate(ks)]
    for col in ("seconds", "seconds_mean"):
        fit = isotonic_regression([r[col] for r in out]).x
        for r, v in zip(out, fit):
            r[col] = float(v)
    return out


def profile_grid(engine, cfg: ProfileConfig, progress=None) -> tuple[list[dict], dict]:
    """Target and drafter rows of ``latency.csv`` plus the drafter fit (slopes, intercepts)."""
    gp = GridProfiler(engine, cfg)
    gp.passes(cfg.warmup, record=False)
    gp.passes(cfg.repeats, progress=progress)
    return gp.rows()


@torch.inference_mode()
def profile_round_overhead(engine, cfg: ProfileConfig, batch: int = 1) -> dict:
    """Per-round engine time outside draft and verify, from real fixed-k generations of
    ``batch`` sequences at once (rounds of a full batch only). The propose call's own fixed
    cost is in the ``draft-phase`` rows, not here: a round that drafts nothing does not pay
    it."""
    from control.registry import make_controller
    from real.engine_types import Request

    g = torch.Generator().manual_seed(cfg.seed + 1)
    vocab = engine.target.embed_tokens.num_embeddings
    P = max(2, min(64, engine.cfg.max_len - cfg.overhead_tokens - 1))
    resid: list[float] = []
    for i in range(cfg.overhead_prompts + 1):
        if batch == 1:
            prompt = torch.randint(0, vocab, (P,), generator=g).tolist()
            gen = engine.generate(
                prompt, cfg.overhead_tokens, make_controller("fixed", {"k": cfg.overhead_k})
            )
            ends = [(r.now_s, r.draft_s, r.verify_s, 1) for r in gen.records]
        else:
            reqs = [
                Request(
                    j,
                    torch.randint(0, vocab, (P,), generator=g).tolist(),
                    cfg.overhead_tokens,
                    make_controller("fixed", {"k": cfg.overhead_k}),
                )
                for j in range(batch)
            ]
            seqs = engine.run_batch(reqs)
            by_round = {
                r.now_s: (r.now_s, r.draft_s, r.verify_s, r.batch_size)
                for s in seqs
                for r in s.records
            }
            ends = sorted(by_round.values())
        if i == 0:
            continue  # warm-up generation
        prev = 0.0
        for now, d, v, size in ends:
            if (size == batch and prev > 0.0) or batch == 1:
                resid.append(now - prev - d - v)
            prev = now
    if not resid:
        raise DSparkError(f"profile: no round of a full batch of {batch} to time the overhead")
    x = np.asarray(resid)
    return {
        "row": _row(OVERHEAD, 0, 0, x, batch),
        "residual_median_s": float(np.median(x)),
        "residual_mean_s": tmean(x),
        "rounds": len(x),
        "batch": batch,
    }


def finish_table(engine, cfg: ProfileConfig, rows: list[dict], fit: dict):
    """Add the round-overhead row (measured now) to grid rows; DataFrame and details."""
    import pandas as pd

    batches = sorted({int(f.get("batch", 1)) for f in fit.values()})
    ovs = [profile_round_overhead(engine, cfg, b) for b in batches]
    rows = rows + [ov["row"] for ov in ovs]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    ov = ovs[0]
    details = {
        "drafter_fit": {str(c): f for c, f in fit.items()},
        "round_overhead": {k: v for k, v in ov.items() if k != "row"},
        "round_overhead_s": ov["row"]["seconds"],
        "round_overhead_mean_s": ov["row"]["seconds_mean"],
    }
    if len(ovs) > 1:
        details["round_overhead_by_batch"] = {
            str(o["batch"]): {
                "seconds": o["row"]["seconds"],
                "seconds_mean": o["row"]["seconds_mean"],
                **{k: v for k, v in o.items() if k != "row"},
            }
            for o in ovs
        }
    return df, details


def profile(engine, cfg: ProfileConfig, progress=None):
    """The full latency table (pandas DataFrame, ``COLUMNS``) and a dict of fit details."""
    rows, fit = profile_grid(engine, cfg, progress)
    return finish_table(engine, cfg, rows, fit)


def with_statistic(df, statistic: str):
    """The table with ``seconds`` = the median (as written) or the mean of the repeats."""
    if statistic == "median":
        return df
    out = df.copy()
    out["seconds"] = out["seconds_mean"]
    return out


def read_latency(path) -> object:
    """Read and check a ``latency.csv`` (DataFrame); a missing column or bad value is one line."""
    from pathlib import Path

    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise DSparkError(f"{p}: latency table not found")
    try:
        df = pd.read_csv(p)
    except Exception as e:
        raise DSparkError(f"{p}: cannot read latency table: {str(e).splitlines()[0]}") from None
    for c in COLUMNS[:5]:
        if c not in df.columns:
            raise DSparkError(f"{p}: latency table lacks column '{c}'")
    for c in COLUMNS[1:5]:
        v = pd.to_numeric(df[c], errors="coerce")
        if v.isna().any():
            raise DSparkError(f"{p}: column '{c}' has a missing or garbled value")
        df[c] = v
    return df


def round_overhead_s(df, column: str = "seconds", batch: int = 1) -> float:
    """The measured per-round overhead of a latency table at ``batch`` (0 when it has no
    such row; a table without a row for ``batch`` gives its first row)."""
    r = df[df["model"].astype(str) == OVERHEAD]
    if not len(r):
        return 0.0
    at = r[r["batch"] == batch]
    return float((at if len(at) else r)[column].iloc[0])


# ---------------------------------------------------------------- a planner's start-up prior
def startup_cost_rows(engine, repeats: int = 3) -> list[tuple[str, int, int, float, float]]:
    """A few seconds' worth of the engine timing itself, as ``RoundCostModel.seed`` rows: the
    verify pass (``Engine.verify``, what a round's ``verify_s`` holds) and draft phases
    (``propose_batch``, what ``draft_s`` holds) over :func:`startup_grid`. Medians of ``repeats`` after one discarded pass. The engine must
    be idle: the buffers of its slots are overwritten with filler (as ``dspark real profile``
    does)."""
    if engine.running:
        raise DSparkError("a start-up profile needs an idle engine")
    k_max = engine.cfg.k_max
    t = RegionTimer(engine, ProfileConfig(repeats=repeats, warmup=1))
    batches, ctxs, ks = startup_grid(engine.slots, k_max, engine.cfg.max_len)
    cells = [("verify", B, k + 1, c) for B in batches for c in ctxs for k in ks]
    if engine.drafter is not None and t.md is not None:
        cells += [("draft", B, k, c) for B in batches for c in ctxs for k in ks if k > 0]
    times: dict[tuple[str, int, int, int], list[float]] = {c: [] for c in cells}
    ecfg = engine.cfg
    engine.cfg = dataclasses.replace(ecfg, temperature=0.0)  # greedy: proposals carry no q
    try:
        with torch.inference_mode():
            for r in range(repeats + 1):
                for cell in cells:
                    path, B, n, c = cell
                    s = t.verify(B, n, c) if path == "verify" else t.propose(B, n, c)
                    if r:
                        times[cell].append(s)
    finally:
        engine.cfg = ecfg
    secs = [float(np.median(times[c])) for c in cells]
    if engine.agree is not None:  # tensor parallel: every rank's planner gets rank 0's numbers
        secs = list(engine.agree(secs))
    # a draft row is n steps over B drafting rows; a verify row, B rows of n tokens each
    return [
        verify_seed_row(B, n, B * c, s) if p == "verify" else (p, B, n, float(B * c), s)
        for (p, B, n, c), s in zip(cells, secs)
    ]


def startup_grid(slots: int, k_max: int, max_len: int) -> tuple[list[int], list[int], list[int]]:
    """(batch sizes, context tokens per row, draft lengths) of the start-up profile: batches
    1, 2, 4, .. up to ``slots`` and two contexts, so that the fit can tell the context read
    from the verified tokens (one context would tie them to the batch size)."""
    batches = sorted({1, slots} | {2**i for i in range(1, 12) if 2**i < slots})
    ctxs = sorted({max(1, min(64, max_len // 4)), max(1, min(192, max_len // 2))})
    return batches, ctxs, sorted({0, 1, 2, 3, 5, k_max // 2, k_max})
