"""Semi-autoregressive block planner: where one block of emitted tokens ends.

A block holds at most ``B = min(block_tokens, span_tokens)`` tokens (``span_tokens`` is the
attention-span limit; 0 = none). Its boundary is *snapped* to a sentence end: once the block
holds at least ``B − snap_tokens`` tokens, the first sentence-end token closes it (the token is
the block's last); if no sentence end comes, the block closes after exactly ``B`` tokens.
The rule is causal — a boundary is known the moment its round is observed — so a driver can
flush and freeze a block's KV right away. Tokens a round emits past a boundary start the next
block (a long round can close more than one block).
"""

from __future__ import annotations


class BlockPlanner:
    __slots__ = (
        "block_tokens",
        "snap_from",
        "tokens_in_block",
        "total_tokens",
        "blocks_closed",
        "last_boundary",
    )

    def __init__(self, block_tokens: int, snap_tokens: int, span_tokens: int = 0) -> None:
        b = block_tokens if span_tokens <= 0 else min(block_tokens, span_tokens)
        if b < 1:
            raise ValueError(f"block size must be >= 1, got {b}")
        if snap_tokens < 0:
            raise ValueError(f"snap_tokens must be >= 0, got {snap_tokens}")
        self.block_tokens = b
        self.snap_from = max(1, b - snap_tokens)  # block length from which a sentence end closes
        self.reset()

    def reset(self) -> None:
        self.tokens_in_block = 0
        self.total_tokens = 0
        self.blocks_closed = 0
        self.last_boundary = 0  # absolute token count at the last boundary

    def feed(self, emitted: int, sentence_ends: tuple[int, ...] = ()) -> int:
        """Account ``emitted`` tokens (``sentence_ends``: 0-based offsets among them); returns
        how many blocks closed. The common case (nothing can close) is the first test: callers
        on a hot path call this per round."""
        t = self.tokens_in_block + emitted
        if t < self.snap_from or (t < self.block_tokens and not sentence_ends):
            self.tokens_in_block = t
            self.total_tokens += emitted
            return 0
        return self._close(emitted, sentence_ends)

    def _close(self, emitted: int, sentence_ends: tuple[int, ...]) -> int:
        """``feed`` when a block may close: walk the round's tokens boundary by boundary."""
        t = self.tokens_in_block
        closed = 0
        start = self.total_tokens  # absolute index of this round's first token
        pos = 0  # tokens of this round already accounted
        ends = sorted(sentence_ends)
        while pos < emitted:
            # where would the current block close, counting from offset ``pos`` of this round?
            to_b = self.block_tokens - t  # tokens until the hard boundary
            cut = None
            for e in ends:
                if e >= pos and t + (e - pos + 1) >= self.snap_from and e - pos + 1 <= to_b:
                    cut = e + 1
                    break
            if cut is None and pos + to_b <= emitted:
                cut = pos + to_b
            if cut is None:
                t += emitted - pos
                pos = emitted
                break
            closed += 1
            self.last_boundary = start + cut
            t = 0
            pos = cut
        self.tokens_in_block = t
        self.total_tokens = start + emitted
        self.blocks_closed += closed
        return closed
