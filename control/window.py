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

Pushing a round is O(1) and cheap (one append to a history list; the simulator pushes one per
sequence per round). The window sums are computed when they are read (at most once per push,
cached) from the history, which keeps at least the last ``2 · size`` rounds. They equal, bit for
bit, those of a fixed-size ring buffer with running sums ``s += new − old`` whose float sums are
recomputed (``sum(buffer)``) each time the ring wraps: that bounded-drift rule is what the sums
follow, so the result depends only on the sequence of rounds and replays give identical values.
Reading every few rounds catches the running sums up push by push (the same operations as
eager updates); reading rarely recomputes them from the last wrap.
"""

from __future__ import annotations

from operator import itemgetter

_ROW_COLS = tuple(itemgetter(j) for j in range(8))


def row_of(obs) -> tuple:
    """The window row of an :class:`~control.types.Observation`:
    ``(n, rej, drafted, emitted, draft_s, round_s, lossy, now_s)``."""
    n, d = obs.accepted, obs.drafted
    return (
        n,
        1 if n < d else 0,
        d,
        obs.emitted,
        obs.draft_s,
        obs.draft_s + obs.verify_s,
        obs.lossy_accepts,
        obs.now_s,
    )


def _window_sum(j: int, every_field: bool = False) -> property:
    """A read-only property: field ``j``'s sum over the window (:meth:`RoundWindow._sums`)."""
    return property(lambda self: self._sums(every_field)[j])


class RoundWindow:
    """The last ``size`` rounds: accepted, rejections, drafted, emitted, times, lossy accepts.

    A round is pushed as numbers (:meth:`push`) or as one row tuple (``push_row``, see
    :func:`row_of`). Rows hold numbers only (no references to observations: tuples of numbers
    leave the garbage collector's tracking, so a long history costs it nothing).
    ``count`` and the ``sum_*`` attributes are read-only views of the window. The history is
    trimmed to its last ``2 · size`` rounds when the window is read (controllers read theirs
    at least once per block), so it holds at most the rounds since the previous read plus
    ``4 · size + 64``.
    """

    __slots__ = ("_cap", "_ct", "_h", "_off", "_s", "push_row", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self.size = size
        self._cap = 4 * size + 64  # history length that a read trims back to 2 · size
        self._h: list = []  # pushed rounds, oldest first, as row tuples
        #: Add one round given as its row ``(n, rej, drafted, emitted, draft_s, round_s, lossy,
        #: now_s)``: the history list's own ``append``, so a push costs no Python frame. The
        #: list lives as long as the window (``clear`` empties it in place), so a caller may
        #: keep this bound method.
        self.push_row = self._h.append
        self.clear()

    def clear(self) -> None:
        self._h.clear()
        self._off = 0  # absolute push index of _h[0]
        self._ct = 0  # push count the cached sums _s cover
        # n, rej, drafted, emitted, draft_s, round_s, lossy (running-sum state at push _ct)
        self._s = [0, 0, 0, 0, 0.0, 0.0, 0]

    def push(
        self,
        n: int,
        rej: int,
        drafted: int,
        emitted: int,
        draft_s: float,
        round_s: float,
        lossy: int,
        now_s: float = 0.0,
    ) -> None:
        """Add one round (``rej`` is 1 when it ended in a rejection); drop the oldest if full."""
        self._h.append((n, rej, drafted, emitted, draft_s, round_s, lossy, now_s))

    # --- reading --
    @property
    def count(self) -> int:
        return min(self._off + len(self._h), self.size)

    # Σ over the window of one row field (n, rej, drafted, emitted, draft_s, round_s, lossy);
    # drafted and draft_s are summed only on request (``_sums(True)``).
    sum_n = _window_sum(0)
    sum_rej = _window_sum(1)
    sum_drafted = _window_sum(2, every_field=True)
    sum_emitted = _window_sum(3)
    sum_draft_s = _window_sum(4, every_field=True)
    sum_round_s = _window_sum(5)
    sum_lossy = _window_sum(6)

    def a_hat(self) -> float | None:
        """â = Σn / (Σn + rejections) over the window; None when no token was verified."""
        s = self._sums()
        trials = s[0] + s[1]
        if trials == 0:
            return None
        return s[0] / trials

    def tpot_s(self) -> float | None:
        """Seconds of draft + verify per emitted token over the window; None without data."""
        s = self._sums()
        if s[3] <= 0 or s[5] <= 0.0:
            return None
        return s[5] / s[3]

    def wall_tpot_s(self) -> float | None:
        """Wall-clock seconds per emitted token: ``now_s`` span from the end of the oldest round
        to the end of the newest, over the tokens of the rounds after the oldest."""
        count = self.count
        if count < 2:
            return None
        h, off = self._h, self._off
        t = off + len(h)
        old, new = h[t - count - off], h[-1]
        tokens = self._sums()[3] - old[3]
        span = new[7] - old[7]
        if tokens <= 0 or span <= 0.0:
            return None
        return span / tokens

    def lossy_fraction(self) -> float:
        """Accepted tokens that strict verification would have refused / accepted tokens."""
        s = self._sums()
        return s[6] / s[0] if s[0] > 0 else 0.0

    # --- internals --
    def _rows(self, lo: int, hi: int) -> list:
        """Rows of the pushes with absolute indices lo..hi-1."""
        return self._h[lo - self._off : hi - self._off]

    def _trim(self) -> None:
        h = self._h
        drop = len(h) - 2 * self.size
        del h[:drop]
        self._off += drop

    def _sums(self, full: bool = False) -> list:
        """[Σn, Σrej, Σdrafted, Σemitted, Σdraft_s, Σround_s, Σlossy] after the last push.
        Without ``full`` the Σdrafted and Σdraft_s slots may be None (not needed by â, TPOT
        and the lossy fraction, so a rare reader skips them)."""
        h, size = self._h, self.size
        t = self._off + len(h)
        ct = self._ct
        s = self._s
        if ct == t and (not full or s[2] is not None):
            return s
        if len(h) >= self._cap:
            self._trim()
        if (
            s[2] is not None
            and t - ct <= size // 2 + 1
            and (ct - size if ct > size else 0) >= self._off
        ):
            self._catch_up(ct, t)
        else:
            self._recompute(t, full)
        self._ct = t
        return self._s

    def _catch_up(self, ct: int, t: int) -> None:
        """Eager ring-buffer updates for pushes ct..t-1 (needs pushes from ct - size on)."""
        size = self.size
        lo = ct - size if ct >= size else 0
        rows = self._rows(lo, t)
        zero = (0, 0, 0, 0, 0.0, 0.0, 0, 0.0)
        sn, srej, sdr, sem, sds, srs, slo = self._s
        for p in range(ct, t):
            new = rows[p - lo]
            old = rows[p - size - lo] if p >= size else zero
            sn += new[0] - old[0]
            srej += new[1] - old[1]
            sdr += new[2] - old[2]
            sem += new[3] - old[3]
            slo += new[6] - old[6]
            sds += new[4] - old[4]
            srs += new[5] - old[5]
            if (p + 1) % size == 0:  # the ring wrapped: exact re-sum of the float columns
                ring = rows[p + 1 - size - lo : p + 1 - lo]
                sds = sum([r[4] for r in ring])
                srs = sum([r[5] for r in ring])
        self._s = [sn, srej, sdr, sem, sds, srs, slo]

    @staticmethod
    def _float_sum(col: list, size: int, wrapped: bool) -> float:
        """Running float sum of a column of pushes since one ring wrap before the last one:
        ``sum`` at the last wrap, then ``+= new - old`` (or from 0.0 before any wrap)."""
        if wrapped:
            x = sum(col[:size])
            for new, old in zip(col[size:], col):
                x += new - old
            return x
        x = 0.0
        for new in col:
            x += new - 0.0
        return x

    def _recompute(self, t: int, full: bool) -> None:
        """The sums after push t from the rounds since the ring wrap before the last one."""
        size = self.size
        w = t - t % size  # pushes at the last wrap
        lo = w - size if w else 0
        rows = self._rows(lo, t)
        win = rows[-size:]
        s = [
            sum([r[0] for r in win]),
            sum([r[1] for r in win]),
            None,
            sum([r[3] for r in win]),
            None,
            self._float_sum([r[5] for r in rows], size, w > 0),
            sum([r[6] for r in win]),
        ]
        if full:
            s[2] = sum([r[2] for r in win])
            s[4] = self._float_sum([r[4] for r in rows], size, w > 0)
        self._s = s


def a_hat_of(
    accepted: list[int] | tuple[int, ...], drafted: list[int] | tuple[int, ...]
) -> float | None:
    """â of a list of rounds (reference implementation used by tests and reports)."""
    s = sum(accepted)
    rej = sum(1 for n, k in zip(accepted, drafted) if n < k)
    return None if s + rej == 0 else s / (s + rej)
