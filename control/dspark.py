"""``dspark``: the confidence scheduler (docs/design.md, "The `dspark` scheduler" and "Formulas"),
with two policies.

**goodput** (the default, load-aware). A round planner (:mod:`control.dspark_planner`, one per
engine replica, called once per round) chooses one draft cap for the batch and lets each
sequence stop below it, maximising expected emitted tokens per second of *batch* round time
(:mod:`control.goodput`) with costs learned online from the observed rounds
(:mod:`control.costmodel`) and per-sequence, per-position acceptance pooled over the batch.
Each sequence keeps its own evidence (forgotten acceptance counts), blocks, guards and loops:

- α loop — the TPOT trim. Error ``e = 1 − latency_ratio`` (measured TPOT of the sequence's
  window over ``slo_tpot_s``), output α in ``[alpha_min, 1]`` starting at 1. α weights the time
  that speculation adds to a round (``1/α``): α = 1 is pure goodput; a sequence that misses its
  SLO lowers α and stops drafting tokens that pay only at full goodput, which shortens the
  rounds it shares. Feedback path: shorter drafts → shorter rounds → lower TPOT → e rises; when
  the SLO is met the integrator rests at its ceiling 1 (pure goodput).
- β loop — unchanged (threshold mode): error ``1 − latency_ratio``, output β; a lower β lets
  more drafted tokens pass, raising tokens per round and lowering TPOT.
- Blocks decide when the trims move (updates only at block ends, as in the seed). The retry
  cap's cool-down is off unless ``goodput_cooldown`` (the plan already stops drafts that do
  not pay; forcing k = 0 also stops them where drafting is nearly free).

Without a planner (a batch-1 driver or a trace replay) a goodput sequence plans a batch of
itself with a private planner that learns from its own rounds.

**seed** (``policy = "seed"``): the seed's rules as written. Per sequence it keeps a sliding
window of rounds and, only when a semi-autoregressive block closes (:mod:`control.blocks`),
updates two loops:

- α loop (aggressiveness): PID on ``e = â − a_target`` (â: :mod:`control.window`), output α in
  ``[alpha_min, alpha_max]``, mapped to ``k = clip(round(α · k_ref), k_min, k_max)``
  (round half up); k only moves when the new value differs by at least ``k_hysteresis``.
- β loop (conservativeness, the threshold of lossy ``threshold`` verification): PID on
  ``e = 1 − latency_ratio``, ``latency_ratio = measured TPOT / slo_tpot_s``, output β in
  ``[beta_min, beta_max]`` (too slow → β falls → more drafted tokens pass).

With ``Kp = Kd = 0`` and ``Ki = γ`` the two loops are the seed's lines exactly::

    α ← α + γ · (â − a_target)
    β ← clip(β − γ · (latency_ratio − 1), 0.7, 0.99)

(α is also kept in its range; see :mod:`control.pid` for why it is bit-exact.) Around the loops:
warm-up (no updates for the first ``warmup_rounds``), a minimum update interval, an anomaly
guard (:mod:`control.anomaly`) whose action is configurable (reset the integrators, raise β, or
verify strictly until it recovers), and a retry cap (after ``retry_cap`` consecutive rounds that
drafted something and accepted nothing, ``cooldown_rounds`` plain autoregressive steps).

``decide`` returns a cached :class:`Decision` (rebuilt only when something changed), and
``observe`` is O(1): the simulator calls both for every sequence every round.

Classes: :class:`~control.dspark_base.DSparkBaseController` does what both policies do
(window, blocks, loops, guard, retry cap, decisions);
:class:`~control.dspark_goodput.GoodputPolicyController` and
:class:`~control.dspark_seed.SeedPolicyController` add each policy's own, each with its config
(:mod:`control.dspark_config`). :class:`DSparkController`, the registry's ``dspark``, builds the
class that its :class:`DSparkConfig`'s ``policy`` names.
"""

from __future__ import annotations

from typing import Any

from control.dspark_base import DSparkBaseController
from control.dspark_config import DSparkConfig, GoodputPolicyConfig
from control.dspark_goodput import GoodputPolicyController
from control.dspark_seed import SeedPolicyController, k_of_alpha

__all__ = [
    "DSparkBaseController",
    "DSparkConfig",
    "DSparkController",
    "GoodputPolicyController",
    "SeedPolicyController",
    "k_of_alpha",
]


class DSparkController(GoodputPolicyController):
    """The registry's ``dspark``: ``DSparkController(config)`` is a :class:`SeedPolicyController`
    when ``config.policy`` is ``"seed"``, else this goodput-policy controller."""

    def __new__(cls, config: DSparkConfig | None = None) -> Any:
        if cls is DSparkController and getattr(config, "policy", None) == "seed":
            return SeedPolicyController(config)
        return super().__new__(cls)

    def __init__(self, config: DSparkConfig | None = None) -> None:
        super().__init__(config or DSparkConfig())

    @classmethod
    def make_planner(cls, config: GoodputPolicyConfig) -> Any:
        """The goodput policy's round planner; the seed policy has none."""
        return None if getattr(config, "policy", None) == "seed" else super().make_planner(config)
