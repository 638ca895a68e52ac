"""The goodput choice of draft lengths for one batched round (pure numpy).

With per-token acceptance rate ``a`` and draft length ``k``, a round emits in expectation

    E(a, k) = Σ_{j=0..k} a^j = (1 − a^(k+1)) / (1 − a)          (Leviathan et al., Eq. 1)

tokens (the accepted prefix plus the target's bonus or correction token; one home:
:func:`control.leviathan.expected_tokens`). A batched round lasts

    T = [steps > 0] · draft_fixed + steps · step_s(drafting, ctx) + verify_s(N, ctx) + overhead,

with ``N = Σ_i (k_i + 1)`` and ``steps = max_i k_i``: the draft phase lasts the longest draft,
and a round that drafts at all pays the phase's fixed cost once. A block drafter
(``CostFunctions.block``) proposes every kept token in one forward: ``steps = [max_i k_i > 0]``.
The planner maximises the batch's goodput ``G = Σ_i E(a_i, k_i) / T``. For each cap ``m`` (the round's longest draft) it
lets each sequence stop below ``m`` on its own evidence: drafted token ``j`` of sequence ``i``
adds ``a_i^j`` expected tokens and ``v = ∂T/∂N`` seconds, so it pays iff ``a_i^j ≥ G · v``
(Dinkelbach's condition for a ratio objective; iterated to its fixed point). The cap with the
highest ``G`` wins; ties go to the shorter cap.

``weight`` (α, per sequence, in (0, ∞)) scales the time penalty of speculation: the time a round
spends beyond a plain decode step counts ``1/α`` — α = 1 is pure goodput, α < 1 drafts less.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from control.cost_kernel import tables
from control.goodput_kernel import (
    best_row,
    cap_bounds,
    floor_lengths,
    mean_tpot_scores,
    plan_rows,
    position_powers,
    slo_scores,
)

Costs = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class RoundPlan:
    """The chosen draft lengths (per sequence), the cap, and the predicted goodput per cap."""

    k: np.ndarray
    cap: int
    caps: np.ndarray  # the caps tried, one per row of k_by_cap and goodput
    k_by_cap: np.ndarray  # (rows, B): the draft lengths chosen under each cap tried
    goodput: np.ndarray  # tokens per second predicted for each cap tried
    seconds: float  # predicted round time of the chosen plan
    seconds_by_cap: np.ndarray | None = None  # predicted round time of each row
    expected: np.ndarray | None = None  # (rows, B): E(a_i, k_i) of each row
    cum: np.ndarray | None = None  # (k_max + 1, B): E(a_i, k) for every k (the SLO floor's)


@dataclass(frozen=True)
class CostFunctions:
    """Round-time pieces as vectorised functions (e.g. of a :class:`RoundCostModel`)."""

    verify_s: Callable[[np.ndarray], np.ndarray]  # N -> seconds
    verify_slope: Callable[[np.ndarray], np.ndarray]  # N -> seconds per verified token
    step_s: Callable[[np.ndarray], np.ndarray]  # drafting sequences -> seconds per step
    overhead_s: float = 0.0
    # N -> output tokens forgone (prompt work pushed out of the pass), and its slope; None = 0
    token_penalty: Callable[[np.ndarray], np.ndarray] | None = None
    penalty_slope: Callable[[np.ndarray], np.ndarray] | None = None
    draft_fixed_s: float = 0.0  # paid once by a round that drafts at all
    block: bool = False  # a block drafter: one draft forward whatever the longest draft
    # seconds a round pays whatever its drafts beyond the plain step alone (the plain step's
    # share of a pass it shares with a prompt chunk): in the round's time, not in the ratio
    shared_s: float = 0.0
    # the parameter vector the callables evaluate (control.cost_kernel), when they are a fitted
    # cost model's: a plan's compiled loop then evaluates them where it reads; None = any
    spec: np.ndarray | None = None


def round_seconds(k: np.ndarray, costs: CostFunctions) -> np.ndarray:
    """Predicted round time for draft-length rows ``k`` (shape ``(rows, B)``)."""
    tokens, steps, drafting = _row_counts(k)
    return _seconds(tokens, steps, costs.step_s(np.maximum(drafting, 1)), costs)


def break_even(plan: RoundPlan, row: int, costs: CostFunctions, weight: np.ndarray) -> np.ndarray:
    """Per sequence, the survival probability a drafted token needs to pay in row ``row`` of
    ``plan``: ``G · v / α_i`` (plus the slope of the prompt work it pushes out), the condition
    :func:`plan_round_lengths` holds each planned token to, for a driver's survival stop to
    hold each drafted token to on the drafter's own confidences."""
    n = plan.k_by_cap[row : row + 1].sum(axis=1) + plan.k_by_cap.shape[1]
    thr = plan.goodput[row] * costs.verify_slope(n)[0] / np.asarray(weight, dtype=float)
    if costs.penalty_slope is not None:
        thr = thr + costs.penalty_slope(n)[0]
    return thr


def _row_counts(k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``k``: verified tokens ``Σ(k_i + 1)``, draft steps ``max k_i`` and drafting
    sequences ``#{k_i > 0}`` (integers: exact however they are summed)."""
    B = k.shape[1]
    return k.sum(axis=1) + B, k.max(axis=1, initial=0), np.count_nonzero(k, axis=1)


def _seconds(tokens, steps, step, costs: CostFunctions) -> np.ndarray:
    """The round times of rows with these counts, ``step`` the step cost at their drafting."""
    if costs.block:
        steps = np.minimum(steps, 1)
    draft = np.where(steps > 0, costs.draft_fixed_s + steps * step, 0.0)
    return draft + costs.verify_s(tokens) + costs.overhead_s


def plan_round_lengths(
    a: np.ndarray,
    kcap: np.ndarray,
    costs: CostFunctions,
    k_max: int,
    weight: np.ndarray | None = None,
    iterations: int = 4,
    cap_range: tuple[int, int] | None = None,
) -> RoundPlan:
    """Draft lengths maximising ``Σ E_i(k_i) / T`` with ``k_i ≤ min(m, kcap_i)`` per cap m.

    ``a``: per-sequence acceptance rates, shape ``(B,)`` (i.i.d. per token: token j is accepted
    with probability ``a_i^j``), or per draft position, shape ``(K, B)`` (row j−1: the rate of
    position j given the earlier ones were accepted; token j with probability ``Π_{l≤j} a_il``).
    ``kcap``: per-sequence upper bounds (0 = this sequence must not draft, e.g. a cool-down);
    ``weight``: α per sequence (None = all 1). ``cap_range``: only caps ``lo..hi`` are tried
    (a planner searching near its last cap); None = all of ``0..k_max`` (exact).
    """
    K = int(k_max)
    powers, cum = _powers(a, K)
    B = powers.shape[1]
    lo, hi = (0, K) if cap_range is None else (max(0, cap_range[0]), min(K, cap_range[1]))
    bound, most, top = cap_bounds(np.asarray(kcap, dtype=np.int64), K, lo, hi)  # (caps, B)
    caps = np.arange(lo, hi + 1)
    if top >= len(cum):
        raise IndexError(f"draft length {top} beyond the {len(cum) - 1} rates known")
    w = np.ones(B) if weight is None else np.asarray(weight, dtype=float)
    # the draft steps of each cap
    per_step = np.minimum(caps, 1) if costs.block else caps
    # every token count and drafting count a row can reach, tabulated once for the loop
    n_hi = B + most
    k, g, t, expected = _plan_rows(powers, cum, bound, per_step, w, costs, iterations, n_hi)
    best = int(np.argmax(g))  # first maximum: the shortest cap among ties
    # the plan's true cap: sequences may all have stopped below the row's cap
    cap = int(k[best].max()) if B else 0
    return RoundPlan(
        k=k[best].copy(),
        cap=cap,
        caps=caps,
        k_by_cap=k,
        goodput=g,
        seconds=float(t[best]),
        seconds_by_cap=t,
        expected=expected,
        cum=cum,
    )


def _plan_rows(powers, cum, bound, per_step, w, costs: CostFunctions, iterations: int, n_hi: int):
    """:func:`~control.goodput_kernel.plan_rows` on the costs at ``B..n_hi`` verified tokens
    and ``1..B + 1`` drafting rows: for a fitted cost model's (``costs.spec``) one compiled
    call that evaluates them at the token counts its rows reach; the callables' tabulated whole
    otherwise. ``iterations`` 0: the rows ``bound`` as given."""
    B = bound.shape[1]
    pen, pen_slope = costs.token_penalty, costs.penalty_slope
    if costs.spec is not None:
        spec = costs.spec
        vs, vsl, pt, pst, st, have = tables(spec, B, n_hi, B + 1)
    else:
        ns, none = np.arange(B, n_hi + 1, dtype=float), np.zeros(0)
        spec = none  # nothing to evaluate: every row is filled below
        vs = np.asarray(costs.verify_s(ns), dtype=float)
        vsl = np.asarray(costs.verify_slope(ns), dtype=float)
        pt = none if pen is None else np.asarray(pen(ns), dtype=float)
        pst = none if pen_slope is None else np.asarray(pen_slope(ns), dtype=float)
        st = np.asarray(costs.step_s(np.arange(1, B + 2, dtype=float)), dtype=float)
        have = np.ones(len(ns), dtype=bool)  # filled whole
    return plan_rows(
        powers,
        cum,
        bound,
        per_step,
        w,
        float(costs.shared_s),
        int(iterations),
        spec,
        have,
        vs,
        vsl,
        pt,
        pen is not None,
        pst,
        pen_slope is not None,
        st,
        bool(costs.block),
        float(costs.draft_fixed_s),
        float(costs.overhead_s),
    )


def slo_floor_plan(
    plan: RoundPlan,
    a: np.ndarray,
    kcap: np.ndarray,
    costs: CostFunctions,
    tpot_s: float,
    stretch: float = 1.0,
    extra_s: float = 0.0,
    lost: np.ndarray | None = None,
    weight: np.ndarray | None = None,
) -> RoundPlan:
    """``plan`` with each row's draft lengths raised to the SLO floor: a sequence predicted to
    miss the TPOT SLO ``tpot_s`` at its goodput length (``stretch · T_r + extra_s`` over its
    expected tokens, as :func:`slo_goodput_row` predicts it) drafts the shortest length that
    meets it, if one within the row's cap and its own bound does; the others keep theirs, and
    ``lost`` sequences (past their TTFT SLO) are left alone. Round times, expected tokens and
    goodput are recomputed for the raised rows (``a``, ``kcap``, ``costs`` and ``weight`` as
    :func:`plan_round_lengths` took them): goodput subject to each sequence's SLO, where the
    goodput plan alone lets a low-acceptance sequence's length fall to what pays in tokens."""
    assert plan.seconds_by_cap is not None
    k = plan.k_by_cap
    B = k.shape[1]
    if not B or not np.isfinite(tpot_s):
        return plan
    cum = plan.cum if plan.cum is not None else _powers(a, int(plan.caps.max()))[1]
    # the shortest length whose expected tokens reach the tokens a round needs (cum rises
    # with k; per-position rates may know fewer positions than the cap: none then)
    k, raised = floor_lengths(
        k,
        cum,
        plan.seconds_by_cap,
        np.atleast_1d(np.asarray(stretch, dtype=float)),
        np.atleast_1d(np.asarray(extra_s, dtype=float)),
        float(tpot_s),
        plan.caps.astype(np.int64),
        np.asarray(kcap, dtype=np.int64),
        np.zeros(B, dtype=bool) if lost is None else np.asarray(lost, dtype=bool),
    )
    if not raised:
        return plan
    # the raised rows' round times, expected tokens and goodput (as plan_round_lengths's)
    w = np.ones(B) if weight is None else np.asarray(weight, dtype=float)
    n_hi = B + int(k.sum(axis=1).max())
    # (no iteration: the powers and each cap's draft steps are not read)
    k, g, t, e = _plan_rows(cum, cum, k, plan.caps.astype(np.int64), w, costs, 0, n_hi)
    best = int(np.argmax(g))
    return RoundPlan(
        k=k[best].copy(),
        cap=int(k[best].max()),
        caps=plan.caps,
        k_by_cap=k,
        goodput=g,
        seconds=float(t[best]),
        seconds_by_cap=t,
        expected=e,
        cum=cum,
    )


def _powers(a, K: int) -> tuple[np.ndarray, np.ndarray]:
    """``(K+1, B)``: P(token j accepted) and its running sum, ``E(a_i, k)`` at row k (``a`` as
    :func:`plan_round_lengths` takes it)."""
    a = np.asarray(a, dtype=float)
    if a.ndim == 2:
        return position_powers(a, K)
    a = np.minimum(np.maximum(a, 0.0), 1.0)  # np.clip, fewer calls
    powers = a[None, :] ** np.arange(K + 1)[:, None]
    return powers, np.add.accumulate(powers, axis=0)


def mean_tpot_row(plan: RoundPlan) -> int:
    """The row of ``plan`` with the least mean predicted time per token over its sequences,
    ``T_r · mean_i 1 / E_ir`` (the higher goodput among rows within 1e-9, relative)."""
    assert plan.expected is not None and plan.seconds_by_cap is not None
    return _best_row(mean_tpot_scores(plan.seconds_by_cap, plan.expected), plan.goodput)


def slo_goodput_row(
    plan: RoundPlan,
    tpot_s: float,
    decode_s: np.ndarray | None = None,
    tokens: np.ndarray | None = None,
    horizon: float = 1.0,
    spread: float = 0.1,
    lost: np.ndarray | None = None,
    stretch: float = 1.0,
    rank: str = "slo-goodput",
    extra_s: float = 0.0,
    horizon_tokens: float = 0.0,
    hurdle: float = 0.0,
) -> int:
    """The row of ``plan`` that best serves the TPOT SLO ``tpot_s``.

    A sequence's predicted TPOT under row r is its own TPOT so far carried ``horizon`` rounds
    like this one: ``p_ir = (D_i + h·s·T_r) / (n_i + h·E_ir)``, with ``D_i`` seconds since its
    first token over ``n_i`` tokens since (``decode_s``, ``tokens``; None = new sequences,
    ``p_ir = s·T_r / E_ir``), or, with ``horizon_tokens`` H > 0, carried H more tokens at the
    row's time per token, ``p_ir = (D_i + H·s·T_r / E_ir) / (n_i + H)`` (H: a sequence's
    expected remaining output); ``s`` = ``stretch``: the factor by which the time a sequence
    waits exceeds the planned rounds, ``1 / (1 − ρ)`` when a share ρ of the replica's time goes
    to prompt chunks the plan does not carry (prefill work arrives at its own rate, so it
    stretches every planned second alike). It meets the SLO with probability ``σ((tpot_s −
    p_ir) / (spread · tpot_s))`` (logistic: requests of equal prediction differ in the prompt
    chunks they will sit through; ``spread`` = 0 is the hard cut ``p_ir ≤ tpot_s``).
    ``extra_s`` is added to every row's ``s·T_r``: prompt chunks as a fixed cost a round, which
    longer drafts amortise (``slo_prefill = "additive"``), where the stretch scales them. Both
    are scalars, or one per sequence (``slo_prefill = "backlog"``, :mod:`control.prefill_backlog`).

    ``rank`` = ``"attainment"``: the row with the highest expected share of *requests* meeting
    the SLO, the higher goodput among ties (within 1e-9), then the shorter cap. ``rank`` =
    ``"slo-goodput"``: the row with the most SLO goodput, its goodput times the share of its
    expected *tokens* that come from sequences meeting the SLO. Under the hard cut either is
    the goodput choice when every sequence meets it in every row. ``lost`` (bool per
    sequence): requests already past their TTFT SLO; they count in no share, and when every
    sequence is lost this is the goodput choice. ``hurdle`` > 0 (``"attainment"`` only): the
    lowest cap whose expected share is within ``hurdle`` of the best row's, so a longer cap
    must be predicted to serve that much more of the batch."""
    assert plan.expected is not None and plan.seconds_by_cap is not None
    B = plan.expected.shape[1]
    lost_ = np.zeros(B, dtype=bool) if lost is None else np.asarray(lost, dtype=bool)
    if lost_.all():  # (and a batch of none: every row's score is 0)
        return int(np.argmax(plan.goodput))
    history = decode_s is not None and tokens is not None
    none = np.zeros(0)
    score = slo_scores(
        plan.expected,
        plan.seconds_by_cap,
        plan.goodput,
        float(tpot_s),
        np.asarray(decode_s, dtype=float) if history else none,
        np.asarray(tokens, dtype=float) if history else none,
        history,
        float(horizon),
        float(horizon_tokens),
        float(spread),
        lost_,
        np.atleast_1d(np.asarray(stretch, dtype=float)),
        np.atleast_1d(np.asarray(extra_s, dtype=float)),
        rank == "attainment",
    )
    if hurdle > 0.0 and rank == "attainment":  # rows run from the lowest cap up
        return int(np.argmax(score >= score.max() - hurdle))
    return _best_row(score, plan.goodput)


def binding_hurdle(
    hurdle: float, start: float, tpot_s: float, decode_s: np.ndarray, tokens: np.ndarray
) -> float:
    """The rank's ``hurdle`` (:func:`slo_goodput_row`) while the TPOT SLO ``tpot_s`` binds: the
    batch's mean TPOT so far (each sequence's ``decode_s`` over its ``tokens``, those with a
    token) at least ``start`` of it, and ``hurdle`` of the batch at least one sequence; else
    0 (the best row)."""
    if hurdle <= 0.0 or len(tokens) * hurdle < 1.0:  # (no array work when off)
        return 0.0
    has = tokens > 0.0
    if not has.any():
        return 0.0
    so_far = float(np.mean(decode_s[has] / tokens[has]))
    return hurdle if so_far >= start * tpot_s else 0.0


def _best_row(score: np.ndarray, goodput: np.ndarray) -> int:
    """The row of the highest ``score``, the higher goodput among rows within 1e-9 of it
    (relative: scores below 0, from a penalty that outweighs the tokens, keep the best row
    among them), then the first."""
    return int(best_row(np.asarray(score, dtype=float), np.asarray(goodput, dtype=float)))
