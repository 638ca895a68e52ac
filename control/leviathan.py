"""Leviathan's expectation for one round of speculative decoding (docs/design.md, "Formulas").

With i.i.d. per-token acceptance rate ``a`` and draft length ``k`` a round emits on average

    E(a, k) = Σ_{j=0..k} a^j = (1 − a^(k+1)) / (1 − a)      (Leviathan et al., ICML 2023, Eq. 1)

tokens, ``k + 1`` at ``a = 1`` (the formula's limit). At batch 1 a round costs ``k·c + 1`` target
forwards (``c``: one drafter step / one target forward), so the expected speedup over
target-only decoding is ``E(a, k) / (k·c + 1)`` (their Thm 3.8). Every package computes both
through these two functions.
"""

from __future__ import annotations


def expected_tokens(a: float, k: int) -> float:
    """``E(a, k)``: expected tokens emitted by a round of draft length ``k``."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(a: float, k: int, c: float) -> float:
    """``E(a, k) / (k·c + 1)``: expected speedup at batch 1 over target-only decoding."""
    return expected_tokens(a, k) / (k * c + 1.0)
