"""The tensor-parallel settings of the engine (:mod:`real.tp`), torch-free so that the command
line offers their defaults without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param


@dataclass(frozen=True)
class TPConfig:
    """Tensor parallelism of the target (``real.tp``): ranks and the process-group timeout."""

    # 1: one process, torch.distributed untouched.
    size: int = param(1, lo=1, hi=64, doc="tensor-parallel ranks")
    # 60 s: far above any collective of these models, short enough that a dead peer is noticed.
    timeout_s: float = param(60.0, lo=1.0, hi=3600.0, doc="process-group timeout, s")
