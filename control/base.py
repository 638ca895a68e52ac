"""The controller protocol shared by every scheduler.

A controller is a sans-IO state machine: the driver calls ``decide(now_s)`` before a round and
``observe(obs)`` after it; time is always an argument, never read from a clock. ``reset()``
returns it to its initial state and ``state()`` gives a plain dict for tracing.
"""

from __future__ import annotations

from typing import Any

from control.types import Decision, Observation, observation_values


class Controller:
    """Base class: subclasses set ``name`` and implement ``decide``/``observe``/``reset``/``state``."""

    name: str = "base"
    #: True for controllers that must be told the future (the simulator's ``oracle``).
    needs_future: bool = False
    #: False for controllers whose ``observe`` never reads ``Observation.confidences``: a driver
    #: may then hand them an empty tuple (the simulator skips building per-token tuples).
    reads_confidences: bool = True

    def decide(self, now_s: float) -> Decision:  # pragma: no cover - interface
        raise NotImplementedError

    def observe(self, obs: Observation) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def observe_values(
        self,
        now_s: float,
        drafted: int,
        accepted: int,
        confidences: tuple[float, ...],
        draft_s: float,
        verify_s: float,
        context_tokens: int,
        lossy_accepts: int,
        emitted: int,
        sentence_ends: tuple[int, ...],
        batch_size: int = 1,
        batch_tokens: int = 0,
        batch_context_tokens: int = 0,
    ) -> None:
        """``observe`` with the :class:`Observation` fields passed positionally, in field order.

        Same effect as ``observe(Observation(...))``; a driver that already holds valid values
        (the simulator's hot loop) calls this to skip building the object. Hot controllers
        override it and make ``observe`` delegate here; the default builds the Observation.
        """
        self.observe(
            Observation(
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
                batch_size,
                batch_tokens,
                batch_context_tokens,
            )
        )

    def reset(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def state(self) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def make_planner(cls, config: Any) -> Any:
        """The round planner (:class:`control.batch.RoundPlanner`) that a batched engine calls
        once per round for a batch of this controller's sequences, or None: each sequence
        then decides on its own (``decide``). One planner per engine replica."""
        return None

    def set_slo(self, slo: Any) -> None:
        """Told by a driver that serves SLOs (a :class:`control.batch.Slo`) before the first
        round; controllers that do not plan against SLOs ignore it."""

    def first_token(self, ttft_s: float) -> None:
        """Told by a driver that knows it when the request's first token is out: its time to
        first token (seconds from arrival). Controllers that do not plan against SLOs ignore
        it."""

    def set_future(self, run_length: int) -> None:
        """Told by a driver that knows it: how many of the next drafted tokens would be accepted.

        Only the ``oracle`` uses it; other controllers ignore it.
        """


class ValuesObserver(Controller):
    """A controller whose observing lives in ``observe_values`` (the simulator's hot path):
    ``observe`` hands it an :class:`Observation`'s fields in field order."""

    def observe(self, obs: Observation) -> None:
        self.observe_values(*observation_values(obs))
