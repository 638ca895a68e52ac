"""``vllm-adaptive-verification``: vLLM's adaptive verification (``enable_adaptive_verification``).

From vLLM's documentation: every (request, position) draft slot is scored by its *survival
probability*, the running product of that request's per-position acceptance estimates; the
highest-scoring slots are admitted across the batch until a global budget of verified tokens is
spent, so position 5 of a confident request can outrank position 1 of a doubtful one. The
budget is the token count that maximises expected accepted tokens per second on a step-cost
model profiled at startup; with a Dynamic SD table it is ``N × K`` (N requests, K the table's
for N). ``num_speculative_tokens`` is each request's window. The estimates come from the
drafter's confidence head where it has one (DSpark), else from an online estimator
recalibrated against verification results.

How the lab runs it, where its engines differ or the doc is silent:

- A round's draft length is decided before drafting, so a request's estimate of position j
  comes from its earlier rounds, at the positions they tried (every earlier token accepted):
  with a confidence head (``acceptance_source`` "confidence", or "auto" when the drafter
  reports confidences) the head's confidences there, else ("online") the outcomes there. The
  estimate is ``(Σ evidence + w·q_j) / (Σ weights + w)`` with the request's evidence forgotten
  over ``memory_rounds`` rounds and ``w = prior_trials``; ``q_j`` is the pooled acceptance at j
  over every request (outcome counts forgotten over ``pooled_memory_rounds``, shrunk to
  ``alpha_prior`` by ``prior_trials``). A position nobody tries any more drifts back to the
  prior, so no estimate locks a position out for good. vLLM documents none of these knobs
  (its online estimator is a logistic model of the draft logits); they are ours.
- The step-cost model is :class:`control.costmodel.RoundCostModel` learned from the rounds
  seen, seeded with the engine's start-up profile when it has one (``profile_prior_rounds``).
  The budget ``m`` of draft slots maximises ``(B + Σ_{admitted} S) / T(k(m))``: the batch's
  expected emitted tokens (the B bonus tokens included) over the round time predicted for the
  draft lengths ``k(m)`` that admitting the best ``m`` slots gives
  (:func:`control.goodput.round_seconds`); the smallest ``m`` among ties. Until the cost model
  is ready every request verifies its full window (adaptive verification off).
- Slots tie-break by position, then batch order, so each request's admitted slots are a prefix.
- With a block drafter (one forward drafts every request's whole window) whose confidences it
  reads, the round's own drafted block is scored, as vLLM scores a DSpark block by its head's
  confidences: every request drafts its window and the driver cuts it where the running
  product of the block's confidences falls below the score of the m-th slot the estimates
  admitted (``Decision.survival``), so the budget holds in expectation rather than exactly.
- A Dynamic SD table (``rows`` > 0) sets the budget to ``N × K`` (``dsd_budget = "exact"``,
  vLLM's rule), or only caps the cost-model budget (``"cap"``, not expressible in vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.batch import BatchContext, RoundPlanner, RoundStats
from control.configio import param
from control.costmodel import RoundCostModel
from control.goodput import round_seconds
from control.peer_common import (
    DECISIONS,
    K_LIMIT,
    MAX_ROWS,
    DsdTableFields,
    PeerController,
    check_dsd,
    dsd_k,
    dsd_rows,
    fold_pending,
    position_counts,
)
from control.types import Decision


@dataclass(frozen=True)
class VllmVerificationConfig(DsdTableFields):
    # the doc's DSpark example: a 7-token window (DSpark's block)
    num_speculative_tokens: int = param(
        7, lo=1, hi=K_LIMIT, doc="each request's draft window", tune=(1, 16)
    )
    # no Dynamic SD table unless asked (0 rows): the budget comes from the cost model
    rows: int = param(0, lo=0, hi=MAX_ROWS, doc="rows of a Dynamic SD table (0 = none)")
    # vLLM: the table's N × K is the budget
    dsd_budget: str = param(
        "exact",
        choices=("exact", "cap"),
        doc="with a table: budget = N × K (vLLM), or the cost-model budget capped by it",
    )
    # vLLM reads a confidence head when the drafter has one, else its online estimator
    acceptance_source: str = param(
        "auto",
        choices=("auto", "confidence", "online"),
        doc="per-position estimates: drafter confidences, own outcomes, or auto",
    )
    # ours (vLLM documents no knob): a request's own evidence spans its last ~8 rounds
    memory_rounds: float = param(
        8.0, lo=1.0, hi=1e6, doc="forgetting horizon of a request's own evidence (rounds)"
    )
    # ours: the pooled rates follow the workload over ~128 rounds
    pooled_memory_rounds: float = param(
        128.0, lo=1.0, hi=1e6, doc="forgetting horizon of the pooled rates (rounds)"
    )
    # ours: 4 pseudo-trials of the pooled rate behind each request's estimate
    prior_trials: float = param(
        4.0, lo=0.01, hi=1e6, doc="pseudo-trials of the prior behind each estimate"
    )
    # ours: the prior of vLLM's Adaptive K for positions never observed
    alpha_prior: float = param(0.85, lo=0.0, hi=1.0, doc="pooled rate before any round")
    # 0.99 per round: the cost fit remembers ~100 rounds, as dspark's
    cost_forget: float = param(0.99, lo=0.5, hi=1.0, doc="forgetting factor of the step costs")
    # an engine's start-up profile counts as 32 rounds (vLLM profiles its step costs at start)
    profile_prior_rounds: float = param(
        32.0, lo=0.0, hi=1e6, doc="weight of a seeded start-up cost profile, in rounds"
    )

    def __post_init__(self) -> None:
        check_dsd(self)


def admission(scores: np.ndarray) -> np.ndarray:
    """Batch index of each draft slot in admission order: survival ``scores`` (K, B) high
    first, ties by position then batch order (each request's admitted slots are a prefix)."""
    K, B = scores.shape
    pos = np.repeat(np.arange(K), B)
    seq = np.tile(np.arange(B), K)
    order = np.lexsort((seq, pos, -scores.reshape(-1)))
    return seq[order]


def lengths_by_budget(owner: np.ndarray, B: int) -> np.ndarray:
    """``(m + 1, B)``: the draft lengths after admitting the first m slots, m = 0..len."""
    onehot = np.zeros((len(owner) + 1, B), dtype=np.int64)
    onehot[np.arange(1, len(owner) + 1), owner] = 1
    return np.cumsum(onehot, axis=0)


class VllmVerificationPlanner(RoundPlanner):
    """Admits draft slots across the batch up to the round's budget."""

    def __init__(self, config: VllmVerificationConfig) -> None:
        self.config = config
        self.rows = dsd_rows(config)
        self.costs = RoundCostModel(forget=config.cost_forget)
        self.reset()

    def reset(self) -> None:
        self.costs.reset()
        n = self.config.num_speculative_tokens
        self.succ = np.zeros(n)  # pooled accepted counts by position, forgotten
        self.tried = np.zeros(n)  # pooled tried counts by position, forgotten
        self.members: Sequence[Any] = ()
        self.last_budget = -1  # draft slots admitted by the last plan
        self.rounds = 0
        self._cut: dict[tuple[int, float], Decision] = {}  # window and survival stop

    @property
    def wants_costs_seed(self) -> bool:
        """Whether a measured start-up profile would be used."""
        return self.config.profile_prior_rounds > 0

    def seed_costs(self, rows) -> None:
        """The engine's start-up cost profile as the prior of the step costs."""
        self.costs.seed(rows, self.config.profile_prior_rounds)

    def pooled(self) -> np.ndarray:
        """The pooled conditional acceptance ``q_j`` by position (module docstring)."""
        c = self.config
        return (self.succ + c.prior_trials * c.alpha_prior) / (self.tried + c.prior_trials)

    def scores(self, members: Sequence[Any], K: int) -> np.ndarray:
        """``(K, B)`` survival probabilities: the running products of the estimates."""
        q = self.pooled()[:K]
        w = self.config.prior_trials
        ev = np.array([m.evidence for m in members], dtype=float)[:, :, :K]  # (B, 2, K)
        est = (ev[:, 0] + w * q) / (ev[:, 1] + w)
        return np.cumprod(np.clip(est.T, 0.0, 1.0), axis=0)

    def budget(self, S: np.ndarray, ks: np.ndarray, batch: BatchContext) -> int:
        """Draft slots to admit (module docstring): the cost-model optimum, or the table's."""
        K, B = S.shape
        full = K * B
        table = B * dsd_k(self.rows, B) if self.rows else full
        if self.rows and self.config.dsd_budget == "exact":
            return min(table, full)
        if not self.costs.ready:
            return min(table, full)
        order = np.sort(S.reshape(-1))[::-1]
        emitted = B + np.concatenate(([0.0], np.cumsum(order)))
        funcs = self.costs.functions(
            batch.context_tokens,
            backlog=batch.prefill_backlog,
            budget=batch.token_budget,
            block=batch.block_draft,
        )
        seconds = np.maximum(round_seconds(ks, funcs), 1e-12)
        best = int(np.argmax(emitted / seconds))
        return min(best, table)

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        self.members = members
        B = len(members)
        K = self.config.num_speculative_tokens
        if batch.max_draft is not None:
            K = min(K, batch.max_draft)
        if K <= 0 or B == 0:
            self.last_budget = 0
            return [DECISIONS[0]] * B
        S = self.scores(members, K)
        ks = lengths_by_budget(admission(S), B)
        m = self.budget(S, ks, batch)
        self.last_budget = m
        if 0 < m < K * B and batch.block_draft and self.config.acceptance_source != "online":
            # the drafted block's own confidences score its slots (module docstring)
            theta = round(float(np.partition(S.reshape(-1), K * B - m)[K * B - m]), 3)
            d = self._cut.get((K, theta))
            if d is None:
                if len(self._cut) > 4096:
                    self._cut.clear()
                d = self._cut[(K, theta)] = Decision(k=K, survival=theta)
            return [d] * B
        return [DECISIONS[k] for k in ks[m].tolist()]

    def observe_round(self, stats: RoundStats) -> None:
        self.rounds += 1
        self.costs.observe(stats)
        for m in self.members:
            m.learn()
        pairs = fold_pending(self.members)
        keep = 1.0 - 1.0 / self.config.pooled_memory_rounds
        self.succ *= keep
        self.tried *= keep
        if pairs:
            tried, acc = position_counts(pairs, len(self.tried))
            self.tried += tried
            self.succ += acc

    def state(self) -> dict[str, Any]:
        return {
            "budget": self.last_budget,
            "rounds": self.rounds,
            "pooled": self.pooled().tolist(),
        }


class VllmVerificationController(PeerController):
    name = "vllm-adaptive-verification"
    config_class = VllmVerificationConfig
    planner_class = VllmVerificationPlanner

    def __init__(self, config: VllmVerificationConfig | None = None) -> None:
        super().__init__(config)
        # the simulator hands confidences only to controllers that read them
        self.reads_confidences = self.config.acceptance_source != "online"

    def reset(self) -> None:
        super().reset()
        #: row 0: Σ evidence (outcomes or confidences) at each position, row 1: Σ weights;
        #: both forgotten at 1/memory_rounds per round
        self.evidence = np.zeros((2, self.config.num_speculative_tokens))
        self.pending_conf: list[tuple[float, ...]] = []  # confidences of the pending rounds

    def own_round(self, drafted: int, accepted: int, confidences: tuple[float, ...]) -> None:
        self.pending_conf.append(confidences)

    def learn(self) -> None:
        """Fold the rounds since the planner last read them into this request's evidence:
        at each position a round tried, its confidence there (confidence source) or whether
        it was accepted (online). Every round forgets; a round that drafted nothing too."""
        src = self.config.acceptance_source
        keep = 1.0 - 1.0 / self.config.memory_rounds
        ev = self.evidence
        n = ev.shape[1]
        rounds = list(zip(self.pending, self.pending_conf))
        self.pending_conf = []
        ev *= keep ** max(len(rounds), 1)
        for (drafted, accepted), confidences in rounds:
            tried = min(accepted + 1, drafted, n)
            if src != "online" and confidences:  # the head's predictions ("auto": when given)
                ev[0, :tried] += confidences[:tried]
            else:
                ev[0, : min(accepted, n)] += 1.0
            ev[1, :tried] += 1.0
