"""The batched part of ``dspark validate``: continuous batching under Poisson arrivals.

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
from real.profile import tmean
from validate import metrics as M
from validate.batched_latency import (
    correct_from_calibration,
    latency_check,
    overhead_by_batch,
    overhead_residuals,
    sim_table,
)
from validate.config import ValidateConfig, controller_config
from validate.mirror import sim_serving_metrics, write_serving_scenario

#: the controller label of the calibration load's replay
CALIBRATION_LABEL = "calibration"
ERROR_COLUMNS = (
    "controller",
    "load",
    "rate_rps",
    "metric",
    "sim",
    "real",
    "real_spread",
    "error_pct",
)


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


def real_serving_metrics(
    requests, batches, accepted: int, rounds: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The batched part's metrics of one ``real.serve`` run (its ``requests`` and ``batches``
    tables, Σ accepted over its ``rounds`` sequence-rounds) and its per-request times. A
    request's admission is the end of the last prefill pass before its first token (the serving
    loop runs a round right after every admission)."""
    req = requests.sort_values("request_id")
    if not bool(req["finished"].all()):
        from control.errors import DSparkError

        raise DSparkError(
            f"{int((~req['finished'].astype(bool)).sum())} requests of the replay "
            f"did not finish (rejected or cut off); the batched part needs all"
        )
    pre = np.sort(batches.loc[batches["kind"] == "prefill", "end_s"].to_numpy(dtype=float))
    first = req["first_token_s"].to_numpy(dtype=float)
    j = np.searchsorted(pre, first, side="right") - 1
    times = {
        "request_id": req["request_id"].to_numpy(),
        "arrival_s": req["arrival_s"].to_numpy(dtype=float),
        "admitted_s": pre[np.maximum(j, 0)],
        "first_token_s": first,
        "finish_s": req["finish_s"].to_numpy(dtype=float),
        "tokens": req["emitted_tokens"].to_numpy(dtype=float),
    }
    m = M.serving(
        times["arrival_s"],
        times["admitted_s"],
        first,
        times["finish_s"],
        times["tokens"],
        accepted,
        rounds,
    )
    return m, times


def run_batched(cfg: ValidateConfig, out: Path, log: Callable[[str], None]) -> dict:
    """The batched part (module docstring): measure, then predict and compare."""
    measure_batched(cfg, out, log)
    return analyze_batched(cfg, out, log)


def _record_pool(engine, ps, out_max: int, bdir: Path, log: Callable[[str], None]) -> list:
    """Step 1: the prompt pool and its greedy position traces (``pool_positions.csv``)."""
    import pandas as pd

    from real.tracing import make_prompts, record_positions_full

    vocab = engine.target.embed_tokens.num_embeddings
    pool = make_prompts(ps, engine.tokenizer, vocab)
    traces = []
    for j, p in enumerate(pool):
        recs, _ = record_positions_full(engine, p, out_max, request_id=j)
        traces.append(recs)
    flat = [r for recs in traces for r in recs]
    pd.DataFrame(records_to_columns(flat, type(flat[0]))).to_csv(
        bdir / "pool_positions.csv", index=False
    )
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
    :func:`analyze_batched` can run again on it without the engine."""
    from real.profile import GridProfiler, finish_table
    from validate.run import build_engine

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


def _load_measurements(bdir: Path) -> tuple:
    """Read what :func:`measure_batched` wrote: (meta, streams, pool traces by prompt, real
    requests, rounds, batches, latency table)."""
    import pandas as pd

    from control.types import PositionRecord, records_from_rows

    meta = json.loads((bdir / "measure.json").read_text())
    streams = pd.read_csv(bdir / "streams.csv")
    pos = records_from_rows(
        pd.read_csv(bdir / "pool_positions.csv", dtype={"confidences": str}).to_dict("records"),
        PositionRecord,
    )
    traces: dict[int, list] = {}
    for p in pos:
        traces.setdefault(int(p.request_id), []).append(p)
    rq_all = pd.read_csv(bdir / "requests.csv")
    rd_all = pd.read_csv(bdir / "rounds.csv", usecols=["controller", "load", "repeat", "accepted"])
    bt_all = pd.read_csv(bdir / "batches.csv")
    lat = pd.read_csv(bdir / "profile" / "latency.csv")
    return meta, streams, traces, rq_all, rd_all, bt_all, lat


def _real_runs(rq_all, rd_all, bt_all, label: str, load: str) -> list[tuple[dict, object]]:
    """The real runs of one controller label at one load: (serving metrics, batches) per
    repeat."""
    runs = []
    key = ["controller", "load", "repeat"]
    for rep in sorted(
        rq_all.loc[(rq_all["controller"] == label) & (rq_all["load"] == load), "repeat"].unique()
    ):
        sel = dict(zip(key, (label, load, rep)))

        def pick(df, sel=sel):
            m = np.ones(len(df), dtype=bool)
            for k, v in sel.items():
                m &= (df[k] == v).to_numpy()
            return df[m]

        rd = pick(rd_all)
        bt = pick(bt_all)
        m, _ = real_serving_metrics(pick(rq_all), bt, int(rd["accepted"].sum()), len(rd))
        runs.append((m, bt))
    return runs


def _calibrate(cfg: ValidateConfig, meta: dict, lat, cal_runs, pdir: Path, log) -> dict:
    """Step 5: the profile at the latency statistic and the round overhead per batch size;
    writes the simulator's latency table and the plain one (without the overhead)."""
    from real.profile import with_statistic

    b = cfg.batched
    stat = with_statistic(lat, cfg.latency_statistic)
    batches = sorted({int(x) for x in lat["batch"].unique()})
    ov_rows = stat[stat["model"].astype(str) == "round-overhead"]
    profile_ov = {int(r.batch): float(r.seconds) for r in ov_rows.itertuples(index=False)}
    resid: dict[int, list[float]] = {}
    for _, bt in cal_runs:
        for bb, v in overhead_residuals(bt).items():
            resid.setdefault(bb, []).extend(v)
    cal_ov = overhead_by_batch(resid, batches)
    if b.overhead_from == "calibration" and cal_ov:
        overhead = {bb: cal_ov[bb] for bb in batches}
        ov_src = "calibration load (serving loop residual)"
    else:
        overhead = {bb: profile_ov.get(bb, 0.0) for bb in batches}
        ov_src = "profile round-overhead rows (run_batch of fixed k)"
    stat, correction = _corrected_profile(cfg, stat, cal_runs, pdir, log)
    sim_lat = sim_table(stat, b.k_max, overhead)
    sim_lat_csv = pdir / f"latency_sim_{cfg.latency_statistic}.csv"
    sim_lat.to_csv(sim_lat_csv, index=False)
    plain_csv = pdir / f"latency_{cfg.latency_statistic}.csv"  # without the round overhead
    stat.to_csv(plain_csv, index=False)
    log(
        "batched: round overhead per batch (ms): "
        + ", ".join(f"B{bb} {overhead[bb] * 1e3:.2f}" for bb in batches)
        + f" [{ov_src}]"
    )
    return {
        "sim_lat": sim_lat,
        "sim_lat_csv": sim_lat_csv,
        "plain_csv": plain_csv,
        "overhead": overhead,
        "ov_src": ov_src,
        "profile_ov": profile_ov,
        "resid": resid,
        "correction": correction,
    }


def _corrected_profile(cfg: ValidateConfig, stat, cal_runs, pdir: Path, log) -> tuple:
    """The profile's table corrected by the calibration load's own rounds
    (``batched_latency.correct_from_calibration``; ``[batched] profile_correction``), the
    profile as measured kept beside it; (table, what was applied)."""
    b = cfg.batched
    if b.profile_correction == "off":
        return stat, {"mode": "off"}
    raw_csv = pdir / f"latency_profile_{cfg.latency_statistic}.csv"  # the profile as measured
    stat.to_csv(raw_csv, index=False)
    per_size = b.profile_correction == "per-batch"
    fixed, info = correct_from_calibration(
        raw_csv, [bt for _, bt in cal_runs], b.k_max, per_size=per_size
    )
    v, d = info["verify_scale"], info["drafter_scale"]
    scales = (
        [f"B{g} {v[g]:.3f} / {d[g]:.3f}" for g in v]
        if per_size
        else [f"{x:.3f} / {d[g]:.3f}" for g, x in list(v.items())[:1]]
    )
    log(
        f"batched: profile corrected by the calibration load's rounds ({b.profile_correction}; "
        f"verify / drafter step x): {', '.join(scales)}"
    )
    return fixed, {"mode": b.profile_correction, **info}


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


def _decision_tables(cfg: ValidateConfig, meta: dict, cal: dict, log) -> dict:
    """Per held-out controller, the simulator's latency table with its own CPU per round beyond
    the calibration controller's (``meta["decision_cpu_s_by_batch"]``, nearest batch size) added
    to the round overhead: the calibration residual holds only the calibration controller's
    decisions (a planner's ``plan`` is ~0.5 ms a round here)."""
    import pandas as pd

    b = cfg.batched
    cpu = {
        c: {int(bb): float(v) for bb, v in d.items()}
        for c, d in meta.get("decision_cpu_s_by_batch", {}).items()
    }
    base = cpu.get("calibration", {})
    plain = pd.read_csv(cal["plain_csv"])
    out = {}
    for c in b.controllers:
        extra = {bb: max(v - base.get(bb, 0.0), 0.0) for bb, v in cpu.get(c, {}).items()}
        known = sorted(extra)
        ov = {
            bb: v + (extra[min(known, key=lambda k: abs(k - bb))] if known else 0.0)
            for bb, v in cal["overhead"].items()
        }
        path = Path(cal["sim_lat_csv"]).with_name(f"latency_sim_{c}.csv")
        sim_table(plain, b.k_max, ov).to_csv(path, index=False)
        out[c] = path
        log(
            f"batched: {c} decision CPU beyond the calibration controller (ms/round by batch): "
            + (", ".join(f"B{bb} {v * 1e3:.3f}" for bb, v in extra.items()) or "not measured")
        )
    return out


def _predict(
    cfg: ValidateConfig, bdir: Path, streams, traces, load: str, name: str, conf, lat_csv, sub=""
) -> dict:
    """Step 6: simulate one controller on one load's replay (its mirror scenario)."""
    from sim import load_scenario, simulate

    b = cfg.batched
    st = streams[streams["load"] == load].sort_values("request_id")
    folder = bdir / "sim" / load / name / sub if sub else bdir / "sim" / load / name
    n_out = st["output_tokens"].astype(int).tolist()
    scn = write_serving_scenario(
        folder,
        f"{cfg.name}-batched-{load}",
        lat_csv,
        b.k_max,
        b.slots,
        st["arrival_s"].tolist(),
        st["prompt_tokens"].astype(int).tolist(),
        n_out,
        [traces[int(j)][:n] for j, n in zip(st["pool_index"], n_out)],
        {name: to_dict(conf)},
    )
    res = simulate(load_scenario(scn), name, conf, seed=0, trace=True, baseline=False)
    res.requests.to_csv(folder / "requests.csv", index=False)
    m, _ = sim_serving_metrics(res)
    return m


def _speed_diagnostics(cfg, out: Path, bdir: Path, runs, cal: dict, predict) -> tuple:
    """The latency model on each real run's own rounds (real draft and verify time over the
    table's for the same batch, tokens and context: the machine's speed during the run), and
    the error left when each run is predicted at its own measured speed (the table scaled by
    that ratio; not a prediction: it reads the run's own times). Writes ``latency_check.csv``
    and ``errors_batched_speed_corrected.csv``; returns both frames."""
    import pandas as pd

    b = cfg.batched
    speed, corrected_rows = [], []
    for (c, ld), rs in runs.items():
        for rep, (m_real, bt) in enumerate(rs):
            ratio = latency_check(bt, cal["plain_csv"])
            speed.append({"controller": c, "load": ld, "repeat": rep, **ratio})
            if not b.speed_corrected:
                continue
            scaled = sim_table(cal["sim_lat"], b.k_max, {}, scale=ratio["round_ratio"])
            path = bdir / "sim" / ld / c / f"latency_speed_rep{rep}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            scaled.to_csv(path, index=False)
            m_sim = predict(ld, c, path, f"speed_rep{rep}")
            for m in M.SERVING_METRICS:
                corrected_rows.append(
                    {
                        "controller": c,
                        "load": ld,
                        "repeat": rep,
                        "metric": m,
                        "sim": m_sim[m],
                        "real": m_real[m],
                        "error_pct": M.error_pct(m_sim[m], m_real[m]),
                        "speed_ratio": ratio["round_ratio"],
                    }
                )
    speed_df = pd.DataFrame(speed)
    speed_df.to_csv(bdir / "latency_check.csv", index=False)
    corrected = pd.DataFrame(corrected_rows)
    if len(corrected):
        corrected.to_csv(out / "errors_batched_speed_corrected.csv", index=False)
    return speed_df, corrected


def _error_table(meta: dict, preds: dict, real: dict, out: Path):
    """Step 7a: sim vs the real median per controller x load x metric (``errors_batched.csv``)."""
    import pandas as pd

    rates = {ld: v["rate_rps"] for ld, v in meta["loads"].items()}
    rows_out = [
        {**r, "rate_rps": rates[r["load"]]}
        for r in M.error_rows(preds, real, M.SERVING_METRICS, "load")
    ]
    err = pd.DataFrame(rows_out, columns=list(ERROR_COLUMNS))
    err.to_csv(out / "errors_batched.csv", index=False)
    return err


def _rank_orders(err, real: dict, load_names) -> dict:
    """Step 7b: the controllers' orders per load, simulated and real (TPOT and throughput), and
    the pairs the real repeats tell apart by TPOT (``metrics.resolved_pairs``)."""
    ranks = {}
    for ld in load_names:
        t = err[(err["load"] == ld) & (err["metric"] == M.RANK_METRIC)]
        tp = err[(err["load"] == ld) & (err["metric"] == "throughput_tokens_per_s")]
        ranks[ld] = {
            "metric": M.RANK_METRIC,
            "sim_order": t.sort_values("sim")["controller"].tolist(),
            "real_order": t.sort_values("real")["controller"].tolist(),
            "real_values": dict(zip(t["controller"], t["real"])),
            "real_spread_pct": dict(zip(t["controller"], t["real_spread"])),
            "real_repeats": M.repeats_of(real, t["controller"], ld, M.RANK_METRIC),
            "throughput_sim_order": tp.sort_values("sim", ascending=False)["controller"].tolist(),
            "throughput_real_order": tp.sort_values("real", ascending=False)["controller"].tolist(),
        }
        ranks[ld]["agree"] = ranks[ld]["sim_order"] == ranks[ld]["real_order"]
        ranks[ld]["told_apart"] = M.told_apart(t, ranks[ld]["real_repeats"])
    return ranks


def _latency_check_summary(speed_df) -> dict:
    """The ``latency_check`` entry of the summary."""
    return {
        "what": "per real run: its Σ verify_s / the table's verify for the same rounds "
        "(verify_ratio), the same for the draft phase (draft_ratio: the table's "
        "draft-phase rows, without the drafter catch-up after rounds that did not "
        "draft), and for both together (round_ratio)",
        "round_ratio_min": float(speed_df["round_ratio"].min()),
        "round_ratio_max": float(speed_df["round_ratio"].max()),
        "round_ratio_median": float(speed_df["round_ratio"].median()),
        "draft_ratio_median": float(speed_df["draft_ratio"].median()),
        "verify_ratio_median": float(speed_df["verify_ratio"].median()),
    }


def _summary(cfg, meta, err, real, ranks, cal_check, speed_df, corrected, cal, t_start) -> dict:
    """Step 7c: the ``batched/summary.json`` contents."""
    b = cfg.batched
    head = err[err["metric"].isin(tuple(M.SERVING_TARGETS))]
    max_err = float(head["error_pct"].abs().max())
    within_target = {
        m: bool((head[head["metric"] == m]["error_pct"].abs() <= t).all())
        for m, t in M.SERVING_TARGETS.items()
    }
    return {
        "kind": "validate-batched",
        "name": cfg.name,
        "max_abs_error_pct": max_err,
        "max_abs_error_metrics": list(M.SERVING_TARGETS),
        "targets_pct": M.SERVING_TARGETS,
        "within_target": within_target,
        "rank_agreement": {ld: r["agree"] for ld, r in ranks.items()},
        "rank_orders": ranks,
        "headline_errors_within_real_spread": int(
            (head["error_pct"].abs() <= head["real_spread"]).sum()
        ),
        "headline_errors": len(head),
        "max_real_spread_pct": float(head["real_spread"].max()),
        "repeats": b.repeats,
        # what a simulator exact on every true value would score on these repeats (seeded)
        "noise_floor": M.noise_floor_of(real, M.SERVING_TARGETS, np.random.default_rng(0)),
        "capacity_probe": meta["capacity_probe"],
        "loads": meta["loads"],
        "calibration_check": cal_check,
        "latency_check": _latency_check_summary(speed_df),
        "speed_corrected_max_abs_error_pct": (
            float(
                corrected[corrected["metric"].isin(tuple(M.SERVING_TARGETS))]["error_pct"]
                .abs()
                .max()
            )
            if len(corrected)
            else None
        ),
        "round_overhead_s_by_batch": {str(k): v for k, v in cal["overhead"].items()},
        "round_overhead_source": cal["ov_src"],
        "round_overhead_profile_s_by_batch": {str(k): v for k, v in cal["profile_ov"].items()},
        "round_overhead_calibration_residual": {
            str(k): {"rounds": len(v), "trimmed_mean_s": tmean(v)}
            for k, v in sorted(cal["resid"].items())
        },
        "profile_correction": cal["correction"],
        "controllers_heldout": {c: src for c, (_, src) in meta["controllers"].items()},
        "engine": meta["engine"],
        "prefill_convention": "simulator prompt = P - 1 tokens, output = N + 1; engine first "
        "token = end of the simulated first round (module docstring)",
        "runtime_s": meta["measure_s"] + time.perf_counter() - t_start,
    }


def analyze_batched(cfg: ValidateConfig, out: Path, log: Callable[[str], None]) -> dict:
    """Steps 5-7 from the measurements under ``out/batched`` (no engine): calibration,
    predictions, errors; writes ``errors_batched.csv`` and ``batched/summary.json``."""
    t_start = time.perf_counter()
    b = cfg.batched
    bdir = out / "batched"
    pdir = bdir / "profile"
    meta, streams, traces, rq_all, rd_all, bt_all, lat = _load_measurements(bdir)
    x_name, x_table = meta["calibration_controller"]
    x_cfg = make_config(x_name, x_table, source="batched calibration")
    ctrl_cfgs = {
        c: make_config(c, t, source=f"batched {c}") for c, (t, _) in meta["controllers"].items()
    }

    def real_runs(label: str, load: str) -> list[tuple[dict, object]]:
        return _real_runs(rq_all, rd_all, bt_all, label, load)

    # 5. calibration: the profile, and the serving loop's round overhead per batch size
    cal_runs = real_runs(CALIBRATION_LABEL, "calibration")
    cal = _calibrate(cfg, meta, lat, cal_runs, pdir, log)

    # 6. predictions: every load x controller (and the calibration load, as a check)
    def predict(load: str, name: str, conf, lat_csv: Path = cal["sim_lat_csv"], sub="") -> dict:
        return _predict(cfg, bdir, streams, traces, load, name, conf, lat_csv, sub)

    cal_real = next(m for m, _ in cal_runs)
    cal_sim = predict("calibration", x_name, x_cfg)
    tables = _decision_tables(cfg, meta, cal, log)
    preds = {
        (c, ld): predict(ld, c, ctrl_cfgs[c], tables[c])
        for ld in b.load_names
        for c in b.controllers
    }
    runs = {(c, ld): real_runs(c, ld) for (c, ld) in preds}
    real = {k: [m for m, _ in v] for k, v in runs.items()}
    log(f"batched: predicted {len(preds)} controller x load pairs")

    # diagnostics: the latency model on each real run's own rounds, and the speed-corrected error
    speed_df, corrected = _speed_diagnostics(
        cfg,
        out,
        bdir,
        runs,
        cal,
        lambda ld, c, path, sub: predict(ld, c, ctrl_cfgs[c], path, sub),
    )

    # 7. errors, ranking, summary
    err = _error_table(meta, preds, real, out)
    ranks = _rank_orders(err, real, b.load_names)
    cal_check = {
        "controller": x_name,
        "controller_config": x_table,
        "real": cal_real,
        "sim": cal_sim,
        "error_pct": {k: M.error_pct(cal_sim[k], cal_real[k]) for k in M.SERVING_METRICS},
    }
    summary = _summary(cfg, meta, err, real, ranks, cal_check, speed_df, corrected, cal, t_start)
    (bdir / "summary.json").write_text(json.dumps(json_safe(summary), indent=1))
    log(f"batched: done in {summary['runtime_s']:.0f} s")
    return summary


def format_table(err) -> str:
    """The batched error table as aligned text (controller x load x metric)."""
    head = (
        f"{'controller':<14} {'load':<16} {'rate/s':>7} {'metric':<24} {'sim':>11} "
        f"{'real':>11} {'spread%':>8} {'error%':>8}"
    )
    lines = [head]
    for r in err.itertuples(index=False):
        lines.append(
            f"{r.controller:<14} {r.load:<16} {r.rate_rps:>7.3f} {r.metric:<24} "
            f"{r.sim:>11.5g} {r.real:>11.5g} {r.real_spread:>8.2f} "
            f"{r.error_pct:>+8.2f}"
        )
    return "\n".join(lines)
