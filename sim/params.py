"""``EngineParams``: what the serving loop reads from a scenario and its cluster, nothing more."""

from __future__ import annotations

from dataclasses import dataclass

from sim.cluster import Cluster

#: ``deployment.max_draft_tokens`` at or above this value means "no engine cap on k".
NO_DRAFT_CAP = 1024


@dataclass(frozen=True, slots=True)
class EngineParams:
    """The serving loop's parameters (``EngineParams.of(scenario, cluster)``).

    ``max_draft_tokens``: the engine's cap on any k (``NO_DRAFT_CAP`` or more: none).
    ``draft_within_length``: k is cut to the request's remaining tokens − 1. KV: a request
    reserves ``kv_bytes_per_token`` × (prompt + output) bytes of ``kv_budget_bytes`` on admission.
    """

    replicas: int
    max_batch: int
    routing: str  # "round-robin" or "least-outstanding"
    warmup_s: float
    horizon_s: float | None
    lossy_accept_max: float
    round_overhead_s: float
    max_draft_tokens: int
    draft_within_length: bool
    kv_bytes_per_token: float
    kv_budget_bytes: float

    @classmethod
    def of(cls, scn, cluster: Cluster) -> EngineParams:
        dep = scn.deployment
        return cls(replicas=dep.replicas, max_batch=dep.max_batch, routing=dep.routing,
                   warmup_s=scn.sim.warmup_s, horizon_s=scn.sim.horizon_s,
                   lossy_accept_max=scn.acceptance.lossy_accept_max,
                   round_overhead_s=scn.latency.round_overhead_s,
                   max_draft_tokens=dep.max_draft_tokens,
                   draft_within_length=dep.draft_within_length,
                   kv_bytes_per_token=cluster.kv_bytes_per_token,
                   kv_budget_bytes=cluster.kv_budget_bytes)

    @property
    def max_draft(self) -> int | None:
        """The engine's cap on any k, None when it has none."""
        return self.max_draft_tokens if self.max_draft_tokens < NO_DRAFT_CAP else None

    @property
    def caps_draft(self) -> bool:
        """Whether the engine cuts the controllers' k at all."""
        return self.max_draft is not None or self.draft_within_length
