"""The batched part's latency model: the profile's table, the serving loop's round overhead and
the correction of the table by the calibration load's own rounds (``dspark validate --part
batched``, steps 5 and 7 of :mod:`validate.batched`).

A batch trace (``real.serve.BATCH_COLUMNS``) holds one row per round or prefill pass. A round's
``verify_s`` is its one target pass over ``verify_tokens`` at ``context_tokens`` (summed over
the batch), its ``draft_s`` the propose call: ``draft_steps`` drafter steps over ``drafting``
rows, the call's own fixed cost included (the table's ``draft-phase`` rows hold both), and, in
the first round after a prefill, the newly admitted rows' catch-up on their prompts (which the
simulator charges at the end of the prefill pass).
"""

from __future__ import annotations

import numpy as np

from control.latency_rows import DRAFT_PHASE, DRAFTER
from real.profile import TIME_COLUMNS, tmean


def overhead_residuals(batches) -> dict[int, list[float]]:
    """Per batch size, each round's time outside its draft and verify phases: its end less the
    end of the event before it (round or prefill; the loop only sleeps when nothing runs, and
    then the next event is a prefill), less draft_s and verify_s."""
    ev = batches.sort_values("end_s")
    out: dict[int, list[float]] = {}
    prev = None
    for r in ev.itertuples(index=False):
        if r.kind == "round" and prev is not None:
            out.setdefault(int(r.batch_size), []).append(
                float(r.end_s - prev - r.draft_s - r.verify_s)
            )
        prev = float(r.end_s)
    return out


def overhead_by_batch(
    resid: dict[int, list[float]], batches: list[int], min_rounds: int = 5
) -> dict[int, float]:
    """The residual per batch size of ``batches``: a line over the batch sizes seen in ``resid``
    (their trimmed means, weighted by the square root of their round counts); one size seen:
    its value; none: empty."""
    seen = {b: tmean(v) for b, v in resid.items() if len(v) >= min_rounds}
    if not seen:
        seen = {b: tmean(v) for b, v in resid.items() if v}
    if not seen:
        return {}
    if len(seen) == 1:
        (v,) = seen.values()
        return {b: max(v, 0.0) for b in batches}
    xs = np.array(sorted(seen), dtype=float)
    ys = np.array([seen[int(b)] for b in xs])
    w = np.sqrt([len(resid[int(b)]) for b in xs])
    slope, icpt = np.polyfit(xs, ys, 1, w=w)
    return {b: max(float(icpt + slope * b), 0.0) for b in batches}


def round_phases(batches, latency_csv):
    """The rounds of one batch trace beside the table's time for each phase: columns
    ``verify_s``, ``draft_s`` (measured), ``table_verify_s`` (the target row for the round's
    batch, verify tokens and context), ``table_draft_s`` (the ``draft-phase`` row of the
    round's drafting rows, draft steps and context; a table without such rows: draft steps x
    one drafter step) and ``after_prefill`` (the event before the round was a prefill pass: its
    draft phase holds the admitted rows' prompt catch-up)."""
    from sim.latency import Table, phase_seconds, table_models

    T, D = Table(latency_csv, "target"), Table(latency_csv, "drafter")
    P = Table(latency_csv, DRAFT_PHASE) if DRAFT_PHASE in table_models(latency_csv) else None
    ev = batches.sort_values("end_s")
    after = (ev["kind"].shift(1) == "prefill").to_numpy()
    keep = (ev["kind"] == "round").to_numpy()
    r = ev[keep].copy()
    r["after_prefill"] = after[keep]
    r["table_verify_s"] = [
        T.seconds(int(b), int(t), float(c))
        for b, t, c in zip(r["batch_size"], r["verify_tokens"], r["context_tokens"])
    ]
    steps = r["draft_steps"].fillna(0).astype(int)
    r["table_draft_s"] = [
        phase_seconds(P, D, int(n), int(s), float(c)) if s else 0.0
        for s, n, c in zip(steps, r["drafting"].fillna(0).astype(int), r["context_tokens"])
    ]
    return r


def latency_check(batches, latency_csv) -> dict[str, float]:
    """One real run's rounds against the simulator's latency table: Σ real verify_s / Σ the
    table's verify time for each round's (batch, verify tokens, context), the same for the draft
    phase (:func:`round_phases`' ``table_draft_s``), and for the two together."""
    r = round_phases(batches, latency_csv)
    v, d = float(r["verify_s"].sum()), float(r["draft_s"].sum())
    pv = float(r["table_verify_s"].sum())
    pd_ = float(r["table_draft_s"].sum())
    return {
        "rounds": len(r),
        "verify_ratio": v / pv if pv else float("nan"),
        "draft_ratio": d / pd_ if pd_ else float("nan"),
        "round_ratio": (v + d) / (pv + pd_) if pv + pd_ else float("nan"),
    }


def _nearest(batch_sizes, grid: list[int]) -> np.ndarray:
    """The grid batch size nearest each batch size, on a log scale."""
    g = np.log(np.asarray(grid, dtype=float))
    b = np.log(np.maximum(np.asarray(batch_sizes, dtype=float), 1.0))
    return np.asarray(grid)[np.abs(b[:, None] - g[None, :]).argmin(axis=1)]


def _ratios(measured, tabled, near, grid, min_rounds: int, per_size: bool) -> dict[int, float]:
    """Σ measured / Σ tabled per grid batch size over its nearest rounds (a run's time is a sum
    of rounds); a size with fewer than ``min_rounds`` rounds, or every size unless
    ``per_size``, takes the ratio pooled over all."""
    m, t = np.asarray(measured, dtype=float), np.asarray(tabled, dtype=float)
    pooled = float(m.sum() / t.sum()) if len(m) >= min_rounds and t.sum() > 0 else float("nan")
    out = {}
    for g in grid:
        sel = near == g
        ok = per_size and sel.sum() >= min_rounds and t[sel].sum() > 0
        out[int(g)] = float(m[sel].sum() / t[sel].sum()) if ok else pooled
    return out


def _verify_rows(df, k_max: int):
    """The target rows of one verify pass per round (new tokens per row <= ``k_max + 1``), not
    the prefill chunks."""
    return (df["model"].astype(str) == "target") & (df["new_tokens"] <= k_max + 1)


def correct_from_calibration(
    latency_csv,
    cal_batches: list,
    k_max: int,
    min_rounds: int = 5,
    per_size: bool = True,
):
    """The table of ``latency_csv`` corrected by the calibration load's own rounds, as
    ``real.trace_correction.correct_from_trace`` corrects the batch-1 table: per profiled batch size g,
    every target verify row is scaled by Σ verify_s / Σ the table's verify time of the
    calibration rounds whose batch size is nearest g, and every drafter and ``draft-phase`` row
    of batch g by Σ draft_s / Σ the table's draft phase of the drafting rounds nearest g that
    follow a round, not a prefill (the first draft of a newly admitted row carries its
    prompt catch-up, which the simulator charges at the prefill). A size with fewer than
    ``min_rounds`` rounds, and every size unless ``per_size``, takes the ratio pooled over all
    of them; no usable rounds: the table unchanged. For rounds at profiled batch sizes the
    corrected table's ratios are exactly 1 (tests). Returns (table, what was applied)."""
    import pandas as pd

    out = pd.read_csv(latency_csv)
    grid = sorted({int(b) for b in out["batch"].unique()})
    rounds = [round_phases(bt, latency_csv) for bt in cal_batches]
    r = pd.concat(rounds) if rounds else pd.DataFrame()
    if not len(r):
        return out, {"rounds": 0, "verify_scale": {}, "drafter_scale": {}}
    near = _nearest(r["batch_size"], grid)
    v_scale = _ratios(r["verify_s"], r["table_verify_s"], near, grid, min_rounds, per_size)
    d = (r["table_draft_s"] > 0) & ~r["after_prefill"].astype(bool)
    d_scale = _ratios(
        r["draft_s"][d],
        r["table_draft_s"][d],
        near[d.to_numpy()],
        grid,
        min_rounds,
        per_size,
    )
    cols = [c for c in TIME_COLUMNS if c in out.columns]
    verify = _verify_rows(out, k_max)
    drafter = out["model"].astype(str).isin([DRAFTER, DRAFT_PHASE])
    for g in grid:
        for rows, s in ((verify, v_scale[g]), (drafter, d_scale[g])):
            if np.isfinite(s) and s > 0:
                sel = rows & (out["batch"] == g)
                out.loc[sel, cols] = out.loc[sel, cols] * s
    return out, {
        "rounds": len(r),
        "drafting_rounds_used": int(d.sum()),
        "verify_scale": v_scale,
        "drafter_scale": d_scale,
    }


def sim_table(lat, k_max: int, overhead: dict[int, float], scale: float = 1.0):
    """The simulator's latency table: ``lat`` with ``overhead[b]`` added to every target verify
    row (new tokens <= k_max + 1) of batch ``b`` (one verify pass per round), every time then
    multiplied by ``scale``."""
    out = lat.copy()
    cols = [c for c in TIME_COLUMNS if c in out.columns]
    if scale != 1.0:
        out[cols] = out[cols] * scale
    verify = _verify_rows(out, k_max)
    for b, s in overhead.items():
        sel = verify & (out["batch"] == b)
        out.loc[sel, cols] = out.loc[sel, cols] + s
    return out
