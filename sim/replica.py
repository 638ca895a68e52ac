"""``Replica``: one model replica serving its own batch, as a SimPy process.

A replica owns its resources: the FIFO queue of waiting requests, the requests being
prefilled, the running set, its KV memory and a batch view of the running set. Its process
(:meth:`Replica.serve`) runs one of two schedulers (``deployment.scheduler``):

- ``chunked`` (vLLM / Sarathi-Serve): every forward is a *step* that carries the running
  batch's round (its decode/verify rows) and prompt chunks under a token budget
  (``max_num_batched_tokens``; the rows' Σ(k_i + 1) first, then partial prefills in admission
  order, then newly admitted requests); the step that completes a prompt emits its first token.
- ``prefill-first``: admitted requests are prefilled whole in one pass while the running batch
  waits, then rounds.

A prefill chunk of ``n`` tokens after ``p`` computed ones attends causally to its prefix
(:func:`sim.latency.causal_pairs`) and reads the prefix's KV.

KV memory (``deployment.kv_allocation``): ``reserve`` holds prompt + output tokens from
admission; ``paged`` allocates blocks of ``kv_block_tokens`` as tokens are computed (a prompt
chunk's tokens; a row's context + k + 1, the +1 the token it feeds next round). When a row
cannot hold its context, the newest requests are preempted (partial prefills first, then the
newest running rows, the row itself when it is the newest): their KV is freed, they rejoin the
front of the queue and are prefilled again over prompt + emitted tokens (recompute; the pass
that completes emits one token, as a first prefill does). A row whose drafts do not fit has its
k cut (no preemption for drafts). Counted: ``preemptions``, ``recomputed_tokens`` (prefill work
a preemption sends back: the lost KV and the token the row was about to feed).

Prefix caching (paged KV, ``deployment.prefix_caching``, a trace with ``hash_ids``;
:mod:`sim.prefix_cache`): an admitted request's leading prompt blocks whose hashes are resident
are not prefilled (its first chunk starts after them and reads their KV); blocks a prefill
completes become resident; unreferenced ones are evicted, least recently released first,
before any preemption. Counted: ``prefix_cache_hit_tokens``.

A round (:meth:`Replica.begin_round`, then one SimPy timeout, then :meth:`Replica.settle`) is,
in order: decide (each sequence's controller, or the replica's round planner, gives a Decision;
the engine caps k, and under paged KV the free memory does), draw acceptance (whole-batch numpy
draws), time the round (the draft phase lasts the batch's largest draft-step count × one
drafter step, its first step also carries the step's prompt chunks and the drafter catch-up:
a row that drafts after rounds at k = 0 first prefills the tokens its drafter missed, one per
such round; :meth:`Replica.catch_up`; one target pass verifies
Σ(k_i + 1) tokens with the chunks), then observe (each controller gets its Observation with the
modelled times and the batch context; the planner gets the round's RoundStats) and advance
(positions move; a request ends when it has emitted its output length, the last round's
emission capped).

Speed: the batch view keeps the controllers' bound ``decide``/``observe_values``, positions,
context lengths, remaining tokens and KV capacity between rounds and is rebuilt only when the
running set changes; per-sequence work besides the controller calls is a few list
comprehensions, and random draws are whole-batch numpy calls in a fixed order (so results are
bit-identical to the one-array-per-round formulation): run lengths, confidences, lossy
resampling, sentence ends, then the acceptance model's own advance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

from sim.acceptance import AcceptanceModel
from sim.cluster import Cluster
from sim.kv_memory import KvMemory
from sim.ledger import Ledger
from sim.params import EngineParams
from sim.prefill_scheduler import PrefillScheduler
from sim.rounds import BatchView, Round, RoundExecutor, observer
from sim.trace import RoundTrace

__all__ = ["BatchView", "Replica", "Round", "Shared", "observer"]


@dataclass
class Shared:
    """What all replicas of a run share: the clock, the parameters, the models, the ledger,
    the controller factory, the trace (None: untraced) and what the controllers ask for
    (``needs_future``: told each round's run lengths; ``confidences_to_controllers``: per-token
    confidence tuples are built for them)."""

    env: simpy.Environment
    params: EngineParams
    cluster: Cluster
    acc: AcceptanceModel
    ledger: Ledger
    make_ctrl: Callable[[], Any]
    tracer: RoundTrace | None
    needs_future: bool
    confidences_to_controllers: bool


class Replica(RoundExecutor, PrefillScheduler, KvMemory):
    """One replica: its waiting queue, prefills, running set, KV memory, batch view and round
    planner. Its concepts are its bases: :class:`~sim.kv_memory.KvMemory`,
    :class:`~sim.prefill_scheduler.PrefillScheduler` and :class:`~sim.rounds.RoundExecutor`."""

    def __init__(self, index: int, shared: Shared, planner: Any = None) -> None:
        self.index = index
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.controllers: dict[int, Any] = {}
        self.kv_used = 0.0  # bytes reserved (kv_allocation = 'reserve')
        self.outstanding = 0
        self.wake: simpy.Event | None = None
        self.batch: BatchView | None = None
        self.planner = planner
        self.planner_needs_future = bool(getattr(planner, "needs_future", False))
        self.planner_needs_rates = bool(getattr(planner, "needs_rates", False))
        # read every round: own attributes rather than chains through ``shared``
        self.env, self.params, self.cluster = shared.env, shared.params, shared.cluster
        self.acc, self.ledger, self.counters = shared.acc, shared.ledger, shared.ledger.counters
        self.make_ctrl, self.tracer = shared.make_ctrl, shared.tracer
        self.needs_future = shared.needs_future
        self.confidences_to_controllers = shared.confidences_to_controllers
        self.caps_draft, self.max_draft = shared.params.caps_draft, shared.params.max_draft
        self.draft_cap = shared.params.draft_cap
        self.warmup_s = shared.params.warmup_s
        self.round_overhead_s = shared.params.round_overhead_s
        self.progress = shared.ledger.progress
        p = shared.params
        # scheduling: prompts being prefilled (admission order), each one's prefill length
        # (prompt + tokens emitted before a preemption) and tokens of it computed
        self.chunked = p.scheduler == "chunked"
        self.token_budget = p.max_num_batched_tokens
        self.chunk_cap = p.prefill_chunk_tokens or p.max_num_batched_tokens
        self.shortest_first = p.prefill_order == "shortest-first"
        self.prefilling: list[int] = []
        self.target: dict[int, int] = {}
        self.computed: dict[int, int] = {}
        # paged KV: free blocks, KV tokens each request holds (a multiple of the block size)
        self.paged = p.kv_allocation == "paged"
        self.block = p.kv_block_tokens
        self.free_blocks = p.kv_blocks
        self.max_tokens = p.kv_blocks * p.kv_block_tokens
        self.kv_cap: dict[int, int] = {}
        self.prefix = self.prefix_cache(p)
        self.rows_short = False  # some running row may hold less KV than its context
        # drafter catch-up: tokens a request's drafter has not seen (nonzero entries; a live
        # batch view holds the running rows'); only with a drafter deployed
        self.catches_up = shared.cluster.use_drafter
        self.behind: dict[int, int] = {}
        self.preempted_now = False  # a preemption in this step (no admissions then)

    # -- arrivals and the process -------------------------------------------------------------
    def enqueue(self, i: int) -> None:
        """Request ``i`` joins the waiting queue (wakes the replica when idle)."""
        self.outstanding += 1
        self.waiting.append(i)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def serve(self):
        """The replica's SimPy process: a step (chunked) or a prefill pass / a round
        (prefill-first), else sleep."""
        env = self.env
        while True:
            if self.chunked:
                if self.running or self.prefilling or self.waiting:
                    ran = yield from self.step()
                    if ran:
                        continue
                    if self.running or self.prefilling or self.waiting:
                        raise RuntimeError(
                            f"replica {self.index}: no step possible with "
                            f"{len(self.waiting)} waiting requests"
                        )
            else:
                admitted = self.admit() if self.waiting else None
                if admitted:
                    yield env.timeout(
                        self.prefill_seconds(
                            [
                                (i, self.target[i] - self.computed[i], self.computed[i])
                                for i in admitted
                            ]
                        )
                    )
                    self.prefilled(admitted, env.now)
                    continue
                if self.running:
                    batch, rnd = self.begin_round()
                    yield env.timeout(self.time_round(batch, rnd))
                    self.settle(batch, rnd, env.now)
                    continue
            self.wake = env.event()
            yield self.wake
            self.wake = None

    def step(self):
        """One forward of the chunked scheduler: the running batch's round (if any) and the
        prompt chunks that fit the rest of the token budget. Returns whether it ran."""
        self.preempted_now = False
        batch = rnd = None
        budget = self.token_budget
        if self.running:
            batch, rnd = self.begin_round()
            budget -= sum(rnd.k) + rnd.size
        chunks = (
            self.schedule_chunks(budget) if budget > 0 and (self.prefilling or self.waiting) else []
        )
        if rnd is None:
            if not chunks:
                return False
            yield self.env.timeout(self.prefill_seconds(chunks))
        else:
            yield self.env.timeout(self.time_round(batch, rnd, chunks))
            self.settle(batch, rnd, self.env.now)
        if chunks:
            self.chunks_done(chunks, self.env.now)
        return True

    def finish(self, i: int, t: float) -> None:
        self.ledger.finish(i, t)
        if self.paged:
            self.free_kv(i)
        else:
            self.kv_used -= self.ledger.kv_need[i]
        self.outstanding -= 1
        self.controllers.pop(i, None)
        self.behind.pop(i, None)

    def flush(self) -> None:
        """Write the batch view's positions (and KV capacities) back and drop it (the running
        set changes)."""
        b = self.batch
        if b is not None:
            self.ledger.emitted[b.ids] = b.positions
            if b.cap:
                self.kv_cap.update(zip(b.request_ids, b.cap))
            if b.lagging or self.behind:
                for i, x in zip(b.request_ids, b.behind):
                    if x:
                        self.behind[i] = x
                    else:
                        self.behind.pop(i, None)
            self.batch = None

    def view(self) -> BatchView:
        """The batch view of the running set (built when the set changed)."""
        batch = self.batch
        if batch is None:
            ledger = self.ledger
            batch = self.batch = BatchView(
                list(self.running),
                [self.controllers[i] for i in self.running],
                ledger.emitted,
                ledger.prompt,
                ledger.output,
                self.kv_cap if self.paged else None,
                ledger.total,
                self.behind,
            )
        return batch
