"""``dspark validate``: calibrate the simulator on the engine, predict held-out runs, compare.

1. profile: ``latency.csv`` from separate profiling passes over the engine (``real.profile``),
   run in slices between the real runs (so that the shared machine's changing background load
   reaches the profile and the measurement alike); the simulator uses the mean of the repeats
   (``latency_statistic``), ``latency.csv`` keeps the median as its ``seconds``;
2. position traces: the greedy position trace of every prompt of every workload (recorded once
   per workload, controller-independent);
3. calibration trace: controller X on workload A, run on the engine; a statistical acceptance
   model is fitted on its rounds, and the mirror is checked on it;
4. measurement: the engine runs every held-out pair ``repeats`` times, interleaved;
5. prediction (from calibration data only): the simulator mirrors the engine
   (``dspark.validation.mirror``) for every held-out controller Y x workload B: acceptance
   replayed from B's position traces, and (separately reported) the statistical model fitted
   on A;
6. ``errors.csv`` (+ ``errors_fitted.csv``), rank agreement, a latency breakdown that says which
   part of the model is off, ``summary.json`` and the resolved ``config.toml``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from control.configio import to_dict, to_toml
from control.metrics import json_safe
from control.registry import make_config, make_controller
from control.types import PositionRecord, records_to_columns
from dspark.validation import metrics as M
from dspark.validation.config import ValidateConfig, controller_config
from dspark.validation.mirror import fit_acceptance, predict, write_scenario

ERROR_COLUMNS = ("controller", "workload", "metric", "sim", "real", "real_spread", "error_pct")


def build_engine(cfg: ValidateConfig, engine_cfg=None):
    """The engine of ``cfg.models`` with ``engine_cfg`` (default ``cfg.engine``)."""
    ecfg = cfg.engine if engine_cfg is None else engine_cfg
    if cfg.models.source == "tiny":
        from real.tiny import tiny_engine

        return tiny_engine(cfg.models.tiny, ecfg)
    from real.runtime import build_engine as build

    return build(ecfg, cfg.models.checkpoints or None)


def _log_fn(quiet: bool) -> Callable[[str], None]:
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if not quiet:
            print(f"[validate {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)
    return log


def _write_rounds(path: Path, records) -> None:
    import pandas as pd

    pd.DataFrame(records_to_columns(records)).to_csv(path, index=False)


def _write_positions(path: Path, positions: list[list[PositionRecord]]) -> None:
    import pandas as pd

    flat = [r for recs in positions for r in recs]
    pd.DataFrame(records_to_columns(flat, PositionRecord)).to_csv(path, index=False)


def _requests_rows(reqs, **extra) -> list[dict]:
    return [{**extra, "request_id": q.request_id, "prompt_tokens": q.prompt_tokens,
             "output_tokens": q.output_tokens, "seconds": q.seconds, "decode_s": q.decode_s,
             "rounds": q.rounds} for q in reqs]


def _split_rounds(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.request_id, []).append(r)
    return out


def _replay_exact(sim_rounds, records) -> float:
    """Fraction of requests whose (k, drafted, accepted) sequence the simulator reproduced."""
    real = _split_rounds(records)
    sim = {rid: list(zip(g["k"], g["drafted"], g["accepted"]))
           for rid, g in sim_rounds.groupby("request_id", sort=True)}
    ok = 0
    for rid, recs in real.items():
        ok += sim.get(rid) == [(r.k, r.drafted, r.accepted) for r in recs]
    return ok / len(real) if real else float("nan")


def _breakdown(sim_res, records, reqs, propose_intercept_s: float = 0.0) -> dict:
    """Where the time goes, real vs simulated, in seconds summed over the requests.

    The simulator charges the propose call's fixed cost (``propose_intercept_s``) in its round
    overhead, the engine times it inside ``draft_s``: it is moved to the draft side here so the
    parts compare like with like."""
    rd = sim_res.rounds
    moved = propose_intercept_s * int((rd["draft_s"] > 0).sum())  # rounds that ran the drafter
    req = sim_res.requests.sort_values("finish_s")
    finish = req["finish_s"].to_numpy(dtype=float)
    start = np.concatenate([[0.0], finish[:-1]])
    sim_pre = float((req["first_token_s"].to_numpy(dtype=float) - start).sum())
    sim_draft = float(rd["draft_s"].sum()) + moved
    sim_verify = float(rd["verify_s"].sum())
    sim_total = float(finish[-1]) if len(finish) else 0.0
    real_draft = float(sum(r.draft_s for r in records))
    real_verify = float(sum(r.verify_s for r in records))
    real_total = float(sum(q.seconds for q in reqs))
    real_decode = float(sum(q.decode_s for q in reqs))
    out = {
        "real_total_s": real_total, "sim_total_s": sim_total,
        "real_draft_s": real_draft, "sim_draft_s": sim_draft,
        "real_verify_s": real_verify, "sim_verify_s": sim_verify,
        "real_round_overhead_s": real_decode - real_draft - real_verify,
        "sim_round_overhead_s": sim_total - sim_pre - sim_draft - sim_verify,  # minus moved
        "real_prefill_s": real_total - real_decode, "sim_prefill_s": sim_pre,
        "real_rounds": len(records), "sim_rounds": int(len(rd)),
    }
    for part in ("draft", "verify", "round_overhead", "prefill"):
        out[f"{part}_error_pct_of_total"] = (out[f"sim_{part}_s"] - out[f"real_{part}_s"]) \
            / real_total * 100.0 if real_total else float("nan")
    return out


def run_validate(cfg: ValidateConfig, out: Path, quiet: bool = False) -> dict:
    """Every part of ``cfg.parts``; ``summary.json`` holds the batch-1 summary (when that part
    runs) and the batched part's under ``"batched"``."""
    import torch

    t_start = time.perf_counter()
    log = _log_fn(quiet)
    torch.set_num_threads(cfg.threads)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(dataclasses.replace(
        cfg, workloads={w: to_dict(v) for w, v in cfg.workloads.items()})))
    if "batch1" in cfg.parts:
        summary = _run_batch1(cfg, out, log)
    else:
        summary = {"kind": "validate", "name": cfg.name}
    if "batched" in cfg.parts:
        from dspark.validation.batched import run_batched

        summary["batched"] = run_batched(cfg, out, log)
        summary["runtime_s"] = time.perf_counter() - t_start
        (out / "summary.json").write_text(json.dumps(json_safe(summary), indent=1))
    return summary


def _run_batch1(cfg: ValidateConfig, out: Path, log: Callable[[str], None]) -> dict:
    import pandas as pd

    from real.profile import GridProfiler, finish_table, round_overhead_s, with_statistic
    from real.tracing import make_prompts, record_positions_full, run_requests

    t_start = time.perf_counter()
    engine = build_engine(cfg)
    kmax = cfg.engine.k_max
    vocab = engine.target.embed_tokens.num_embeddings
    log(f"engine: {cfg.models.source} models, target {cfg.engine.target_dtype}, drafter "
        f"{cfg.engine.drafter} {cfg.engine.drafter_dtype}, {cfg.engine.device}, k_max {kmax}")

    # 1. latency profile: separate profiling passes (interleaved with the real repeats)
    prof_dir = out / "profile"
    prof_dir.mkdir(exist_ok=True)
    gp = GridProfiler(engine, cfg.profile)
    gp.passes(cfg.profile.warmup, record=False)
    n_pairs = len(cfg.heldout.workloads) * len(cfg.heldout.controllers)
    n_slices = 1 + cfg.repeats * n_pairs if cfg.interleave_profile else 1
    # the timed cells, spread evenly: one slice now, one after every real run of a pair
    per_slice = [len(x) for x in np.array_split(
        np.arange(cfg.profile.repeats * len(gp.cells)), n_slices)]
    slices = iter(per_slice)
    gp.run_cells(next(slices))
    log(f"profile: {len(gp.cells)} cells x {cfg.profile.repeats} repeats in {n_slices} slices")

    # 2. prompts and greedy position traces, once per workload
    names = [cfg.calibration.workload] + list(cfg.heldout.workloads)
    prompts, positions, greedy = {}, {}, {}
    for w in names:
        ps = cfg.prompt_set(w)
        prompts[w] = make_prompts(ps, engine.tokenizer, vocab)
        positions[w], greedy[w] = [], []
        for i, p in enumerate(prompts[w]):
            recs, cont = record_positions_full(engine, p, ps.max_new_tokens, request_id=i)
            positions[w].append(recs)
            greedy[w].append(cont)
        d = out / "traces" / w
        d.mkdir(parents=True, exist_ok=True)
        _write_positions(d / "positions.csv", positions[w])
        runs = [r.run_length for recs in positions[w] for r in recs]
        log(f"positions {w}: {len(prompts[w])} prompts, mean run length {np.mean(runs):.2f}")

    def scenario(w: str, folder: Path, fitted: dict | None, ctrls: dict) -> Path:
        ps = cfg.prompt_set(w)
        return write_scenario(folder, f"{cfg.name}-{w}", sim_lat_csv, overhead_s, kmax,
                              [len(p) for p in prompts[w]], [ps.max_new_tokens] * len(prompts[w]),
                              None if fitted else positions[w], fitted, ctrls)

    # 3. calibration trace: controller X on workload A
    cal = cfg.calibration
    A = cal.workload
    x_cfg = make_config(cal.controller, cal.controller_config, source="calibration")
    x_label = f"{cal.controller}(calibration)"
    cal_recs, cal_reqs = run_requests(engine, prompts[A], cfg.prompt_set(A).max_new_tokens,
                                      lambda: make_controller(cal.controller, x_cfg), x_label)
    d = out / "traces" / A
    _write_rounds(d / "rounds.csv", cal_recs)
    pd.DataFrame(_requests_rows(cal_reqs, controller=x_label)).to_csv(d / "requests.csv",
                                                                      index=False)
    fitted = fit_acceptance(cal_recs)
    cal_real = M.real_metrics(cal_recs, cal_reqs)
    log(f"calibration {x_label} on {A}: â {cal_real['acceptance_rate']:.3f}, throughput "
        f"{cal_real['throughput_tokens_per_s']:.1f} tokens/s")

    # 4. real runs of the held-out set, repeated and interleaved
    real: dict = {(c, w): [] for w in cfg.heldout.workloads for c in cfg.heldout.controllers}
    real_recs: dict = {}
    greedy_eq: dict = {}
    all_rounds, all_reqs = [], []
    ctrl_cfgs, ctrl_src = {}, {}
    for c in cfg.heldout.controllers:
        ctrl_cfgs[c], ctrl_src[c] = controller_config(cfg, c)
    for rep in range(cfg.repeats):
        for w in cfg.heldout.workloads:
            n_new = cfg.prompt_set(w).max_new_tokens
            for c in cfg.heldout.controllers:
                recs, reqs = run_requests(engine, prompts[w], n_new,
                                          lambda c=c: make_controller(c, ctrl_cfgs[c]), c)
                real[c, w].append(M.real_metrics(recs, reqs))
                real_recs.setdefault((c, w), []).append((recs, reqs))
                all_rounds.append(pd.DataFrame(records_to_columns(recs)).assign(
                    workload=w, repeat=rep))
                all_reqs.append(pd.DataFrame(_requests_rows(reqs, controller=c, workload=w,
                                                            repeat=rep)))
                if rep == 0:
                    same = sum(q.tokens == g for q, g in zip(reqs, greedy[w]))
                    greedy_eq[c, w] = same / len(reqs)
                if cfg.interleave_profile:
                    gp.run_cells(next(slices))
        log(f"real runs: repeat {rep + 1}/{cfg.repeats} done")
    pd.concat(all_rounds, ignore_index=True).to_csv(out / "rounds.csv", index=False)
    pd.concat(all_reqs, ignore_index=True).to_csv(out / "requests.csv", index=False)

    # 5. the latency table (+ round overhead measured now), then the predictions
    rows, fit = gp.rows()
    lat, details = finish_table(engine, cfg.profile, rows, fit)
    lat_csv = prof_dir / "latency.csv"
    lat.to_csv(lat_csv, index=False)
    sim_lat = with_statistic(lat, cfg.latency_statistic)
    sim_lat_csv = prof_dir / f"latency_sim_{cfg.latency_statistic}.csv"
    sim_lat.to_csv(sim_lat_csv, index=False)
    overhead_s = round_overhead_s(sim_lat)
    ro = details["round_overhead"]
    icpt = ro["intercept_mean_s"] if cfg.latency_statistic == "mean" else ro["intercept_s"]
    (prof_dir / "summary.json").write_text(json.dumps(json_safe(
        {"kind": "profile", "passes": gp.done, "slices_cells": per_slice, **details}), indent=1))
    log(f"profile: {len(lat)} rows from {gp.done} passes, round overhead "
        f"{overhead_s * 1e3:.3f} ms ({cfg.latency_statistic})")
    scn_a = scenario(A, out / "sim" / A / "replay", None, {cal.controller: to_dict(x_cfg)})
    cal_real = M.real_metrics(cal_recs, cal_reqs)
    cal_sim, cal_res = predict(scn_a, cal.controller, x_cfg)
    cal_check = {
        "controller": cal.controller, "controller_config": to_dict(x_cfg), "workload": A,
        "replay_exact_requests": _replay_exact(cal_res.rounds, cal_recs),
        "real": cal_real, "sim": cal_sim,
        "error_pct": {k: M.error_pct(cal_sim[k], cal_real[k]) for k in M.METRICS},
        "latency_breakdown": _breakdown(cal_res, cal_recs, cal_reqs, icpt),
    }

    ctrl_tables = {c: to_dict(v) for c, v in ctrl_cfgs.items()}
    preds, fitted_preds, sim_runs = {}, {}, {}
    for w in cfg.heldout.workloads:
        scn = scenario(w, out / "sim" / w / "replay", None, ctrl_tables)
        scn_f = (scenario(w, out / "sim" / w / "fitted", fitted, ctrl_tables)
                 if w in cfg.heldout.fitted_workloads else None)
        for c in cfg.heldout.controllers:
            preds[c, w], sim_runs[c, w] = predict(scn, c, ctrl_cfgs[c])
            if scn_f is not None:
                fitted_preds[c, w], _ = predict(scn_f, c, ctrl_cfgs[c], seeds=(0, 1, 2))
    log(f"predicted {len(preds)} controller x workload pairs (+{len(fitted_preds)} fitted)")

    # 6. errors
    def table(pred: dict) -> pd.DataFrame:
        rows = []
        for (c, w), sim in pred.items():
            runs = real[c, w]
            for m in M.METRICS:
                vals = [r[m] for r in runs]
                med = float(np.median(vals))
                rows.append({"controller": c, "workload": w, "metric": m, "sim": sim[m],
                             "real": med, "real_spread": M.spread_pct(vals),
                             "error_pct": M.error_pct(sim[m], med)})
        return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))

    err = table(preds)
    err.to_csv(out / "errors.csv", index=False)
    err_f = table(fitted_preds) if fitted_preds else None
    if err_f is not None:
        err_f.to_csv(out / "errors_fitted.csv", index=False)
    head = err[err["metric"].isin(M.HEADLINE)]
    max_err = float(head["error_pct"].abs().max())
    ranks = {}
    for w in cfg.heldout.workloads:
        tp = err[(err["workload"] == w) & (err["metric"] == "throughput_tokens_per_s")]
        ranks[w] = {"sim_order": tp.sort_values("sim", ascending=False)["controller"].tolist(),
                    "real_order": tp.sort_values("real", ascending=False)["controller"].tolist()}
        ranks[w]["agree"] = ranks[w]["sim_order"] == ranks[w]["real_order"]
    diag = {}
    for (c, w), res in sim_runs.items():
        parts = [_breakdown(res, recs, reqs, icpt) for recs, reqs in real_recs[c, w]]
        diag[f"{c}|{w}"] = {
            "replay_exact_requests": float(np.mean([_replay_exact(res.rounds, recs)
                                                    for recs, _ in real_recs[c, w]])),
            "real_tokens_equal_greedy_reference": greedy_eq[c, w],
            "latency_breakdown_mean_over_repeats": {k: float(np.mean([p[k] for p in parts]))
                                                    for k in parts[0]}}
    within = head.assign(ok=head["error_pct"].abs() <= 5.0).groupby("controller")["ok"]
    summary = {
        "kind": "validate", "name": cfg.name,
        "max_abs_error_pct": max_err,
        "max_abs_error_metrics": list(M.HEADLINE),
        "rank_agreement": {w: r["agree"] for w, r in ranks.items()},
        "rank_orders": ranks,
        "controllers_within_5pct_on_all_workloads": sorted(
            c for c, ok in within.all().items() if ok),
        "max_abs_error_pct_fitted": (float(err_f[err_f["metric"].isin(M.HEADLINE)]["error_pct"]
                                           .abs().max()) if err_f is not None else None),
        "repeats": cfg.repeats,
        "max_real_spread_pct": float(head["real_spread"].max()),
        # an error no larger than the real runs' own spread cannot be told from noise
        "headline_errors_within_real_spread": int(
            (head["error_pct"].abs() <= head["real_spread"]).sum()),
        "headline_errors": int(len(head)),
        "calibrated_on": {
            "latency": "a separate profiling pass over the engine's own verify/draft code paths "
                       "(profile/latency.csv, medians of interleaved repeats); round overhead "
                       "from fixed-k generations of random prompts in that pass",
            "acceptance_replay": "greedy position traces recorded once per workload (the "
                                 "held-out prompts' own, controller-independent: the target's "
                                 "greedy continuation and the drafter's proposals from each "
                                 "position do not depend on any controller)",
            "acceptance_fitted": f"i.i.d. rate and confidence model fitted on the rounds of "
                                 f"controller X = {cal.controller} on workload A = {A} only; "
                                 f"used for {list(cfg.heldout.fitted_workloads)} "
                                 f"(errors_fitted.csv), never on their traces",
            "controllers_heldout": {c: ctrl_src[c] for c in cfg.heldout.controllers},
            "controllers_seen_in_calibration": [cal.controller + " " + json.dumps(
                to_dict(x_cfg))],
        },
        "fitted_acceptance": fitted,
        "calibration_check": cal_check,
        "diagnostics": diag,
        "engine": dataclasses.asdict(cfg.engine),
        "models": cfg.models.source,
        "threads": cfg.threads,
        "runtime_s": time.perf_counter() - t_start,
    }
    (out / "summary.json").write_text(json.dumps(json_safe(summary), indent=1))
    log(f"done in {summary['runtime_s']:.0f} s")
    return summary


def format_table(err) -> str:
    """The error table as aligned text (one line per controller x workload x metric)."""
    lines = [f"{'controller':<14} {'workload':<10} {'metric':<24} {'sim':>11} {'real':>11} "
             f"{'spread%':>8} {'error%':>8}"]
    for r in err.itertuples(index=False):
        lines.append(f"{r.controller:<14} {r.workload:<10} {r.metric:<24} {r.sim:>11.5g} "
                     f"{r.real:>11.5g} {r.real_spread:>8.2f} {r.error_pct:>+8.2f}")
    return "\n".join(lines)
