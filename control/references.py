"""Honest references for batched serving (simulator only: they are told what no engine knows).

- ``clairvoyant`` — *clairvoyant, one round ahead*. Before each round it is told every sequence's
  run length ``L_i`` (how many drafted tokens the target would accept from here). Sequence ``i``
  then drafts ``min(L_i, m)`` for the round's cap ``m``, which emits exactly
  ``min(L_i, m) + 1`` tokens, and the cap maximises ``(Σ_i min(L_i, m) + B) / T(B, m)`` with
  ``T`` from the same online cost model the causal planner learns (it knows the future of
  acceptance, not the hardware). At batch 1 with ``L`` known this is the best any controller can
  do in one round; across rounds it is greedy (one round ahead), so it is a reference, not a
  bound.
- ``rate-oracle`` — the load-aware ``dspark`` planner told each request's *true* per-token
  acceptance rate instead of estimating it: the best causal per-request choice, and the ceiling
  of what better acceptance estimates could buy.

A per-sequence "draft exactly L" oracle is no reference under batching: the draft phase lasts
the longest draft of the batch (docs/design.md, "Where the seed is wrong").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.base import Controller
from control.batch import BatchContext, RoundPlanner, RoundStats
from control.configio import param
from control.costmodel import RoundCostModel
from control.dspark_config import DSparkConfig, GoodputPolicyConfig
from control.dspark_goodput import GoodputPolicyController
from control.dspark_planner import DSparkPlanner
from control.goodput import round_seconds
from control.types import Decision, Observation


@dataclass(frozen=True)
class ClairvoyantConfig:
    # 16: the longest draft the engines' static KV caches are sized for by default.
    k_max: int = param(16, lo=1, hi=64, doc="largest cap of a round", tune=(1, 32))
    # the causal planner's cold start, so both learn their costs from the same first rounds.
    k_start: int = param(4, lo=1, hi=64, doc="cap of the first rounds (cold start)", tune=(1, 16))
    # the causal planner's forgetting, for the same reason.
    cost_forget: float = param(
        0.99, lo=0.5, hi=1.0, doc="forgetting factor of the cost fit", tune=(0.9, 1.0)
    )


class ClairvoyantPlanner(RoundPlanner):
    """Told the run lengths L of the batch before each round (``set_futures``)."""

    needs_future = True

    def __init__(self, config: ClairvoyantConfig) -> None:
        self.config = config
        self.costs = RoundCostModel(forget=config.cost_forget)
        self._decisions = tuple(Decision(k=k) for k in range(config.k_max + 1))
        self.reset()

    def reset(self) -> None:
        self.costs.reset()
        self.rounds = 0
        self.future: list[int] | None = None
        self.last_cap = 0

    def set_futures(self, run_lengths: Sequence[int]) -> None:
        self.future = [int(x) for x in run_lengths]

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        c = self.config
        k_max = c.k_max if batch.max_draft is None else min(c.k_max, batch.max_draft)
        futures = self.future
        if futures is None or len(futures) != len(members):
            futures = [m.future if m.future is not None else 0 for m in members]
        self.future = None
        L = np.minimum(np.maximum(np.asarray(futures, dtype=np.int64), 0), k_max)
        if not self.costs.ready:
            cap = min(c.k_start if self.rounds % 2 == 0 else 1, k_max)
            k = np.minimum(L, cap)
        else:
            costs = self.costs.functions(
                batch.context_tokens,
                backlog=batch.prefill_backlog,
                budget=batch.token_budget,
                batch_size=batch.batch_size,
                block=batch.block_draft,
            )
            caps = np.arange(k_max + 1)
            ks = np.minimum(L[None, :], caps[:, None])
            g = (ks.sum(axis=1) + len(L)) / np.maximum(round_seconds(ks, costs), 1e-12)
            k = ks[int(np.argmax(g))]
        self.last_cap = int(k.max()) if len(k) else 0
        return [self._decisions[x] for x in k.tolist()]

    def observe_round(self, stats: RoundStats) -> None:
        self.rounds += 1
        self.costs.observe(stats)

    def state(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "cap": self.last_cap}


class ClairvoyantController(Controller):
    """A sequence under the clairvoyant; alone (batch 1, no planner) it plans for itself."""

    name = "clairvoyant"
    needs_future = True
    reads_confidences = False

    def __init__(self, config: ClairvoyantConfig | None = None) -> None:
        self.config = config or ClairvoyantConfig()
        self._solo = ClairvoyantPlanner(self.config)
        self.reset()

    @classmethod
    def make_planner(cls, config: ClairvoyantConfig) -> ClairvoyantPlanner:
        return ClairvoyantPlanner(config)

    def reset(self) -> None:
        self._solo.reset()
        self.future: int | None = None
        self.rounds = 0
        self.context_tokens = 0
        self.last_k = 0

    def set_future(self, run_length: int) -> None:
        self.future = run_length

    def decide(self, now_s: float, batch: BatchContext | None = None) -> Decision:
        ctx = BatchContext(1, self.context_tokens) if batch is None else batch
        d = self._solo.plan(now_s, (self,), ctx)[0]
        self.last_k = d.k
        return d

    def observe(self, obs: Observation) -> None:
        self.rounds += 1
        self.future = None
        self.context_tokens = obs.context_tokens + obs.emitted
        self._solo.observe_round(RoundStats.of_observation(obs))

    def state(self) -> dict[str, Any]:
        return {"k": self.last_k, "future": self.future, "rounds": self.rounds}


class RateOraclePlanner(DSparkPlanner):
    needs_rates = True


class RateOracleController(GoodputPolicyController):
    """``dspark`` (goodput policy) whose planner is told each request's true rate."""

    name = "rate-oracle"

    @classmethod
    def make_planner(cls, config: GoodputPolicyConfig) -> RateOraclePlanner:
        return RateOraclePlanner(config)

    def __init__(self, config: DSparkConfig | None = None) -> None:
        super().__init__(config or DSparkConfig())  # refuses policy "seed"
