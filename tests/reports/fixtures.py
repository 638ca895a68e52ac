"""Synthetic run folders that follow docs/results-format.md exactly (for the report's tests).

Numbers come from simple closed forms (a speedup per controller, i.i.d. acceptance with a fixed
rate) so tests can assert the report's derived values exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from control.types import RoundRecord, records_to_columns
from sim.metrics import SUMMARY_KEYS

# controller -> (speedup over k=0, acceptance rate a); "ar" is the k = 0 baseline
CONTROLLERS = {
    "ar": (1.0, 0.0),
    "fixed": (1.8, 0.7),
    "hf-heuristic": (2.0, 0.7),
    "analytic": (2.3, 0.7),
    "dspark": (2.6, 0.7),
    "clairvoyant": (3.1, 0.7),
}
BASE_TPUT = 1000.0  # k = 0 throughput at load scale 1 and 8 GPUs (tokens/s)
BASE_TPOT_S = 0.040
BASE_E2E_P99_S = 12.0
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.05  # the simulate and capacity runs' [slo]
# capacity run: controller -> capacity load scale per seed (seeds 1, 2, 3)
CAPACITY = {
    "fixed:k=0": (0.8, 0.9, 1.0),
    "fixed:k=2": (1.3, 1.4, 1.6),
    "dspark": (1.5, 1.6, 1.55),
    "clairvoyant": (2.0, 2.1, 2.2),
}


def _write(folder: Path, summary: dict, config: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    (folder / "config.toml").write_text(config)
    return folder


def sim_row(
    controller: str, seed: int, load_scale: float, num_gpus: int = 8, busy_base: float = 0.5
) -> dict:
    sp, a = CONTROLLERS[controller]
    is_base = controller == "ar"
    tput = BASE_TPUT * load_scale * num_gpus / 8 * (sp if load_scale > 0.6 else 1 + (sp - 1) / 2)
    tput *= 1 + 0.01 * seed
    mal = 1.0 if is_base else (1 - a**6) / (1 - a)
    row = dict(
        controller=controller,
        seed=seed,
        load_scale=load_scale,
        offered_rps=2.0 * load_scale * num_gpus / 8,
        throughput_tokens_per_s=tput,
        goodput_tokens_per_s=0.9 * tput,
        slo_attainment=0.97,
        speedup=sp,
        mean_accepted_length=mal,
        acceptance_rate=np.nan if is_base else a,
        vpr=np.nan if is_base else 0.55,
        du=np.nan if is_base else 0.5,
        ttft_p50_s=0.2,
        ttft_p90_s=0.3,
        ttft_p99_s=0.5,
        tpot_p50_s=BASE_TPOT_S / sp,
        tpot_p90_s=1.5 * BASE_TPOT_S / sp,
        tpot_p99_s=2 * BASE_TPOT_S / sp,
        e2e_p50_s=4.0 / sp,
        e2e_p90_s=8.0 / sp,
        e2e_p99_s=BASE_E2E_P99_S / sp,
        gpu_busy_fraction=busy_base if is_base else min(0.95, busy_base * sp / 2),
        bandwidth_utilization=0.3 if is_base else 0.3 * sp / 2,
        lossy_accept_fraction=0.0,
        requests_finished=100,
        requests_unfinished=0,
        requests_rejected=0,
        output_tokens=20000,
        sim_time_s=60.0,
        num_gpus=num_gpus,
        mean_tpot_s=BASE_TPOT_S / sp,
    )
    return {k: row.get(k, np.nan) for k in SUMMARY_KEYS}  # a key added later: missing (NaN)


def write_simulate_run(
    folder: Path,
    *,
    trace: bool = True,
    scenario: str = "8xA100 70B+8B",
    hardware: str = "A100-SXM-80GB",
    target: str = "Llama-3.1-70B",
    target_params: float = 70e9,
) -> Path:
    rows = [sim_row(c, s, ls) for c in CONTROLLERS for ls in (0.5, 1.0, 1.5) for s in (0, 1)]
    pd.DataFrame(rows).to_csv(
        folder / "results.csv" if folder.exists() else _mk(folder) / "results.csv", index=False
    )
    _write(
        folder,
        {
            "kind": "simulate",
            "scenario": scenario,
            "seed": 0,
            "hardware": hardware,
            "target": target,
            "target_params": target_params,
            "drafter": "Llama-3.1-8B",
            "drafter_params": 8e9,
            "tensor_parallel": 8,
            "num_gpus": 8,
            "rows": rows,
        },
        f'[hardware]\npreset = "{hardware}"\n[target]\npreset = "{target}"\n'
        f"[slo]\nttft_s = {SLO_TTFT_S}\ntpot_s = {SLO_TPOT_S}\n",
    )
    req = []
    for c, (sp, _) in CONTROLLERS.items():
        for i in range(40):
            out = 8 + 8 * i  # 8 .. 320 tokens: some at or below 32
            tpot = BASE_TPOT_S / sp * (1 + 0.02 * i)
            e2e = 0.2 + tpot * (out - 1)
            req.append(
                dict(
                    controller=c,
                    request_id=i,
                    arrival_s=0.5 * i,
                    prompt_tokens=100,
                    output_tokens=out,
                    first_token_s=0.5 * i + 0.2,
                    finish_s=0.5 * i + e2e,
                    ttft_s=0.2,
                    tpot_s=tpot,
                    e2e_s=e2e,
                    finished=i != 39,
                    replica=i % 8,
                )
            )
    pd.DataFrame(req).to_csv(folder / "requests.csv", index=False)
    if trace:
        write_rounds(folder / "rounds.csv", controllers=("fixed", "dspark"))
        write_controller_trace(folder / "controller_trace.csv")
    return folder


def _mk(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# scripted rounds: (drafted, accepted) patterns whose per-position acceptance is known exactly
ROUND_PATTERN = ((4, 4), (4, 2), (4, 0), (2, 2), (4, 3))


def write_rounds(path: Path, controllers=("fixed", "dspark"), repeats: int = 4) -> None:
    recs = []
    for c in controllers:
        t = 0.0
        for rep in range(repeats):
            for j, (d, n) in enumerate(ROUND_PATTERN):
                t += 0.05
                recs.append(
                    RoundRecord(
                        request_id=rep,
                        round=j,
                        now_s=t,
                        k=d,
                        drafted=d,
                        accepted=n,
                        emitted=n + 1,
                        draft_s=0.01,
                        verify_s=0.04,
                        context_tokens=100 + j,
                        confidences=(0.9,) * d,
                        controller=c,
                        block_end=j == 4,
                    )
                )
    pd.DataFrame(records_to_columns(recs)).to_csv(path, index=False)


def write_controller_trace(path: Path) -> None:
    rows = []
    for c in ("dspark", "hf-heuristic"):
        for rid in (0, 1):
            n = 30 if rid == 0 else 10
            for i in range(n):
                dsp = c == "dspark"
                rows.append(
                    dict(
                        controller=c,
                        request_id=rid,
                        now_s=0.05 * i,
                        k=int(4 + (i // 5) % 3) if dsp else 3 + i % 4,
                        alpha=0.8 + 0.02 * (i // 10) if dsp else None,
                        beta=0.85 - 0.01 * (i // 10) if dsp else None,
                        a_hat=0.6 + 0.01 * i,
                        block_end=dsp and i % 10 == 9,
                    )
                )
    pd.DataFrame(rows).to_csv(path, index=False)


def write_scaling_run(folder: Path) -> Path:
    _mk(folder)
    rows = [
        sim_row(c, 0, 1.0, num_gpus=g) for c in ("ar", "dspark") for g in (1, 2, 8, 64, 256, 1024)
    ]
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    return _write(
        folder,
        {
            "kind": "simulate",
            "scenario": "scaling H100",
            "seed": 0,
            "hardware": "H100-SXM",
            "num_gpus": [1, 2, 8, 64, 256, 1024],
            "rows": rows,
        },
    )


def write_tune_run(folder: Path, multi: bool = False, n: int = 12) -> Path:
    _mk(folder)
    rng = np.random.default_rng(3)
    trials = pd.DataFrame(
        {
            "number": np.arange(n),
            "datetime_start": pd.Timestamp("2025-01-01"),
            "params_alpha": rng.uniform(0.3, 1.5, n),
            "params_beta": rng.uniform(0.7, 0.99, n),
            "state": ["COMPLETE"] * (n - 2) + ["PRUNED", "COMPLETE"],
        }
    )
    if multi:
        trials["values_0"] = 1000 + 100 * np.arange(n)
        trials["values_1"] = 0.05 + 0.01 * np.arange(n) + rng.uniform(0, 0.02, n)
        trials.loc[trials["state"] == "PRUNED", ["values_0", "values_1"]] = np.nan
        trials.iloc[[0, 4, 8, 11]].to_csv(folder / "pareto.csv", index=False)
        summary = {
            "kind": "tune",
            "study_name": "mo",
            "storage": "journal",
            "objective": "throughput-vs-p99",
            "directions": ["maximize", "minimize"],
            "metric_names": ["throughput_tokens_per_s", "tpot_p99_s"],
            "n_trials": n,
            "best_value": None,
            "best_params": {},
        }
    else:
        trials["value"] = 1000 + 50 * np.sin(np.arange(n)) + 10 * np.arange(n)
        trials.loc[trials["state"] == "PRUNED", "value"] = np.nan
        best = int(trials["value"].idxmax())
        summary = {
            "kind": "tune",
            "study_name": "so",
            "storage": "journal",
            "objective": "throughput_tokens_per_s",
            "directions": ["maximize"],
            "n_trials": n,
            "best_value": float(trials["value"].max()),
            "best_params": {
                "alpha": float(trials.loc[best, "params_alpha"]),
                "beta": float(trials.loc[best, "params_beta"]),
            },
        }
        pd.DataFrame(
            {"param": ["alpha", "beta", "block_tokens"], "importance": [0.6, 0.3, 0.1]}
        ).to_csv(folder / "importances.csv", index=False)
        ev = [
            dict(
                controller=c,
                workload=w,
                seed=0,
                **{k: v for k, v in sim_row(c, 0, 1.0).items() if k not in ("controller", "seed")},
            )
            for c in ("dspark", "fixed", "clairvoyant")
            for w in ("azure-code", "azure-conv")
        ]
        pd.DataFrame(ev).to_csv(folder / "evaluation.csv", index=False)
    trials.to_csv(folder / "trials.csv", index=False)
    return _write(folder, summary)


def write_real_run(folder: Path) -> Path:
    _mk(folder)
    rows = [
        dict(
            controller="ar",
            tokens_per_s=50.0,
            tokens_per_s_p10=48.0,
            tokens_per_s_p90=52.0,
            mean_accepted_length=1.0,
            acceptance_rate=None,
            speedup_vs_ar=1.0,
            mode="strict",
        ),
        dict(
            controller="dspark",
            tokens_per_s=110.0,
            tokens_per_s_p10=104.0,
            tokens_per_s_p90=115.0,
            mean_accepted_length=3.1,
            acceptance_rate=0.72,
            speedup_vs_ar=2.2,
            mode="strict",
            nll_change_pct=0.0,
            token_agreement=1.0,
        ),
        dict(
            controller="dspark-threshold",
            tokens_per_s=125.0,
            tokens_per_s_p10=119.0,
            tokens_per_s_p90=131.0,
            mean_accepted_length=3.6,
            acceptance_rate=0.78,
            speedup_vs_ar=2.5,
            mode="threshold",
            beta=0.85,
            nll_change_pct=0.21,
            token_agreement=0.97,
        ),
    ]
    write_rounds(folder / "rounds.csv", controllers=("dspark",), repeats=2)
    return _write(folder, {"kind": "real", "rows": rows, "target_params": 12_000_000})


def write_validate_run(folder: Path) -> Path:
    _mk(folder)
    rows = []
    metrics = {
        "throughput_tokens_per_s": 100.0,
        "mean_accepted_length": 3.0,
        "acceptance_rate": 0.7,
        "tpot_p50_s": 0.02,
        "tpot_p99_s": 0.05,
    }
    for i, c in enumerate(("fixed", "hf-heuristic", "dspark")):
        for j, w in enumerate(("code", "prose")):
            for m, v in metrics.items():
                real = v * (1 + 0.1 * i) * (1 - 0.05 * j)
                err = (-3 + 2 * i + j) * 1.0
                rows.append(
                    dict(
                        controller=c,
                        workload=w,
                        metric=m,
                        sim=real * (1 + err / 100),
                        real=real,
                        real_spread=2.0 + i,
                        error_pct=err,
                    )
                )
    pd.DataFrame(rows).to_csv(folder / "errors.csv", index=False)
    return _write(
        folder,
        {
            "kind": "validate",
            "max_abs_error_pct": 3.0,
            "rank_agreement": {"code": True, "prose": True},
        },
    )


def write_capacity_run(folder: Path, scenario: str = "capacity 70B") -> Path:
    """A ``dspark capacity`` folder: per seed, attainment falls linearly from 1 at load 0 to
    0.9 at the capacity (probes at 0.5×, 1× and 1.05× the capacity)."""
    _mk(folder)
    seeds, per_seed, probes, rows = (1, 2, 3), [], [], []
    for c, caps in CAPACITY.items():
        for s, cap in zip(seeds, caps):
            per_seed.append(
                dict(
                    controller=c,
                    seed=s,
                    capacity_load_scale=cap,
                    missed_load_scale=1.05 * cap,
                    capacity_rps=2.0 * cap,
                    probes=3,
                )
            )
            for x in (0.5 * cap, cap, 1.05 * cap):
                probes.append(
                    dict(
                        controller=c,
                        seed=s,
                        load_scale=x,
                        offered_rps=2.0 * x,
                        slo_attainment=1 - 0.1 * x / cap,
                        goodput_tokens_per_s=1000.0 * x,
                        throughput_tokens_per_s=1000.0 * x,
                        ttft_p99_s=0.5 * x / cap,
                        tpot_p99_s=0.02 * x / cap,
                        mean_tpot_s=0.01,
                        mean_accepted_length=2.0,
                    )
                )
        v = np.array(caps)
        rows.append(
            dict(
                controller=c,
                seeds=3,
                capacity_load_scale=float(np.median(v)),
                capacity_min=float(v.min()),
                capacity_max=float(v.max()),
                capacity_spread=float((v.max() - v.min()) / np.median(v)),
                capacity_rps=2.0 * float(np.median(v)),
                crossed=True,
            )
        )
    pd.DataFrame(per_seed).to_csv(folder / "capacity.csv", index=False)
    pd.DataFrame(probes).to_csv(folder / "probes.csv", index=False)
    return _write(
        folder,
        {
            "kind": "capacity",
            "scenario": scenario,
            "seeds": list(seeds),
            "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S},
            "search": {"attainment": 0.9, "start": 1.0, "lo": 0.05, "hi": 20.0, "rel_tol": 0.02},
            "rows": rows,
        },
        f"[slo]\nttft_s = {SLO_TTFT_S}\ntpot_s = {SLO_TPOT_S}\n",
    )


def write_all(root: Path) -> list[Path]:
    """The fixed set of runs a full report is built from."""
    return [
        write_simulate_run(root / "sim"),
        write_capacity_run(root / "capacity"),
        write_scaling_run(root / "scaling"),
        write_tune_run(root / "tune"),
        write_tune_run(root / "tune-mo", multi=True),
        write_real_run(root / "real"),
        write_validate_run(root / "validate"),
    ]
