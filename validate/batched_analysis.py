"""Steps 5-7 of the batched part of ``dspark validate`` (:mod:`validate.batched`, whose
docstring describes the part): from what the measurement wrote under ``out/batched`` alone (no
engine), the calibration of the simulator, its predictions of every controller x load, the
error table, the rank agreement and ``batched/summary.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from control.configio import to_dict
from control.latency_rows import OVERHEAD
from control.metrics import json_safe
from control.registry import make_config
from real.profile import tmean
from validate import metrics as M
from validate.batched import CALIBRATION_LABEL
from validate.batched_latency import (
    correct_from_calibration,
    latency_check,
    overhead_by_batch,
    overhead_residuals,
    sim_table,
)
from validate.config import ValidateConfig
from validate.mirror import sim_serving_metrics, write_serving_scenario
from validate.tables import error_table, rank_orders


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
    ov_rows = stat[stat["model"].astype(str) == OVERHEAD]
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
    """Step 7a: sim vs the real median per controller x load x metric, with each load's arrival
    rate (``errors_batched.csv``)."""
    rates = {ld: v["rate_rps"] for ld, v in meta["loads"].items()}
    err = error_table(preds, real, M.SERVING_METRICS, "load", {"rate_rps": rates})
    err.to_csv(out / "errors_batched.csv", index=False)
    return err


def _rank_orders(err, real: dict, load_names) -> dict:
    """Step 7b: the controllers' orders per load, simulated and real, by TPOT (lower first;
    ``tables.rank_orders``: with the pairs the real repeats tell apart) and by throughput, and
    the real values and spreads beside them."""
    ranks = rank_orders(err, real, "load", load_names, M.RANK_METRIC, False)
    for ld, r in ranks.items():
        t = err[(err["load"] == ld) & (err["metric"] == M.RANK_METRIC)]
        tp = err[(err["load"] == ld) & (err["metric"] == "throughput_tokens_per_s")]
        ranks[ld] = {
            "metric": M.RANK_METRIC,
            **r,
            "real_values": dict(zip(t["controller"], t["real"])),
            "real_spread_pct": dict(zip(t["controller"], t["real_spread"])),
            "throughput_sim_order": tp.sort_values("sim", ascending=False)["controller"].tolist(),
            "throughput_real_order": tp.sort_values("real", ascending=False)["controller"].tolist(),
        }
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
