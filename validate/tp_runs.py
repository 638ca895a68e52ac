"""The measured side of ``dspark validate --part tp``: one spawned group of TP = N ranks does
everything, in ``repeats`` alternations, so that a change of the machine's background load
reaches the calibration and the measurements alike (a 2-core VM's speed drifts by 10-25% over a
minute; calibrating first and measuring later showed it as model error):

1. rank 0 alone, on an unsharded engine built before the process group (the other ranks wait
   at a barrier): a slice of the TP = 1 latency profile, k-cycling generations of the
   calibration prompts (the profile's correction), a chunk of the full-width projection timings,
   a chunk of draft phases timed alone and one measured repeat of every controller at TP = 1
   (the control);
2. all ranks: a chunk of the collectives profile, the same draft phases on every rank at once
   (the replicated drafter side by side) and one measured repeat at TP = N.

Rank 0 writes what the parent (``validate.tp``) predicts from and compares against; the config,
the engine and the prompts are :mod:`validate.tp_setup`'s.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np


def measure_repeat(engine, cfg, prompts, out: dict) -> None:
    """One measured repeat of every controller over ``prompts``, the controllers alternating
    prompt by prompt (a drift of the machine's speed reaches them alike): tokens/s, TPOT and
    the ``RoundRecord``s (as dicts) appended to ``out[controller]``."""
    from control import make_controller

    sums = {c: [0.0, 0.0, 0.0] for c in cfg.controllers}  # tokens, seconds, prefill seconds
    for i, p in enumerate(prompts):
        for c in cfg.controllers:
            g = engine.generate(p, cfg.new_tokens, make_controller(c), request_id=i)
            f, s = engine.prefills[-1], sums[c]
            s[0], s[1], s[2] = (
                s[0] + len(g.tokens),
                s[1] + g.seconds,
                s[2] + f["end_s"] - f["start_s"],
            )
            o = out.setdefault(c, {"tps": [], "tpot": [], "records": []})
            o["records"].extend(asdict(r) for r in g.records)
    for c, (toks, secs, pre) in sums.items():
        out[c]["tps"].append(toks / secs)
        out[c]["tpot"].append((secs - pre) / toks)


def chunk_passes(cfg) -> int:
    """Timed passes of the projections and collectives per repeat (``collective_repeats``
    spread over ``repeats``, rounded up)."""
    return -(-cfg.collective_repeats // cfg.repeats)


def drafter_context(cfg) -> int:
    """Cached tokens at which the draft phases are timed: the middle of a generation."""
    return cfg.prompt_tokens + cfg.new_tokens // 2


def warm_up(engine, cfg, prompts) -> None:
    """One untimed generation per controller: first-call dispatch and allocator warm-up."""
    from control import make_controller

    for c in cfg.controllers:
        engine.generate(prompts[0], cfg.new_tokens, make_controller(c), request_id=0)


class TP1Side:
    """Rank 0's unsharded engine: the calibration (profile, its correction by engine rounds,
    full-width projections) and the TP = 1 control runs, a slice at a time."""

    def __init__(self, cfg) -> None:
        from real.profile import GridProfiler
        from real.tp_profile import drafter_draft_lengths, message_tokens
        from real.tracing import record_positions_full
        from validate.tp_setup import engine_for, prompts_for

        self.cfg = cfg
        self.engine = e = engine_for(cfg)
        self.prompts, self.val = prompts_for(e, cfg, "test"), prompts_for(e, cfg, "val")
        self.positions = [
            record_positions_full(e, p, cfg.new_tokens, i)[0] for i, p in enumerate(self.prompts)
        ]
        self.pcfg = self.profile_config(cfg)
        self.gp = GridProfiler(e, self.pcfg)
        self.gp.passes(self.pcfg.warmup, record=False)
        cells = np.arange(cfg.profile_repeats * len(self.gp.cells))
        self.slices = [len(x) for x in np.array_split(cells, cfg.repeats)]
        self.toks = message_tokens((1,), e.cfg.k_max) + [cfg.prompt_tokens - 1]
        self.proj_times: dict = {}
        self.drafter_ks = drafter_draft_lengths(e.cfg.k_max)
        self.drafter_times: dict = {}  # k -> seconds of a draft phase, this process alone
        self.cycle_recs: list = []
        self.measured: dict = {}
        warm_up(e, cfg, self.prompts)

    @staticmethod
    def profile_config(cfg):
        """The TP = 1 profile's grid: one middle context, the prompt's prefill length."""
        from real.profile import ProfileConfig

        return ProfileConfig(
            contexts=(cfg.prompt_tokens + cfg.new_tokens // 2,),
            prefill_tokens=(cfg.prompt_tokens - 1,),
            repeats=cfg.profile_repeats,
            warmup=1,
        )

    def step(self, r: int) -> None:
        """Repeat ``r``: a profile slice, the k-cycling calibration generations, a chunk of
        projection timings and of draft phases, then one measured repeat of every controller."""
        from real.tp_profile import time_drafter, time_projections
        from real.trace_correction import CycleK, calibration_ks

        cfg, e = self.cfg, self.engine
        self.gp.run_cells(self.slices[r])
        if cfg.correct_profile:
            for i, p in enumerate(self.val):
                ks = CycleK(calibration_ks(e.cfg.k_max), offset=r * len(self.val) + i)
                self.cycle_recs.extend(e.generate(p, cfg.new_tokens, ks, request_id=i).records)
        n = chunk_passes(cfg)
        layers = e.target.cfg.n_layers  # a forward's chain of layers a sample, as the TP side's
        time_projections(e, self.toks, n, 1 if r == 0 else 0, self.proj_times, layers)
        ctx = drafter_context(cfg)
        time_drafter(e, ctx, self.drafter_ks, n, 2 if r == 0 else 0, self.drafter_times)
        measure_repeat(e, cfg, self.prompts, self.measured)

    def result(self) -> dict:
        """The simulator's TP = 1 table (``cfg.latency_statistic``, corrected by the cycling
        rounds when ``cfg.correct_profile``), its correction, the projections' means, the
        greedy positions and the TP = 1 runs; JSON-ready."""
        from real.profile import finish_table, with_statistic
        from real.trace_correction import correct_from_trace

        cfg, e = self.cfg, self.engine
        rows, fit = self.gp.rows()
        lat, _ = finish_table(e, self.pcfg, rows, fit)
        table = with_statistic(lat, cfg.latency_statistic)
        fix: dict = {}
        if self.cycle_recs:
            table, more = correct_from_trace(
                table, self.cycle_recs, "seconds", statistic=cfg.latency_statistic
            )
            fix.update(more)
        return {
            "table": table.to_dict("list"),
            "correction": fix,
            "projections": {int(t): float(np.mean(v)) for t, v in self.proj_times.items()},
            "drafter_alone": self.drafter_times,
            "positions": [[asdict(p) for p in ps] for ps in self.positions],
            "measure": self.measured,
            "k_max": e.cfg.k_max,
            "layers": e.target.cfg.n_layers,
        }


def rank_job(rank: int, size: int, port: int, data: dict, path: str) -> None:
    """One TP rank (module docstring); rank 0 writes ``path``."""
    import torch
    import torch.distributed as dist

    from real import tp
    from real.tp_profile import (
        collective_rows,
        drafter_draft_lengths,
        message_tokens,
        time_collectives,
        time_drafter,
    )
    from validate.tp_setup import TPValidateConfig, engine_for, prompts_for

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    torch.set_num_threads(1)
    cfg = TPValidateConfig(**data)
    # rank 0's TP = 1 engine is built before the group exists: it is not sharded
    one = TP1Side(cfg) if rank == 0 else None
    tp.init(size, "cpu", cfg.timeout_s)
    try:
        engine = engine_for(cfg)
        prompts = prompts_for(engine, cfg)
        toks = message_tokens((1,), engine.cfg.k_max) + [cfg.prompt_tokens - 1]
        warm_up(engine, cfg, prompts)
        times: dict = {}
        drafter: dict = {}  # k -> seconds of a draft phase, every rank at once
        dks = drafter_draft_lengths(engine.cfg.k_max)
        meas: dict = {}
        layers = engine.target.cfg.n_layers  # the projections run a forward's worth at a time
        n = chunk_passes(cfg)
        for r in range(cfg.repeats):
            if one is not None:
                one.step(r)
            dist.barrier()
            time_collectives(engine, toks, n, 1 if r == 0 else 0, times, layers)
            warm = 2 if r == 0 else 0
            time_drafter(engine, drafter_context(cfg), dks, n, warm, drafter, dist.barrier)
            measure_repeat(engine, cfg, prompts, meas)
        coll = collective_rows(engine, toks, times)
        tp.shutdown(synced=True)
    finally:
        tp.shutdown()
    if one is not None:
        out = {
            "measure": meas,
            "collectives": coll.to_dict("list"),
            "drafter_side": drafter,
            "tp1": one.result(),
        }
        Path(path).write_text(json.dumps(out))
