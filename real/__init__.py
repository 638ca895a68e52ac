"""real package: the PyTorch engine. This module stays free of torch so that the command line
can offer the engine's choices without loading it."""

from dataclasses import dataclass

from control.configio import param

#: ``EngineConfig.drafter`` choices: model drafters (conv: the seed's token-only conv drafter;
#: feat: the conv drafter conditioned on the target's hidden states; tf: a tiny transformer),
#: prompt lookup, lookup + model hybrids; block: one forward proposes a block of tokens, with a
#: confidence head (real.block_drafter).
DRAFTERS = ("conv", "tf", "feat", "block", "ngram", "ngram+conv", "ngram+tf", "ngram+feat")


@dataclass(frozen=True)
class TPConfig:
    """Tensor parallelism of the target (``real.tp``): ranks and the process-group timeout."""

    # 1: one process, torch.distributed untouched.
    size: int = param(1, lo=1, hi=64, doc="tensor-parallel ranks")
    # 60 s: far above any collective of these models, short enough that a dead peer is noticed.
    timeout_s: float = param(60.0, lo=1.0, hi=3600.0, doc="process-group timeout, s")
