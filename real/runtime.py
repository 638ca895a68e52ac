"""Build an engine from the shipped checkpoints and an ``EngineConfig``."""

from __future__ import annotations

from pathlib import Path

import torch

from control.errors import DSparkError
from real.checkpoint import DTYPES
from real.drafter_protocol import Drafter
from real.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from real.engine import Engine, EngineConfig
from real.store import load_bundle
from real.tokenizer import EOT, sentence_end_ids
from real.tp import shard_engine

DRAFTER_MODELS = {
    "conv": "drafter_conv",
    "tf": "drafter_tf",
    "feat": "drafter_feat",
    "block": "drafter_block",
}


def build_engine(
    cfg: EngineConfig, checkpoint_dir: str | Path | None = None, bundle=None
) -> Engine:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise DSparkError("engine.device = 'cuda' but no CUDA device is available")
    if bundle is None:
        bundle = load_bundle(
            checkpoint_dir,
            names=("target",) + drafter_models(cfg.drafter),
            target_dtype=DTYPES[cfg.precision],
            drafter_dtype=DTYPES[cfg.drafter_dtype],
            device=cfg.device,
        )
    tok = bundle.tokenizer
    target = bundle.models["target"].to(device=cfg.device, dtype=DTYPES[cfg.precision])
    engine = Engine(
        target,
        build_drafter(cfg, bundle, cfg.drafter),
        cfg,
        tokenizer=tok,
        eot_id=tok.token_to_id(EOT),
        sentence_end_ids=sentence_end_ids(tok),
    )
    shard_engine(engine)  # under --tp N: the target sharded over the ranks (real.tp)
    return engine


def load_engine_config(
    config_path: str | None, flags: dict | None = None, **overrides
) -> EngineConfig:
    """EngineConfig from ``config_path``'s [engine] table, then ``flags`` (command-line values;
    None = not given), then ``overrides``."""
    from control.configio import from_mapping, read_toml

    data = dict(read_toml(config_path).get("engine", {})) if config_path else {}
    data.update({k: v for k, v in (flags or {}).items() if v is not None})
    data.update(overrides)
    return from_mapping(EngineConfig, data, source=config_path or "<command line>", prefix="engine")


def drafter_models(drafter: str) -> tuple[str, ...]:
    """Checkpoint names a drafter choice needs (none for ``ngram``)."""
    kind = drafter.removeprefix("ngram+")
    return (DRAFTER_MODELS[kind],) if kind in DRAFTER_MODELS else ()


def build_drafter(cfg: EngineConfig, bundle, drafter: str) -> Drafter:
    """The drafter ``drafter`` (an ``EngineConfig.drafter`` choice) from a loaded bundle."""
    vocab = bundle.tokenizer.get_vocab_size()
    if drafter == "ngram":
        return NgramDrafter(vocab_size=vocab)
    kind = drafter.removeprefix("ngram+")
    if kind not in DRAFTER_MODELS or DRAFTER_MODELS[kind] not in bundle.models:
        raise DSparkError(f"drafter {drafter!r} needs the {kind!r} drafter checkpoint")
    m = bundle.models[DRAFTER_MODELS[kind]].to(device=cfg.device, dtype=DTYPES[cfg.drafter_dtype])
    if m.kind == "block":  # one forward a block, conditioned on several target layers
        from real.block_drafter import BlockDrafter, check_bundle
        from real.block_recalibration import OnlineCalibration

        check_bundle(bundle)
        recal = OnlineCalibration() if cfg.block_recalibration else None
        length = cfg.max_len + cfg.k_max + 1
        return BlockDrafter(m, length, DTYPES[cfg.drafter_dtype], cfg.device, 1, recal)
    cls = ModelDrafter
    if m.kind == "featconv":  # conditioned on the target's hidden states
        from real.feature_drafter import FeatureDrafter as cls
    d = cls(m, cfg.max_len + cfg.k_max + 1, DTYPES[cfg.drafter_dtype], cfg.device)
    if kind != drafter:
        n = cfg.lookup_min_match
        d = HybridDrafter(d, NgramDrafter(max_ngram=n, min_ngram=n, vocab_size=vocab), n)
    return d


def encode(engine: Engine, text: str) -> list[int]:
    ids = engine.tokenizer.encode(text).ids
    if not ids:
        raise DSparkError("the prompt encodes to no tokens")
    return ids
