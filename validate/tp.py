"""``dspark validate --part tp``: does the simulator's TP model predict the sharded engine?

Calibration is TP = 1 plus what the TP = N ranks measure of their own: the TP = 1 engine's
latency table (``real.profile``, read by ``sim.latency.Table``), first corrected by the engine's
own k-cycling rounds on calibration prompts (``real.trace_correction.correct_from_trace``, as the batch-1
part); the full-width time of one layer's four projections (``real.tp_profile.
time_projections``); and, timed on the TP = N ranks, the same projections through the sharded
modules with their all-reduces, the full-width ones on every rank at once, the broadcasts of
the engine's agreed readings (``collectives.csv``) and the replicated drafter's draft phases on
every rank at once. The model (:func:`tp_table`): a TP = N verify pass of T tokens costs
``f(T) × (verify_1(T) − layers × full(T)) + layers × sharded(T)``; the drafter's rows take its
side-by-side factor; each round adds two agreed readings (three with a round planner), priced
as the profiled broadcast. The acceptance is the TP = 1 run's greedy positions (greedy TP = N
commits TP = 1's tokens, tests/real/test_tp.py); each controller decides its own draft lengths
on the TP = N table, as a timing-fed controller does on the engine.

Measured: the same generations at TP = 1 (in this process) and TP = N (spawned ranks),
``repeats`` times each; measured = the median over repeats, the spread (max - min) / median
(as the other parts). Output ``errors_tp.csv``
and ``tp/summary.json`` under the run folder; the last line printed is
``validate_tp_max_abs_error_pct=<x>`` (throughput and TPOT, every controller).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from control.errors import DSparkError
from control.metrics import json_safe
from validate.tp_setup import TPValidateConfig


def _spawn(cfg: TPValidateConfig, path: Path) -> dict:
    import logging

    import torch.multiprocessing as mp

    from real.tp import free_port
    from validate.tp_runs import rank_job

    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        mp.start_processes(
            rank_job,
            args=(cfg.tp, free_port(), asdict(cfg), str(path)),
            nprocs=cfg.tp,
            join=True,
            start_method="spawn",
        )
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        first = (str(e).strip().splitlines() or ["?"])[-1]
        raise DSparkError(f"validate tp: a rank failed: {first}") from None
    return json.loads(path.read_text())


def _line(x, y):
    """The least-squares line through (x, y), as a function (latency + per-token time)."""
    b, a = np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 1)
    return lambda t: a + b * np.asarray(t, dtype=float)


def tp_table(table, proj1: dict, coll, layers: int, drafter_factor: float | None = None):
    """The TP = N latency table from the TP = 1 ``table`` (DataFrame). A target pass of T tokens
    (batch × new tokens) costs ``f(T) × (tp1(T) - layers × full(T)) + layers × sharded(T)``: the
    sharded layer's projections (``coll`` kind ``sharded``, TP = N, all-reduces included) in
    place of the full-width ones (``proj1``, TP = 1, seconds by tokens), and the rest of the
    pass (attention, norms, embedding, head) slowed by ``f(T) = replicated(T) / full(T)``, what
    the same compute costs with N ranks running side by side (``coll`` kind ``replicated``; 1
    when the profile has none). The drafter is replicated: its rows and the ``draft-phase``
    rows are scaled by ``drafter_factor`` (its own draft phases timed on every rank at once
    over the same timed alone, ``real.tp_profile.side_by_side_factor``), or without one by
    ``f`` at its tokens (a phase: at one step's tokens).
    Each timing is the least-squares line over the profiled sizes (a latency plus a per-token
    time, as the simulator's collective model): one size's mean of 20 samples moved 5-25%
    between runs, the line pools them. Means, not medians: a run pays every slow all-reduce."""
    from control.latency_rows import DRAFT_PHASE, DRAFTER, TARGET
    from real.profile import TIME_COLUMNS

    col = "seconds_mean" if "seconds_mean" in coll else "seconds"
    sh = coll[coll["kind"] == "sharded"].sort_values("tokens")
    rep = coll[coll["kind"] == "replicated"].sort_values("tokens")
    t1 = sorted(proj1)
    sharded, full = _line(sh["tokens"], sh[col]), _line(t1, [proj1[t] for t in t1])
    side = _line(rep["tokens"], rep[col]) if len(rep) > 1 else full
    out = table.copy()
    model = out["model"].astype(str)
    for who in (TARGET, DRAFTER, DRAFT_PHASE):
        rows = model == who
        toks = (out.loc[rows, "batch"] * out.loc[rows, "new_tokens"]).to_numpy(dtype=float)
        if who == DRAFT_PHASE:  # a phase of k steps: f at one step's tokens
            toks = out.loc[rows, "batch"].to_numpy(dtype=float)
        if who != TARGET and drafter_factor is not None:
            f = np.full(len(toks), float(drafter_factor))
        else:
            f = side(toks) / full(toks)
        for c in TIME_COLUMNS:
            if c in out:
                x = out.loc[rows, c].to_numpy(dtype=float)
                if who == "target":  # the rest of the pass side by side, the projections sharded
                    x = np.maximum(x - layers * full(toks), 0.0)
                    out.loc[rows, c] = f * x + layers * sharded(toks)
                else:
                    out.loc[rows, c] = f * x
    return out


def agree_overhead_s(coll, calls: int = 1) -> float:
    """``calls`` agreed time readings (``Engine.agree``: two per round, three with a round
    planner), each priced as the profile's broadcast (its mean), or without one as the smallest
    all-reduce."""
    kind = "broadcast" if (coll["kind"] == "broadcast").any() else "all_reduce"
    ar = coll[coll["kind"] == kind].sort_values("tokens")
    col = "seconds_mean" if "seconds_mean" in ar else "seconds"
    return calls * float(ar[col].mean() if kind == "broadcast" else ar[col].iloc[0])


def predict(
    folder: Path, table, overhead_s: float, k_max: int, cfg, positions, extra: dict | None = None
) -> dict:
    """(TPOT, tokens/s, mean draft length) by controller: the simulator replays the greedy
    acceptance ``positions`` (identical at every TP: greedy TP = N commits TP = 1's tokens) with
    each controller deciding its own draft lengths on ``table`` (a timing-fed controller drafts
    differently at TP = N); ``extra``: seconds per round added to a controller's overhead (its
    own CPU)."""
    from control.configio import to_dict
    from control.registry import make_config
    from validate.mirror import predict as sim_predict
    from validate.mirror import write_scenario

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
        out[c] = (decode / tokens, tokens / busy, float(res.rounds["drafted"].mean()))
    return out


def run_tp(cfg: TPValidateConfig, out: Path, log=print) -> dict:
    """Calibrate at TP = 1, predict TP = N, measure both (``tp_runs``: one spawned group,
    calibration and measurements alternated); write and return the summary."""
    import pandas as pd

    from control.registry import make_planner
    from control.types import PositionRecord, records_from_rows, records_to_columns
    from real.profile import round_overhead_s
    from real.tp_profile import side_by_side_factor
    from real.trace_correction import trace_ratios

    (out / "tp").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(
        f"spawning {cfg.tp} ranks: {cfg.repeats} x (TP = 1 calibration slice and run on rank 0, "
        f"then collectives and the TP = {cfg.tp} run)"
    )
    res = _spawn(cfg, out / "tp" / "measure_tp.json")
    one = res["tp1"]
    for m in (one["measure"], res["measure"]):
        for v in m.values():
            v["records"] = records_from_rows(v["records"])
    table, fix, k_max = pd.DataFrame(one["table"]), one["correction"], int(one["k_max"])
    table.to_csv(out / "tp" / "latency_tp1.csv", index=False)
    coll = pd.DataFrame(res["collectives"])
    coll.to_csv(out / "tp" / "collectives.csv", index=False)
    pos = [records_from_rows(ps, PositionRecord) for ps in one["positions"]]
    proj1 = {int(t): v for t, v in one["projections"].items()}
    ro = round_overhead_s(table)
    extra = _decision_overheads(cfg, one["measure"], k_max)
    pred1 = predict(out / "tp" / "sim_tp1", table, ro, k_max, cfg, pos, extra)
    f_draft = side_by_side_factor(_by_k(one["drafter_alone"]), _by_k(res["drafter_side"]))
    tab_n = tp_table(table, proj1, coll, int(one["layers"]), f_draft)
    # two agreed readings a round, a third after the round for a round planner's statistics
    ro_n = ro + agree_overhead_s(coll, 2)
    planned = {c for c in cfg.controllers if make_planner(c) is not None}
    extra_n = {c: v + (agree_overhead_s(coll) if c in planned else 0.0) for c, v in extra.items()}
    predn = predict(out / "tp" / f"sim_tp{cfg.tp}", tab_n, ro_n, k_max, cfg, pos, extra_n)
    rows = _rows(cfg, one["measure"], res["measure"], pred1, predn)
    recs_n = [r for c in cfg.controllers for r in res["measure"][c]["records"]]
    per_k = trace_ratios(tab_n, recs_n, "seconds", cfg.latency_statistic)
    recs_1 = [r for c in cfg.controllers for r in one["measure"][c]["records"]]
    per_k1 = trace_ratios(table, recs_1, "seconds", cfg.latency_statistic)
    for n, recs in ((1, recs_1), (cfg.tp, recs_n)):
        pd.DataFrame(records_to_columns(recs)).to_csv(out / "tp" / f"rounds_tp{n}.csv", index=False)
    err = pd.DataFrame(rows)
    err.to_csv(out / "errors_tp.csv", index=False)
    worst = float(err["abs_error_pct"].max())
    summary = {
        "tp": cfg.tp,
        "config": asdict(cfg),
        "max_abs_error_pct": worst,
        "trace_correction": fix,
        # the replicated drafter's draft phases, every rank at once over one process alone
        "drafter_side_by_side_factor": f_draft,
        # measured / predicted TP = N round time by draft length (the model's error per k)
        "tp_rounds_vs_table": per_k,
        "tp1_rounds_vs_table": per_k1,
        "runtime_s": time.perf_counter() - t0,
        "rows": rows,
    }
    (out / "tp" / "summary.json").write_text(json.dumps(json_safe(summary), indent=1, default=str))
    return summary


def _by_k(times: dict) -> dict[int, list]:
    """JSON's string keys back to draft lengths."""
    return {int(k): v for k, v in times.items()}


def _decision_overheads(cfg: TPValidateConfig, one: dict, k_max: int) -> dict[str, float]:
    """Each controller's CPU per round beyond fixed k's (``mirror.decision_cpu_s``), replayed
    over its TP = 1 rounds (the calibration side); the profile's overhead holds fixed k's."""
    from control.registry import make_config
    from validate.mirror import decision_cpu_s

    recs = [r for c in cfg.controllers for r in one[c]["records"]]
    base = decision_cpu_s("fixed", make_config("fixed"), recs, k_max)
    return {
        c: max(decision_cpu_s(c, make_config(c), one[c]["records"], k_max) - base, 0.0)
        for c in cfg.controllers
    }


def _rows(cfg, one, tpn, pred1: dict, predn: dict) -> list[dict]:
    """One row per (controller, metric): TP = N predicted against measured (the headline), with
    the same simulator's TP = 1 prediction against the TP = 1 run beside it (the control).
    Measured = the median of the repeats and their spread (max − min) / median, as every other
    part's error table (``metrics.error_rows``): one disturbed repeat of a shared machine (one
    repeat much slower than the others) does not set the figure."""
    from control.metrics import range_pct_of_median
    from validate.metrics import error_pct

    rows = []
    for c in cfg.controllers:
        for i, (metric, key) in enumerate((("tpot_s", "tpot"), ("throughput_tokens_per_s", "tps"))):
            m, m1 = float(np.median(tpn[c][key])), float(np.median(one[c][key]))
            pred = predn[c][i]
            drafted = [r.drafted for r in tpn[c]["records"]]
            err = error_pct(pred, m)
            rows.append(
                {
                    "controller": c,
                    "metric": metric,
                    "tp1_measured": m1,
                    "tp1_predicted": pred1[c][i],
                    "tp1_error_pct": error_pct(pred1[c][i], m1),
                    "tp_measured": m,
                    "tp_predicted": pred,
                    "error_pct": err,
                    "abs_error_pct": abs(err),
                    "real_spread_pct": range_pct_of_median(tpn[c][key]),
                    "tp_mean_k_measured": float(np.mean(drafted)) if drafted else float("nan"),
                    "tp_mean_k_predicted": predn[c][2],
                }
            )
    return rows
