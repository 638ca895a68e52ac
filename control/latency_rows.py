"""The model names of a latency table's rows (``latency.csv``, docs/results-format.md): what
``dspark real profile`` writes (:mod:`real.profile`) and what the simulator's table backend
(:mod:`sim.latency`) and the validation read. Plain strings, so both sides of the sim / real
boundary import them from here."""

#: one target forward of ``new_tokens`` tokens a row
TARGET = "target"
#: one drafter step
DRAFTER = "drafter"
#: a whole draft phase of ``new_tokens`` = k steps, its fixed cost included
DRAFT_PHASE = "draft-phase"
#: the engine's per-round overhead beyond its draft and verify phases
OVERHEAD = "round-overhead"
#: the row saying the profile timed a block drafter (``new_tokens`` = its block size B, seconds
#: 0): the table's draft-phase rows are then one block forward each, keeping the row's k of B
#: slots
BLOCK_MARKER = "block-drafter"
