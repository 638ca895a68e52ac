"""``dspark validate --part tp``: does the simulator's TP model predict the sharded engine?

Calibration is TP = 1 only plus the measured collectives: the TP = 1 engine's latency table
(``real.profile``, read by ``sim.latency.Table``), the full-width time of one layer's four
projections (``real.tp_profile.time_projections``) and ``collectives.csv`` of the TP = N ranks
(``real.tp_profile``: the projections through the sharded modules, all-reduces included). The
model: a TP = N verify pass of T tokens costs the TP = 1 table's pass, with every layer's
projections replaced by their sharded time, ``verify_1(T) + layers × (sharded(T) - full(T))``;
the drafter is replicated, so its table time stands; each round adds the engine's three agreed
time readings (broadcasts, priced as the smallest all-reduce). The round sequence (draft lengths,
acceptance) is the TP = 1 run's: greedy TP = N commits the same tokens (tests/real/test_tp.py);
a timing-fed controller may choose other k on other timings, which this replay does not follow.

Measured: the same generations at TP = 1 (in this process) and TP = N (spawned ranks),
``repeats`` times each; the spread is (max - min) / mean over repeats. Output ``errors_tp.csv``
and ``tp/summary.json`` under the run folder; the last line printed is
``validate_tp_max_abs_error_pct=<x>`` (throughput and TPOT, every controller).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from control.configio import param
from control.errors import DSparkError


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
    # False: the shipped checkpoints.
    tiny: bool = param(False, doc="tiny random models instead of the shipped ones")
    # 300 s: the whole TP run, far above its minute.
    timeout_s: float = param(300.0, lo=10.0, hi=7200.0, doc="process-group timeout, s")


def _engine(cfg: TPValidateConfig):
    from real.engine import EngineConfig

    # room for the profile grid: its context plus a prefill chunk
    ecfg = EngineConfig(stop_at_eot=False, max_len=2 * cfg.prompt_tokens + cfg.new_tokens + 8)
    if cfg.tiny:
        from real.tiny import TinyModelsConfig, tiny_engine

        return tiny_engine(TinyModelsConfig(), ecfg)
    from real.runtime import build_engine

    return build_engine(ecfg)


def _prompts(engine, cfg: TPValidateConfig) -> list[list[int]]:
    from real.serve import _windows

    rng = np.random.default_rng(0)
    kind = "random" if cfg.tiny else "code"
    vocab = engine.target.cfg.vocab_size
    return _windows([cfg.prompt_tokens] * cfg.prompts, kind, "test", engine.tokenizer, vocab, rng)


def _measure(engine, cfg: TPValidateConfig, prompts, keep_records: bool = False) -> dict:
    """Per controller: tokens/s and TPOT of every repeat (interleaved); with ``keep_records``
    also the ``RoundRecord``s of the first repeat (the controllers' CPU is replayed on them)."""
    from control import make_controller

    out: dict = {c: {"tps": [], "tpot": [], "records": []} for c in cfg.controllers}
    for c in cfg.controllers:  # one untimed pass: first-call dispatch and allocator warm-up
        engine.generate(prompts[0], cfg.new_tokens, make_controller(c), request_id=0)
    for r in range(cfg.repeats):
        for c in cfg.controllers:
            toks = secs = pre = 0.0
            for i, p in enumerate(prompts):
                g = engine.generate(p, cfg.new_tokens, make_controller(c), request_id=i)
                f = engine.prefills[-1]
                toks, secs = toks + len(g.tokens), secs + g.seconds
                pre += f["end_s"] - f["start_s"]
                if r == 0 and keep_records:
                    out[c]["records"].extend(g.records)
            out[c]["tps"].append(toks / secs)
            out[c]["tpot"].append((secs - pre) / toks)
    return out


def _rank(rank: int, size: int, port: int, data: dict, path: str) -> None:
    """One TP rank: collectives profile, then the measured generations (rank 0 writes)."""
    import torch

    from real import tp
    from real.tp_profile import message_tokens, profile_collectives

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    torch.set_num_threads(1)
    cfg = TPValidateConfig(**data)
    tp.init(size, "cpu", cfg.timeout_s)
    try:
        engine = _engine(cfg)
        prompts = _prompts(engine, cfg)
        toks = message_tokens((1,), engine.cfg.k_max) + [cfg.prompt_tokens - 1]
        coll = profile_collectives(engine, toks, cfg.profile_repeats * 4, 3)
        meas = _measure(engine, cfg, prompts)
    finally:
        tp.shutdown()
    if rank == 0:
        Path(path).write_text(json.dumps({"measure": meas, "collectives": coll.to_dict("list")}))


def _spawn(cfg: TPValidateConfig, path: Path) -> dict:
    import logging

    import torch.multiprocessing as mp

    from real.tp import free_port

    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        mp.start_processes(
            _rank,
            args=(cfg.tp, free_port(), asdict(cfg), str(path)),
            nprocs=cfg.tp,
            join=True,
            start_method="spawn",
        )
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        first = (str(e).strip().splitlines() or ["?"])[-1]
        raise DSparkError(f"validate tp: a rank failed: {first}") from None
    return json.loads(path.read_text())


def tp_table(table, proj1: dict, coll, layers: int):
    """The TP = N latency table: the TP = 1 ``table`` (DataFrame) with every target pass of T
    tokens (batch × new tokens) charged ``layers × (sharded(T) - full(T))`` more, the sharded
    layer's projections (``coll``, TP = N, all-reduces included) in place of the full-width ones
    (``proj1``, seconds by tokens). The drafter is replicated: its rows stand. Means, not
    medians, of the collectives: a run pays every slow all-reduce."""
    sh = coll[coll["kind"] == "sharded"].sort_values("tokens")
    col = "seconds_mean" if "seconds_mean" in coll else "seconds"
    t1 = np.array(sorted(proj1))
    full = np.array([proj1[t] for t in t1])
    out = table.copy()
    tgt = out["model"].astype(str) == "target"
    toks = (out.loc[tgt, "batch"] * out.loc[tgt, "new_tokens"]).to_numpy(dtype=float)
    extra = layers * (np.interp(toks, sh["tokens"], sh[col]) - np.interp(toks, t1, full))
    for c in ("seconds", "seconds_mean", "seconds_p10", "seconds_p90"):
        if c in out:
            out.loc[tgt, c] = out.loc[tgt, c].to_numpy(dtype=float) + extra
    return out


def agree_overhead_s(coll) -> float:
    """The engine's three agreed time readings per round (``Engine.agree``), each priced as the
    smallest all-reduce (its mean)."""
    ar = coll[coll["kind"] == "all_reduce"].sort_values("tokens")
    col = "seconds_mean" if "seconds_mean" in ar else "seconds"
    return 3 * float(ar[col].iloc[0])


def predict(
    folder: Path, table, overhead_s: float, k_max: int, cfg, positions, extra: dict | None = None
) -> dict:
    """(TPOT, tokens/s) by controller: the simulator replays the greedy acceptance ``positions``
    (identical at every TP: greedy TP = N commits TP = 1's tokens) with each controller deciding
    its own draft lengths on ``table`` (a timing-fed controller drafts differently at TP = N);
    ``extra``: seconds per round added to a controller's overhead (its own CPU)."""
    from control.configio import to_dict
    from control.registry import make_config
    from dspark.validation.mirror import predict as sim_predict
    from dspark.validation.mirror import write_scenario

    folder.mkdir(parents=True, exist_ok=True)
    lat = folder / "latency.csv"
    table.to_csv(lat, index=False)
    ctrls = {c: make_config(c) for c in cfg.controllers}
    n = len(positions)
    scn = write_scenario(
        folder,
        folder.name,
        lat,
        overhead_s,
        k_max,
        [cfg.prompt_tokens] * n,
        [cfg.new_tokens] * n,
        positions,
        None,
        {c: to_dict(v) for c, v in ctrls.items()},
    )
    out = {}
    for c, ccfg in ctrls.items():
        _, res = sim_predict(scn, c, ccfg, extra_overhead_s=(extra or {}).get(c, 0.0))
        rq = res.requests
        tokens = float((rq["output_tokens"] - 1).sum())  # minus the mapped prompt token
        decode = float((rq["finish_s"] - rq["first_token_s"]).sum())
        busy = float(rq["finish_s"].max())  # requests run back to back from t = 0
        out[c] = (decode / tokens, tokens / busy)
    return out


def _calibrate(engine, cfg: TPValidateConfig):
    """The TP = 1 latency table and full-width projection times."""
    from real.profile import ProfileConfig, profile
    from real.tp_profile import message_tokens, time_projections

    pcfg = ProfileConfig(
        contexts=(cfg.prompt_tokens + cfg.new_tokens // 2,),
        prefill_tokens=(cfg.prompt_tokens - 1,),
        repeats=cfg.profile_repeats,
        warmup=1,
    )
    df, _ = profile(engine, pcfg)
    toks = message_tokens((1,), engine.cfg.k_max) + [cfg.prompt_tokens - 1]
    return df, time_projections(engine, toks, cfg.profile_repeats * 4, 3)


def _spread(xs) -> float:
    return float((max(xs) - min(xs)) / np.mean(xs) * 100) if len(xs) > 1 else 0.0


def run_tp(cfg: TPValidateConfig, out: Path, log=print) -> dict:
    """Calibrate at TP = 1, predict TP = N, measure both; write and return the summary."""
    import pandas as pd
    import torch

    from real.profile import round_overhead_s
    from real.tracing import record_positions_full

    torch.set_num_threads(1)
    (out / "tp").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine = _engine(cfg)
    prompts = _prompts(engine, cfg)
    log("TP = 1: profile, projections and greedy position traces")
    table, proj1 = _calibrate(engine, cfg)
    table.to_csv(out / "tp" / "latency_tp1.csv", index=False)
    pos = [record_positions_full(engine, p, cfg.new_tokens, i)[0] for i, p in enumerate(prompts)]
    log("TP = 1: measured generations")
    one = _measure(engine, cfg, prompts, keep_records=True)
    log(f"TP = {cfg.tp}: spawning the ranks (collectives, then the generations)")
    res = _spawn(cfg, out / "tp" / "measure_tp.json")
    coll = pd.DataFrame(res["collectives"])
    coll.to_csv(out / "tp" / "collectives.csv", index=False)
    k_max, ro = engine.cfg.k_max, round_overhead_s(table)
    extra = _decision_overheads(cfg, one, k_max)
    pred1 = predict(out / "tp" / "sim_tp1", table, ro, k_max, cfg, pos, extra)
    tab_n = tp_table(table, proj1, coll, engine.target.cfg.n_layers)
    ro_n = ro + agree_overhead_s(coll)
    predn = predict(out / "tp" / f"sim_tp{cfg.tp}", tab_n, ro_n, k_max, cfg, pos, extra)
    rows = _rows(cfg, one, res["measure"], pred1, predn)
    err = pd.DataFrame(rows)
    err.to_csv(out / "errors_tp.csv", index=False)
    worst = float(err["abs_error_pct"].max())
    summary = {
        "tp": cfg.tp,
        "config": asdict(cfg),
        "max_abs_error_pct": worst,
        "runtime_s": time.perf_counter() - t0,
        "rows": rows,
    }
    (out / "tp" / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _decision_overheads(cfg: TPValidateConfig, one: dict, k_max: int) -> dict[str, float]:
    """Each controller's CPU per round beyond fixed k's (``mirror.decision_cpu_s``), replayed
    over its TP = 1 rounds (the calibration side); the profile's overhead holds fixed k's."""
    from control.registry import make_config
    from dspark.validation.mirror import decision_cpu_s

    recs = [r for c in cfg.controllers for r in one[c]["records"]]
    base = decision_cpu_s("fixed", make_config("fixed"), recs, k_max)
    return {
        c: max(decision_cpu_s(c, make_config(c), one[c]["records"], k_max) - base, 0.0)
        for c in cfg.controllers
    }


def _rows(cfg, one, tpn, pred1: dict, predn: dict) -> list[dict]:
    """One row per (controller, metric): TP = N predicted against measured (the headline), with
    the same simulator's TP = 1 prediction against the TP = 1 run beside it (the control)."""
    rows = []
    for c in cfg.controllers:
        for i, (metric, key) in enumerate((("tpot_s", "tpot"), ("throughput_tokens_per_s", "tps"))):
            m, m1 = float(np.mean(tpn[c][key])), float(np.mean(one[c][key]))
            pred = predn[c][i]
            rows.append(
                {
                    "controller": c,
                    "metric": metric,
                    "tp1_measured": m1,
                    "tp1_predicted": pred1[c][i],
                    "tp1_error_pct": (pred1[c][i] - m1) / m1 * 100,
                    "tp_measured": m,
                    "tp_predicted": pred,
                    "error_pct": (pred - m) / m * 100,
                    "abs_error_pct": abs(pred - m) / m * 100,
                    "real_spread_pct": _spread(tpn[c][key]),
                }
            )
    return rows


def print_tp(summary: dict) -> None:
    import pandas as pd

    df = pd.DataFrame(summary["rows"])
    print(f"\n# TP = {summary['tp']} predicted from TP = 1 + measured collectives (errors_tp.csv)")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"tp runtime: {summary['runtime_s']:.0f} s", file=sys.stderr)


def run_tp_command(args) -> int:
    """``dspark validate --part tp [--fast] [--repeats N] [--set tp.KEY=VALUE]``."""
    from control.configio import from_mapping
    from dspark.args import parse_sets

    data = {k.removeprefix("tp."): v for k, v in parse_sets(args.set).items()}
    if args.fast:
        data.setdefault("tiny", True)
    if args.repeats is not None:
        data["repeats"] = args.repeats
    cfg = from_mapping(TPValidateConfig, data, source="<command line>", prefix="tp")
    quiet = getattr(args, "quiet", False)
    summary = run_tp(cfg, Path(args.out), (lambda m: None) if quiet else _log)
    print_tp(summary)
    print(f"validate_tp_max_abs_error_pct={summary['max_abs_error_pct']:.3f}")
    return 0


def _log(msg: str) -> None:
    print(f"[validate tp] {msg}", file=sys.stderr, flush=True)
