"""What flows between a controller and its driver (the simulator or the real engine).

A *round* is one draft phase plus one verify pass for one sequence. The driver asks the
controller for a :class:`Decision`, runs the round, and hands back an :class:`Observation`.
Both drivers also write one :class:`RoundRecord` per round; a table of them is a *trace*,
which calibrates the simulator and can be replayed through any controller.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["strict", "threshold"]
MODES: tuple[str, ...] = ("strict", "threshold")


@dataclass(frozen=True, slots=True)
class Decision:
    """What the controller asks of the next round.

    ``k``: draft length (0 = a plain autoregressive step). ``mode``: ``strict`` (lossless) or
    ``threshold`` (lossy β rule: accept drafted x iff p(x) >= β · max p). ``beta``: the
    verification threshold, used only in threshold mode. ``tau``: drafter-confidence stop —
    drafting stops at the first draft position whose drafter confidence (the drafter's top
    probability there, read *before* a token is drawn; the drafted token's own probability
    under greedy) is below τ (0 = never stop early); it never changes the output, also under
    sampling, because the stop does not depend on the token drawn. ``survival``: survival stop —
    the draft is cut before the first position whose survival probability, the running product
    ``Π_{i≤j} c_i`` of the drafter's confidences (a confidence head's: the chance that position
    i is accepted given the positions before it were), is below it (0 = never cut); like τ it
    never changes the output. Drivers apply it to the drafted block (a block drafter's forward
    costs the same whatever is kept; an autoregressive drafter has drafted all k by then).
    ``block_end``: the previous round closed a semi-autoregressive block (parameters were
    updated; the block's KV is final). ``stops`` (derived): whether τ or the survival stop is
    set (one attribute the simulator reads per sequence per round).
    """

    k: int
    mode: Mode = "strict"
    beta: float = 0.85
    tau: float = 0.0
    block_end: bool = False
    survival: float = 0.0
    stops: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"Decision.k must be >= 0, got {self.k}")
        if self.mode not in MODES:
            raise ValueError(f"Decision.mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "stops", self.tau > 0.0 or self.survival > 0.0)


_FIELDS = ("k", "mode", "beta", "tau", "block_end", "survival", "stops")
_SETTERS = tuple(Decision.__dict__[f].__set__ for f in _FIELDS)  # the slots' own setters


def valid_decision(
    k: int, mode: Mode, beta: float, tau: float, block_end: bool = False, survival: float = 0.0
) -> Decision:
    """``Decision(k, mode, beta, tau, block_end, survival)`` from values already checked
    (``k ≥ 0``, ``mode`` one of ``MODES``: a controller's own or a decision's cut), built
    without the checks: the hot paths' constructor, a third of the time per decision."""
    d = object.__new__(Decision)
    sk, sm, sb, st, se, ss, sp = _SETTERS
    sk(d, k)
    sm(d, mode)
    sb(d, beta)
    st(d, tau)
    se(d, block_end)
    ss(d, survival)
    sp(d, tau > 0.0 or survival > 0.0)
    return d


def draft_stop(
    confidences: Sequence[float], k: int, tau: float = 0.0, survival: float = 0.0
) -> int:
    """Draft tokens kept of ``k`` under a :class:`Decision`'s stops: cut before the first
    position j whose confidence is below ``tau`` or whose survival ``Π_{i≤j} c_i`` is below
    ``survival`` (each 0 = off); positions past the last confidence given are kept."""
    s = 1.0
    for j in range(min(k, len(confidences))):
        c = confidences[j]
        s *= c
        if c < tau or s < survival:
            return j
    return k


class Observation:
    """What happened in one round of one sequence.

    ``drafted`` tokens were proposed (may be fewer than the decision's k when the τ stop
    fired) and the first ``accepted`` of them were kept (acceptance is a prefix). The round
    emitted ``emitted`` tokens: normally ``accepted + 1`` (the target's correction or bonus
    token), fewer only when the request hit its length limit. ``confidences`` holds the
    drafter's confidence at each drafted position (its top probability there; the drafted
    token's own probability under greedy). ``lossy_accepts`` counts accepted tokens
    that strict verification would have rejected (threshold mode only).
    ``sentence_ends`` are 0-based offsets within the emitted tokens that end a sentence.
    The round's batch context: ``batch_size`` sequences shared the round, whose verify pass
    held ``batch_tokens`` = Σ(drafted_i + 1) tokens over ``batch_context_tokens`` of context
    (a batch-1 engine passes 1, drafted + 1 and context_tokens; 0 means "not told").

    Immutable by convention: treat an Observation as a value and never assign to its fields
    (controllers may keep a reference to it, e.g. in their round window). It is a plain
    ``__slots__`` class rather than a frozen dataclass because the simulator builds one per
    sequence per round and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per
    field) dominated that cost. Equality, hashing and ``repr`` are by value over the fields.
    """

    __slots__ = (
        "now_s",
        "drafted",
        "accepted",
        "confidences",
        "draft_s",
        "verify_s",
        "context_tokens",
        "lossy_accepts",
        "emitted",
        "sentence_ends",
        "batch_size",
        "batch_tokens",
        "batch_context_tokens",
    )

    now_s: float
    drafted: int
    accepted: int
    confidences: tuple[float, ...]
    draft_s: float
    verify_s: float
    context_tokens: int
    lossy_accepts: int
    emitted: int  # -1 given means accepted + 1
    sentence_ends: tuple[int, ...]
    batch_size: int
    batch_tokens: int
    batch_context_tokens: int

    def __init__(
        self,
        now_s: float,
        drafted: int,
        accepted: int,
        confidences: tuple[float, ...] = (),
        draft_s: float = 0.0,
        verify_s: float = 0.0,
        context_tokens: int = 0,
        lossy_accepts: int = 0,
        emitted: int = -1,
        sentence_ends: tuple[int, ...] = (),
        batch_size: int = 1,
        batch_tokens: int = 0,
        batch_context_tokens: int = 0,
    ) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(
                f"Observation needs 0 <= accepted <= drafted, "
                f"got accepted={accepted}, drafted={drafted}"
            )
        if confidences and len(confidences) != drafted:
            raise ValueError(
                f"Observation has {len(confidences)} confidences for {drafted} drafted tokens"
            )
        self.now_s = now_s
        self.drafted = drafted
        self.accepted = accepted
        self.confidences = confidences
        self.draft_s = draft_s
        self.verify_s = verify_s
        self.context_tokens = context_tokens
        self.lossy_accepts = lossy_accepts
        self.emitted = accepted + 1 if emitted < 0 else emitted
        self.sentence_ends = sentence_ends
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        self.batch_context_tokens = batch_context_tokens

    def _values(self) -> tuple:
        return observation_values(self)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return (
            "Observation("
            + ", ".join(f"{f}={getattr(self, f)!r}" for f in OBSERVATION_FIELDS)
            + ")"
        )

    @property
    def rejected(self) -> bool:
        """True when the round ended in a rejection (some drafted token was refused)."""
        return self.accepted < self.drafted


#: Field names of :class:`Observation`, in constructor order.
OBSERVATION_FIELDS: tuple[str, ...] = Observation.__slots__
#: an Observation's fields as a tuple, in field order (one C call: observe() is a hot path)
observation_values = operator.attrgetter(*OBSERVATION_FIELDS)


@dataclass(frozen=True)
class RoundRecord:
    """One row of a trace: a round of one request, as recorded by sim or real."""

    request_id: int
    round: int
    now_s: float
    k: int
    drafted: int
    accepted: int
    emitted: int
    draft_s: float
    verify_s: float
    context_tokens: int
    mode: str = "strict"
    beta: float = 0.85
    tau: float = 0.0
    lossy_accepts: int = 0
    block_end: bool = False
    confidences: tuple[float, ...] = ()
    sentence_ends: tuple[int, ...] = ()
    controller: str = ""
    batch_size: int = 1
    batch_tokens: int = 0
    batch_context_tokens: int = 0
    survival: float = 0.0

    @classmethod
    def from_round(
        cls,
        request_id: int,
        round_index: int,
        decision: Decision,
        obs: Observation,
        controller: str = "",
    ) -> RoundRecord:
        return cls(
            request_id=request_id,
            round=round_index,
            now_s=obs.now_s,
            k=decision.k,
            drafted=obs.drafted,
            accepted=obs.accepted,
            emitted=obs.emitted,
            draft_s=obs.draft_s,
            verify_s=obs.verify_s,
            context_tokens=obs.context_tokens,
            mode=decision.mode,
            beta=decision.beta,
            tau=decision.tau,
            lossy_accepts=obs.lossy_accepts,
            block_end=decision.block_end,
            confidences=tuple(obs.confidences),
            sentence_ends=tuple(obs.sentence_ends),
            controller=controller,
            batch_size=obs.batch_size,
            batch_tokens=obs.batch_tokens,
            batch_context_tokens=obs.batch_context_tokens,
            survival=decision.survival,
        )

    def observation(self) -> Observation:
        """The observation this round fed to its controller."""
        return Observation(
            now_s=self.now_s,
            drafted=self.drafted,
            accepted=self.accepted,
            confidences=self.confidences,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            context_tokens=self.context_tokens,
            lossy_accepts=self.lossy_accepts,
            emitted=self.emitted,
            sentence_ends=self.sentence_ends,
            batch_size=self.batch_size,
            batch_tokens=self.batch_tokens,
            batch_context_tokens=self.batch_context_tokens,
        )


@dataclass(frozen=True)
class PositionRecord:
    """Greedy-replay record: what the drafter would do from one output position of a request.

    Under greedy decoding the output is the target's own greedy continuation, and the drafter's
    proposals from output position ``position`` (tokens already emitted) depend only on that
    prefix. ``run_length`` L is how many consecutive drafter proposals from there agree with the
    target (capped at the recorded horizon); ``confidences`` are the drafter's confidences of its
    proposals along the run and of the first disagreeing one (up to the horizon). For any k and
    τ, the round starting here accepts ``n = min(k_eff, L)`` where ``k_eff`` is k cut at the first
    confidence below τ. ``sentence_end``: the target's token at this position ends a sentence.
    """

    request_id: int
    position: int
    run_length: int
    confidences: tuple[float, ...] = ()
    sentence_end: bool = False


_TUPLE_FIELDS = {"confidences": float, "sentence_ends": int}


def _encode(v: Any) -> Any:
    if isinstance(v, tuple):
        return " ".join(repr(float(x)) if isinstance(x, float) else str(x) for x in v)
    return v


def _int_of(x: Any) -> int:
    f = float(x)
    if not f.is_integer():
        raise ValueError(f"not an integer: {x!r}")
    return int(f)


def _decode(name: str, type_name: str, v: Any) -> Any:
    if name in _TUPLE_FIELDS:
        conv: Callable[[Any], Any] = _TUPLE_FIELDS[name]
        if v is None or (isinstance(v, float) and v != v):  # NaN from an empty CSV cell
            return ()
        if conv is int:  # pandas reads a column of single offsets ("0", "3") as floats
            conv = _int_of
        if isinstance(v, (list, tuple)):
            return tuple(conv(x) for x in v)
        return tuple(conv(x) for x in str(v).split())
    if type_name == "int":
        return int(v)
    if type_name == "float":
        return float(v)
    if type_name == "bool":
        return v if isinstance(v, bool) else str(v).strip().lower() in ("true", "1")
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def columns_of(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def records_to_columns(records: Iterable[Any], cls: type = RoundRecord) -> dict[str, list]:
    """Column dict (``pandas.DataFrame(...)``-ready) of RoundRecords (or PositionRecords);
    tuples become space-separated text so the table survives CSV."""
    names = columns_of(cls)
    cols: dict[str, list] = {c: [] for c in names}
    for r in records:
        for c in names:
            cols[c].append(_encode(getattr(r, c)))
    return cols


def records_from_rows(rows: Iterable[dict], cls: type = RoundRecord) -> list[Any]:
    """Inverse of :func:`records_to_columns` from row dicts (``df.to_dict('records')``).

    Missing optional columns take their defaults; a missing required column raises
    ``KeyError`` naming it.
    """
    fields = dataclasses.fields(cls)
    types_ = {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in fields}
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    out = []
    for row in rows:
        for c in required:
            if c not in row:
                raise KeyError(c)
        out.append(cls(**{c: _decode(c, types_[c], row[c]) for c in types_ if c in row}))
    return out


RECORD_COLUMNS: tuple[str, ...] = columns_of(RoundRecord)
POSITION_COLUMNS: tuple[str, ...] = columns_of(PositionRecord)
