"""What the engine asks of a drafter (``real.drafters``: model, n-gram lookup, hybrid).

A drafter proposes up to ``k`` tokens after a sequence's first ``L`` tokens, for one sequence
(``propose``) or for several engine slots at once (``propose_batch``), and is told how many of
its tokens the target accepted (``accept`` / ``accept_batch``) so it can roll its own state back.
A drafter whose ``wants_hidden`` attribute is true (:class:`HiddenStateDrafter`, the feature
conv drafter) is also handed the target's last hidden states after every target pass (prefill and
verify): ``observe_hidden(segs, hidden)``, ``hidden[i]`` belonging to the packed token i of
``segs``. A :class:`CachedDrafter` also holds a per-slot cache (a model drafter's KV cache) that the engine
sizes with ``allocate`` and checks through ``state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from real.sampling import SamplingParams

#: One proposal: (tokens drafted, their confidences, the drafter's probability rows or None).
Proposal = tuple[int, list[float], "torch.Tensor | None"]


@runtime_checkable
class Drafter(Protocol):
    name: str

    def allocate(self, slots: int) -> None: ...

    def reset(self) -> None: ...

    def reset_slot(self, slot: int) -> None: ...

    def propose(
        self,
        seq: torch.Tensor,
        L: int,
        k: int,
        tau: float,
        sp: SamplingParams,
        gen: torch.Generator | None,
    ) -> Proposal: ...

    def propose_batch(
        self,
        seq: torch.Tensor,
        slots: Sequence[int],
        Ls: Sequence[int],
        ks: Sequence[int],
        taus: Sequence[float],
        sp: SamplingParams,
        gens: Any,
    ) -> list[Proposal]: ...

    def accept(self, L: int, drafted: int, n: int) -> None: ...

    def accept_batch(
        self, slots: Sequence[int], Ls: Sequence[int], drafted: Sequence[int], ns: Sequence[int]
    ) -> None: ...


@runtime_checkable
class CachedDrafter(Drafter, Protocol):
    """A drafter with a per-slot cache: ``state["length"]`` positions, ``state["slots"]``;
    ``valid_of(slot)``: how many positions of that slot's cache hold what it has seen (a row that
    drafted nothing for a while is behind and catches up when it next drafts)."""

    state: Any

    def valid_of(self, slot: int) -> int: ...


@runtime_checkable
class HiddenStateDrafter(Drafter, Protocol):
    """A drafter conditioned on the target's hidden states (``wants_hidden`` true): after each
    target pass the engine calls ``observe_hidden(segs, hidden)`` with that pass's packed
    ``real.models.Segments`` and the target's last-layer output ``[N, D]`` (before its final
    norm). Positions the round rejects are overwritten by later passes; the drafter must use
    only positions below the committed length minus one."""

    wants_hidden: bool

    def observe_hidden(self, segs: Any, hidden: torch.Tensor) -> None: ...
