"""One tuning run end to end: study -> best config -> held-out evaluation -> run folder."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control.errors import ConfigError
from tuning.config import TuningConfig
from tuning.evaluate import entries, evaluate, table, tuned_vs_default
from tuning.export import best_config, best_scenario, choose_best, write_run
from tuning.objective import load_workload
from tuning.storage import JOURNAL_NAME, is_journal, resolve_url
from tuning.study import run_study, sampler_name


def _check_out(out: Path, url: str, resume: bool) -> None:
    if resume:
        return
    j = out / JOURNAL_NAME
    if (
        is_journal(url)
        and Path(url[len("journal:") :]) == j.resolve()
        and j.exists()
        and j.stat().st_size > 0
    ):
        raise ConfigError(
            f"{out} already holds a study ({JOURNAL_NAME}); pass --resume to "
            "continue it, or choose another --out"
        )


def _check_heldout(cfg: TuningConfig) -> None:
    """Held-out workloads must differ from tuning ones as simulated, not only as written."""
    from control.configio import to_dict

    def body(spec: Any) -> dict:
        d = to_dict(load_workload(spec))
        for k in ("name", "controller", "base_dir", "sim"):
            d.pop(k, None)
        return d

    train = [(w.name, body(w)) for w in cfg.tune.workloads]
    for w in cfg.evaluate.workloads:
        b = body(w)
        for name, t in train:
            if b == t:
                raise ConfigError(
                    f"held-out workload '{w.name}' simulates the same scenario as "
                    f"tuning workload '{name}'; held-out workloads must differ"
                )


def _preflight(cfg: TuningConfig, evaluate_heldout: bool) -> None:
    """Every workload's requests checked before the first trial (nothing to measure, no request
    that fits in KV memory, ... is one line naming the workload and its scenario file)."""
    from control.errors import DSparkError
    from sim.api import preflight

    groups = [(cfg.tune.workloads, cfg.tune.sim_seeds)]
    if evaluate_heldout:
        groups.append((cfg.evaluate.workloads, cfg.evaluate.sim_seeds))
    for workloads, seeds in groups:
        for w in workloads:
            try:
                for seed in seeds:
                    preflight(load_workload(w), seed=seed)
            except DSparkError as e:
                msg = str(e)
                raise ConfigError(
                    msg
                    if msg.startswith(w.scenario)
                    else f"{w.scenario}: workload '{w.name}': {msg}"
                ) from None


def _knees(cfg: TuningConfig, heldout: bool, workers: int, log: Callable[[str], None]) -> None:
    """Under an SLO objective, every workload's knee before the first trial (forked workers
    inherit them; a workload whose search never crosses the target stops the run here)."""
    from tuning.config import SLO_OBJECTIVES
    from tuning.slo import prepare_knees

    if cfg.tune.objective not in SLO_OBJECTIVES:
        return
    pairs = [(w, s) for w in cfg.tune.workloads for s in cfg.tune.sim_seeds]
    if heldout:
        pairs += [(w, s) for w in cfg.evaluate.workloads for s in cfg.evaluate.sim_seeds]
    log(f"capacity at SLO of {cfg.tune.controller}'s defaults on {len(pairs)} workload-seed pairs")
    prepare_knees(cfg, pairs, workers=workers)


def tune(
    cfg: TuningConfig,
    out: str | Path,
    storage: str | None = None,
    workers: int = 1,
    resume: bool = False,
    progress: bool = False,
    evaluate_heldout: bool = True,
    simulate: Callable | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Run the study, export the best config, evaluate on held-out workloads; returns the
    summary (also written to ``out/summary.json``)."""
    out = Path(out)
    url = resolve_url(storage, out)
    _check_out(out, url, resume)
    if evaluate_heldout and not cfg.evaluate.workloads:
        raise ConfigError("no [[evaluate.workloads]]: add held-out workloads or skip evaluation")
    _check_heldout(cfg)
    _preflight(cfg, evaluate_heldout)
    _knees(cfg, evaluate_heldout, workers, log)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(
        f"study '{cfg.study_name()}': {cfg.tune.n_trials} trials, {workers} worker(s), "
        f"sampler {sampler_name(cfg)}, objective {cfg.tune.objective}"
    )
    study = run_study(
        cfg, url, workers=workers, resume=resume, simulate=simulate, progress=progress
    )
    tune_s = time.perf_counter() - t0
    slo = None
    if cfg.tune.objective == "throughput-p99":
        slo = min(load_workload(w).slo.tpot_s for w in cfg.tune.workloads)
    best = choose_best(study, cfg, slo)
    config = best_config(study, cfg, best)
    scenario = best_scenario(best)
    extra: dict[str, Any] = {
        "tune_seconds": round(tune_s, 3),
        "workers": workers,
        "sampler": sampler_name(cfg),
        "pinned": cfg.pinned(),
    }
    df = None
    if evaluate_heldout:
        t1 = time.perf_counter()
        ents, info = entries(cfg, config, simulate, log, workers, scenario)
        extra.update(info)
        df = evaluate(cfg, ents, workers=workers, simulate=simulate, progress=progress)
        extra["heldout_means"] = table(df).reset_index().to_dict("records")
        versus, cap = tuned_vs_default(cfg, ents, df, workers)
        if cap is not None:
            cap.to_csv(out / "heldout_capacity.csv", index=False)
        extra["tuned_vs_default"] = versus
        extra["evaluate_seconds"] = round(time.perf_counter() - t1, 3)
    return write_run(out, cfg, study, url, best, config, df, extra, scenario)
