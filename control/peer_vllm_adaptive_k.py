"""``vllm-adaptive-k``: vLLM's online Adaptive K (``enable_adaptive_k``).

From vLLM's documentation: every step picks the K that maximises goodput, expected tokens per
step over the step's relative latency,

    G(K) = E_acc(K) / (1 + K·c_draft + bs_penalty·batch_size),
    E_acc(K) = 1 + Σ_{i=1..K} Π_{j≤i} α_j,

where α_j is a per-position EMA (weight ``ema_alpha`` on the newest step) of the *conditional*
acceptance rate at draft position j (position j accepted given the earlier ones were), and
positions never observed take ``alpha_prior``. K = 0 (no speculation) when no K ≥ 1 reaches
G ≥ 1.0 (and ``min_tokens`` is 0); K never goes below ``min_tokens`` otherwise. After a change
K holds for ``cooldown_steps`` steps. With a Dynamic SD table (``rows`` > 0) the table's K for
the batch size bounds K from above ("DSD sets the coarse range, Adaptive K fine-tunes within
it"); without one, ``num_speculative_tokens`` does.

Our reading where the doc is silent: a position is *tracked* while it is within the step's K;
the EMA of a tracked position starts at ``alpha_prior`` and moves once per step on the batch's
pooled rate there (accepted at j / tried at j over the step's requests, where some request tried
it); positions beyond K are untracked and read ``alpha_prior`` again, so a K that shrank (or
speculation switched off) probes longer drafts once its cooldown is over instead of trusting
stale estimates for good. K is the smallest of equally good ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.batch import BatchContext, RoundPlanner, RoundStats
from control.configio import param
from control.errors import ConfigError
from control.peer_common import (
    K_LIMIT,
    MAX_ROWS,
    DsdTableFields,
    PeerController,
    check_dsd,
    dsd_k,
    dsd_rows,
    ema_update,
    fold_pending,
    uniform,
)
from control.types import Decision


@dataclass(frozen=True)
class VllmAdaptiveKConfig(DsdTableFields):
    # the doc's usage example drafts up to 10 tokens
    num_speculative_tokens: int = param(
        10, lo=1, hi=K_LIMIT, doc="largest K (the draft window)", tune=(1, 16)
    )
    # the doc's default: 0.3 (0 = slow, 1 = the newest step alone)
    ema_alpha: float = param(
        0.3, lo=0.0, hi=1.0, doc="adaptive_k_ema_alpha: EMA weight of a new step", tune=(0.01, 1.0)
    )
    # the doc's default 0.1144 (0.5B -> 7B AWQ on an RTX 4050); re-profile per hardware
    c_draft: float = param(
        0.1144,
        lo=0.0,
        hi=10.0,
        doc="adaptive_k_c_draft: draft forward / target forward time",
        tune=(0.005, 1.0),
        log=True,
    )
    # the doc's default 0: K = 0 may switch speculation off
    min_tokens: int = param(
        0,
        lo=0,
        hi=K_LIMIT,
        doc="adaptive_k_min_tokens: smallest K",
        tune=(0, 4),
        hi_from=("num_speculative_tokens", 0),
    )
    # the doc's default: 2 steps after a K change
    cooldown_steps: int = param(
        2,
        lo=0,
        hi=100_000,
        doc="adaptive_k_cooldown_steps: steps K holds after a change",
        tune=(0, 32),
    )
    # the doc's default 0.002 per request in the batch
    bs_penalty: float = param(
        0.002,
        lo=0.0,
        hi=1.0,
        doc="adaptive_k_bs_penalty: verify overhead per request",
        tune=(0.0, 0.02),
    )
    # the doc's default 0.85 for positions not yet tracked
    alpha_prior: float = param(
        0.85,
        lo=0.0,
        hi=1.0,
        doc="adaptive_k_alpha_prior: acceptance of untracked positions",
        tune=(0.3, 0.99),
    )
    # no Dynamic SD table unless asked (0 rows)
    rows: int = param(0, lo=0, hi=MAX_ROWS, doc="rows of a Dynamic SD table bounding K (0 = none)")

    def __post_init__(self) -> None:
        if self.min_tokens > self.num_speculative_tokens:
            raise ConfigError(
                f"min_tokens = {self.min_tokens} > num_speculative_tokens = "
                f"{self.num_speculative_tokens}"
            )
        check_dsd(self)


def goodputs(
    alphas: Sequence[float], c_draft: float, bs_penalty: float, batch_size: int, k_max: int
) -> list[float]:
    """``G(K)`` for K = 0..k_max (module docstring)."""
    over = 1.0 + bs_penalty * batch_size
    out = [1.0 / over]
    e, survive = 1.0, 1.0
    for k in range(1, k_max + 1):
        survive *= alphas[k - 1]
        e += survive
        out.append(e / (over + k * c_draft))
    return out


def best_k(
    config: VllmAdaptiveKConfig, alphas: Sequence[float], batch_size: int, k_max: int
) -> int:
    """The K in ``[max(1, min_tokens), k_max]`` with the highest G (the smallest among ties);
    0 when its G is below 1.0 and ``min_tokens`` is 0; ``k_max`` when that is below the range."""
    c = config
    lo = max(1, c.min_tokens)
    if k_max < lo:
        return k_max
    g = goodputs(alphas, c.c_draft, c.bs_penalty, batch_size, k_max)
    k = max(range(lo, k_max + 1), key=lambda i: (g[i], -i))
    return 0 if g[k] < 1.0 and c.min_tokens == 0 else k


class VllmAdaptiveKPlanner(RoundPlanner):
    """One K per step for the whole batch, from the pooled per-position EMA."""

    def __init__(self, config: VllmAdaptiveKConfig) -> None:
        self.config = config
        self.rows = dsd_rows(config)
        self.reset()

    def reset(self) -> None:
        c = self.config
        self.alphas = [c.alpha_prior] * c.num_speculative_tokens
        self.k: int | None = None  # no step planned yet
        self.hold = 0  # steps K still holds after its last change
        self.steps = 0
        self.members: Sequence[Any] = ()

    def k_max(self, batch_size: int) -> int:
        n = self.config.num_speculative_tokens
        return min(n, dsd_k(self.rows, batch_size)) if self.rows else n

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        self.members = members
        k_max = self.k_max(batch.batch_size)
        best = best_k(self.config, self.alphas, batch.batch_size, k_max)
        if self.k is None:
            self.k = best
        elif self.hold > 0:
            self.hold -= 1
        elif best != self.k:
            self.k = best
            self.hold = self.config.cooldown_steps
        k = min(self.k, k_max)
        prior = self.config.alpha_prior
        for j in range(k, len(self.alphas)):  # beyond K: untracked (module docstring)
            self.alphas[j] = prior
        return uniform(k, batch, len(members))

    def observe_round(self, stats: RoundStats) -> None:
        self.steps += 1
        pairs = fold_pending(self.members)
        if pairs:
            ema_update(self.alphas, pairs, self.config.ema_alpha)

    def state(self) -> dict[str, Any]:
        return {"k": self.k, "hold": self.hold, "alphas": list(self.alphas)}


class VllmAdaptiveKController(PeerController):
    name = "vllm-adaptive-k"
    config_class = VllmAdaptiveKConfig
    planner_class = VllmAdaptiveKPlanner
