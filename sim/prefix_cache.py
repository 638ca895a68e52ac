"""``PrefixCache``: automatic prefix caching over paged KV memory (vLLM V1 / SGLang style).

A request's prompt is a chain of hash blocks of ``hash_block_tokens`` tokens (a JSONL trace's
``hash_ids``: one id per block, equal ids = equal prefixes up to and including that block).
When a request's prefill has computed a full block whose hash is not resident, the block's KV
becomes a cache block (its memory moves from the request to the cache). An admitted request
whose leading blocks are resident references them instead of computing them again (a cache
hit; at least one prompt token is always computed, for its logits). A cache block is pinned
while a request references it; unreferenced blocks stay resident, least recently released
first out, and are evicted when memory is needed (before any preemption). The replica owns the
free-block count; this class owns which hashes are resident and who references them.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, hash_ids: list[tuple[int, ...]], hash_block_tokens: int, block: int) -> None:
        self.hash_ids = hash_ids
        self.tokens = hash_block_tokens  # tokens per cache block
        self.blocks = hash_block_tokens // block  # KV blocks per cache block
        self.refs: dict[int, int] = {}  # resident hash -> requests referencing it
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced, oldest first
        self.pinned: dict[int, list[int]] = {}  # request -> hashes it references
        self.done: dict[int, int] = {}  # request -> leading hash blocks looked up or registered

    def shared_tokens(self, i: int) -> int:
        """Tokens of request ``i``'s KV that belong to the cache."""
        return len(self.pinned.get(i, ())) * self.tokens

    def lookup(self, i: int, tokens: int, prompt: int) -> int:
        """Pins the longest resident prefix of request ``i``'s prompt blocks (whole blocks
        inside the prompt, leaving at least one of the prefill's ``tokens`` to compute);
        returns the tokens it covers."""
        hs, refs = self.hash_ids[i], self.refs
        limit = min(len(hs), prompt // self.tokens, (tokens - 1) // self.tokens)
        j = 0
        while j < limit and hs[j] in refs:
            j += 1
        for h in hs[:j]:
            if not refs[h]:
                del self.lru[h]
            refs[h] += 1
        self.pinned[i] = list(hs[:j])
        self.done[i] = j
        return j * self.tokens

    def register(self, i: int, computed: int, prompt: int) -> None:
        """Request ``i`` has computed ``computed`` tokens: its full prompt blocks not yet
        resident become cache blocks it references (a block another request made resident
        meanwhile stays the request's own)."""
        hs = self.hash_ids[i]
        j = self.done.get(i, 0)
        full = min(len(hs), min(computed, prompt) // self.tokens)
        if j >= full:
            return
        refs, pinned = self.refs, self.pinned.setdefault(i, [])
        for h in hs[j:full]:
            if h not in refs:
                refs[h] = 1
                pinned.append(h)
        self.done[i] = full

    def release(self, i: int) -> int:
        """Request ``i`` leaves (finished or preempted): its references are dropped (blocks
        no one references become evictable, the prompt's tail first); returns the tokens of
        its KV the cache keeps."""
        self.done.pop(i, None)
        hs = self.pinned.pop(i, None)
        if not hs:
            return 0
        refs, lru = self.refs, self.lru
        for h in reversed(hs):
            refs[h] -= 1
            if not refs[h]:
                lru[h] = None
        return len(hs) * self.tokens

    def evict(self, blocks: int) -> int:
        """Evicts least recently released blocks until ``blocks`` KV blocks are freed or none
        is left; returns the KV blocks freed."""
        freed = 0
        lru, refs = self.lru, self.refs
        while freed < blocks and lru:
            h, _ = lru.popitem(last=False)
            del refs[h]
            freed += self.blocks
        return freed

    def resident_blocks(self) -> int:
        """KV blocks the cache holds (referenced or not)."""
        return len(self.refs) * self.blocks
