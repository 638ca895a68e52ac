"""``RoundTrace``: the per-round records of a traced run (``RoundRecord`` rows and the
controllers' state after each round)."""

from __future__ import annotations

from typing import Any

import numpy as np

from control.types import Decision, Observation, RoundRecord, records_to_columns

CONTROLLER_TRACE_COLUMNS = (
    "controller",
    "request_id",
    "now_s",
    "k",
    "alpha",
    "beta",
    "a_hat",
    "block_end",
)


class RoundTrace:
    """Collects one :class:`RoundRecord` and one controller-state row per sequence per round."""

    def __init__(self, label: str, num_requests: int) -> None:
        self.label = label
        self.records: list[RoundRecord] = []
        self.controllers: dict[str, list] = {c: [] for c in CONTROLLER_TRACE_COLUMNS}
        self.rounds_done = np.zeros(num_requests, dtype=np.int64)

    def record(
        self, request_id: int, decision: Decision, obs: Observation, state: dict[str, Any]
    ) -> None:
        """The round ``obs`` of ``request_id`` and its controller's ``state()`` after it."""
        self.records.append(
            RoundRecord.from_round(
                request_id, int(self.rounds_done[request_id]), decision, obs, self.label
            )
        )
        values = (
            self.label,
            request_id,
            obs.now_s,
            state.get("k", decision.k),
            state.get("alpha"),
            state.get("beta"),
            state.get("a_hat"),
            decision.block_end,
        )
        for col, v in zip(CONTROLLER_TRACE_COLUMNS, values):
            self.controllers[col].append(v)

    def round_done(self, ids: np.ndarray) -> None:
        self.rounds_done[ids] += 1

    def round_columns(self) -> dict[str, list]:
        """The rounds as ``RECORD_COLUMNS`` columns (tuples as space-separated text)."""
        return records_to_columns(self.records)
