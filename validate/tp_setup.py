"""What the TP part of ``dspark validate`` (:mod:`validate.tp`) measures: its config, the engine
and the prompts, read alike by the parent process and by every spawned rank
(:mod:`validate.tp_runs`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.configio import param


@dataclass(frozen=True)
class TPValidateConfig:
    # 2: the smallest sharding, and all a 2-core machine can hold.
    tp: int = param(2, lo=2, hi=64, doc="tensor-parallel degree predicted and measured")
    # one fixed-k and one load-aware controller.
    controllers: tuple[str, ...] = param(("fixed", "dspark"), doc="controllers compared")
    # 3 x 48 tokens per controller: a few hundred rounds at TP = 2 in about a minute.
    prompts: int = param(3, lo=1, hi=100, doc="held-out code prompts per controller")
    prompt_tokens: int = param(64, lo=2, hi=512, doc="prompt length in tokens")
    new_tokens: int = param(48, lo=2, hi=512, doc="tokens generated per prompt")
    # 3: a spread to compare the error with.
    repeats: int = param(3, lo=1, hi=20, doc="real runs per (tp, controller)")
    # 5 passes over a one-context grid: the TP = 1 calibration in a few seconds.
    profile_repeats: int = param(5, lo=1, hi=100, doc="timed passes of the TP = 1 profile")
    # 30 passes, each a forward's worth of layers back to back (real.tp_profile, chain): one
    # sharded layer's time spreads 2x between p10 and p90 on a shared CPU; 20 single layers
    # moved the prediction ~15% between runs.
    collective_repeats: int = param(
        30, lo=3, hi=10000, doc="timed passes of the projections and collectives"
    )
    # the TP = 1 table corrected by the engine's own rounds (k cycling over 0..k_max on held-apart
    # calibration prompts, real.trace_correction.correct_from_trace), as the batch-1 part does.
    correct_profile: bool = param(True, doc="correct the TP = 1 profile by engine rounds")
    # the expected run time is a sum of mean forward times (as ValidateConfig.latency_statistic).
    latency_statistic: str = param(
        "mean", choices=("mean", "median"), doc="profile statistic for the simulator"
    )
    # False: the shipped checkpoints.
    tiny: bool = param(False, doc="tiny random models instead of the shipped ones")
    # 300 s: the whole TP run, far above its minute.
    timeout_s: float = param(300.0, lo=10.0, hi=7200.0, doc="process-group timeout, s")


def engine_for(cfg: TPValidateConfig):
    """The engine the part measures (sharded when a TP context is active)."""
    from real.engine import EngineConfig

    # room for the profile grid: its context plus a prefill chunk
    ecfg = EngineConfig(
        stop_at_eot=False,
        block_recalibration=False,
        max_len=2 * cfg.prompt_tokens + cfg.new_tokens + 8,
    )
    if cfg.tiny:
        from real.tiny import TinyModelsConfig, tiny_engine

        return tiny_engine(TinyModelsConfig(), ecfg)
    from real.runtime import build_engine

    return build_engine(ecfg)


def prompts_for(engine, cfg: TPValidateConfig, split: str = "test") -> list[list[int]]:
    """The measured prompts (``test`` split) or the calibration ones (``val``)."""
    from real.serve import _windows

    rng = np.random.default_rng(0 if split == "test" else 1)
    kind = "random" if cfg.tiny else "code"
    vocab = engine.target.cfg.vocab_size
    return _windows([cfg.prompt_tokens] * cfg.prompts, kind, split, engine.tokenizer, vocab, rng)
