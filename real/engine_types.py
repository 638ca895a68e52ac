"""The engine's configuration and the records of a request's life in it (:class:`Request`,
:class:`Sequence`, :class:`Generation`), and the device sync every timing waits on: apart from
:mod:`real.engine` so that what times or drives the engine (``real.profile``,
``real.tp_profile``) reads them without importing it. ``real.engine`` imports them all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from control.configio import param
from control.types import RoundRecord
from real import DRAFTERS
from real.checkpoint import AUTO_DTYPE, DTYPES, resolve_dtype
from real.sampling import SamplingParams


@dataclass(frozen=True)
class EngineConfig:
    # 16: above the controllers' k range [3, 15] (docs/design.md), so no decision is cut.
    k_max: int = param(16, lo=0, hi=64, doc="largest draft length a round may use")
    # 1024 tokens of context: prompts + outputs of the benchmarks fit with room to spare.
    max_len: int = param(1024, lo=8, hi=2048, doc="longest sequence (prompt + output)")
    # greedy by default: lossless and token-identical to target-only decoding.
    temperature: float = param(0.0, lo=0.0, hi=10.0, doc="sampling temperature (0 = greedy)")
    top_k: int = param(0, lo=0, hi=65536, doc="top-k filter (0 = off)")
    top_p: float = param(1.0, lo=0.0, hi=1.0, doc="top-p (nucleus) filter (1 = off)")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of the sampling generator")
    device: str = param("cpu", choices=("cpu", "cuda"), doc="device of both models")
    # auto: bf16 on CUDA and on CPUs that multiply bf16 natively (half the memory traffic); on
    # other CPUs, where bf16 is emulated and compute-bound, bf16 at slots = 1 (faster at batch
    # 1) and float32 when batched (one forward serves many rows; token-identical)
    # (real.checkpoint.resolve_dtype). The field keeps the request; ``precision`` resolves it
    # (so a replace() of device or slots re-resolves), and ``record()`` is what a run writes.
    target_dtype: str = param(
        AUTO_DTYPE, choices=(AUTO_DTYPE, *DTYPES), doc="target precision (auto: by device)"
    )
    # drafters stay fp32 (issue 4): their confidences feed the controllers.
    drafter_dtype: str = param("float32", choices=tuple(DTYPES), doc="drafter precision")
    # the seed's drafter.
    drafter: str = param(
        "conv", choices=DRAFTERS, doc="which drafter (ngram+X: prompt lookup, else model X)"
    )
    # shorter matches are often coincidences that a model drafter continues better.
    lookup_min_match: int = param(4, lo=1, hi=32, doc="ngram+X: match length that triggers lookup")
    # on: the block drafter's confidence head is refitted on the rounds the engine verifies
    # (real.block_recalibration); its shipped calibration came from other prompts.
    block_recalibration: bool = param(
        True, doc="block drafter: refit the confidence head's calibration on verified rounds"
    )
    # stop at the end-of-text token, as a user would; benchmarks turn it off.
    stop_at_eot: bool = param(True, doc="stop after emitting the end-of-text token")
    # 1: the batch-1 engine; serving and batched benchmarks raise it (cache memory grows with it).
    slots: int = param(1, lo=1, hi=256, doc="sequences in flight at once (KV cache slots)")

    @property
    def precision(self) -> str:
        """The target precision this config runs (a DTYPES name; ``auto`` resolved)."""
        return resolve_dtype(self.target_dtype, self.device, self.slots)

    def record(self) -> dict:
        """The config as a run folder records it: its fields, the target precision resolved."""
        return {**asdict(self), "target_dtype": self.precision}

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class Generation:
    tokens: list[int]
    records: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0
    text: str = ""


@dataclass
class Request:
    """A request for the batched core. ``seed`` seeds the sequence's own sampling generator
    (None: ``EngineConfig.seed + request_id``); ``arrival_s`` is on the caller's clock."""

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    controller: Any
    arrival_s: float = 0.0
    seed: int | None = None


class Sequence:
    """A request in flight: its slot, committed length ``L`` (prompt + emitted), the length at
    which it ends, emitted tokens, round records and timestamps (on the engine's clock)."""

    __slots__ = (
        "req",
        "slot",
        "L",
        "end",
        "rnd",
        "tokens",
        "records",
        "gen",
        "name",
        "admit_s",
        "first_token_s",
        "finish_s",
        "done",
        "prompt_tokens",
    )

    def __init__(self, req: Request, slot: int, end: int, gen) -> None:
        self.req, self.slot, self.end, self.gen = req, slot, end, gen
        self.prompt_tokens = self.L = len(req.prompt)
        self.rnd = 0
        self.tokens: list[int] = []
        self.records: list[RoundRecord] | None = []
        self.name = getattr(req.controller, "name", "")
        self.admit_s = self.first_token_s = self.finish_s = float("nan")
        self.done = False

    @property
    def ctrl(self):
        return self.req.controller


def sync(device: str) -> None:
    """Wait for the device (CUDA) to finish its queued work; a no-op on the CPU."""
    if device == "cuda":
        torch.cuda.synchronize()
