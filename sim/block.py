"""Block (semi-autoregressive) drafting in the simulator: the ``[draft]`` section of a scenario.

A block drafter proposes up to ``B`` tokens (the draft block) in ONE forward, conditioned on the
target's hidden states and the last verified token (docs/design.md, "Block drafting
(semi-autoregressive generation)"). So a round that drafts pays one drafter forward for the drafting rows at ``B`` new
tokens per row, whatever ``k <= B`` each row keeps (:class:`BlockForward`), and no row drafts
more than ``B`` (the engine cap). Acceptance per block position comes from the confidence head's
calibration curve: ``acceptance.model = "curve"`` with ``acceptance.position_rates``, the
conditional acceptance of position j given positions 1..j-1 were accepted; a preset's curve
fills it when the scenario leaves it empty.

A block drafter's confidences are its head's, calibrated: ``acceptance.head_concentration``
(:mod:`sim.acceptance`) is ``BLOCK_HEAD_CONCENTRATION`` unless the scenario sets it.

Presets (``draft.preset``; sizes are the drafter model presets of the same name in
:mod:`sim.models`). Both curves are scenario assumptions, not measurements:

- ``DSpark-block-7``: B = 7, the block DeepSeek's DSpark drafters ship with; conditional
  acceptance 0.80 at position 1 falling 0.03 a position (0.62 at 7);
- ``DFlash-block-16``: B = 16, DFlash's block; 0.82 at position 1 falling 0.02 a position
  (0.52 at 16): a deeper drafter that holds acceptance longer over a longer block.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.errors import ConfigError

#: preset name -> (block size B, conditional acceptance per block position 1..B).
BLOCK_PRESETS: dict[str, tuple[int, tuple[float, ...]]] = {
    "DSpark-block-7": (7, tuple(round(0.80 - 0.03 * j, 2) for j in range(7))),
    "DFlash-block-16": (16, tuple(round(0.82 - 0.02 * j, 2) for j in range(16))),
}
#: ``acceptance.head_concentration`` of a block drafter's confidence head unless the scenario
#: sets one: the spread of the lab's shipped block head's confidences on unseen prompts (κ 2.3 to
#: 4.5 by block position, ``benchmarks/real_speed.py``'s rounds of fixed k = 7).
BLOCK_HEAD_CONCENTRATION = 3.0
#: the block size of a custom block drafter without ``draft.block_size``: DSpark's.
DEFAULT_BLOCK_SIZE = 7


@dataclass(frozen=True)
class DraftConfig:
    # every drafter of the lab's presets drafts one token per forward.
    kind: str = param(
        "autoregressive",
        choices=("autoregressive", "block"),
        doc="drafter kind: one token per forward, or a block of up to B in one forward",
    )
    # 'custom': block size and curve from this section and [acceptance].
    preset: str = param(
        "custom",
        choices=("custom", *BLOCK_PRESETS),
        doc="block drafter preset (block size and acceptance curve)",
    )
    # None = the preset's (7 for 'custom', DSpark's); tuned over 4-16, DSpark's 7 to DFlash's 16:
    # a bigger block costs more per forward and accepts less at its far positions.
    block_size: int | None = param(
        None, lo=1, hi=64, tune=(4, 16), doc="draft block B: tokens one drafter forward proposes"
    )

    def resolved_block_size(self) -> int:
        """B of a block drafter (the preset's when not given)."""
        if self.block_size is not None:
            return self.block_size
        return BLOCK_PRESETS[self.preset][0] if self.preset in BLOCK_PRESETS else DEFAULT_BLOCK_SIZE

    def curve(self) -> tuple[float, ...]:
        """The preset's acceptance curve (empty for 'custom')."""
        return BLOCK_PRESETS[self.preset][1] if self.preset in BLOCK_PRESETS else ()

    def check(self) -> None:
        if self.kind != "block" and (self.preset != "custom" or self.block_size is not None):
            key = "draft.preset" if self.preset != "custom" else "draft.block_size"
            raise ConfigError(f"{key} is set but draft.kind = {self.kind!r}; allowed with 'block'")


class BlockForward:
    """A latency backend for a block drafter: a drafter "step" over ``batch`` rows is one
    forward of ``block`` new tokens per row (``inner`` prices it); prompt chunks (the drafter's
    own prefill and catch-up) cost what they cost ``inner``."""

    def __init__(self, inner, block: int) -> None:
        self.inner, self.block = inner, block

    def seconds(self, batch: int, new_tokens: int, context_sum: float) -> float:
        return self.inner.seconds(batch, batch * self.block, context_sum)

    def pass_seconds(
        self,
        batch: int,
        new_tokens: int,
        context_sum: float,
        chunks: int,
        chunk_tokens: int,
        chunk_pairs: float,
        chunk_prefix: float,
    ) -> float:
        return self.inner.pass_seconds(
            batch, batch * self.block, context_sum, chunks, chunk_tokens, chunk_pairs, chunk_prefix
        )
