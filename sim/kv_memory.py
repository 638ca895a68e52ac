"""KV memory and the prefix cache of a :class:`~sim.replica.Replica` (the rules:
:mod:`sim.replica`): admission's reservation (``reserve``) or blocks as tokens are computed
(``paged``), preemption by recompute when a row cannot hold its context, and prefix-cache
lookup, registration and eviction (:mod:`sim.prefix_cache`)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from control.errors import ConfigError
from sim.ledger import Ledger
from sim.params import EngineParams
from sim.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from sim.rounds import BatchView, Round


class KvMemory:
    """The KV memory and prefix cache of a replica (a base of :class:`~sim.replica.Replica`,
    whose ``__init__`` sets the state below)."""

    ledger: Ledger
    counters: Any
    params: EngineParams
    waiting: deque[int]
    running: list[int]
    prefilling: list[int]
    target: dict[int, int]
    computed: dict[int, int]
    behind: dict[int, int]
    kv_used: float  # bytes reserved (kv_allocation = 'reserve')
    paged: bool
    block: int
    free_blocks: int
    max_tokens: int
    kv_cap: dict[int, int]
    prefix: PrefixCache | None
    rows_short: bool
    preempted_now: bool

    if TYPE_CHECKING:  # the replica's, and the prefill scheduler's

        def view(self) -> BatchView: ...

        def flush(self) -> None: ...

        def prefill_length(self, i: int) -> int: ...

    def never_fits(self, i: int) -> bool:
        """Whether request ``i`` (prompt + output) can never be held in this replica's KV."""
        if self.paged:
            return self.ledger.total[i] > self.max_tokens
        return self.ledger.kv_need[i] > self.params.kv_budget_bytes

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
