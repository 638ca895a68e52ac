"""Studies on the tiny scenario: bookkeeping, objective re-check, export, held-out evaluation."""

from __future__ import annotations

import dataclasses
import json

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from control import make_config
from control.configio import read_toml
from sim import load_scenario, simulate
from tuning.export import load_best_config
from tuning.objective import Objective
from tuning.run import tune
from tuning.space import params_to_config, start_points
from tuning.study import run_study


def _dspark_on(workload, cfg, seed: int) -> dict:
    """The summary of dspark with ``cfg`` on a tuning ``workload`` (its scenario and
    overrides), simulated directly rather than through the tuner."""
    scn = load_scenario(workload.scenario).with_overrides(workload.overrides)
    return simulate(scn, "dspark", controller_config=cfg, seed=seed, baseline=False).summary


def test_five_trial_memory_study(tiny_cfg):
    study = run_study(tiny_cfg, "memory", n_trials=5)
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(study.trials) == 5 and len(done) == 5
    assert sorted(t.user_attrs["slot"] for t in study.trials) == [0, 1, 2, 3, 4]
    # the untuned defaults ran first (a goodput study has no seed-policy start point)
    (dflt,) = start_points("dspark")
    assert study.trials[0].params == dflt
    assert params_to_config("dspark", study.trials[0].params) == make_config("dspark")
    # bookkeeping: the best is no worse than the enqueued starting points
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    feasible = [t for t in complete if all(c <= 0 for c in t.user_attrs.get("constraint", (0,)))]
    assert study.best_value == max(t.value for t in feasible)
    assert study.best_value >= study.trials[0].value
    # the stored value is exactly what an independent simulation of the best params gives
    best = params_to_config("dspark", study.best_params)
    runs = [
        simulate(
            load_scenario(w.scenario).with_overrides(w.overrides),
            "dspark",
            controller_config=best,
            seed=s,
            baseline=False,
        ).summary
        for w in tiny_cfg.tune.workloads
        for s in tiny_cfg.tune.sim_seeds
    ]
    mean = sum(r["throughput_tokens_per_s"] for r in runs) / len(runs)
    assert study.best_value == pytest.approx(mean, rel=1e-12)
    # per-workload intermediate reports (running means) for the pruner
    iv = study.best_trial.intermediate_values
    assert list(iv) == [0, 1]
    assert iv[0] == pytest.approx(runs[0]["throughput_tokens_per_s"], rel=1e-12)
    assert iv[1] == pytest.approx(mean, rel=1e-12)
    # the seed point runs threshold mode: its lossy fraction is measured and constrained
    t0 = study.trials[0]
    assert t0.user_attrs["constraint"][0] == pytest.approx(
        t0.user_attrs["lossy_accept_fraction"] - tiny_cfg.tune.max_lossy_fraction
    )


def test_best_is_default_only_for_the_untuned_defaults(tiny_cfg):
    from types import SimpleNamespace

    from tuning.export import _is_default

    (dflt,) = start_points("dspark")
    assert _is_default("dspark", SimpleNamespace(params=dict(dflt)), tiny_cfg)
    moved = {**dflt, "memory_rounds": dflt["memory_rounds"] * 2}
    assert not _is_default("dspark", SimpleNamespace(params=moved), tiny_cfg)


def test_fixed_trial_scores_like_the_simulator(tiny_cfg):
    obj = Objective(tiny_cfg)
    p = start_points("dspark")[0]
    v = obj(optuna.trial.FixedTrial(p))
    assert v == pytest.approx(obj.values(make_config("dspark"))[0], rel=1e-12)


def test_tune_writes_the_run_folder(tiny_cfg, tmp_path):
    out = tmp_path / "run"
    returned = tune(tiny_cfg, out, storage=None, workers=1)
    files = {p.name for p in out.iterdir()}
    assert {
        "study.journal",
        "trials.csv",
        "best_config.toml",
        "evaluation.csv",
        "importances.csv",
        "summary.json",
        "config.toml",
    } <= files
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "tune" and summary["n_trials"] == 5
    assert returned["best_params"] == summary["best_params"]
    # trial 0 runs the untuned defaults (the only start point of a goodput study): the summary
    # says the best is the default exactly when that trial is the best
    assert summary["best_is_default"] == (summary["best_trial"] == 0)
    assert summary["directions"] == ["maximize"] and summary["objective"] == "throughput"
    for k in ("study_name", "storage", "best_value", "best_params"):
        assert k in summary
    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 5
    feasible = [c for c in trials.columns if "constraint" in c]
    ok = (
        trials[feasible]
        .apply(lambda col: col.astype(str).str.strip("[]()").astype(float) <= 0)
        .all(axis=1)
        if feasible
        else True
    )
    assert trials.loc[ok, "value"].max() == pytest.approx(summary["best_value"])
    # best_config.toml loads as the config of the best trial, and a scenario uses it as is
    name, cfg = load_best_config(out / "best_config.toml")
    assert name == "dspark" and cfg == params_to_config("dspark", summary["best_params"])
    table = read_toml(out / "best_config.toml")["controller"]["dspark"]
    assert make_config("dspark", table) == cfg
    w = tiny_cfg.tune.workloads[0]
    scn = load_scenario(w.scenario).with_overrides({**w.overrides, "controller.dspark": table})
    via_scenario = simulate(scn, "dspark", seed=0, baseline=False).summary
    direct = _dspark_on(w, cfg, seed=0)
    assert via_scenario["throughput_tokens_per_s"] == direct["throughput_tokens_per_s"]
    # evaluation matrix: every entry x held-out workload x held-out seed, nothing else
    ev = pd.read_csv(out / "evaluation.csv")
    assert list(ev.columns[:3]) == ["controller", "workload", "seed"]
    labels = [
        "dspark-tuned",
        "dspark-seed",
        "dspark-default",
        "fixed",
        "analytic",
        "fixed-best",
        "clairvoyant",
        "rate-oracle",
        "fixed-k0",
    ]
    assert list(ev["controller"]) == labels
    assert set(ev["workload"]) == {"tiny-light-iid"} and set(ev["seed"]) == {100}
    assert ev.set_index("controller").loc["fixed-k0", "speedup"] == 1.0
    k = summary["fixed_best_k"]
    sweep = {r["k"]: r["throughput_tokens_per_s"] for r in summary["fixed_k_sweep"]}
    assert sweep[k] == max(sweep.values())
    # the tuned row is an independent simulation of the exported config on the held-out workload
    h = tiny_cfg.evaluate.workloads[0]
    again = _dspark_on(h, cfg, seed=100)
    row = ev.set_index("controller").loc["dspark-tuned"]
    assert row["throughput_tokens_per_s"] == pytest.approx(again["throughput_tokens_per_s"])
    imp = pd.read_csv(out / "importances.csv")
    assert list(imp.columns) == ["param", "importance"]


def test_multi_objective_quality_study_pins_threshold(tiny_cfg, tmp_path):
    cfg = dataclasses.replace(
        tiny_cfg,
        tune=dataclasses.replace(tiny_cfg.tune, objective="throughput-quality", n_trials=4),
    )
    s = tune(cfg, tmp_path / "q", storage="memory", evaluate_heldout=False)
    assert s["directions"] == ["maximize", "minimize"] and s["sampler"] == "nsga2"
    pareto = pd.read_csv(tmp_path / "q" / "pareto.csv")
    assert {"throughput_tokens_per_s", "lossy_accept_fraction"} <= set(pareto.columns)
    assert len(pareto) >= 1
    _, best = load_best_config(tmp_path / "q" / "best_config.toml")
    assert best.mode == "threshold" and "mode" not in s["best_params"]


def test_baseline_tuning_respects_the_quality_constraint(tiny_cfg):
    from tuning.evaluate import tune_baseline

    config, value = tune_baseline(tiny_cfg, "fixed", 6)
    obj = Objective(tiny_cfg, controller="fixed")
    # the returned value is the config's own score, no worse than the default k = 4
    assert value == pytest.approx(obj.values(config)[0], rel=1e-12)
    assert value >= obj.values(make_config("fixed"))[0]
    lossy = obj.scores(config)["lossy_accept_fraction"]
    assert lossy <= tiny_cfg.tune.max_lossy_fraction


@pytest.mark.parametrize(
    "objective, pruner",
    [("p99_tpot", "wilcoxon"), ("goodput", "median"), ("throughput-p99", "median")],
)
def test_objectives_directions_and_best(tiny_cfg, tmp_path, objective, pruner):
    from tuning.export import choose_best

    cfg = dataclasses.replace(
        tiny_cfg,
        tune=dataclasses.replace(tiny_cfg.tune, objective=objective, pruner=pruner, n_trials=4),
    )
    study = run_study(cfg, "memory")
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    best = choose_best(study, cfg, slo_tpot_s=1.0)
    if objective == "p99_tpot":
        assert study.direction == optuna.study.StudyDirection.MINIMIZE
        feasible = [t for t in complete if t.user_attrs["constraint"][0] <= 0] or complete
        assert best.value == min(t.value for t in feasible)
        assert best.value == pytest.approx(best.user_attrs["tpot_p99_s"])
    elif objective == "goodput":
        assert best.value == pytest.approx(best.user_attrs["goodput_tokens_per_s"])
    else:
        assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
        front = {t.number for t in study.best_trials}
        assert best.number in front and best.values[1] <= 1.0
        assert best.values[0] == max(t.values[0] for t in study.best_trials if t.values[1] <= 1.0)
