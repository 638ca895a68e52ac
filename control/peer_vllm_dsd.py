"""``vllm-dsd``: vLLM's Dynamic Speculative Decoding (``num_speculative_tokens_per_batch_size``).

From vLLM's documentation: the speculative config holds a table of rows ``[start_bs, end_bs,
K]``; while the running batch size (the concurrency) is within a row's range, every request
drafts that row's K tokens; K = 0 turns speculation off. Every K is at most
``num_speculative_tokens``, the draft window. The documented example is the default here:
``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]`` with ``num_speculative_tokens = 3``.

Batch-level: the planner reads the round's batch size (:class:`control.batch.BatchContext`);
a sequence deciding alone uses the batch size of its last round (1 before any). The table's
fields are scalars so ``dspark tune`` searches its boundaries and Ks (:mod:`control.peer_common`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.batch import BatchContext, RoundPlanner, RoundStats
from control.configio import param
from control.peer_common import (
    K_LIMIT,
    MAX_ROWS,
    DsdTableFields,
    PeerController,
    check_dsd,
    dsd_k,
    dsd_rows,
    fold_pending,
    uniform,
)
from control.types import Decision


@dataclass(frozen=True)
class VllmDsdConfig(DsdTableFields):
    # the doc's example window: 3 draft tokens at most
    num_speculative_tokens: int = param(
        3, lo=1, hi=K_LIMIT, doc="draft window: every row's K is at most this", tune=(1, 16)
    )
    # the doc's example has three rows; the tuner searches a fixed number of rows
    rows: int = param(3, lo=1, hi=MAX_ROWS, doc="rows of the table in use")

    def __post_init__(self) -> None:
        check_dsd(self)


class VllmDsdPlanner(RoundPlanner):
    """K of the table's row for the round's batch size, for every sequence."""

    def __init__(self, config: VllmDsdConfig) -> None:
        self.config = config
        self.rows = dsd_rows(config)
        self.members: Sequence[Any] = ()
        self.last_k = -1

    def plan(self, now_s: float, members: Sequence[Any], batch: BatchContext) -> list[Decision]:
        self.members = members
        self.last_k = dsd_k(self.rows, batch.batch_size)
        return uniform(self.last_k, batch, len(members))

    def observe_round(self, stats: RoundStats) -> None:
        fold_pending(self.members)  # nothing to learn: the table is fixed

    def state(self) -> dict[str, Any]:
        return {"k": self.last_k}


class VllmDsdController(PeerController):
    name = "vllm-dsd"
    config_class = VllmDsdConfig
    planner_class = VllmDsdPlanner
