"""A ``simulate`` sweep as an Optuna study (tuning/sweep.py), under faults.

What every test checks: each point is finished by exactly one trial, nothing is left RUNNING or
WAITING, and the run folder is byte for byte the serial one. Faults: a point claimed by a worker
that died (the storage state written directly), a point queued twice, a point that fails, and
(slow) a worker or the main command killed with SIGKILL mid-sweep, then the same command again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import tuning.sweep as tsweep
from control.errors import DSparkError
from sim import load_scenario, sweep
from sim.compare import compare_runs
from tuning.storage import make_storage, resolve_url

from .conftest import ROOT, run_cli
from .test_faults import _alive, _claim_as_dead_worker, _pids_of

TINY = ROOT / "configs" / "tiny.toml"
CONTROLLERS = ("fixed", "dspark")
FILES = ("results.csv", "requests.csv", "summary.json", "config.toml")


def _same(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _exactly_once(study: optuna.Study, n: int) -> list:
    trials = study.get_trials()
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(n))
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    return done


def _sweep(scn, loads) -> sweep.Sweep:
    return sweep.Sweep.of(scn, 0, [(c, None, c) for c in CONTROLLERS], loads)


def _compare(scn, loads, out: Path, url: str | None = None, workers: int = 1):
    runner = None if url is None else (lambda sw: tsweep.run_sweep(sw, url, workers))
    return compare_runs(scn, CONTROLLERS, load_scales=loads, out_dir=out, runner=runner)


def test_a_dead_workers_point_is_run_again_once_and_the_folder_is_the_serial_one(tmp_path):
    scn = load_scenario(TINY)
    url = resolve_url(None, tmp_path / "study")
    sw = _sweep(scn, (1.0,))
    study = tsweep.prepare(sw, url)
    dead = _claim_as_dead_worker(study)
    _compare(scn, (1.0,), tmp_path / "serial")
    _compare(scn, (1.0,), tmp_path / "run", url)
    _same(tmp_path / "serial", tmp_path / "run")
    study = optuna.load_study(study_name=tsweep.study_name(sw), storage=make_storage(url))
    done = _exactly_once(study, len(sw.points()))
    assert study._storage.get_trial(dead._trial_id).state == TrialState.FAIL
    retry = [t for t in done if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retry) == 1 and retry[0].user_attrs["slot"] == dead.user_attrs["slot"]


def test_a_point_queued_twice_runs_once(tmp_path):
    scn = load_scenario(TINY)
    url = resolve_url(None, tmp_path / "study")
    sw = _sweep(scn, (1.0,))
    study = tsweep.prepare(sw, url)
    for slot in (0, 3):  # a second command preparing the same study at the same moment
        study.enqueue_trial({}, user_attrs={"slot": slot})
    _compare(scn, (1.0,), tmp_path / "serial")
    _compare(scn, (1.0,), tmp_path / "run", url)
    _same(tmp_path / "serial", tmp_path / "run")
    study = optuna.load_study(study_name=tsweep.study_name(sw), storage=make_storage(url))
    _exactly_once(study, len(sw.points()))
    dups = [t for t in study.get_trials() if "duplicate_of" in t.user_attrs]
    assert len(dups) == 2 and all(t.state == TrialState.FAIL for t in dups)


def test_a_failing_point_is_its_own_one_line_error_and_the_others_are_kept(tmp_path):
    scn = load_scenario(TINY).with_overrides({"sim.horizon_s": 1e-6})
    with pytest.raises(DSparkError) as serial:
        compare_runs(scn, CONTROLLERS)
    url = resolve_url(None, tmp_path / "study")
    with pytest.raises(DSparkError) as study_run:
        _compare(scn, (1.0,), None, url)
    assert str(study_run.value) == str(serial.value)
    name = tsweep.study_name(_sweep(scn, (1.0,)))
    study = optuna.load_study(study_name=name, storage=make_storage(url))
    done = {t.user_attrs["slot"] for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert done == {2, 3}  # the two baselines; both controller runs fail


# ---- processes killed mid-sweep (slow: real simulations in worker processes) ----------------

LOADS = "0.5,1,1.5,2"
SETS = ("--set", "workload.num_requests=120")


def _cli(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dspark",
        "simulate",
        str(TINY),
        "--loads",
        LOADS,
        *SETS,
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


def _study(url: str) -> optuna.Study | None:
    try:
        (s,) = optuna.get_all_study_summaries(make_storage(url))
    except ValueError:
        return None
    return optuna.load_study(study_name=s.study_name, storage=make_storage(url))


def _kill_mid_sweep(cmd: list[str], url: str, victim: str) -> int:
    """Start the sweep; once 4 points are done and one runs, SIGKILL the main process or the
    worker running that point; returns the command's exit status."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed = False
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not killed and proc.poll() is None:
            time.sleep(0.05)
            study = _study(url) if Path(url.removeprefix("journal:")).exists() else None
            if study is None:
                continue
            trials = study.get_trials()
            done = [t for t in trials if t.state == TrialState.COMPLETE]
            running = [
                t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("worker")
            ]
            if len(done) >= 4 and running:
                os.kill(proc.pid if victim == "main" else _pids_of(running).pop(), signal.SIGKILL)
                killed = True
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, f"no kill: exit {proc.returncode} " + proc.stderr.read().decode()[-2000:]
    return rc


@pytest.fixture(scope="module")
def serial_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serial") / "run"
    r = run_cli(_cli(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.slow
def test_a_killed_worker_loses_no_point_and_runs_none_twice(tmp_path, serial_folder):
    out = tmp_path / "run"
    url = resolve_url(None, out)
    rc = _kill_mid_sweep(_cli(out, "--workers", "2", "--storage", "journal"), url, "worker")
    assert rc == 0
    study = _study(url)
    assert study is not None
    _exactly_once(study, 16)
    assert [t for t in study.get_trials() if t.state == TrialState.FAIL]  # the killed point
    _same(serial_folder, out)


@pytest.mark.slow
def test_a_sweep_killed_with_its_command_resumes_on_the_same_storage(tmp_path, serial_folder):
    out = tmp_path / "run"
    url = resolve_url(None, out)
    cmd = _cli(out, "--workers", "2", "--storage", "journal")
    assert _kill_mid_sweep(cmd, url, "main") == -signal.SIGKILL
    study = _study(url)
    assert study is not None
    workers = _pids_of(study.get_trials())
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    assert workers and not any(_alive(p) for p in workers), "workers outlived their command"
    finished = {t.number for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert not (out / "summary.json").exists()
    r = run_cli(cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    study = _study(url)
    assert study is not None
    done = _exactly_once(study, 16)
    assert finished <= {t.number for t in done}  # every point finished before the kill kept
    _same(serial_folder, out)
