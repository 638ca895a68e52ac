"""The latency table corrected by the engine's own rounds: a controller that cycles the draft
length (:class:`CycleK`) makes the engine run rounds at every k, in its own alternation of
draft and verify; measured over tabled time per k (:func:`trace_ratios`) then scales the
table's rows (:func:`correct_from_trace`). ``dspark validate`` corrects every profile it
predicts from so (``correct_profile``); the rows and columns are :mod:`real.profile`'s.
"""

from __future__ import annotations

import numpy as np

from control.errors import DSparkError
from control.latency_rows import DRAFT_PHASE, DRAFTER, TARGET
from control.types import Decision


class CycleK:
    """A controller that asks k = ``ks[0]``, ``ks[1]``, ... round after round (cycling, from
    ``offset``): the engine's own rounds at every draft length, in the engine's alternation of
    draft and verify, for :func:`correct_from_trace`."""

    def __init__(self, ks, offset: int = 0) -> None:
        self.ks = [int(k) for k in ks]
        if not self.ks or min(self.ks) < 0:
            raise DSparkError(f"CycleK needs draft lengths >= 0, got {ks!r}")
        self.offset = int(offset)
        self.i = self.offset

    def decide(self, now_s: float) -> Decision:
        return Decision(k=self.ks[self.i % len(self.ks)])

    def observe(self, obs) -> None:
        self.i += 1

    def reset(self) -> None:
        self.i = self.offset


def _at_context(df, model: str, new_tokens: int, ctx, column: str) -> np.ndarray:
    """The table's value for batch-1 rows of ``model`` at ``new_tokens``, linear over context
    and clamped at the grid's edges (as ``sim.latency.Table``); nan when the row is missing."""
    r = df[(df["model"] == model) & (df["batch"] == 1) & (df["new_tokens"] == new_tokens)]
    if not len(r):
        return np.full(np.shape(ctx), np.nan)
    r = r.sort_values("context_tokens")
    return np.interp(
        np.asarray(ctx, dtype=float), r["context_tokens"].to_numpy(float), r[column].to_numpy(float)
    )


def _ratio(measured, tabled, statistic: str) -> float:
    """Median of measured / tabled, or (``"mean"``) the ratio of their sums: a run's time is a
    sum of rounds, so under a changing background load its expectation is the sum's."""
    m, t = np.asarray(measured, dtype=float), np.asarray(tabled, dtype=float)
    if statistic == "mean":
        return float(m.sum() / t.sum()) if t.sum() > 0 else float("nan")
    return float(np.median(m / t))


def _batch1_at(df, model: str, new_tokens, ctx, column: str) -> np.ndarray:
    """The table's value for batch-1 rows of ``model`` at each (``new_tokens``, ``ctx``) pair,
    linear in both and clamped at the grid's edges (as ``sim.latency.Table``); nan when the
    model has no rows."""
    ctx = np.atleast_1d(np.asarray(ctx, dtype=float))
    new = np.broadcast_to(np.asarray(new_tokens, dtype=float), ctx.shape)
    r = df[(df["model"] == model) & (df["batch"] == 1)]
    if not len(r):
        return np.full(ctx.shape, np.nan)
    news = np.sort(r["new_tokens"].unique()).astype(float)
    per = np.array([_at_context(df, model, int(n), ctx, column) for n in news])
    if len(news) == 1:
        return per[0]
    j = np.clip(np.searchsorted(news, new), 1, len(news) - 1)
    w = np.clip((new - news[j - 1]) / (news[j] - news[j - 1]), 0.0, 1.0)
    cols = np.arange(len(ctx))
    return (1.0 - w) * per[j - 1, cols] + w * per[j, cols]


def draft_phases(records) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch-1 record, in order: the drafter steps its draft phase ran (the drafted tokens,
    one more when the τ stop fired before k: that step's token was dropped), the tokens its
    first step fed beyond the usual one (one per round since the drafter last ran: a draft-free
    round commits a token it never saw), and whether the phase is the generation's first
    (``round`` 0 starts one), whose first step feeds the whole prompt — the simulator charges
    that at the prefill."""
    steps, extra, first = [], [], []
    since: dict = {}  # request id -> rounds since its drafter last ran (None: never)
    for r in records:
        if r.round == 0:
            since[r.request_id] = None
        n = r.drafted + 1 if (r.tau > 0.0 and r.drafted < r.k) else r.drafted
        gap = since.get(r.request_id)
        steps.append(n)
        extra.append((gap or 0) if n else 0)
        first.append(n > 0 and gap is None)
        if n:
            since[r.request_id] = 0
        elif gap is not None:
            since[r.request_id] = gap + 1
    return np.array(steps), np.array(extra), np.array(first, dtype=bool)


def tabled_draft_s(df, records, column: str = "seconds", phases=None) -> np.ndarray:
    """What the simulator's table backend charges each batch-1 record's draft phase: the
    ``draft-phase`` row of its steps at its context (without such rows, steps x the drafter
    step), plus what feeding :func:`draft_phases`' extra tokens adds to the first step,
    ``drafter row(extra + 1) - row(1)``; 0 for a round whose drafter did not run. ``phases``:
    :func:`draft_phases` of these records, when the caller has it already."""
    steps, extra, _ = draft_phases(records) if phases is None else phases
    ctx = np.array([r.context_tokens for r in records], dtype=float)
    if ((df["model"] == DRAFT_PHASE) & (df["batch"] == 1)).any():
        phase = _batch1_at(df, DRAFT_PHASE, steps, ctx, column)
    else:
        phase = steps * _batch1_at(df, DRAFTER, 1, ctx, column)
    feed = _batch1_at(df, DRAFTER, extra + 1, ctx, column) - _batch1_at(df, DRAFTER, 1, ctx, column)
    return np.where(steps > 0, phase + np.maximum(feed, 0.0), 0.0)


def trace_ratios(
    df, records, column: str = "seconds", statistic: str = "median", keep=None
) -> dict:
    """Per draft length k of batch-1 engine rounds (``RoundRecord``s): measured over tabled
    verify time (target row ``k + 1`` at the round's context), measured over tabled draft time
    (:func:`tabled_draft_s`, over the rounds whose drafter ran) and their round sum; each the
    median of the per-round ratios or (``statistic = "mean"``) the ratio of the sums. A
    generation's first draft phase (it feeds the prompt) is left out, and with ``keep`` (one
    flag per record) every record it flags False; the rounds are read in order all the same
    (a left-out draft-free round still puts the drafter behind). ``{k: {...}}``."""
    keep = [True] * len(records) if keep is None else list(keep)
    recs = [r for r in records if r.batch_size == 1]
    use = [f for r, f in zip(records, keep) if r.batch_size == 1]
    if not recs:
        return {}
    phases = draft_phases(recs)
    steps, _, first = phases
    pd_all = tabled_draft_s(df, recs, column, phases)
    by_k: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        if use[i] and not first[i]:
            by_k.setdefault(int(r.drafted), []).append(i)
    out = {}
    for k, idx in sorted(by_k.items()):
        rs = [recs[i] for i in idx]
        ctx = np.array([r.context_tokens for r in rs], dtype=float)
        v = np.array([r.verify_s for r in rs])
        d = np.array([r.draft_s for r in rs])
        pv = _at_context(df, TARGET, k + 1, ctx, column)
        pd_ = pd_all[idx]
        ran = steps[idx] > 0
        out[k] = {
            "rounds": len(rs),
            "verify_ratio": _ratio(v, pv, statistic),
            "draft_ratio": _ratio(d[ran], pd_[ran], statistic) if ran.any() else float("nan"),
            "round_ratio": _ratio(v + d, pv + pd_, statistic),
        }
    return out


def calibration_ks(k_max: int) -> list[int]:
    """The draft lengths a calibration generation cycles through (:class:`CycleK`): 0 twice,
    then 1..``k_max``. The second 0 follows a draft-free round, as the profile's k = 0 cell
    (a verify after a verify) and a controller's draft-free stretches do; the first follows a
    round that drafted ``k_max`` (:func:`correct_from_trace` leaves it out)."""
    return [0, *range(k_max + 1)]


def after_a_draft(records) -> list[bool]:
    """Per batch-1 record, in order: whether the previous round of the same generation drafted
    (``round`` 0 starts a generation). Its verify pass then follows a drafter pass: on a CPU a
    draft-free round right after a drafting one verifies slower than one inside a draft-free
    stretch (the profile's k-cycling rounds measure both; the cause is not isolated, the
    caches are the likely one)."""
    last: dict = {}  # request id -> what its previous round drafted
    out = []
    for r in records:
        out.append(r.round > 0 and last.get(r.request_id, 0) > 0)
        last[r.request_id] = r.drafted
    return out


def correct_from_trace(
    df,
    records,
    column: str = "seconds",
    min_rounds: int = 5,
    statistic: str = "median",
) -> tuple[object, dict]:
    """The table corrected by the engine's own batch-1 rounds: every target row of verify size
    ``k + 1`` scaled by the measured / tabled verify time of the rounds that drafted k (k with
    at least ``min_rounds`` rounds), every batch-1 ``draft-phase`` and drafter row by the
    measured / tabled draft time (:func:`tabled_draft_s`) of the rounds whose drafter ran, a
    generation's first draft phase left out (``statistic``: median of the per-round ratios, or
    ratio of the sums). After it, that ratio of each corrected k is exactly 1 on these rounds
    (``trace_ratios``).

    Draft-free rounds count only where the previous round drafted nothing either
    (:func:`after_a_draft`): the state the profile's k = 0 cell and a controller's draft-free
    stretches verify in (a k-cycling generation reaches k = 0 from k_max, whose draft-free
    round verified 7-16% above the table in five TP validation runs, and the correction then
    priced every draft-free stretch that much too high). Those after a draft are reported
    beside (``zero_draft_after_draft``: their ratio against the corrected table)."""
    flags = after_a_draft(records)
    cold = [f and r.drafted == 0 for r, f in zip(records, flags)]
    warm = [not c for c in cold]
    out = df.copy()
    before = trace_ratios(df, records, column, statistic, warm)
    scale = {}
    for k, r in before.items():
        if r["rounds"] >= min_rounds and np.isfinite(r["verify_ratio"]) and r["verify_ratio"] > 0:
            rows = (out["model"] == TARGET) & (out["batch"] == 1) & (out["new_tokens"] == k + 1)
            out.loc[rows, column] = out.loc[rows, column] * r["verify_ratio"]
            scale[k] = r["verify_ratio"]
    recs = [r for r in records if r.batch_size == 1]
    phases = draft_phases(recs)
    steps, _, first = phases
    ran = (steps > 0) & ~first
    d_scale = float("nan")
    if ran.sum() >= min_rounds:
        d = np.array([r.draft_s for r in recs])
        d_scale = _ratio(d[ran], tabled_draft_s(df, recs, column, phases)[ran], statistic)
        if np.isfinite(d_scale) and d_scale > 0:
            rows = out["model"].isin([DRAFTER, DRAFT_PHASE]) & (out["batch"] == 1)
            out.loc[rows, column] = out.loc[rows, column] * d_scale
    after = trace_ratios(out, records, column, statistic, warm)
    return out, {
        "statistic": statistic,
        "verify_scale_by_k": scale,
        "drafter_scale": d_scale,
        "before": before,
        "after": after,
        "zero_draft_after_draft": trace_ratios(out, records, column, statistic, cold).get(0),
    }
