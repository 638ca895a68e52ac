"""The decisions a round planner hands its batch: each sequence's own decision cut to the
length the plan gives it, visiting only the sequences where something changed.

A sequence's own decision (``take_decision``: its mode, β, τ, block-end flag and its cap, 0 in a
cool-down) changes only when it is rebuilt, or for the one round after a block end; the
sequence then marks its slot (``SeqArrays.dirty``). Each slot remembers the decision last taken
(``base``), the one handed out (``out``) and the length it was cut to (``out_x``), so a round
takes the decisions of the marked slots only and hands out again every slot whose decision and
length did not move: per round, a gather and a Python step per changed sequence, the same
decisions as taking and cutting every sequence's decision each round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from control.types import Decision

#: cut decisions kept for reuse before the cache is emptied (β moves continuously in threshold
#: mode, so the distinct decisions are unbounded)
CACHE_SIZE = 4096


class HandOut:
    """Taking and cutting a batch's decisions (module docstring); one per planner."""

    def __init__(self) -> None:
        self._cut: dict[tuple, Decision] = {}

    def reset(self) -> None:
        self._cut.clear()

    def with_k(self, d: Decision, k: int, survival: float = 0.0) -> Decision:
        """``d`` with length ``k`` and survival stop ``survival`` (one cached object each)."""
        if d.k == k and d.survival == survival:
            return d
        key = (k, d.mode, d.beta, d.tau, d.block_end, survival)
        out = self._cut.get(key)
        if out is None:
            if len(self._cut) > CACHE_SIZE:
                self._cut.clear()
            out = self._cut[key] = Decision(
                k=k, mode=d.mode, beta=d.beta, tau=d.tau, block_end=d.block_end, survival=survival
            )
        return out

    def take(self, st: Any, idx: np.ndarray, members: list) -> np.ndarray:
        """Take the decisions of the marked slots among ``idx`` (``members`` in the same
        order) into ``st.base`` / ``st.base_k``; the mask of those slots (their hand-outs are
        redone). A block-end decision taken now marks its slot again (the next round hands
        the sequence's cached decision)."""
        fresh = st.dirty[idx]
        where = np.flatnonzero(fresh)
        if len(where):
            slots = idx[where]
            st.dirty[slots] = False
            taken = [members[i].take_decision() for i in where.tolist()]
            st.base[slots] = np.fromiter(taken, dtype=object, count=len(taken))
            st.base_k[slots] = [d.k for d in taken]
        return fresh

    def cut(self, st: Any, idx: np.ndarray, fresh: np.ndarray, x: np.ndarray) -> list[Decision]:
        """Each slot's taken decision cut to ``x`` (``d`` itself when ``d.k ≤ x``): its last
        hand-out where the decision is not ``fresh`` and ``x`` is the length it was cut to."""
        out = st.out[idx].tolist()
        redo = np.flatnonzero(fresh | (st.out_x[idx] != x))
        if len(redo):
            slots, xs = idx[redo], x[redo]
            with_k = self.with_k
            cut = [
                d if d.k <= xi else with_k(d, xi)
                for d, xi in zip(st.base[slots].tolist(), xs.tolist())
            ]
            for i, c in zip(redo.tolist(), cut):
                out[i] = c
            st.out[slots] = np.fromiter(cut, dtype=object, count=len(cut))
            st.out_x[slots] = xs
        return out
