"""Sliding window of recent rounds with O(1) running sums, and the acceptance-rate estimator.

The estimator of the per-token acceptance rate ``a`` is

    â = Σn / (Σn + rounds that ended in a rejection)

Each drafted token that was *verified* is a Bernoulli trial: the ``n`` accepted tokens of a round
are successes and the first refused token (if any) is the one failure; tokens after it were
never verified (acceptance is a prefix). So successes / trials is the maximum-likelihood
estimate of ``a`` under the i.i.d. model, whatever the draft lengths were.

Why not accepted/drafted (VPR)? It is not an estimate of ``a``: with a constant ``a`` and draft
length ``k`` its expectation is ``a(1 - a^k) / (k(1 - a))``, which *falls as k grows*, so a
controller that raises ``k`` would see its own signal drop and back off (a feedback loop on its
own action, not on the drafter's quality). It also counts the unverified tokens after a
rejection as failures, and it penalises a round cut short by the drafter-confidence stop τ:
such a round that accepted everything it drafted ended in *no* rejection and is all successes
for â, while VPR would blend it with rounds of different length.

Everything here is O(1) per round: fixed-size ring buffers with running sums. Float sums are
recomputed from the buffer each time the ring wraps, so rounding drift stays bounded and the
result depends only on the sequence of rounds (replays give identical values).
"""

from __future__ import annotations


class RoundWindow:
    """The last ``size`` rounds: accepted, rejections, drafted, emitted, times, lossy accepts."""

    __slots__ = ("size", "_n", "_rej", "_drafted", "_emitted", "_draft_s", "_round_s",
                 "_lossy", "_now", "_i", "count", "sum_n", "sum_rej", "sum_drafted", "sum_emitted",
                 "sum_draft_s", "sum_round_s", "sum_lossy")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        s = self.size
        self._n = [0] * s
        self._rej = [0] * s
        self._drafted = [0] * s
        self._emitted = [0] * s
        self._draft_s = [0.0] * s
        self._round_s = [0.0] * s
        self._lossy = [0] * s
        self._now = [0.0] * s
        self._i = 0
        self.count = 0
        self.sum_n = self.sum_rej = self.sum_drafted = self.sum_emitted = self.sum_lossy = 0
        self.sum_draft_s = self.sum_round_s = 0.0

    def push(self, n: int, rej: int, drafted: int, emitted: int, draft_s: float,
             round_s: float, lossy: int, now_s: float = 0.0) -> None:
        """Add one round (``rej`` is 1 when it ended in a rejection); drop the oldest if full."""
        i = self._i
        self.sum_n += n - self._n[i]
        self.sum_rej += rej - self._rej[i]
        self.sum_drafted += drafted - self._drafted[i]
        self.sum_emitted += emitted - self._emitted[i]
        self.sum_lossy += lossy - self._lossy[i]
        self.sum_draft_s += draft_s - self._draft_s[i]
        self.sum_round_s += round_s - self._round_s[i]
        self._n[i] = n
        self._rej[i] = rej
        self._drafted[i] = drafted
        self._emitted[i] = emitted
        self._lossy[i] = lossy
        self._draft_s[i] = draft_s
        self._round_s[i] = round_s
        self._now[i] = now_s
        i += 1
        if i == self.size:
            i = 0
            # exact re-sum of the float columns once per wrap: bounded drift, amortised O(1).
            self.sum_draft_s = sum(self._draft_s)
            self.sum_round_s = sum(self._round_s)
        self._i = i
        if self.count < self.size:
            self.count += 1

    def a_hat(self) -> float | None:
        """â = Σn / (Σn + rejections) over the window; None when no token was verified."""
        trials = self.sum_n + self.sum_rej
        if trials == 0:
            return None
        return self.sum_n / trials

    def tpot_s(self) -> float | None:
        """Seconds of draft + verify per emitted token over the window; None without data."""
        if self.sum_emitted <= 0 or self.sum_round_s <= 0.0:
            return None
        return self.sum_round_s / self.sum_emitted

    def wall_tpot_s(self) -> float | None:
        """Wall-clock seconds per emitted token: ``now_s`` span from the end of the oldest round
        to the end of the newest, over the tokens of the rounds after the oldest."""
        if self.count < 2:
            return None
        old = self._i if self.count == self.size else 0
        new = self._i - 1
        tokens = self.sum_emitted - self._emitted[old]
        span = self._now[new] - self._now[old]
        if tokens <= 0 or span <= 0.0:
            return None
        return span / tokens

    def lossy_fraction(self) -> float:
        """Accepted tokens that strict verification would have refused / accepted tokens."""
        return self.sum_lossy / self.sum_n if self.sum_n > 0 else 0.0


def a_hat_of(accepted: list[int] | tuple[int, ...],
             drafted: list[int] | tuple[int, ...]) -> float | None:
    """â of a list of rounds (reference implementation used by tests and reports)."""
    s = sum(accepted)
    rej = sum(1 for n, k in zip(accepted, drafted) if n < k)
    return None if s + rej == 0 else s / (s + rej)
