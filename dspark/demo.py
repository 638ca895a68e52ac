"""The embedded default main job (``dspark demo``): every part of the lab once, then a report.

Steps (each writes a run folder under ``OUT``; ``reports/`` then reads only those files):

1. tune the ``dspark`` controller on the simulator (short Optuna study, held-out evaluation);
2. simulate the standard scenario (8×(TP8 Llama-3.1-70B) on H100 + Llama-3.1-8B drafter, Azure
   conversation arrivals) with every controller — no speculation, fixed k, every baseline, the
   seed's defaults, the tuned config, the clairvoyant and rate-oracle references — at several loads;
3. the seed's A100 claim scenario and a scaling sweep from 1 to 1024 GPUs;
4. controller traces on a small scenario (k, α, β, â over time);
5. the real engine on the shipped models (batch 1, every controller);
6. a validation of the simulator against the real engine;
7. the report (Markdown + self-contained HTML).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from control.configio import param
from control.errors import DSparkError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

#: The controllers the demo simulates on the standard scenario besides the tuned config and the
#: references: no speculation, fixed k, every baseline and the seed's dspark defaults.
SIM_CONTROLLERS = (
    "fixed:k=0",
    "fixed:k=1",
    "fixed:k=2",
    "fixed:k=4",
    "hf-heuristic",
    "confidence-stop",
    "ema-hysteresis",
    "analytic",
    "dspark",
    "vllm-dsd",
    "vllm-adaptive-k",
    "vllm-adaptive-verification",
    "sglang-adaptive",
)
#: The contenders whose capacity at SLO the demo searches (besides the tuned config).
CAPACITY_CONTROLLERS = ("fixed:k=1", "fixed:k=2", "dspark", "vllm-dsd", "sglang-adaptive")


@dataclass(frozen=True)
class DemoConfig:
    # a short study of configs/tune_standard.toml (slo-capacity: ~40 simulations a trial):
    # its 10 random start-up trials, then 30 of TPE.
    tune_trials: int = param(40, lo=2, hi=100_000, doc="Optuna trials of the demo study")
    # two workers use both cores of the reference machine.
    workers: int = param(2, lo=1, hi=64, doc="tuning worker processes")
    # below, at and above the scenario's nominal load.
    loads: tuple[float, ...] = param(
        (0.5, 1.0, 1.5), lo=0.01, hi=100.0, doc="load scales of the standard-scenario comparison"
    )
    # one-GPU replicas: 1 to 1024 GPUs.
    scaling_replicas: tuple[int, ...] = param(
        (1, 8, 64, 1024), lo=1, hi=4096, doc="replica counts of the scaling sweep"
    )
    # requests per replica in the scaling sweep: ~5 s of arrivals; the 1024-GPU point ~ 25 s CPU.
    scaling_requests_per_replica: int = param(
        20, lo=1, hi=100_000, doc="requests per replica, scaling sweep"
    )
    # 2000 of the trace's requests and a 5% bisection: the capacity step's ~30 searches of
    # ~6 probes take a few minutes on 2 cores (benchmarks/slo_value.py runs the full 4000).
    capacity_requests: int = param(
        2000, lo=10, hi=1_000_000, doc="requests of the capacity-at-SLO step"
    )
    # prompts and tokens of the real-engine step: about a minute on 2 cores.
    real_prompts: int = param(4, lo=1, hi=1000, doc="prompts of the real-engine benchmark")
    # 96 new tokens per prompt: several controller blocks' worth of rounds.
    real_new_tokens: int = param(96, lo=8, hi=4096, doc="new tokens per prompt, real engine")
    # 3 repeats: the report can show a real p10-p90 (one repeat has no spread); the real step
    # takes about three times as long as one repeat (~3 minutes on 2 cores).
    real_repeats: int = param(3, lo=1, hi=100, doc="repeats of the real-engine benchmark")
    # the demo's validation config: shipped models, a few prompts per workload.
    validate_config: str = param("configs/validate_demo.toml", doc="validate config of the demo")


def _step(i: int, n: int, what: str) -> float:
    print(f"[{i}/{n}] {what}", file=sys.stderr, flush=True)
    return time.perf_counter()


def _cli(argv: list[str]) -> None:
    from dspark.cli import main

    rc = main(argv)
    if rc != 0:
        raise DSparkError(f"demo step failed: dspark {' '.join(argv)} (exit {rc})")


def _scaling(cfg: DemoConfig, tuned: str, out: Path) -> None:
    """One simulate run folder whose rows span 1..1024 GPUs (reports' scaling plot).

    Data-parallel replicas of the tiny scenario (Llama-3.1-8B + Llama-3.2-1B on one H100 each)
    with Poisson arrivals at the same rate per replica, so every point offers each GPU the same
    load; the simulator models no cross-node network, which the report states.
    """
    import pandas as pd

    from dspark.cmd_simulate import parse_controller_spec
    from sim import Comparison, compare_runs, load_scenario
    from sim.compare import write_run_folder

    base = load_scenario(CONFIGS / "tiny.toml")
    controllers = [parse_controller_spec("fixed:k=0"), parse_controller_spec(tuned)]
    rows, reqs = [], []
    for r in cfg.scaling_replicas:
        scn = base.with_overrides(
            {
                "deployment.replicas": r,
                "deployment.routing": "least-outstanding",
                "workload.rate_rps": base.workload.rate_rps * r,
                "workload.num_requests": r * cfg.scaling_requests_per_replica,
            }
        )
        c = compare_runs(scn, controllers, seed=0)
        rows.append(c.results)
        reqs.append(c.requests.assign(num_gpus=r * base.deployment.tp))
    write_run_folder(
        out,
        base.with_overrides({"name": "tiny-scaling"}),
        0,
        Comparison(
            pd.concat(rows, ignore_index=True), pd.concat(reqs, ignore_index=True), names=c.names
        ),
    )


def _tune(cfg: DemoConfig, out: Path, n: int) -> str:
    """Step 1: a short study of dspark; returns the tuned controller's ``--controller`` spec."""
    _step(1, n, f"tune: {cfg.tune_trials} trials of the dspark controller on the simulator")
    _cli(
        [
            "tune",
            str(CONFIGS / "tune_standard.toml"),
            "--trials",
            str(cfg.tune_trials),
            "--workers",
            str(cfg.workers),
            "--out",
            str(out / "tune"),
            "--quiet",
        ]
    )
    return f"dspark@{out / 'tune' / 'best_config.toml'}"


def _simulate(cfg: DemoConfig, out: Path, tuned: str, n: int) -> None:
    """Steps 2-5: every controller on the standard scenario over loads and the main contenders'
    capacity at SLO; the A100 scenario and the scaling sweep; controller traces on the tiny
    scenario."""
    every = [*SIM_CONTROLLERS, tuned, "clairvoyant", "rate-oracle"]
    loads = ",".join(f"{x:g}" for x in cfg.loads)
    _step(2, n, f"simulate: standard scenario, every controller, loads {loads}")
    specs = [a for c in every for a in ("--controller", c)]
    _cli(
        [
            "simulate",
            str(CONFIGS / "standard.toml"),
            *specs,
            "--loads",
            loads,
            "--out",
            str(out / "simulate-standard"),
            "--quiet",
        ]
    )
    _step(3, n, "capacity at SLO: the standard scenario's [slo], the main contenders")
    _cli(
        [
            "capacity",
            str(CONFIGS / "standard.toml"),
            *[a for c in (*CAPACITY_CONTROLLERS, tuned) for a in ("--controller", c)],
            "--set",
            f"workload.num_requests={cfg.capacity_requests}",
            "--seeds",
            "1",
            "--rel-tol",
            "0.05",
            "--workers",
            str(cfg.workers),
            "--out",
            str(out / "capacity-standard"),
        ]
    )
    _step(4, n, "simulate: the seed's A100 scenario, and scaling from 1 to 1024 GPUs")
    _cli(
        [
            "simulate",
            str(CONFIGS / "a100_70b.toml"),
            "--controller",
            "fixed:k=0",
            "--controller",
            "dspark",
            "--controller",
            tuned,
            "--out",
            str(out / "simulate-a100"),
            "--quiet",
        ]
    )
    _scaling(cfg, tuned, out / "simulate-scaling")
    _step(5, n, "simulate: controller traces on the tiny scenario")
    # long outputs, so that a request spans many blocks of controller updates
    long_outputs = [
        "workload.output.mean_tokens=900",
        "workload.output.max_tokens=2000",
        "workload.num_requests=12",
    ]
    _cli(
        [
            "simulate",
            str(CONFIGS / "tiny.toml"),
            "--controller",
            "hf-heuristic",
            "--controller",
            "dspark",
            "--controller",
            tuned,
            "--trace",
            *[a for s in long_outputs for a in ("--set", s)],
            "--out",
            str(out / "simulate-traces"),
            "--quiet",
        ]
    )


def run_demo(out: str | Path = "runs/demo", cfg: DemoConfig | None = None) -> Path:
    cfg = cfg or DemoConfig()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    n = 8
    tuned = _tune(cfg, out, n)
    _simulate(cfg, out, tuned, n)
    _step(6, n, "real engine: shipped models, batch 1, every controller; threshold-mode quality")
    _cli(
        [
            "real",
            "bench",
            "--prompts",
            str(cfg.real_prompts),
            "--new-tokens",
            str(cfg.real_new_tokens),
            "--repeats",
            str(cfg.real_repeats),
            "--no-hf",
            "--quality-betas",
            "0.95 0.85 0.7",
            "--out",
            str(out / "real"),
        ]
    )
    _step(7, n, "validate: simulator prediction vs the real engine")
    _cli(["validate", str(REPO / cfg.validate_config), "--out", str(out / "validate"), "--quiet"])
    _step(8, n, f"report (steps 1-7 took {time.perf_counter() - t0:.0f} s)")
    report = out / "report"
    _cli(["report", str(out), "--out", str(report), "--title", "DSpark Lab demo"])
    return report / "index.html"
