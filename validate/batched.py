"""The batched part of ``dspark validate``: continuous batching under Poisson arrivals. This
module measures (steps 1-4, the engine's runs), :mod:`validate.batched_analysis` predicts and
compares (steps 5-7, from the measurements alone).

1. the batched engine (``[batched]``: slots, k_max, max_len) and a prompt pool (a prompt set);
   the greedy position trace of every pool prompt, recorded once (controller-independent);
2. a latency profile over batch (``real.profile``, ``[batched.profile]``), its cells run in
   slices between the real runs;
3. a capacity probe: ``capacity_requests`` pool requests of the longest output, all at t = 0,
   under the calibration controller; the loads are multiples of the requests per second it
   sustains (``calibration_load``, ``loads``), so that "light", "near saturation" and
   "overloaded" mean the same on a fast and a slow machine;
4. one arrival stream per load (Poisson, output lengths uniform in ``[output_tokens_min, the
   pool's max_new_tokens]``, each request's prompt drawn from the pool), replayed in wall-clock
   time by ``real.serve``: the calibration load once (calibration controller), every held-out
   controller x load ``repeats`` times, interleaved;
5. calibration (from the profile and the calibration load only): the profile's verify and
   drafter rows per batch size scaled by the calibration load's own rounds (measured over
   tabled time, ``batched_latency.correct_from_calibration``), and the per-round overhead of the
   serving loop per batch size (time between consecutive events less the draft and verify
   phases), folded into the profile's target verify rows at each batch size;
6. prediction: the simulator mirrors each replay (``mirror.write_serving_scenario``: the same
   arrivals and lengths, acceptance replayed from each request's pool-prompt trace, one replica
   of max_batch = slots) for every controller x load, dspark with its round planner
   (``control.registry.make_planner``, on both sides);
7. ``errors_batched.csv`` (controller x load x metric, the real median of the repeats, their
   spread beside each error), ranking agreement per load (by TPOT p50), ``batched/summary.json``.

Prefill and the first token: the engine's prefill caches the prompt but its last token and emits
nothing, its first round verifies from the last prompt token and emits the first token. The
simulator's prefill emits a token, so the mirror gives it the prompt's first P - 1 tokens and one
output token more (the engine's last prompt token): its rounds then run at the engine's contexts
and emit the engine's tokens, and the engine's first token is the end of the simulated request's
first round (read from the simulator's round trace), its admission the end of the simulated
prefill. The one difference left: the engine's drafter catches up on the prompt in its first
drafting round, the simulator charges that catch-up (the profile's drafter rows of N > 1 new
tokens) at the end of the prefill pass: TTFT is not affected, queueing is by that catch-up.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from control.configio import to_dict
from control.metrics import json_safe
from control.registry import make_config, make_controller, make_planner
from control.types import records_to_columns
from validate.config import ValidateConfig, controller_config
from validate.harness import build_engine, write_positions

#: the controller label of the calibration load's replay
CALIBRATION_LABEL = "calibration"


def poisson_stream(
    rate_rps: float, duration_s: float, pool: list[list[int]], out_min: int, out_max: int, seed: int
):
    """(arrivals, pool index per request): Poisson at ``rate_rps`` on ``[0, duration_s)``, the
    first at t = 0; output lengths uniform in ``[out_min, out_max]``, prompts drawn from
    ``pool``. Deterministic given the arguments."""
    from real.serve import Arrival

    rng = np.random.default_rng(seed)
    times = [0.0]
    while True:
        t = times[-1] + float(rng.exponential(1.0 / rate_rps))
        if t >= duration_s:
            break
        times.append(t)
    n = len(times)
    idx = rng.integers(0, len(pool), n)
    out = rng.integers(out_min, out_max + 1, n)
    return (
        [Arrival(i, times[i], list(pool[int(idx[i])]), int(out[i])) for i in range(n)],
        idx.tolist(),
    )


def _record_pool(engine, ps, out_max: int, bdir: Path, log: Callable[[str], None]) -> list:
    """Step 1: the prompt pool and its greedy position traces (``pool_positions.csv``)."""
    from real.tracing import make_prompts, record_positions_full

    vocab = engine.target.embed_tokens.num_embeddings
    pool = make_prompts(ps, engine.tokenizer, vocab)
    traces = []
    for j, p in enumerate(pool):
        recs, _ = record_positions_full(engine, p, out_max, request_id=j)
        traces.append(recs)
    write_positions(bdir / "pool_positions.csv", traces)
    flat = [r for recs in traces for r in recs]
    log(f"batched: pool traces, mean run length {np.mean([r.run_length for r in flat]):.2f}")
    return pool


def _start_profile(gp, b) -> tuple[list[int], Callable[[], None]]:
    """Step 2: warm up, split the profile's cells in slices, run the first; return the slice
    sizes and the function that runs the next slice (between real runs, if interleaved)."""
    gp.passes(b.profile.warmup, record=False)
    n_runs = 1 + b.repeats * len(b.loads) * len(b.controllers)
    n_slices = 1 + n_runs if b.interleave_profile else 1
    per_slice = [
        len(x) for x in np.array_split(np.arange(b.profile.repeats * len(gp.cells)), n_slices)
    ]
    slices = iter(per_slice)
    gp.run_cells(next(slices))

    def profile_slice() -> None:
        if b.interleave_profile:
            gp.run_cells(next(slices))

    return per_slice, profile_slice


def _capacity_probe(engine, b, pool, out_max, x_name, x_cfg, log) -> dict:
    """Step 3: the calibration controller on ``capacity_requests`` requests at t = 0."""
    from real.engine import Request

    def probe_requests(n: int) -> list:
        return [
            Request(i, pool[i % len(pool)], out_max, make_controller(x_name, x_cfg))
            for i in range(n)
        ]

    engine.run_batch(
        probe_requests(min(b.slots, b.capacity_requests)), planner=make_planner(x_name, x_cfg)
    )  # warm-up, untimed
    t0 = time.perf_counter()
    engine.run_batch(probe_requests(b.capacity_requests), planner=make_planner(x_name, x_cfg))
    probe_s = time.perf_counter() - t0
    probe_tok_s = b.capacity_requests * out_max / probe_s
    probe_rps = probe_tok_s / ((b.output_tokens_min + out_max) / 2)
    capacity_rps = b.capacity_rps or probe_rps
    log(
        f"batched: capacity probe {probe_tok_s:.1f} tokens/s at full batch -> "
        f"{probe_rps:.3f} requests/s"
        + (f" (capacity_rps = {b.capacity_rps:g} used)" if b.capacity_rps else "")
    )
    return {
        "tokens_per_s": probe_tok_s,
        "requests_per_s": probe_rps,
        "capacity_rps_used": capacity_rps,
        "requests": b.capacity_requests,
        "output_tokens": out_max,
        "seconds": probe_s,
    }


def _write_streams(b, pool, out_max, capacity_rps, bdir: Path) -> tuple[dict, dict]:
    """Step 4a: one Poisson arrival stream per load (``streams.csv``); return loads, streams."""
    import pandas as pd

    loads = {"calibration": b.calibration_load, **dict(zip(b.load_names, b.loads))}
    streams = {}
    for i, (name, x) in enumerate(loads.items()):
        streams[name] = poisson_stream(
            x * capacity_rps, b.duration_s, pool, b.output_tokens_min, out_max, b.seed + 1000 * i
        )
    pd.DataFrame(
        [
            {
                "load": ld,
                "rate_rps": loads[ld] * capacity_rps,
                "request_id": a.request_id,
                "arrival_s": a.arrival_s,
                "pool_index": j,
                "prompt_tokens": len(a.prompt),
                "output_tokens": a.output_tokens,
            }
            for ld, (st, idx) in streams.items()
            for a, j in zip(st, idx)
        ]
    ).to_csv(bdir / "streams.csv", index=False)
    return loads, streams


def _replay_all(engine, b, streams, x_name, x_cfg, ctrl_cfgs, profile_slice, bdir, log) -> None:
    """Step 4b: the real replays (calibration once, then controller x load x repeat,
    interleaved with profile slices); writes ``requests.csv``, ``rounds.csv``, ``batches.csv``."""
    import pandas as pd

    from real.serve import serve

    all_req, all_rounds, all_batches = [], [], []

    def replay(load: str, name: str, conf, label: str, rep: int) -> None:
        stream, _ = streams[load]
        res = serve(
            engine, stream, lambda: make_controller(name, conf), make_planner(name, conf), label
        )
        for msg in res.rejected:
            log(msg)
        tag = {"load": load, "repeat": rep}
        all_req.append(res.requests.assign(**tag))
        all_rounds.append(
            pd.DataFrame(records_to_columns(res.records)).assign(controller=label, **tag)
        )
        all_batches.append(res.batches.assign(**tag))
        s = res.summary
        log(
            f"batched real {label} @ {load} ({len(stream)} requests) rep {rep}: "
            f"{s['throughput_tokens_per_s']:.1f} tokens/s, TPOT p50 "
            f"{s['tpot_p50_s'] * 1e3:.1f} ms, TTFT p50 {s['ttft_p50_s'] * 1e3:.0f} ms, "
            f"mean batch {s['mean_batch_size']:.2f}"
        )

    replay("calibration", x_name, x_cfg, CALIBRATION_LABEL, 0)
    profile_slice()
    for rep in range(b.repeats):
        for ld in b.load_names:
            for c in b.controllers:
                replay(ld, c, ctrl_cfgs[c], c, rep)
                profile_slice()
        log(f"batched real runs: repeat {rep + 1}/{b.repeats} done")
    pd.concat(all_req, ignore_index=True).to_csv(bdir / "requests.csv", index=False)
    pd.concat(all_rounds, ignore_index=True).to_csv(bdir / "rounds.csv", index=False)
    pd.concat(all_batches, ignore_index=True).to_csv(bdir / "batches.csv", index=False)


def measure_batched(cfg: ValidateConfig, out: Path, log: Callable[[str], None]) -> dict:
    """Steps 1-4: the engine's runs and profile. Everything the prediction needs is written
    under ``out/batched`` (``measure.json``, ``streams.csv``, ``pool_positions.csv``, the real
    ``requests.csv`` / ``rounds.csv`` / ``batches.csv``, ``profile/latency.csv``), so that
    :func:`validate.batched_analysis.analyze_batched` can run again on it without the engine."""
    from real.profile import GridProfiler, finish_table

    t_start = time.perf_counter()
    b = cfg.batched
    bdir = out / "batched"
    bdir.mkdir(parents=True, exist_ok=True)
    ecfg = dataclasses.replace(cfg.engine, slots=b.slots, k_max=b.k_max, max_len=b.max_len)
    engine = build_engine(cfg, ecfg)
    ps = cfg.prompt_set(b.pool)
    out_max = ps.max_new_tokens
    log(
        f"batched: {b.slots} slots, k_max {b.k_max}, pool '{b.pool}' ({ps.n_prompts} prompts, "
        f"outputs {b.output_tokens_min}-{out_max})"
    )
    gp = GridProfiler(engine, b.profile)  # checks the grid against the engine first

    # 1. pool and its greedy position traces
    pool = _record_pool(engine, ps, out_max, bdir, log)

    # 2. the profile over batch, in slices between the real runs
    pdir = bdir / "profile"
    pdir.mkdir(exist_ok=True)
    per_slice, profile_slice = _start_profile(gp, b)

    # 3. capacity probe
    x_name = b.calibration_controller
    x_cfg = make_config(x_name, b.calibration_controller_config, source="batched calibration")
    probe = _capacity_probe(engine, b, pool, out_max, x_name, x_cfg, log)
    capacity_rps = probe["capacity_rps_used"]

    # 4. arrival streams and the real replays
    loads, streams = _write_streams(b, pool, out_max, capacity_rps, bdir)
    ctrl_cfgs, ctrl_src = {}, {}
    for c in b.controllers:
        ctrl_cfgs[c], ctrl_src[c] = controller_config(cfg, c)
    _replay_all(engine, b, streams, x_name, x_cfg, ctrl_cfgs, profile_slice, bdir, log)

    # the profile table (+ round overhead rows per batch, measured now)
    rows, fit = gp.rows()
    lat, details = finish_table(engine, b.profile, rows, fit)
    lat.to_csv(pdir / "latency.csv", index=False)
    meta = {
        "capacity_probe": probe,
        "loads": {
            ld: {
                "x_capacity": loads[ld],
                "rate_rps": loads[ld] * capacity_rps,
                "requests": len(streams[ld][0]),
            }
            for ld in loads
        },
        "calibration_controller": [x_name, to_dict(x_cfg)],
        "controllers": {c: [to_dict(ctrl_cfgs[c]), ctrl_src[c]] for c in b.controllers},
        "profile": {"passes": gp.done, "slices_cells": per_slice, **details},
        "decision_cpu_s_by_batch": _decision_cpu(cfg, bdir, x_name, x_cfg, ctrl_cfgs),
        "engine": ecfg.record(),
        "measure_s": time.perf_counter() - t_start,
    }
    (bdir / "measure.json").write_text(json.dumps(json_safe(meta), indent=1))
    log(f"batched: measured in {meta['measure_s']:.0f} s")
    return meta


def _decision_cpu(cfg: ValidateConfig, bdir: Path, x_name, x_cfg, ctrl_cfgs) -> dict:
    """Each controller's CPU per round by batch size (``mirror.decision_cpu_by_batch``),
    replayed over the calibration load's rounds; ``"calibration"``: the calibration controller's.
    Measured with the runs (a timing), so that a re-analysis reads it and repeats its table."""
    import pandas as pd

    from control.types import records_from_rows
    from validate.mirror import decision_cpu_by_batch

    rows = pd.read_csv(bdir / "rounds.csv", dtype={"confidences": str, "sentence_ends": str})
    recs = records_from_rows(rows[rows["controller"] == CALIBRATION_LABEL].to_dict("records"))
    k_max = cfg.batched.k_max
    out = {"calibration": decision_cpu_by_batch(x_name, x_cfg, recs, k_max)}
    for c, conf in ctrl_cfgs.items():
        out[c] = decision_cpu_by_batch(c, conf, recs, k_max)
    return out
