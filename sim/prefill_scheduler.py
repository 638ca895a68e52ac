"""The prefill scheduler of a :class:`~sim.replica.Replica` (``deployment.scheduler``, the
rules: :mod:`sim.replica`): admission from the waiting queue (FIFO or ``shortest-first``), the
prompt chunks of a step under the token budget (``chunked``) or whole prefills
(``prefill-first``), their modelled seconds, completed prefills' first tokens, and the prefill
backlog the round planner is told."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

import simpy

from sim.cluster import Cluster
from sim.latency import causal_pairs
from sim.ledger import Ledger
from sim.params import EngineParams
from sim.prefix_cache import PrefixCache


class PrefillScheduler:
    """Admission and prefill of a replica (a base of :class:`~sim.replica.Replica`, whose
    ``__init__`` sets the state below)."""

    env: simpy.Environment
    cluster: Cluster
    ledger: Ledger
    counters: Any
    params: EngineParams
    make_ctrl: Callable[[], Any]
    waiting: deque[int]
    running: list[int]
    controllers: dict[int, Any]
    outstanding: int
    chunked: bool
    token_budget: int
    chunk_cap: int
    shortest_first: bool
    prefilling: list[int]
    target: dict[int, int]
    computed: dict[int, int]
    paged: bool
    prefix: PrefixCache | None
    rows_short: bool
    preempted_now: bool

    if TYPE_CHECKING:  # the replica's, and the KV memory's

        def flush(self) -> None: ...

        def finish(self, i: int, t: float) -> None: ...

        def never_fits(self, i: int) -> bool: ...

        def cache_lookup(self, i: int, tokens: int) -> int: ...

        def reserve_kv(self, i: int, tokens: int, cached: int = 0) -> bool: ...

        def allocate(self, i: int, need: int) -> int: ...

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
