"""What the peer controllers share: vLLM's Dynamic SD table, per-position acceptance counts, and
the controller half of a batch-level policy.

The peers (``vllm-dsd``, ``vllm-adaptive-k``, ``vllm-adaptive-verification``, ``sglang-adaptive``)
are policies that vLLM and SGLang apply to a whole batch, so each is a round planner
(:class:`control.batch.RoundPlanner`) plus a thin per-sequence controller
(:class:`PeerController`) that keeps what only the sequence sees: its last rounds and, for
adaptive verification, its own acceptance estimates. A driver without a planner (a batch-1
engine, a trace replay) calls ``decide``: the sequence then plans a batch of itself with a
private planner fed by its own rounds, so every peer also decides alone.

**Dynamic SD table** (vLLM ``num_speculative_tokens_per_batch_size``: rows ``[start_bs,
end_bs, K]``, K draft tokens while the running batch size is in ``[start_bs, end_bs]``). The
table is held as scalar fields so the tuner can search it (:mod:`tuning.space` reads scalar
params only): ``rows`` rows, row ``i`` ending at ``end_bs_i`` (the last at ``max_bs``), each
starting one past the previous end (the first at 1), with ``k_i`` draft tokens. A batch larger
than ``max_bs`` uses the last row's K (vLLM's scheduler never runs more than its
``--max-num-seqs``; keep ``max_bs`` at or above it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.base import ValuesObserver
from control.batch import BatchContext, RoundStats
from control.configio import param
from control.errors import ConfigError
from control.types import Decision

#: Rows a table may have (the tuner searches a fixed number of them).
MAX_ROWS = 6
#: Largest draft length any peer asks for (the configs' upper bound of K).
K_LIMIT = 64
#: One immutable Decision per draft length: decide() allocates nothing.
DECISIONS: tuple[Decision, ...] = tuple(Decision(k=k) for k in range(K_LIMIT + 1))

_ALL_ROWS = tuple(range(1, MAX_ROWS + 1))


def _rows_from(i: int) -> tuple[int, ...]:
    """Row counts under which row ``i`` (1-based) exists."""
    return tuple(r for r in _ALL_ROWS if r >= i)


@dataclass(frozen=True)
class DsdTableFields:
    """The Dynamic SD table as scalar fields; a subclass adds ``rows`` (rows in use, 0 = no
    table where the policy allows none) and ``num_speculative_tokens`` (every K is at most it).

    Defaults are vLLM's documented example ``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]``; the
    tuned ranges keep every end below ``max_bs`` so any drawn table is valid."""

    # the doc's example table: K = 3 up to batch 64
    end_bs_1: int = param(
        64,
        lo=1,
        hi=1 << 20,
        doc="last batch size of row 1",
        tune=(1, 128),
        log=True,
        when={"rows": _rows_from(2)},
    )
    # ... K = 1 up to batch 128
    end_bs_2: int = param(
        128,
        lo=1,
        hi=1 << 20,
        doc="last batch size of row 2",
        tune=(2, 256),
        log=True,
        lo_from=("end_bs_1", 1),
        when={"rows": _rows_from(3)},
    )
    # rows 3-5 end where a longer table would put them (unused by the 3-row default)
    end_bs_3: int = param(
        256,
        lo=1,
        hi=1 << 20,
        doc="last batch size of row 3",
        tune=(3, 384),
        log=True,
        lo_from=("end_bs_2", 1),
        when={"rows": _rows_from(4)},
    )
    end_bs_4: int = param(
        384,
        lo=1,
        hi=1 << 20,
        doc="last batch size of row 4",
        tune=(4, 448),
        log=True,
        lo_from=("end_bs_3", 1),
        when={"rows": _rows_from(5)},
    )
    end_bs_5: int = param(
        448,
        lo=1,
        hi=1 << 20,
        doc="last batch size of row 5",
        tune=(5, 480),
        log=True,
        lo_from=("end_bs_4", 1),
        when={"rows": _rows_from(6)},
    )
    # the doc's example: the last row ends at batch 512
    max_bs: int = param(512, lo=1, hi=1 << 20, doc="last batch size of the last row")
    # the doc's example Ks: 3, 1, 0 (no drafting from batch 129)
    k_1: int = param(
        3,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 1",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(1)},
    )
    k_2: int = param(
        1,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 2",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(2)},
    )
    k_3: int = param(
        0,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 3",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(3)},
    )
    # rows 4-6: no drafting, as the example's last row
    k_4: int = param(
        0,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 4",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(4)},
    )
    k_5: int = param(
        0,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 5",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(5)},
    )
    k_6: int = param(
        0,
        lo=0,
        hi=K_LIMIT,
        doc="K of row 6",
        tune=(0, 16),
        hi_from=("num_speculative_tokens", 0),
        when={"rows": _rows_from(6)},
    )


def dsd_rows(cfg: Any) -> tuple[tuple[int, int, int], ...]:
    """The table's rows ``(start_bs, end_bs, K)`` (empty when ``cfg.rows`` is 0)."""
    n = cfg.rows
    ends = [getattr(cfg, f"end_bs_{i}") for i in range(1, n)] + [cfg.max_bs]
    ks = [getattr(cfg, f"k_{i}") for i in range(1, n + 1)]
    starts = [1] + [e + 1 for e in ends[:-1]]
    return tuple(zip(starts, ends, ks)) if n else ()


def check_dsd(cfg: Any) -> None:
    """The rows of ``cfg`` form a table: ends strictly increasing up to ``max_bs``, every K at
    most ``num_speculative_tokens``. One-line :class:`ConfigError` otherwise."""
    ends = [getattr(cfg, f"end_bs_{i}") for i in range(1, cfg.rows)] + [cfg.max_bs]
    prev = 0
    for i, e in enumerate(ends, 1):
        if e <= prev:
            name = "max_bs" if i == cfg.rows else f"end_bs_{i}"
            raise ConfigError(
                f"{name} = {e} must be above the previous row's end {prev} (rows are "
                "[start_bs, end_bs] ranges in increasing order)"
            )
        prev = e
    for i in range(1, cfg.rows + 1):
        k = getattr(cfg, f"k_{i}")
        if k > cfg.num_speculative_tokens:
            raise ConfigError(
                f"k_{i} = {k} exceeds num_speculative_tokens = {cfg.num_speculative_tokens} "
                "(every K of the table is at most the draft window)"
            )


def dsd_k(rows: Sequence[tuple[int, int, int]], batch_size: int) -> int:
    """K of the row whose ``[start_bs, end_bs]`` holds ``batch_size`` (the last row's beyond
    the table's end)."""
    for _, end, k in rows:
        if batch_size <= end:
            return k
    return rows[-1][2]


def table_fields(rows: Sequence[Sequence[Any]], where: str) -> dict[str, int]:
    """Config fields (``rows``, ``end_bs_i``, ``max_bs``, ``k_i``) of a table given as vLLM's
    list of ``[start_bs, end_bs, K]``: contiguous from batch 1, at most :data:`MAX_ROWS`
    rows. ``where`` names the table in the one-line error."""
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ConfigError(f"{where}: expected a non-empty list of [start_bs, end_bs, K] rows")
    if len(rows) > MAX_ROWS:
        raise ConfigError(f"{where}: {len(rows)} rows; allowed at most {MAX_ROWS}")
    out: dict[str, int] = {"rows": len(rows)}
    expect = 1
    for i, row in enumerate(rows, 1):
        if (
            not isinstance(row, (list, tuple))
            or len(row) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in row)
        ):
            raise ConfigError(f"{where}[{i - 1}] = {row!r}: expected [start_bs, end_bs, K]")
        start, end, k = row
        if start != expect or end < start:
            raise ConfigError(
                f"{where}[{i - 1}] = {list(row)}: rows must cover batch sizes from 1 without "
                f"gaps (this row should start at {expect} and end at or after it)"
            )
        out["max_bs" if i == len(rows) else f"end_bs_{i}"] = end
        out[f"k_{i}"] = k
        expect = end + 1
    return out


# --------------------------------------------------------------------- per-position counts
def position_counts(pairs: Sequence[tuple[int, int]], size: int) -> tuple[list[int], list[int]]:
    """Per draft position j = 1..size: rounds that tried it (every earlier token accepted and
    j ≤ drafted) and rounds that accepted it, from ``(drafted, accepted)`` pairs."""
    tried, acc = [0] * size, [0] * size
    for d, n in pairs:
        top = min(n + 1, d, size)
        for j in range(top):
            tried[j] += 1
        for j in range(min(n, size)):
            acc[j] += 1
    return tried, acc


def ema_update(values: list[float], pairs: Sequence[tuple[int, int]], alpha: float) -> None:
    """One EMA step per position of ``values`` (conditional acceptance at draft positions
    1..len): ``v_j ← (1 − α)·v_j + α·accepted_j / tried_j`` where some round tried position j;
    untouched elsewhere."""
    tried, acc = position_counts(pairs, len(values))
    for j, t in enumerate(tried):
        if t:
            values[j] += alpha * (acc[j] / t - values[j])


def fold_pending(members: Sequence[Any]) -> list[tuple[int, int]]:
    """The members' ``(drafted, accepted)`` rounds since the last fold (then cleared)."""
    out: list[tuple[int, int]] = []
    for m in members:
        if m.pending:
            out.extend(m.pending)
            m.pending = []
    return out


def uniform(k: int, batch: BatchContext, size: int) -> list[Decision]:
    """``size`` decisions of draft length ``k`` capped by the engine's ``max_draft``."""
    if batch.max_draft is not None and k > batch.max_draft:
        k = batch.max_draft
    return [DECISIONS[k]] * size


# --------------------------------------------------------------------- the sequence's half
class PeerController(ValuesObserver):
    """A sequence driven by a peer's round planner (``planner_class``); alone, it plans a
    batch of itself with a private one fed by its own rounds.

    Keeps the rounds it drafted since the planner last read them (``pending``: ``(drafted,
    accepted)`` pairs), the batch size and context of its last round. Subclasses set
    ``name``, ``config_class`` and ``planner_class``."""

    config_class: type
    planner_class: type
    reads_confidences = False

    def __init__(self, config: Any = None) -> None:
        self.config = config or self.config_class()
        self.reset()

    @classmethod
    def make_planner(cls, config: Any) -> Any:
        return cls.planner_class(config)

    def reset(self) -> None:
        self.rounds = 0
        self.pending: list[tuple[int, int]] = []
        self.batch_size = 1  # the last round's batch (1 before any: a batch of one)
        self.context_tokens = 0
        self._solo: Any = None  # the private planner of a sequence no planner drives

    def decide(self, now_s: float) -> Decision:
        """This sequence's decision when no round planner drives it: a plan for a batch of
        itself (the batch size of its last round, 1 before any)."""
        if self._solo is None:
            self._solo = self.planner_class(self.config)
        return self._solo.plan(now_s, (self,), BatchContext(self.batch_size, self.context_tokens))[
            0
        ]

    def observe_values(
        self,
        now_s,
        drafted,
        accepted,
        confidences,
        draft_s,
        verify_s,
        context_tokens,
        lossy_accepts,
        emitted,
        sentence_ends,
        batch_size=1,
        batch_tokens=0,
        batch_context_tokens=0,
    ) -> None:
        self.rounds += 1
        if drafted:
            self.pending.append((drafted, accepted))
            self.own_round(drafted, accepted, confidences)
        self.batch_size = batch_size if batch_size > 0 else 1
        self.context_tokens = context_tokens + emitted
        solo = self._solo
        if solo is not None:  # no round planner: the round goes to the private one
            solo.members = (self,)
            solo.observe_round(
                RoundStats.of_sequence(
                    now_s,
                    drafted,
                    accepted,
                    emitted,
                    draft_s,
                    verify_s,
                    context_tokens,
                    batch_size,
                    batch_tokens,
                    batch_context_tokens,
                )
            )

    def own_round(self, drafted: int, accepted: int, confidences: tuple[float, ...]) -> None:
        """What the sequence itself learns from a round that drafted (default: nothing)."""

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rounds": self.rounds, "batch_size": self.batch_size}
        if self._solo is not None:
            out.update(self._solo.state())
        return out
