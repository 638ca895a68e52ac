"""optuna-dashboard, through its own server code in-process, agrees with ``best_config.toml``:
a trial that breaks the quality constraint is marked infeasible and is never the best, and the
objective has its metric's name instead of "Objective 0"."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pandas as pd
import pytest

optuna_dashboard = pytest.importorskip("optuna_dashboard")

LOSSY_LIMIT = 0.005


def fake_simulate(scn, controller, config, seed, baseline) -> dict:
    """Threshold mode is faster and breaks the quality limit; strict mode is feasible and its
    throughput grows with alpha_max, so a strict trial wins the feasible ones."""
    threshold = getattr(config, "mode", "strict") == "threshold"
    tput = 1000.0 + 100.0 * float(getattr(config, "alpha_max", 1.0)) + (500.0 if threshold else 0)
    return {
        "throughput_tokens_per_s": tput,
        "goodput_tokens_per_s": tput,
        "tpot_p99_s": 0.05,
        "mean_accepted_length": 2.0,
        "acceptance_rate": 0.7,
        "lossy_accept_fraction": 0.02 if threshold else 0.0,
    }


def api(app, path: str) -> dict:
    """GET ``path`` from the dashboard's WSGI app, as its browser front end would."""
    status = {}

    def start(s, headers, exc_info=None):
        status["s"] = s

    env = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "x",
        "SERVER_PORT": "80",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
    }
    body = b"".join(app(env, start))
    assert status["s"].startswith("200"), (status, body[:300], env["wsgi.errors"].getvalue())
    return json.loads(body)


@pytest.fixture
def tuned(tiny_cfg, tmp_path) -> Path:
    """A seeded 8-trial study, all of them random start-up trials: each draws the mode with
    even odds, so (deterministically, for this seed and space) some are threshold trials. With
    3 start-up trials, all three drew strict once the space gained two dimensions
    and the model-guided trials after them never tried threshold."""
    from tuning.run import tune

    cfg = dataclasses.replace(
        tiny_cfg,
        tune=dataclasses.replace(
            tiny_cfg.tune,
            n_trials=8,
            n_startup_trials=8,
            max_lossy_fraction=LOSSY_LIMIT,
            mode="",
        ),
    )
    out = tmp_path / "tune"
    tune(cfg, out, storage=None, workers=1, evaluate_heldout=False, simulate=fake_simulate)
    return out


def test_dashboard_best_trial_is_best_config(tuned):
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    summary = json.loads((tuned / "summary.json").read_text())
    assert summary["n_infeasible"] >= 1, "the fixture needs an infeasible trial to test with"
    storage = JournalStorage(JournalFileBackend(str(tuned / "study.journal")))
    app = optuna_dashboard.wsgi(storage)
    studies = api(app, "/api/studies")["study_summaries"]
    (st,) = [s for s in studies if s["study_name"] == summary["study_name"]]
    detail = api(app, f"/api/studies/{st['study_id']}")
    # the objective is named, not "Objective 0"
    assert detail["objective_names"] == ["throughput_tokens_per_s"]
    # the dashboard's best trial is the exported one
    (best,) = detail["best_trials"]
    assert best["number"] == summary["best_trial"]
    toml = (tuned / "best_config.toml").read_text()
    assert f"(trial {summary['best_trial']}," in toml
    # infeasible trials carry the constraint where the dashboard reads it, and none is best
    by_number = {t["number"]: t for t in detail["trials"]}
    study = optuna.load_study(study_name=summary["study_name"], storage=storage)
    bad = [t for t in study.trials if t.user_attrs.get("infeasible")]
    assert bad
    for t in bad:
        assert by_number[t.number]["constraints"] and all(
            c > 0 for c in by_number[t.number]["constraints"]
        )
        assert t.user_attrs["throughput_tokens_per_s"] > best["values"][0]
    assert best["constraints"] and all(c <= 0 for c in best["constraints"])
    # Optuna's own best trial agrees too
    assert study.best_trial.number == summary["best_trial"]


def test_report_history_never_passes_through_an_infeasible_trial(tuned):
    import numpy as np

    from reports import plots
    from reports.analysis import feasible_mask
    from reports.loader import load_runs

    (run,) = load_runs([tuned])
    trials = run.tables["trials"]
    ok = feasible_mask(trials)
    assert (~ok).any()
    fig = plots.plot_tuning_history(trials, ["maximize"], ["throughput_tokens_per_s"])
    best = next(ln for ln in fig.axes[0].get_lines() if "best feasible" in ln.get_label())
    summary = json.loads((tuned / "summary.json").read_text())
    assert np.nanmax(best.get_ydata()) == pytest.approx(summary["best_value"])
    bad_values = set(pd.to_numeric(trials.loc[~ok, "value"]).round(6))
    assert not bad_values & set(np.round(best.get_ydata(), 6))
    marks = [ln for ln in fig.axes[0].get_lines() if "infeasible" in ln.get_label()]
    assert marks and len(marks[0].get_xdata()) == int((~ok).sum())
