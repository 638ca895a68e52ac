"""Run-folder discovery and one-line errors that name the bad file (also through the CLI)."""

from __future__ import annotations

import json
import shutil

import pytest

from control.errors import DSparkError
from dspark.cli import main
from reports.loader import discover, load_runs
from tests.reports.fixtures import write_simulate_run, write_tune_run, write_validate_run


def one_line_error(paths, match: str) -> str:
    with pytest.raises(DSparkError) as ei:
        load_runs(paths)
    msg = str(ei.value)
    assert "\n" not in msg and match in msg, msg
    return msg


def test_discovers_run_folders_and_dispatches_on_kind(run_root):
    runs = load_runs([run_root])
    assert {r.name: r.kind for r in runs} == {
        "sim": "simulate",
        "capacity": "capacity",
        "scaling": "simulate",
        "tune": "tune",
        "tune-mo": "tune",
        "real": "real",
        "validate": "validate",
    }
    sim = next(r for r in runs if r.name == "sim")
    assert set(sim.tables) == {"results", "requests", "rounds", "trace"}
    assert sim.config["hardware"]["preset"] == sim.summary["hardware"] == "A100-SXM-80GB"
    # a run folder given directly, twice, and via its summary.json, is read once
    assert discover([run_root / "sim", run_root / "sim", run_root / "sim" / "summary.json"]) == [
        run_root / "sim"
    ]


def test_missing_summary_json(tmp_path):
    run = write_validate_run(tmp_path / "v")
    (run / "summary.json").unlink()
    msg = one_line_error([run], "summary.json")
    assert str(run / "summary.json") in msg and "missing" in msg
    one_line_error([tmp_path / "empty"], "no such file")
    (tmp_path / "empty").mkdir()
    one_line_error([tmp_path / "empty"], "no run folder found")


def test_bad_json_names_the_file(tmp_path):
    run = write_validate_run(tmp_path / "v")
    (run / "summary.json").write_text('{"kind": "validate", ')
    msg = one_line_error([run], "bad JSON")
    assert str(run / "summary.json") in msg and "line 1" in msg


def test_unknown_kind(tmp_path):
    run = write_validate_run(tmp_path / "v")
    (run / "summary.json").write_text(json.dumps({"kind": "bake"}))
    one_line_error([run], "unknown kind 'bake'")


def test_csv_missing_required_column(tmp_path):
    run = write_simulate_run(tmp_path / "s")
    text = (run / "requests.csv").read_text().replace("tpot_s", "tpot_ms", 1)
    (run / "requests.csv").write_text(text)
    msg = one_line_error([run], "missing required column 'tpot_s'")
    assert str(run / "requests.csv") in msg


def test_missing_required_file_and_empty_csv(tmp_path):
    run = write_validate_run(tmp_path / "v")
    (run / "errors.csv").unlink()
    one_line_error([run], f"{run / 'errors.csv'}: missing")
    run2 = write_tune_run(tmp_path / "t")
    (run2 / "importances.csv").write_text("")
    one_line_error([run2], f"{run2 / 'importances.csv'}: empty file")


def test_bad_real_rows(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"kind": "real", "rows": [{"controller": "x"}]}))
    one_line_error([d], "missing required column 'tokens_per_s'")


def test_trials_from_optuna_journal(tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    run = write_tune_run(tmp_path / "t")
    (run / "trials.csv").unlink()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(run / "study.journal")))
    study = optuna.create_study(study_name="so", storage=storage, direction="maximize")
    study.optimize(lambda t: t.suggest_float("alpha", 0.3, 1.5) * 10, n_trials=4)
    (r,) = load_runs([run])
    assert len(r.tables["trials"]) == 4 and "params_alpha" in r.tables["trials"].columns
    (run / "study.journal").write_text("not a journal\n")
    one_line_error([run], "study.journal")


def test_cli_bad_file_exit_2_one_line(tmp_path, capsys):
    run = write_simulate_run(tmp_path / "s", trace=False)
    (run / "results.csv").write_text("controller,seed\nx,0\n")
    rc = main(["report", str(run), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith("dspark: error: ") and str(run / "results.csv") in err
    assert "load_scale" in err


def test_cli_writes_report_and_prints_path_last(run_root, tmp_path, capsys):
    out = tmp_path / "rep"
    sub = tmp_path / "only-sim"
    shutil.copytree(run_root / "sim", sub)
    rc = main(["report", str(sub), "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and lines[-1] == f"report: {(out / 'index.html').resolve()}"
    md = (out / "report.md").read_text()
    # sections without data are listed as skipped, with the reason
    for name in (
        "Real engine",
        "Tuning history",
        "Pareto front",
        "Simulator vs real engine",
        "Scaling with cluster size",
    ):
        assert f"| {name} |" in md
    assert "dspark validate" in md
