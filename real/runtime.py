"""Build an engine from the shipped checkpoints and an ``EngineConfig``."""

from __future__ import annotations

from pathlib import Path

import torch

from control.errors import DSparkError
from real.checkpoint import DTYPES
from real.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from real.engine import Engine, EngineConfig
from real.store import load_bundle
from real.tokenizer import EOT, sentence_end_ids

DRAFTER_MODELS = {"conv": "drafter_conv", "tf": "drafter_tf"}


def build_engine(cfg: EngineConfig, checkpoint_dir: str | Path | None = None,
                 bundle=None) -> Engine:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise DSparkError("engine.device = 'cuda' but no CUDA device is available")
    model_kind = cfg.drafter.removeprefix("ngram+")
    names = ("target",) + ((DRAFTER_MODELS[model_kind],) if model_kind in DRAFTER_MODELS else ())
    if bundle is None:
        bundle = load_bundle(checkpoint_dir, names=names, target_dtype=DTYPES[cfg.target_dtype],
                             drafter_dtype=DTYPES[cfg.drafter_dtype], device=cfg.device)
    tok = bundle.tokenizer
    length = cfg.max_len + cfg.k_max + 1
    target = bundle.models["target"].to(device=cfg.device, dtype=DTYPES[cfg.target_dtype])
    if cfg.drafter == "ngram":
        drafter = NgramDrafter(vocab_size=tok.get_vocab_size())
    else:
        m = bundle.models[DRAFTER_MODELS[model_kind]].to(device=cfg.device,
                                                        dtype=DTYPES[cfg.drafter_dtype])
        drafter = ModelDrafter(m, length, DTYPES[cfg.drafter_dtype], cfg.device)
        if model_kind != cfg.drafter:
            drafter = HybridDrafter(drafter, NgramDrafter(vocab_size=tok.get_vocab_size()),
                                    cfg.lookup_min_match)
    return Engine(target, drafter, cfg, tokenizer=tok, eot_id=tok.token_to_id(EOT),
                  sentence_end_ids=sentence_end_ids(tok))


def encode(engine: Engine, text: str) -> list[int]:
    ids = engine.tokenizer.encode(text).ids
    if not ids:
        raise DSparkError("the prompt encodes to no tokens")
    return ids
