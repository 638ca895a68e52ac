"""Tiny random models for fast checks of the calibration loop (CI): no checkpoint needed.

The target is a small random transformer with strong layers (a varied, non-repeating greedy
continuation); the drafter is the same network with seeded noise added to its weights, so it
agrees with the target often but not always — partial acceptance of every kind is exercised.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from control.configio import param
from real.checkpoint import DTYPES
from real.drafters import ModelDrafter
from real.engine import Engine, EngineConfig
from real.models import Transformer, TransformerConfig
from real.tp import shard_engine


@dataclass(frozen=True)
class TinyModelsConfig:
    # 64 tokens: small enough for a fast forward, large enough that random guesses fail.
    vocab_size: int = param(64, lo=8, hi=4096, doc="vocabulary of the tiny models")
    # 32 x 2 layers: ~30 k parameters, a forward in well under a millisecond.
    d_model: int = param(32, lo=8, hi=1024, doc="tiny target width")
    n_layers: int = param(2, lo=1, hi=16, doc="tiny target layers")
    # 0.05 relative weight noise: acceptance around 0.5-0.8 per token.
    drafter_noise: float = param(0.05, lo=0.0, hi=10.0, doc="relative weight noise of the drafter")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of both models")
    # sentence-end token ids (the tiny vocabulary has no text).
    sentence_end_ids: tuple[int, ...] = param((3, 7), lo=0, doc="token ids that end a sentence")


def tiny_engine(cfg: TinyModelsConfig, engine_cfg: EngineConfig) -> Engine:
    g = torch.Generator().manual_seed(cfg.seed)
    tc = TransformerConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=2,
        d_ff=2 * cfg.d_model,
        max_seq_len=engine_cfg.max_len + engine_cfg.k_max + 2,
    )
    target = Transformer(tc)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() == 2:
                std = 0.5 if "embed" in name else 3.0 / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
    drafter = copy.deepcopy(target)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=g) * cfg.drafter_noise * p.std().clamp_min(1e-3))
    tdt, ddt = DTYPES[engine_cfg.precision], DTYPES[engine_cfg.drafter_dtype]
    target = target.to(dtype=tdt, device=engine_cfg.device).eval()
    drafter = drafter.to(dtype=ddt, device=engine_cfg.device).eval()
    length = engine_cfg.max_len + engine_cfg.k_max + 1
    d = ModelDrafter(drafter, length, ddt, engine_cfg.device)
    d.name = "drafter-tf"
    engine = Engine(target, d, engine_cfg, sentence_end_ids=frozenset(cfg.sentence_end_ids))
    shard_engine(engine)  # under --tp N: the target sharded over the ranks (real.tp)
    return engine
