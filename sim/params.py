"""``EngineParams``: what the serving loop reads from a scenario and its cluster, nothing more."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.cluster import Cluster

#: ``deployment.max_draft_tokens`` at or above this value means "no engine cap on k".
NO_DRAFT_CAP = 1024
#: KV blocks of a replica whose KV costs nothing per token (no memory limit).
UNLIMITED_BLOCKS = 1 << 62


@dataclass(frozen=True, slots=True)
class EngineParams:
    """The serving loop's parameters (``EngineParams.of(scenario, cluster)``).

    ``max_draft_tokens``: the engine's cap on any k (``NO_DRAFT_CAP`` or more: none), the k_max
    its planner is told. ``draft_block``: a block drafter's B (0: autoregressive), which cuts
    the k a round drafts, as the engine's block drafter keeps at most B of its slots.
    ``draft_within_length``: k is cut to the request's remaining tokens − 1.

    Scheduling: ``scheduler`` 'chunked' (prompt chunks share each forward with the decode rows
    under ``max_num_batched_tokens``, at most ``prefill_chunk_tokens`` per request and forward,
    0 = no such cap) or 'prefill-first' (one pass prefills every admitted prompt whole).
    ``prefill_order``: 'fcfs' (arrival order) or 'shortest-first' (the waiting request with the
    fewest prefill tokens is admitted first, and partial prefills take the budget in order of
    the tokens they have left).

    KV: ``kv_allocation`` 'reserve' (a request reserves ``kv_bytes_per_token`` × (prompt +
    output) bytes of ``kv_budget_bytes`` on admission) or 'paged' (``kv_blocks`` blocks of
    ``kv_block_tokens`` tokens, allocated as tokens are computed; preemption by recompute).
    ``prefix_caching`` (paged only, requests with hash ids): prompt blocks of
    ``hash_block_tokens`` tokens whose hash is resident are not computed again.
    ``seed_planner_costs``: each round planner gets :meth:`Cluster.cost_seed_rows` first.
    """

    replicas: int
    max_batch: int
    routing: str  # "round-robin", "least-outstanding" or "least-pending-tokens"
    warmup_s: float
    horizon_s: float | None
    lossy_accept_max: float
    round_overhead_s: float
    max_draft_tokens: int
    draft_within_length: bool
    kv_bytes_per_token: float
    kv_budget_bytes: float
    scheduler: str = "chunked"
    max_num_batched_tokens: int = 2048
    prefill_chunk_tokens: int = 0
    prefill_order: str = "fcfs"
    kv_allocation: str = "paged"
    kv_block_tokens: int = 16
    prefix_caching: bool = True
    hash_block_tokens: int = 512
    seed_planner_costs: bool = False
    slo_ttft_s: float = math.inf  # the scenario's SLOs, handed to controllers and planners
    slo_tpot_s: float = math.inf
    draft_block: int = 0

    @classmethod
    def of(cls, scn, cluster: Cluster) -> EngineParams:
        dep = scn.deployment
        return cls(
            replicas=dep.replicas,
            max_batch=dep.max_batch,
            routing=dep.routing,
            warmup_s=scn.sim.warmup_s,
            slo_ttft_s=scn.slo.ttft_s,
            slo_tpot_s=scn.slo.tpot_s,
            horizon_s=scn.sim.horizon_s,
            lossy_accept_max=scn.acceptance.lossy_accept_max,
            round_overhead_s=scn.latency.round_overhead_s,
            max_draft_tokens=dep.max_draft_tokens,
            # a block drafter proposes at most its block B (sim.block)
            draft_block=cluster.block_size,
            draft_within_length=dep.draft_within_length,
            kv_bytes_per_token=cluster.kv_bytes_per_token,
            kv_budget_bytes=cluster.kv_budget_bytes,
            scheduler=dep.scheduler,
            max_num_batched_tokens=dep.max_num_batched_tokens,
            prefill_chunk_tokens=dep.prefill_chunk_tokens,
            prefill_order=dep.prefill_order,
            kv_allocation=dep.kv_allocation,
            kv_block_tokens=dep.kv_block_tokens,
            prefix_caching=dep.prefix_caching,
            hash_block_tokens=scn.workload.trace_hash_block_tokens,
            seed_planner_costs=dep.seed_planner_costs,
        )

    @property
    def max_draft(self) -> int | None:
        """The engine's cap on any k, None when it has none."""
        return self.max_draft_tokens if self.max_draft_tokens < NO_DRAFT_CAP else None

    @property
    def draft_cap(self) -> int | None:
        """The most tokens a round drafts: the engine's cap, cut to a block drafter's B."""
        cap = self.max_draft
        if self.draft_block:
            return self.draft_block if cap is None else min(cap, self.draft_block)
        return cap

    @property
    def caps_draft(self) -> bool:
        """Whether the engine cuts the controllers' k at all."""
        return self.draft_cap is not None or self.draft_within_length

    @property
    def kv_blocks(self) -> int:
        """KV blocks of one replica (paged)."""
        per_block = self.kv_bytes_per_token * self.kv_block_tokens
        if per_block <= 0:
            return UNLIMITED_BLOCKS
        return max(math.floor(self.kv_budget_bytes / per_block), 0)

    @property
    def kv_capacity_tokens(self) -> float:
        """The most tokens (prompt + output) one request may hold in a replica's KV memory:
        a longer request can never be served (rejected)."""
        if self.kv_bytes_per_token <= 0:
            return math.inf
        if self.kv_allocation == "paged":
            return float(self.kv_blocks * self.kv_block_tokens)
        return self.kv_budget_bytes / self.kv_bytes_per_token

    def never_fits(self, total_tokens):
        """Whether requests of ``total_tokens`` (prompt + output; a number or a numpy array)
        can never be held in one replica's KV memory (the engine rejects them)."""
        if self.kv_bytes_per_token <= 0:
            return total_tokens < 0
        if self.kv_allocation == "paged":
            return total_tokens > self.kv_blocks * self.kv_block_tokens
        return total_tokens * self.kv_bytes_per_token > self.kv_budget_bytes
