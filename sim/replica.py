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
from itertools import islice, repeat
from typing import Any

import numpy as np
import simpy

from control.batch import BatchContext, RoundStats
from control.errors import ConfigError
from control.types import Observation
from sim.acceptance import AcceptanceModel, lossy_probability
from sim.cluster import Cluster
from sim.drafting import cap_draft_lengths, confidence_stop, resample_lossy
from sim.latency import causal_pairs
from sim.ledger import Ledger
from sim.params import EngineParams
from sim.prefix_cache import PrefixCache
from sim.trace import RoundTrace


def observer(c: Any) -> Callable[..., None]:
    """``c.observe_values`` (Observation fields positionally), or an adapter for a controller
    that only has ``observe``."""
    f = getattr(c, "observe_values", None)
    if f is not None:
        return f
    obs = c.observe
    return lambda *values: obs(Observation(*values))


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


class BatchView:
    """The running set as the round loop reads it, kept between rounds until the set changes:
    request ids (list and numpy), controllers and their bound ``decide`` and observe methods,
    positions (numpy; authoritative while the view lives, written back to the ledger by
    :meth:`Replica.flush`), context lengths and remaining tokens (lists); under paged KV the
    KV tokens each row holds (``cap``, authoritative while the view lives) and its prompt +
    output (``total``); the tokens each row's drafter has not seen (``behind``, authoritative
    while the view lives)."""

    __slots__ = (
        "behind",
        "cap",
        "context",
        "controllers",
        "decide",
        "ids",
        "lagging",
        "observe",
        "positions",
        "remaining",
        "request_ids",
        "total",
    )
    cap: list[int]  # empty unless paged
    total: list[int]  # empty unless paged
    behind: list[int]  # tokens each row's drafter has not seen (see Replica.catch_up)
    lagging: bool  # some row's drafter is behind

    def __init__(
        self,
        request_ids: list[int],
        controllers: list,
        emitted: np.ndarray,
        prompt: list[int],
        output: list[int],
        kv_cap: dict[int, int] | None = None,
        total: list[int] | None = None,
        behind: dict[int, int] | None = None,
    ) -> None:
        self.request_ids = request_ids
        self.ids = ids = np.array(request_ids, dtype=np.int64)
        self.controllers = controllers
        self.decide = [c.decide for c in controllers]
        self.observe = [observer(c) for c in controllers]
        self.positions = emitted[ids]
        pos = self.positions.tolist()
        self.context = [prompt[i] + p for i, p in zip(request_ids, pos)]
        self.remaining = [output[i] - p for i, p in zip(request_ids, pos)]
        if kv_cap is not None and total is not None:
            self.cap = [kv_cap[i] for i in request_ids]
            self.total = [total[i] for i in request_ids]
        else:
            self.cap, self.total = [], []
        self.behind = [behind.get(i, 0) for i in request_ids] if behind else [0] * len(pos)
        self.lagging = any(self.behind)


class Round:
    """One round of a batch, filled step by step: its decisions, the (capped) draft lengths
    ``k``, drafted tokens (after the τ stop), accepted tokens, the drawn confidences and lossy
    accepts (None when not drawn), draft steps, and its cost. No ``__init__``: one is made per
    round, and the steps set its fields."""

    __slots__ = (
        "accepted",
        "catchup_tokens",
        "confidences",
        "context_tokens",
        "decisions",
        "draft_s",
        "draft_steps",
        "drafted",
        "drafting",
        "k",
        "k_array",
        "lossy",
        "max_k",
        "prefill_tokens",
        "size",
        "start_s",
        "verify_s",
        "verify_tokens",
    )
    accepted: list[int]
    catchup_tokens: int
    confidences: np.ndarray | None
    context_tokens: int
    decisions: list[Any]
    draft_s: float
    draft_steps: int
    drafted: list[int]
    drafting: int
    k: list[int]
    k_array: np.ndarray | None
    lossy: np.ndarray | None
    max_k: int
    prefill_tokens: int
    size: int
    start_s: float
    verify_s: float
    verify_tokens: int


class Replica:
    """One replica: its waiting queue, prefills, running set, KV memory, batch view and round
    planner."""

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

    # -- admission and prefill ----------------------------------------------------------------
    def never_fits(self, i: int) -> bool:
        """Whether request ``i`` (prompt + output) can never be held in this replica's KV."""
        if self.paged:
            return self.ledger.total[i] > self.max_tokens
        return self.ledger.kv_need[i] > self.params.kv_budget_bytes

    def reject(self, i: int) -> None:
        """Request ``i`` (at the head of the queue) can never fit: reported unfinished."""
        self.waiting.popleft()
        self.ledger.rejected[i] = True
        self.outstanding -= 1

    def prefill_length(self, i: int) -> int:
        """Tokens a (re)prefill of request ``i`` computes: its prompt and the tokens it emitted
        before a preemption."""
        return self.ledger.prompt[i] + int(self.ledger.emitted[i])

    def admit(self) -> list[int]:
        """Prefill-first: waiting requests admitted whole in FIFO order while the batch has room
        and their KV fits (reserve: prompt + output; paged: the prefill's blocks); one that can
        never fit is rejected (reported unfinished)."""
        room = self.params.max_batch - len(self.running)
        admitted: list[int] = []
        while len(admitted) < room:
            head = self.admit_head(None)
            if head is None:
                break
            admitted.append(head[0])
        return admitted

    def admit_head(self, limit: int | None) -> tuple[int, int, int] | None:
        """Admits the head of the queue for its first ``limit`` prefill tokens (None: all):
        heads that can never fit are rejected; the one admitted takes its cached prefix and the
        KV of its first tokens. Returns (request, tokens, prefix), None when the queue is empty
        or its head does not fit now."""
        waiting = self.waiting
        while waiting:
            if self.shortest_first and len(waiting) > 1:
                self.shortest_to_front()
            i = waiting[0]
            if self.never_fits(i):
                self.reject(i)
                continue
            t = self.prefill_length(i)
            s = self.cache_lookup(i, t)
            n = t - s if limit is None else min(t - s, limit)
            if not self.reserve_kv(i, n, s):
                return None
            waiting.popleft()
            self.target[i], self.computed[i] = t, s
            admitted = self.ledger.admitted_s
            if admitted[i] != admitted[i]:  # NaN: the first admission
                admitted[i] = self.env.now
            return i, n, s
        return None

    def shortest_to_front(self) -> None:
        """'shortest-first': the waiting request with the fewest prefill tokens (the earliest
        of equals) moves to the head of the queue."""
        waiting = self.waiting
        j = min(range(len(waiting)), key=lambda x: self.prefill_length(waiting[x]))
        if j:
            i = waiting[j]
            del waiting[j]
            waiting.appendleft(i)

    def reserve_kv(self, i: int, tokens: int, cached: int = 0) -> bool:
        """KV memory for admitting request ``i``: paged, the blocks of its first ``tokens``
        after the ``cached`` prefix tokens it shares with the prefix cache (evicting unused
        cache blocks when short); reserve, prompt + output at once. False (nothing taken, the
        cached prefix released) when it does not fit now."""
        if self.paged:
            blocks = -(-tokens // self.block)
            if blocks > self.free_blocks and self.prefix is not None:
                self.reclaim(blocks)
            if blocks > self.free_blocks:
                if self.prefix is not None:
                    self.prefix.release(i)
                return False
            self.free_blocks -= blocks
            self.kv_cap[i] = cached + blocks * self.block
            if cached:
                self.counters.prefix_cache_hit_tokens += cached
            return True
        need = self.ledger.kv_need[i]
        if self.kv_used + need > self.params.kv_budget_bytes:
            return False
        self.kv_used += need
        return True

    def schedule_chunks(self, budget: int) -> list[tuple[int, int, int]]:
        """Chunked: the step's prompt chunks ``(request, tokens, prefix)`` within ``budget``
        tokens: partial prefills in admission order, then (unless this step preempted) newly
        admitted requests while the batch has room and their first chunk's KV fits.
        'shortest-first': partial prefills by the tokens they have left, and a waiting request
        with fewer prefill tokens than the next partial prefill has left is admitted before it."""
        chunks: list[tuple[int, int, int]] = []
        cap, prefilling = self.chunk_cap, self.prefilling
        order = (
            sorted(prefilling, key=lambda i: self.target[i] - self.computed[i])
            if self.shortest_first
            else list(prefilling)
        )
        for i in order:
            if budget <= 0:
                break
            if i not in prefilling:  # preempted by an older prefill's growth
                continue
            c = self.computed[i]
            if self.shortest_first:
                budget = self.admit_chunks(chunks, budget, self.target[i] - c)
                if budget <= 0:
                    break
            n = min(self.target[i] - c, budget, cap)
            if self.paged:
                n = min(n, self.allocate(i, c + n) - c)
                if n <= 0:
                    break
            chunks.append((i, n, c))
            budget -= n
        self.admit_chunks(chunks, budget, None)
        return chunks

    def admit_chunks(
        self, chunks: list[tuple[int, int, int]], budget: int, shorter_than: int | None
    ) -> int:
        """Admits waiting requests (their first chunks appended to ``chunks``) while the batch
        has room, the budget lasts and the head's KV fits; with ``shorter_than``, only heads
        of fewer prefill tokens ('shortest-first'). Never in a step that preempted. Returns
        the budget left."""
        cap, prefilling, waiting = self.chunk_cap, self.prefilling, self.waiting
        room = self.params.max_batch - len(self.running) - len(prefilling)
        while room > 0 and budget > 0 and waiting and not self.preempted_now:
            if shorter_than is not None:
                if len(waiting) > 1:
                    self.shortest_to_front()
                if self.prefill_length(waiting[0]) >= shorter_than:
                    break
            head = self.admit_head(min(budget, cap))
            if head is None:
                break
            prefilling.append(head[0])
            chunks.append(head)
            budget -= head[1]
            room -= 1
        return budget

    def chunk_stats(self, chunks: list[tuple[int, int, int]]) -> tuple[int, int, int, int]:
        """(chunks, their tokens, causal query-key pairs, prefix tokens read); counts the
        tokens as prefill work."""
        tokens = pairs = prefix = 0
        for _, n, p in chunks:
            tokens += n
            pairs += causal_pairs(n, p)
            prefix += p
        self.counters.prefill_computed += tokens
        return len(chunks), tokens, pairs, prefix

    def prefill_seconds(self, chunks: list[tuple[int, int, int]]) -> float:
        """Duration of a pass of prompt chunks alone (target, and drafter when deployed)."""
        cl, cnt = self.cluster, self.counters
        count, tokens, pairs, prefix = self.chunk_stats(chunks)
        seconds = cl.lat_t.pass_seconds(0, 0, 0.0, count, tokens, pairs, prefix)
        busy = seconds * cl.tp
        cnt.bytes_moved += cl.roof_t.bytes_per_gpu(count, tokens, prefix) * cl.tp
        if cl.use_drafter:
            drafter_s = cl.lat_d.pass_seconds(0, 0, 0.0, count, tokens, pairs, prefix)
            cnt.bytes_moved += cl.roof_d.bytes_per_gpu(count, tokens, prefix) * cl.dtp
            busy += drafter_s * cl.dtp
            seconds = seconds + drafter_s if cl.colocated else max(seconds, drafter_s)
        cnt.gpu_busy_s += busy
        return seconds

    def chunks_done(self, chunks: list[tuple[int, int, int]], t: float) -> None:
        """After a step: the chunks' tokens are computed; completed prefills emit."""
        computed, target = self.computed, self.target
        done = []
        for i, n, _ in chunks:
            computed[i] += n
            if computed[i] >= target[i]:
                done.append(i)
            if self.prefix is not None:
                self.prefix.register(i, computed[i], self.ledger.prompt[i])
        if done:
            for i in done:
                self.prefilling.remove(i)
            self.prefilled(done, t)

    def prefilled(self, ids: list[int], t: float) -> None:
        """After a completed prefill: each emits one token (its first, or after a recompute its
        next); requests that are done end, the others run."""
        self.flush()
        ledger, cnt, warmup_s = self.ledger, self.counters, self.params.warmup_s
        first, emitted, output = ledger.first_token_s, ledger.emitted, ledger.output
        for i in ids:
            if self.prefix is not None:
                self.prefix.register(i, self.target[i], ledger.prompt[i])
            del self.target[i]
            self.computed.pop(i, None)
            if first[i] != first[i]:  # NaN: the first prefill
                first[i] = t
            e = int(emitted[i]) + 1
            emitted[i] = e
            cnt.prefill_tokens += 1
            if t >= warmup_s:
                cnt.measured_tokens += 1
            if e >= output[i]:
                self.finish(i, t)
            else:
                if i not in self.controllers:
                    c = self.controllers[i] = self.make_ctrl()
                    told = getattr(c, "first_token", None)
                    if told is not None:
                        told(t - float(self.ledger.reqs.arrival_s[i]))
                self.running.append(i)
                self.rows_short = self.paged
        ledger.report_progress()

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

    # -- paged KV ------------------------------------------------------------------------------
    def allocate(self, i: int, need: int) -> int:
        """Paged: blocks so that request ``i`` holds KV for ``need`` tokens, preempting newer
        requests (:meth:`victim`) while memory is short; returns the tokens it holds (fewer
        than ``need`` when nothing newer is left to preempt)."""
        cap, bs = self.kv_cap.get(i, 0), self.block
        while need > cap:
            blocks = -(-(need - cap) // bs)
            if blocks <= self.free_blocks:
                self.free_blocks -= blocks
                cap += blocks * bs
                break
            if self.prefix is not None and self.prefix.lru:
                self.reclaim(blocks)
                continue
            victim = self.victim(i)
            if victim is None:
                cap += self.free_blocks * bs
                self.free_blocks = 0
                break
            self.preempt(victim)
        self.kv_cap[i] = cap
        return cap

    def victim(self, i: int) -> int | None:
        """The newest request that ``i`` may preempt: the last partial prefill, else (when
        ``i`` runs) the last running row; None when ``i`` is the newest."""
        prefilling, running = self.prefilling, self.running
        if prefilling and prefilling[-1] != i:
            return prefilling[-1]
        if i in prefilling:
            return None
        if running and running[-1] != i:
            return running[-1]
        return None

    def preempt(self, v: int) -> None:
        """Free request ``v``'s KV and send it back to the front of the queue: it is prefilled
        again over its prompt and emitted tokens (recompute)."""
        cnt = self.counters
        if v in self.prefilling:
            self.prefilling.remove(v)
            lost = self.computed.pop(v, 0)
        else:
            self.flush()
            self.running.remove(v)
            lost = self.prefill_length(v)
        self.target.pop(v, None)
        self.behind.pop(v, None)  # the recompute prefills the drafter too
        self.free_kv(v)
        cnt.preemptions += 1
        cnt.recomputed_tokens += lost
        self.waiting.appendleft(v)
        self.preempted_now = True

    def prefix_cache(self, p: EngineParams) -> PrefixCache | None:
        """The replica's prefix cache: paged KV, ``prefix_caching`` on and a trace with hash
        ids; else None."""
        hashes = self.ledger.hash_ids
        if not (self.paged and p.prefix_caching and hashes is not None):
            return None
        if p.hash_block_tokens % p.kv_block_tokens:
            raise ConfigError(
                f"workload.trace_hash_block_tokens = {p.hash_block_tokens} is not a multiple of "
                f"deployment.kv_block_tokens = {p.kv_block_tokens}; prefix caching shares whole "
                "KV blocks (or set deployment.prefix_caching = false)"
            )
        return PrefixCache(hashes, p.hash_block_tokens, p.kv_block_tokens)

    def cache_lookup(self, i: int, tokens: int) -> int:
        """Prefix tokens of request ``i``'s prefill of ``tokens`` held by the prefix cache
        (pinned until it leaves; 0 without a cache)."""
        if self.prefix is None:
            return 0
        return self.prefix.lookup(i, tokens, self.ledger.prompt[i])

    def reclaim(self, blocks: int) -> None:
        """Evicts unused prefix-cache blocks until ``blocks`` KV blocks are free (or none is
        left to evict)."""
        assert self.prefix is not None
        freed = self.prefix.evict(blocks - self.free_blocks)
        self.free_blocks += freed
        self.counters.prefix_cache_evictions += freed // self.prefix.blocks

    def free_kv(self, i: int) -> None:
        """Paged: request ``i``'s own KV blocks are freed; those it shares stay cached."""
        cached = self.prefix.release(i) if self.prefix is not None else 0
        self.free_blocks += (self.kv_cap.pop(i, 0) - cached) // self.block

    def ensure_rows(self) -> None:
        """Paged: every running row holds KV for its context (its next round at k = 0); rows
        that cannot get it preempt the newest requests, or themselves when they are the
        newest."""
        batch = self.view()
        if max([c - k for c, k in zip(batch.context, batch.cap)]) <= 0:
            self.rows_short = False
            return
        self.flush()
        for i in list(self.running):
            if i not in self.running:
                continue
            need = self.prefill_length(i)  # prompt + emitted = the row's context
            if self.allocate(i, need) < need:
                self.preempt(i)
        self.rows_short = False

    def grow_rows(self, batch: BatchView, rnd: Round) -> None:
        """Paged: each row's KV grows to context + k + 1 (capped at prompt + output); when
        the free blocks run out, the rows left have their k cut to what fits."""
        cap, total = batch.cap, batch.total
        need = [t if c + k + 1 > t else c + k + 1 for c, k, t in zip(batch.context, rnd.k, total)]
        if max([n - c for n, c in zip(need, cap)]) <= 0:
            return
        bs, k_new, cut = self.block, list(rnd.k), False
        for j, (n, c) in enumerate(zip(need, cap)):
            if n <= c:
                continue
            blocks = -(-(n - c) // bs)
            if blocks > self.free_blocks and self.prefix is not None:
                self.reclaim(blocks)
            if blocks > self.free_blocks:
                blocks = self.free_blocks
                room = c + blocks * bs - batch.context[j] - 1  # drafts that fit
                k_new[j] = max(min(k_new[j], room), 0)
                cut = True
                self.rows_short = True
            self.free_blocks -= blocks
            cap[j] = c + blocks * bs
        if cut:
            rnd.k = k_new
            if rnd.k_array is not None:
                rnd.k_array = np.array(k_new, dtype=np.int64)
            rnd.max_k = max(k_new)

    # -- a round ------------------------------------------------------------------------------
    def begin_round(self) -> tuple[BatchView, Round]:
        """The running batch's round up to its timing: decisions, capped k, acceptance."""
        if self.rows_short:
            self.ensure_rows()
        batch = self.view()
        rnd = Round()
        rnd.start_s, rnd.size = self.env.now, len(batch.request_ids)
        run_lengths = self.acc.run_lengths(batch.ids, batch.positions)
        self.decide(batch, rnd, run_lengths)
        if self.paged:
            self.grow_rows(batch, rnd)
        if rnd.max_k > 0:
            self.draw_acceptance(batch, rnd, run_lengths)
        else:
            rnd.drafted, rnd.accepted = rnd.k, [0] * rnd.size
            rnd.confidences = rnd.lossy = None
            rnd.draft_steps = 0
        return batch, rnd

    def decide(self, batch: BatchView, rnd: Round, run_lengths: np.ndarray) -> None:
        """The round's decisions (the controllers', or the planner's) and the capped k."""
        now = rnd.start_s
        if self.needs_future:
            for c, future in zip(batch.controllers, run_lengths.tolist()):
                c.set_future(future)
        if self.planner is None:
            decisions = [f(now) for f in batch.decide]
        else:
            decisions = self.plan(batch, now, run_lengths)
        rnd.decisions = decisions
        k = [d.k for d in decisions]
        if self.caps_draft:
            last_useful = (
                self.ledger.reqs.output_tokens[batch.ids] - batch.positions - 1
                if self.params.draft_within_length
                else None
            )
            k_array = cap_draft_lengths(np.array(k, dtype=np.int64), self.max_draft, last_useful)
            rnd.k_array, rnd.k, rnd.max_k = k_array, k_array.tolist(), int(k_array.max())
        else:
            rnd.k_array, rnd.k, rnd.max_k = None, k, max(k)

    def plan(self, batch: BatchView, now: float, run_lengths: np.ndarray) -> list:
        """The planner's decisions for the batch (told the run lengths / true rates first
        when it asks for them)."""
        planner = self.planner
        if self.planner_needs_future:
            planner.set_futures(run_lengths.tolist())
        if self.planner_needs_rates:
            planner.set_rates(self.acc.true_rates(batch.ids, batch.positions).tolist())
        size = len(batch.request_ids)
        decisions = planner.plan(
            now,
            batch.controllers,
            BatchContext(
                size,
                sum(batch.context),
                self.max_draft,
                *self.prefill_pressure(),
                self.waiting_since(),
            ),
        )
        if len(decisions) != size:
            raise ValueError(
                f"round planner returned {len(decisions)} decisions for a batch of {size}"
            )
        return decisions

    def partial_prefill_left(self) -> int:
        """Prompt tokens the partial prefills have still to compute."""
        return sum([self.target[i] - self.computed[i] for i in self.prefilling])

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens this replica has still to prefill: the rest of each partial prefill
        and every waiting request's (re)prefill (prefix-cache hits not deducted)."""
        return self.partial_prefill_left() + sum([self.prefill_length(i) for i in self.waiting])

    def waiting_since(self) -> float | None:
        """Arrival time of the oldest request with prompt tokens left to prefill (partial
        prefills, then the head of the queue), None when none waits."""
        arrival = self.ledger.reqs.arrival_s
        times = [arrival[i] for i in self.prefilling]
        if self.waiting:
            times.append(arrival[self.waiting[0]])
        return float(min(times)) if times else None

    def prefill_pressure(self) -> tuple[int, int | None]:
        """(prompt tokens waiting for the next chunks, the pass's token budget) under chunked
        prefill: partial prefills' remaining tokens, then waiting requests that the batch has
        room for; (0, None) when prefill does not share the pass."""
        if not self.chunked:
            return 0, None
        backlog = self.partial_prefill_left()
        room = self.params.max_batch - len(self.running) - len(self.prefilling)
        for i in islice(self.waiting, max(room, 0)):
            backlog += self.prefill_length(i)
        return backlog, self.token_budget

    def draw_acceptance(self, batch: BatchView, rnd: Round, run_lengths: np.ndarray) -> None:
        """Confidences, the τ stop, accepted tokens and threshold-mode lossy accepts
        (a round with some k > 0)."""
        acc, decisions, max_k = self.acc, rnd.decisions, rnd.max_k
        any_tau = any([d.tau for d in decisions])  # noqa: C419 - a list comp is faster here
        if any_tau or self.confidences_to_controllers:
            rnd.confidences = acc.confidences(batch.ids, batch.positions, run_lengths, max_k)
        else:
            acc.skip_confidences(rnd.size, max_k)
            rnd.confidences = None
        drafted = accepted = None  # numpy arrays, only when needed
        if any_tau:
            assert rnd.confidences is not None
            k = rnd.k_array if rnd.k_array is not None else np.array(rnd.k, dtype=np.int64)
            drafted, rnd.draft_steps = confidence_stop(
                rnd.confidences, np.array([d.tau for d in decisions]), k
            )
            accepted = np.minimum(drafted, run_lengths)
            rnd.drafted = drafted.tolist()
        else:
            rnd.draft_steps, rnd.drafted = max_k, rnd.k
        if rnd.draft_steps and self.cluster.block_size:
            rnd.draft_steps = 1  # a block drafter (sim.block): one forward whatever k <= B
        rnd.lossy = None
        if "threshold" in [d.mode for d in decisions]:
            if drafted is None:
                drafted = (
                    rnd.k_array if rnd.k_array is not None else np.array(rnd.k, dtype=np.int64)
                )
                accepted = np.minimum(drafted, run_lengths)
            assert accepted is not None
            accepted, rnd.lossy = self.lossy_accepts(batch, decisions, accepted, drafted)
        if accepted is None:
            rnd.accepted = [
                x if x < y else y  # not min(): slower
                for x, y in zip(run_lengths.tolist(), rnd.drafted)
            ]
        else:
            rnd.accepted = accepted.tolist()

    def lossy_accepts(
        self, batch: BatchView, decisions: list, accepted: np.ndarray, drafted: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        threshold = np.array([d.mode == "threshold" for d in decisions])
        beta = np.array([d.beta for d in decisions])
        pass_probability = np.where(
            threshold, lossy_probability(beta, self.params.lossy_accept_max), 0.0
        )
        return resample_lossy(
            accepted,
            drafted,
            pass_probability,
            batch.ids,
            batch.positions,
            self.acc.rng,
            self.acc.run_lengths,
        )

    def time_round(
        self, batch: BatchView, rnd: Round, chunks: list[tuple[int, int, int]] | None = None
    ) -> float:
        """The round's modelled seconds (draft phase, verify pass with the step's prompt
        chunks, fixed overhead); counts GPU time and bytes moved."""
        cl, cnt = self.cluster, self.counters
        size = rnd.size
        context = rnd.context_tokens = sum(batch.context)
        rnd.drafting = size - rnd.k.count(0)
        tokens = rnd.verify_tokens = sum(rnd.drafted) + size
        rnd.prefill_tokens = rnd.catchup_tokens = 0
        stats = None
        if chunks:
            stats = self.chunk_stats(chunks)
            rnd.prefill_tokens = stats[1]
        draft_s = self.draft_seconds(batch, rnd, stats)
        if stats is not None:
            count, ctok, pairs, prefix = stats
            verify_s = cl.lat_t.pass_seconds(
                size, tokens, float(context), count, ctok, pairs, prefix
            )
            cnt.bytes_moved += (
                cl.roof_t.bytes_per_gpu(size, tokens, float(context + prefix)) * cl.tp
            )
        else:
            verify_s = cl.lat_t.seconds(size, tokens, float(context))
            cnt.bytes_moved += cl.roof_t.bytes_per_gpu(size, tokens, float(context)) * cl.tp
        cnt.gpu_busy_s += (
            (draft_s + verify_s) * cl.tp if cl.colocated else (verify_s * cl.tp + draft_s * cl.dtp)
        )
        rnd.draft_s, rnd.verify_s = draft_s, verify_s
        return draft_s + verify_s + self.round_overhead_s

    def draft_seconds(
        self, batch: BatchView, rnd: Round, stats: tuple[int, int, int, int] | None
    ) -> float:
        """The draft phase: ``draft_steps`` drafter steps over the drafting rows (a measured
        table's draft-phase rows, :meth:`Cluster.draft_phase_s`); the first also carries the
        drafter's share of the step's prompt chunks (``stats``) and the drafting rows' catch-up
        (:meth:`catch_up`). Without drafting, the prompt chunks' drafter pass."""
        cl, cnt = self.cluster, self.counters
        steps, size, drafting = rnd.draft_steps, rnd.size, rnd.drafting
        if self.catches_up and (batch.lagging or drafting < size):
            stats = self.catch_up(batch, rnd, stats)
        if not steps:
            if stats is None or not cl.use_drafter:
                return 0.0
            count, ctok, pairs, prefix = stats
            cnt.bytes_moved += cl.roof_d.bytes_per_gpu(count, ctok, prefix) * cl.dtp
            return cl.lat_d.pass_seconds(0, 0, 0.0, count, ctok, pairs, prefix)
        draft_context = float(
            rnd.context_tokens
            if drafting == size
            else sum([c for c, x in zip(batch.context, rnd.k) if x])
        )
        if stats is None:
            cnt.bytes_moved += (
                steps * cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context) * cl.dtp
            )
            return cl.draft_phase_s(drafting, steps, draft_context)
        count, ctok, pairs, prefix = stats
        cnt.bytes_moved += (
            cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context + prefix)
            + (steps - 1) * cl.roof_d.bytes_per_gpu(drafting, drafting, draft_context)
        ) * cl.dtp
        if cl.phase is not None:  # the measured phase, plus what the chunks add to its first
            # step: the drafter's rows of `count + ctok` tokens less those of `count`
            feed = cl.lat_d.seconds(count, ctok + count, prefix) - cl.lat_d.seconds(
                count, count, prefix
            )
            return cl.draft_phase_s(drafting, steps, draft_context) + max(feed, 0.0)
        return cl.lat_d.pass_seconds(
            drafting, drafting, draft_context, count, ctok, pairs, prefix
        ) + (steps - 1) * cl.lat_d.seconds(drafting, drafting, draft_context)

    def catch_up(
        self, batch: BatchView, rnd: Round, stats: tuple[int, int, int, int] | None
    ) -> tuple[int, int, int, int] | None:
        """Drafter catch-up: a row that drafted nothing in a round (k = 0) fed its token to the
        target alone, so the drafter falls one token behind; the next round it drafts in, its
        drafter first prefills the tokens it missed (a chunk of ``behind`` tokens after the
        ``context - 1 - behind`` it holds), batched into the first drafter step with the
        prompt chunks. Returns the step's chunk stats with the catch-up added; counts
        ``drafter_catchup_tokens``; moves each row's ``behind`` past this round."""
        count = tokens = pairs = prefix = 0
        behind = []
        for b, k, c in zip(batch.behind, rnd.k, batch.context):
            if not k:
                behind.append(b + 1)
                continue
            behind.append(0)
            if b:
                p = c - 1 - b
                count += 1
                tokens += b
                pairs += causal_pairs(b, p)
                prefix += p
        batch.behind, batch.lagging = behind, rnd.drafting < rnd.size
        if not count:
            return stats
        self.counters.drafter_catchup_tokens += tokens
        rnd.catchup_tokens = tokens
        if stats is not None:
            count, tokens = count + stats[0], tokens + stats[1]
            pairs, prefix = pairs + stats[2], prefix + stats[3]
        return count, tokens, pairs, prefix

    def settle(self, batch: BatchView, rnd: Round, end: float) -> None:
        """After the round's timeout: emit, count, observe, advance."""
        emitted = [
            x + 1 if x < y else y  # min(accepted + 1, remaining)
            for x, y in zip(rnd.accepted, batch.remaining)
        ]
        sentence_ends = self.acc.sentence_ends(batch.request_ids, batch.positions, emitted)
        ended, accepted, emitted_total = self.count(batch, rnd, emitted, end)
        if self.tracer is None:
            self.observe(batch, rnd, end, emitted, sentence_ends)
        else:
            self.observe_traced(batch, rnd, end, emitted, sentence_ends)
        if self.planner is not None:
            self.planner.observe_round(
                RoundStats(
                    rnd.start_s,
                    end,
                    rnd.size,
                    rnd.drafting,
                    rnd.draft_steps,
                    rnd.verify_tokens,
                    rnd.context_tokens,
                    rnd.draft_s,
                    rnd.verify_s,
                    accepted,
                    emitted_total,
                    rnd.prefill_tokens,
                    rnd.catchup_tokens,
                )
            )
        self.advance(batch, emitted, ended, end)
        if self.progress is not None:
            self.progress(self.ledger.finished)

    def count(
        self, batch: BatchView, rnd: Round, emitted: list[int], end: float
    ) -> tuple[bool, int, int]:
        """Adds the round to the counters; returns (some request may have emitted its last
        token, Σ accepted, Σ emitted)."""
        cnt, accepted, drafted = self.counters, rnd.accepted, rnd.drafted
        cnt.rounds += rnd.size
        accepted_total, emitted_total = sum(accepted), sum(emitted)
        cnt.accepted += accepted_total
        cnt.drafted += rnd.verify_tokens - rnd.size
        cnt.rejected_rounds += sum([x < y for x, y in zip(accepted, drafted)])
        ended = min(batch.remaining) <= rnd.max_k + 1
        # accepted tokens that were emitted: n, less the ones cut by the length limit
        cnt.accepted_emitted += accepted_total - (
            sum([x - y for x, y in zip(accepted, emitted) if x > y]) if ended else 0
        )
        cnt.round_tokens += emitted_total
        if end >= self.warmup_s:
            cnt.measured_tokens += emitted_total
        if rnd.lossy is not None:
            cnt.lossy += int(rnd.lossy.sum())
        return ended, accepted_total, emitted_total

    def observe(
        self, batch: BatchView, rnd: Round, end: float, emitted: list[int], sentence_ends: list
    ) -> None:
        """Each controller's observation, through the bound observe_values(now_s, drafted,
        accepted, confidences, draft_s, verify_s, context, lossy, emitted, sentence_ends,
        batch_size, batch_tokens, batch_context_tokens)."""
        draft_s, verify_s, size = rnd.draft_s, rnd.verify_s, rnd.size
        tokens, context = rnd.verify_tokens, rnd.context_tokens
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else repeat(0)
        if rnd.confidences is None:  # nothing drafted, or no controller reads confidences
            for f, ke, n, cx, lo, e, se in zip(
                batch.observe,
                rnd.drafted,
                rnd.accepted,
                batch.context,
                lossy,
                emitted,
                sentence_ends,
            ):
                f(end, ke, n, (), draft_s, verify_s, cx, lo, e, se, size, tokens, context)
        else:
            for f, ke, n, cf, cx, lo, e, se in zip(
                batch.observe,
                rnd.drafted,
                rnd.accepted,
                rnd.confidences.tolist(),
                batch.context,
                lossy,
                emitted,
                sentence_ends,
            ):
                f(
                    end,
                    ke,
                    n,
                    tuple(cf[:ke]) if ke else (),
                    draft_s,
                    verify_s,
                    cx,
                    lo,
                    e,
                    se,
                    size,
                    tokens,
                    context,
                )

    def observe_traced(
        self, batch: BatchView, rnd: Round, end: float, emitted: list[int], sentence_ends: list
    ) -> None:
        """Each controller's Observation (``observe``), recorded with its state after it."""
        size, tracer = rnd.size, self.tracer
        assert tracer is not None
        confidences = rnd.confidences.tolist() if rnd.confidences is not None else [()] * size
        lossy = rnd.lossy.tolist() if rnd.lossy is not None else [0] * size
        for j, c in enumerate(batch.controllers):
            drafted = rnd.drafted[j]
            obs = Observation(
                end,
                drafted,
                rnd.accepted[j],
                tuple(confidences[j][:drafted]) if drafted else (),
                rnd.draft_s,
                rnd.verify_s,
                batch.context[j],
                lossy[j],
                emitted[j],
                sentence_ends[j],
                size,
                rnd.verify_tokens,
                rnd.context_tokens,
            )
            c.observe(obs)
            tracer.record(batch.request_ids[j], rnd.decisions[j], obs, c.state())
        tracer.round_done(batch.ids)

    def advance(self, batch: BatchView, emitted: list[int], ended: bool, end: float) -> None:
        """Positions, contexts and remaining tokens move on; finished requests leave."""
        emitted_array = np.array(emitted, dtype=np.int64)
        batch.positions += emitted_array
        batch.context = [x + y for x, y in zip(batch.context, emitted)]
        batch.remaining = remaining = [x - y for x, y in zip(batch.remaining, emitted)]
        self.acc.advance(batch.ids, emitted_array)
        if ended and 0 in remaining:
            self.flush()
            for i, x in zip(batch.request_ids, remaining):
                if not x:
                    self.finish(i, end)
            self.running = [i for i, x in zip(batch.request_ids, remaining) if x]
