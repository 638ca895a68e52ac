"""Round costs learned online from observed rounds (no controller reads the simulator's model).

A batched round costs ``draft_steps · step_s(drafting, context) + verify_s(tokens, context)``
plus a fixed overhead. Both parts are linear in a few features and fitted by exponentially
weighted least squares (recursive least squares with forgetting, kept as its sufficient
statistics so it stays well conditioned) with a small ridge pull toward a prior:

    θ = argmin Σ_t λ^(T−t) (y_t − x_tᵀθ)² + ρ‖θ − θ₀‖²

- **verify**: ``x = [1, N, ctx/1000, relu(N − κ) for κ in knots]``: a piecewise-linear cost in
  the verified tokens ``N`` (hinges at powers of two, so the fit can follow the roofline's turn
  from memory-bound to compute-bound) plus the context read. A hinge that no observed round
  reached keeps its prior (0), so the cost beyond the observed range extends the last observed
  slope: the roofline is convex, so this under-estimates there and the planner goes and looks.
- **draft phase**: ``x = [1, steps · [1, drafting sequences, ctx/1000]]`` plus the tokens the
  drafter prefills in the same round (prompt chunks under chunked prefill, and its catch-up
  on tokens it missed in rounds it did not draft), fitted on ``draft_s``. The leading 1 is
  the phase's fixed cost, paid once by a round that drafts at all (a real engine's launch,
  the feed of the last committed tokens, the host sync: ~0.8 ms against a 0.5 ms step on the
  CPU engine); left out, it and the catch-up inflate the per-step cost and the planner drafts
  ever less. It is pulled toward 0 (a tenth of its data weight): rounds at one draft length
  alone cannot tell it from the step, and a step cost that is not linear in the drafting rows
  (a simulated roofline at batch 256) would otherwise park its misfit there and make every
  draft look dearer (the capacity cells of ``benchmarks/controller_value.py`` at batch 256
  show it: a weaker pull drafts fewer tokens a round there).
- **prefill sharing the pass**: a round's verify features use every token of its target pass,
  the drafts' ``Σ(k_i + 1)`` and ``prefill_tokens`` of prompt chunks alike.
- **overhead**: an exponential average of ``(end − start) − draft_s − verify_s``.
- **robust**: both fits weight a round down when its residual is far beyond the typical one
  (Huber), so an engine's occasional slow round does not tilt the costs.

``seed`` takes rows of a measured table (e.g. the engine's ``latency.csv``) as prior rounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from control.batch import RoundStats
from control.cost_kernel import (
    KIND_BUDGET,
    KIND_NONE,
    KIND_SHARED,
    SPEC_VALUE,
    SpecFunction,
    cost_spec,
    draft_rows,
    fold_rows,
    ls_update,
    ridge_solve,
    verify_rows,
)
from control.goodput import CostFunctions

#: Hinge positions (verified tokens per round) of the verify cost.
KNOTS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class LinearCost:
    """Exponentially weighted least squares with a ridge pull toward ``prior``, robust to
    outliers: a row whose residual against the current fit exceeds ``huber`` times the typical
    absolute residual (an exponential average, ``scale``) is weighted down in proportion
    (Huber's weights), so one slow round of a noisy machine (a page fault, another process)
    does not tilt the fit; a lasting change moves ``scale`` and is followed within tens of
    rounds. ``huber = 0``: plain least squares."""

    __slots__ = (
        "_A",
        "_A0",
        "_b",
        "_b0",
        "_dirty",
        "_theta",
        "count",
        "forget",
        "huber",
        "prior",
        "ridge",
        "scale",
    )

    def __init__(
        self,
        n_features: int,
        forget: float = 0.99,
        ridge: float | Sequence[float] = 1e-10,
        prior: Sequence[float] | None = None,
        huber: float = 3.0,
    ) -> None:
        if not 0.0 < forget <= 1.0:
            raise ValueError(f"forgetting factor must be in (0, 1], got {forget}")
        self.forget, self.huber = forget, huber
        self.ridge = np.broadcast_to(np.asarray(ridge, dtype=float), (n_features,)).copy()
        self.prior = np.zeros(n_features) if prior is None else np.asarray(prior, float)
        self._A0 = np.zeros((n_features, n_features))  # a measured profile, never forgotten
        self._b0 = np.zeros(n_features)
        self.reset()

    def set_prior_rows(self, X: np.ndarray, y: np.ndarray, weight: float) -> None:
        """Rows of a measured profile as a prior worth ``weight`` observations in all, spread
        over the rows and never forgotten (``reset`` keeps it): where the observed rounds span
        a feature widely they outweigh it, where they crowd at one value (a planner that drafts
        the same length round after round) the profile keeps that coefficient where it was
        measured. ``weight = 0`` removes it."""
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        w = float(weight) / max(len(y), 1)
        self._A0 = w * (X.T @ X)
        self._b0 = w * (X.T @ y)
        self._dirty = True

    def reset(self) -> None:
        n = len(self.prior)
        self._A = np.zeros((n, n))
        self._b = np.zeros(n)
        self._theta = self.prior.copy()
        self._dirty = bool(self._A0.any())
        self.count = 0.0  # effective number of observations (decays with forgetting)
        self.scale = 0.0  # typical |residual| against the fit (0: none yet)

    def update(self, x: np.ndarray, y: float) -> None:
        self.update_many(np.asarray(x, dtype=float)[None, :], np.array([y], dtype=float))

    def update_many(self, X: np.ndarray, y: np.ndarray) -> None:
        """Rows ``X`` (oldest first) with targets ``y``: one ``update`` per row, except that
        the robust weights of the rows are taken against the fit before all of them."""
        if not len(y):
            return
        X = np.ascontiguousarray(X, dtype=float)
        y = np.ascontiguousarray(y, dtype=float)
        theta = self.theta if self.count > 0.0 and self.huber > 0.0 else self.prior
        self.count, self.scale = ls_update(
            self._A, self._b, X, y, theta, self.count, self.scale, self.forget, self.huber
        )
        self._dirty = True

    @property
    def theta(self) -> np.ndarray:
        if self._dirty:
            # ridge per feature, relative to that feature's own weight in the data (scale
            # free); a feature never seen keeps its prior exactly
            theta, ok = ridge_solve(self._A, self._A0, self._b, self._b0, self.ridge, self.prior)
            self._theta = theta if ok else self.prior.copy()
            self._dirty = False
        return self._theta

    def predict(self, X: np.ndarray) -> np.ndarray:
        return X @ self.theta


_KNOT_ARRAY = np.array(KNOTS, dtype=float)


def verify_seed_row(
    batch: int, per_row: int, context: float, seconds: float
) -> tuple[str, int, int, float, float]:
    """A :meth:`RoundCostModel.seed` row for a verify pass of ``batch`` rows × ``per_row``
    tokens: it holds the pass's ``batch · per_row`` verified tokens, as
    ``RoundStats.verify_tokens`` counts a round's (what the fit reads on that axis)."""
    return ("verify", batch, batch * per_row, float(context), seconds)


def verify_features(tokens: np.ndarray | float, context_tokens: np.ndarray | float) -> np.ndarray:
    """Feature rows ``[1, N, ctx/1000, relu(N − κ)...]`` for verified tokens ``N`` (array)."""
    n = np.atleast_1d(np.asarray(tokens, dtype=float))
    ctx = np.broadcast_to(np.asarray(context_tokens, dtype=float), n.shape)
    return verify_rows(n, ctx, _KNOT_ARRAY)


def draft_features(
    steps: np.ndarray | float,
    drafting: np.ndarray | float,
    context_tokens: np.ndarray | float,
    prefill_tokens: np.ndarray | float = 0.0,
    phase: float | None = None,
) -> np.ndarray:
    """Feature rows of a draft phase: ``1`` (the phase's fixed cost, when it drafts: ``phase``
    overrides), ``steps · [1, drafting sequences, ctx/1000]`` (each step one drafter forward
    over the drafting rows) and ``prefill/1000`` (prompt chunks the drafter also prefills in
    the round's first step); ``steps = 1, phase = 0``, no prefill: one step's own features."""
    d = np.atleast_1d(np.asarray(drafting, dtype=float))
    k, ctx, pre = (
        np.broadcast_to(np.asarray(x, dtype=float), d.shape)
        for x in (steps, context_tokens, prefill_tokens)
    )
    return draft_rows(k, d, ctx, pre, np.nan if phase is None else float(phase))


class RoundCostModel:
    """Draft-step, verify and overhead costs of a batched round, learned from ``RoundStats``."""

    def __init__(self, forget: float = 0.99, overhead_ema: float = 0.05) -> None:
        # a hinge is a change of slope: held near 0 (10⁻⁴ of its data weight) unless the rounds
        # demand it, so two token counts give a straight line, not an arbitrary kink
        self.verify = LinearCost(3 + len(KNOTS), forget, [1e-10] * 3 + [1e-4] * len(KNOTS))
        # the phase's fixed cost: pulled toward 0 (see the module docstring)
        self.step = LinearCost(5, forget, [1e-1] + [1e-10] * 4)
        self.overhead_ema = overhead_ema
        self._seed_levels: set[int] = set()  # token counts of a seeded profile (kept by reset)
        self.reset()

    def reset(self) -> None:
        self.verify.reset()
        self.step.reset()
        self.overhead_s = 0.0
        self.rounds = 0
        self.token_levels: set[int] = set()  # distinct N seen (identifiability of the slope)
        self._pending: list[tuple] = []  # rounds not yet folded into the fits
        self.prefill_tokens = 0.0  # recent prompt-chunk tokens per round (average, 1/10)

    def observe(self, s: RoundStats) -> None:
        """O(1): the round is buffered and folded into the fits when a cost is next read
        (exactly as if folded now: the updates are the same, in the same order)."""
        self.rounds += 1
        self._pending.append(
            (
                s.verify_tokens + s.prefill_tokens,
                s.context_tokens,
                s.verify_s,
                s.draft_steps,
                s.drafting,
                s.draft_s,
                s.prefill_tokens + s.catchup_tokens,
            )
        )
        if len(self.token_levels) < 4:
            self.token_levels.add(s.verify_tokens + s.prefill_tokens)
        self.prefill_tokens += 0.1 * (s.prefill_tokens - self.prefill_tokens)
        extra = (s.end_s - s.start_s) - s.draft_s - s.verify_s
        if extra >= 0.0:
            self.overhead_s += self.overhead_ema * (extra - self.overhead_s)

    def fold(self) -> None:
        """Fold the buffered rounds into the fits (every cost read does it first)."""
        rows = self._pending
        if not rows:
            return
        self._pending = []
        Xv, yv, Xd, yd = fold_rows(np.array(rows, dtype=float), _KNOT_ARRAY)
        self.verify.update_many(Xv, yv)
        # the draft fit forgets per observed draft phase (one update per round that had one)
        if len(yd):
            self.step.update_many(Xd, yd)

    def seed(
        self, rows: Iterable[tuple[str, int, int, float, float]], weight: float = 32.0
    ) -> None:
        """A measured profile (e.g. the engine's ``latency.csv``, or an engine timing itself at
        start-up) as the fits' prior, worth ``weight`` rounds in all and never forgotten
        (:meth:`LinearCost.set_prior_rows`; ``reset`` keeps it). Rows ``(path, batch, tokens,
        context, seconds)``: path ``"verify"`` (a pass of ``tokens`` verified tokens in all over
        ``batch`` rows: :func:`verify_seed_row`),
        ``"draft"`` (a draft phase of ``tokens`` steps over ``batch`` drafting rows) or ``"drafter_prefill"``
        (the drafter fed ``tokens`` tokens in one pass). Rounds then refine it: the slope of the
        verify cost, which rounds crowded at one draft length cannot measure, stays the
        profile's until they spread."""
        self.fold()
        vx, vy, dx, dy = [], [], [], []
        for path, batch, tokens, ctx, seconds in rows:
            if path == "verify":
                vx.append(verify_features(tokens, ctx)[0])
                vy.append(seconds)
                self._seed_levels.add(int(tokens))
            elif path == "draft":
                dx.append(draft_features(float(tokens), batch, ctx)[0])
                dy.append(seconds)
            elif path == "drafter_prefill":
                dx.append(draft_features(0.0, 0.0, ctx, tokens, phase=0.0)[0])
                dy.append(seconds)
            else:
                raise ValueError(
                    f"unknown cost path {path!r}; allowed: verify, draft, drafter_prefill"
                )
        if vy:
            self.verify.set_prior_rows(np.array(vx), np.array(vy), weight)
        if dy:
            self.step.set_prior_rows(np.array(dx), np.array(dy), weight)

    @property
    def ready(self) -> bool:
        """True once the verify slope is identifiable (rounds at ≥ 2 token counts), or after 16
        rounds at one count (a driver that never varies it, e.g. a replayed trace): the slope
        then keeps its prior, 0 — verification flat in tokens, as small batches are."""
        return len(self.token_levels | self._seed_levels) >= 2 or self.rounds >= 16

    def verify_s(self, tokens: np.ndarray, context_tokens: float) -> np.ndarray:
        self.fold()
        return np.maximum(self.verify.predict(verify_features(tokens, context_tokens)), 0.0)

    def verify_slope(self, tokens: np.ndarray) -> np.ndarray:
        """∂verify_s/∂N at ``tokens`` (seconds per extra verified token), never negative."""
        self.fold()
        th = self.verify.theta
        n = np.atleast_1d(np.asarray(tokens, dtype=float))
        slope = th[1] + (n[:, None] > _KNOT_ARRAY[None, :]) @ th[3:]
        return np.maximum(slope, 0.0)

    def step_s(self, drafting: np.ndarray, context_tokens: float) -> np.ndarray:
        """One drafter step over ``drafting`` rows (no prefill)."""
        self.fold()
        x = draft_features(1.0, drafting, context_tokens, phase=0.0)
        return np.maximum(self.step.predict(x), 0.0)

    def functions(
        self,
        context_tokens: float,
        prefill_tokens: float | None = None,
        backlog: int = 0,
        budget: int | None = None,
        batch_size: int = 0,
        prompt_value: float = 0.0,
        block: bool = False,
        sunk: bool = False,
    ) -> CostFunctions:
        """The fitted costs at one context size, as the vectorised functions a plan calls
        (θ read once: cheaper than going through ``verify_s``/``step_s`` per call).

        Prompt tokens sharing the pass are work the run must do whatever the draft lengths, so
        the verify time charged to a round's decode is the pass's time **less the prompt chunk's
        own share**, ``raw(n + p) − (raw(p) − raw(0))``: with a linear cost exactly ``raw(n)``,
        with a convex one (compute-bound passes) more, since the drafts then sit on the steep
        part. Counting the whole pass instead would add a fixed cost to the round and bias the
        goodput ratio toward longer drafts whenever a prompt is in flight. ``sunk``: the plain
        step's own share, ``shared_s`` (:func:`_plain_share`), is left out of it too (else 0).

        With a token ``budget`` per pass and a prompt ``backlog`` (chunked prefill) the chunk is
        ``p(n) = min(backlog, budget − n)``: a draft that pushes a prompt token out of the pass
        is charged that token's time (it is deferred, not saved), and, with ``prompt_value``,
        the output tokens the wait is worth (against a round of ``batch_size`` plain steps).
        ``block``: a block drafter's rounds (one draft forward whatever the lengths). A budget
        and no backlog: the pass carries the drafts alone. An engine that reports no budget
        shares its passes with ``prefill_tokens`` (default: the recent average)."""
        self.fold()
        tv, ts = self.verify.theta, self.step.theta
        v0 = float(tv[0] + tv[2] * context_tokens / 1000.0)
        s0 = float(ts[1] + ts[3] * context_tokens / 1000.0)
        fixed = max(float(ts[0]), 0.0)
        line = (float(tv[1]), _KNOT_ARRAY, tv[3:], s0, float(ts[2]))
        if budget and backlog > 0:
            cap = float(budget)
            free = min(float(backlog), max(cap - batch_size, 0.0))
            value = prompt_value if prompt_value > 0.0 else 0.0
            spec = cost_spec(
                KIND_BUDGET, v0, *line, backlog=backlog, cap=cap, value=value, free=free
            )
        else:
            if prefill_tokens is not None:
                pre = float(prefill_tokens)
            else:  # an engine with a budget reports its backlog: none waiting, no chunk
                pre = 0.0 if budget else self.prefill_tokens
            if pre == 0.0 and bool(np.isfinite(tv).all()):
                # no chunk: raw(n + 0) − (raw(0) − raw(0)) is raw(n), float for float
                spec = cost_spec(KIND_NONE, v0, *line)
                f = SpecFunction
                return CostFunctions(
                    f(spec, "verify"),
                    f(spec, "verify_slope"),
                    f(spec, "step"),
                    self.overhead_s,
                    None,
                    None,
                    fixed,
                    block,
                    spec=spec,
                )
            spec = cost_spec(KIND_SHARED, v0, *line, pre=pre)
        f = SpecFunction
        verify_s = f(spec, "verify")
        pen = spec[SPEC_VALUE] > 0.0
        shared = _plain_share(verify_s, f(spec, "raw"), batch_size) if sunk else 0.0
        return CostFunctions(
            verify_s,
            f(spec, "verify_slope"),
            f(spec, "step"),
            self.overhead_s,
            f(spec, "penalty") if pen else None,
            f(spec, "penalty_slope") if pen else None,
            fixed,
            block,
            shared,
            spec=spec,
        )


def _plain_share(verify_s, raw, batch_size: int) -> float:
    """What the plain step of ``batch_size`` sequences is charged in a pass it shares with a
    prompt chunk beyond its cost alone, ``verify_s(B) − raw(B)`` (≥ 0 on a convex cost: its
    tokens sit on the chunk's steep part): paid whatever the drafts, so while prompts queue
    (time is the bottleneck) the goodput ratio leaves it out
    (:attr:`~control.goodput.CostFunctions.shared_s`)."""
    if batch_size <= 0:
        return 0.0
    b = np.array([float(batch_size)])
    return max(float(verify_s(b)[0] - raw(b)[0]), 0.0)
