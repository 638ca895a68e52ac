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
from numba import njit

from control.types import Decision, valid_decision

#: cut decisions kept for reuse before the cache is emptied (β moves continuously in threshold
#: mode, so the distinct decisions are unbounded)
CACHE_SIZE = 4096


class HandOut:
    """Taking and cutting a batch's decisions (module docstring); one per planner."""

    def __init__(self) -> None:
        self._cut: dict[tuple, Decision] = {}

    def with_k(self, d: Decision, k: int, survival: float = 0.0) -> Decision:
        """``d`` with length ``k`` and survival stop ``survival`` (one cached object each)."""
        if d.k == k and d.survival == survival:
            return d
        key = (k, d.mode, d.beta, d.tau, d.block_end, survival)
        out = self._cut.get(key)
        if out is None:
            if len(self._cut) > CACHE_SIZE:
                self._cut.clear()
            out = self._cut[key] = valid_decision(*key)
        return out

    def take(self, st: Any, idx: np.ndarray, members: list) -> np.ndarray:
        """Take the decisions of the marked slots among ``idx`` (``members`` in the same
        order) into ``st.base`` / ``st.base_k``; their positions in ``idx`` (their hand-outs
        are redone). A block-end decision taken now marks its slot again (the next round hands
        the sequence's cached decision)."""
        fresh = marked(st.dirty, idx)
        if len(fresh):
            base, base_k = st.base, st.base_k
            for i in fresh.tolist():
                d = members[i].take_decision()
                slot = idx[i]
                base[slot] = d
                base_k[slot] = d.k
        return fresh

    def cut(self, st: Any, idx: np.ndarray, fresh: np.ndarray, x: np.ndarray) -> list[Decision]:
        """Each slot's taken decision cut to ``x`` (``d`` itself when ``d.k ≤ x``): its last
        hand-out where the decision is not ``fresh`` (positions) and ``x`` is the length it
        was cut to."""
        out = st.out[idx].tolist()
        redo = moved(st.out_x, idx, x, fresh)
        if len(redo):
            base, keep, with_k = st.base, st.out, self.with_k
            for i, slot, xi in zip(redo.tolist(), idx[redo].tolist(), x[redo].tolist()):
                d = base[slot]
                out[i] = keep[slot] = d if d.k <= xi else with_k(d, xi)
        return out


@njit(cache=True, error_model="numpy")
def marked(dirty, idx):  # pragma: no cover - compiled
    """The positions in ``idx`` of the marked slots, their marks cleared."""
    out = np.empty(idx.shape[0], dtype=np.int64)
    n = 0
    for i in range(idx.shape[0]):
        if dirty[idx[i]]:
            dirty[idx[i]] = False
            out[n] = i
            n += 1
    return out[:n]


@njit(cache=True, error_model="numpy")
def moved(out_x, idx, x, fresh):  # pragma: no cover - compiled
    """The positions in ``idx`` whose hand-out is redone: ``fresh`` ones and those whose
    length ``x`` is not the one they were cut to (``out_x``, set to ``x`` here)."""
    B = idx.shape[0]
    redo = np.zeros(B, dtype=np.bool_)
    for i in fresh:
        redo[i] = True
    out = np.empty(B, dtype=np.int64)
    n = 0
    for i in range(B):
        s = idx[i]
        if redo[i] or out_x[s] != x[i]:
            out_x[s] = x[i]
            out[n] = i
            n += 1
    return out[:n]


@njit(cache=True, error_model="numpy")
def kept_lengths(values, col, idx, cap):  # pragma: no cover - compiled
    """Each slot's planned length (column ``col``: integers, −1 none) where it is one within
    ``cap``, else ``cap``: a kept round's lengths."""
    x = np.empty(idx.shape[0], dtype=np.int64)
    for i in range(idx.shape[0]):
        p = values[idx[i], col]
        x[i] = cap if p < 0.0 or p > cap else int(p)
    return x
