"""Several workers on one storage, and a worker killed with SIGKILL mid-study (journal file)."""

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

from tuning.config import load_tuning_config
from tuning.storage import make_storage, resolve_url
from tuning.study import run_study

from .conftest import ROOT, StudyPoll, run_cli, tune_cli

DONE = (TrialState.COMPLETE, TrialState.PRUNED)

# trials of ~1 s (2 workloads x 2 seeds of 100 requests) so that a kill lands inside one even when
# the machine is loaded (at ~0.3 s a poll could miss the last trials: the fault tests flaked in CI)
SLOW = f'''
[tune]
controller = "dspark"
n_trials = {{n}}
seed = 1
n_startup_trials = 3
sim_seeds = [0, 1]
pruner = "none"
[[tune.workloads]]
name = "busy"
scenario = "{ROOT}/configs/tiny.toml"
overrides = {{{{ "workload.rate_rps" = 40.0, "workload.num_requests" = 100 }}}}
[[tune.workloads]]
name = "markov"
scenario = "{ROOT}/configs/tiny.toml"
overrides = {{{{ "workload.rate_rps" = 30.0, "workload.num_requests" = 100, "acceptance.model" = "markov" }}}}
[[evaluate.workloads]]
name = "held-out"
scenario = "{ROOT}/configs/tiny.toml"
'''


def _config(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "tune.toml"
    p.write_text(SLOW.format(n=n))
    return p


def _study(out: Path, name: str = "dspark-throughput") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=make_storage(resolve_url(None, out)))


@pytest.mark.slow
def test_sigkilled_worker_loses_no_finished_trial_and_resume_completes(tmp_path):
    n = 12
    cfg = _config(tmp_path, n)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        tune_cli(str(cfg), "--out", str(out)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    snapshot = None
    poll = StudyPoll(resolve_url(None, out))
    try:
        while time.time() < deadline:
            time.sleep(0.05)
            if not (out / "study.journal").exists() or proc.poll() is not None:
                continue
            try:
                trials = poll.trials()
            except KeyError:  # the study is not created yet
                continue
            done = [t for t in trials if t.state in DONE]
            running = [t for t in trials if t.state == TrialState.RUNNING]
            if len(done) >= 3 and running:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    snapshot = {t.number: t for t in _study(out).get_trials()}
    finished = {k: t for k, t in snapshot.items() if t.state in DONE}
    killed = [t for t in snapshot.values() if t.state == TrialState.RUNNING]
    assert len(finished) >= 3 and len(finished) < n and len(killed) <= 1
    print(f"killed running trials: {[t.number for t in killed]}")

    # without --resume the run folder is refused; with it the study is continued
    r = run_cli(tune_cli(str(cfg), "--out", str(out)), timeout=60)
    assert r.returncode == 2 and "pass --resume" in r.stderr
    r = run_cli(tune_cli(str(cfg), "--out", str(out), "--resume"))
    assert r.returncode == 0, r.stderr[-2000:]

    after = {t.number: t for t in _study(out).get_trials()}
    for k, t in finished.items():  # every finished trial kept, unchanged
        assert after[k].state == t.state and after[k].values == t.values
        assert after[k].params == t.params
    done = [t for t in after.values() if t.state in DONE]
    assert len(done) == n
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(n))
    for t in killed:  # the killed trial failed and its slot was run again
        assert after[t.number].state == TrialState.FAIL
        retry = [d for d in done if d.system_attrs.get("failed_trial") == t.number]
        assert len(retry) == 1 and retry[0].params.items() >= dict(t.params.items()).items()
        assert retry[0].user_attrs["slot"] == t.user_attrs["slot"]
    assert not [t for t in after.values() if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.slow
def test_two_workers_on_one_journal_run_the_requested_distinct_trials(tmp_path):
    cfg = load_tuning_config(_config(tmp_path, 10))
    url = resolve_url(None, tmp_path / "run")
    study = run_study(cfg, url, workers=2)
    trials = study.get_trials()
    done = [t for t in trials if t.state in DONE]
    assert len(done) == 10
    assert len({t.number for t in done}) == 10
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(10))
    assert len({t.user_attrs["worker"] for t in done}) == 2  # both workers ran trials
    assert all(t.user_attrs.get("stray") for t in trials if t not in done)
    # parameters are distinct: two workers never ran the same suggestion twice
    drawn = [tuple(sorted(t.params.items())) for t in done]
    assert len(set(drawn)) == 10


@pytest.mark.parametrize("sampler", ["random", "cmaes", "gp"])
def test_other_samplers_run(tmp_path, sampler):
    import dataclasses

    cfg = load_tuning_config(
        ROOT / "configs" / "tune_tiny.toml", sampler=sampler, n_trials=4, n_startup_trials=2
    )
    if sampler == "gp":  # the GP sampler refits per trial: keep the space small
        cfg = dataclasses.replace(cfg, tune=dataclasses.replace(cfg.tune, controller="fixed"))
    study = run_study(cfg, "memory")
    assert len(study.get_trials(states=DONE)) == 4


WORKER = (
    "import sys; from tuning.config import load_tuning_config; "
    "from tuning.study import run_worker; "
    "run_worker(load_tuning_config(sys.argv[1]), sys.argv[2], int(sys.argv[3]))"
)


@pytest.mark.slow
def test_surviving_worker_requeues_the_trial_of_a_killed_one(tmp_path):
    from tuning.study import prepare_study

    n = 10
    path = _config(tmp_path, n)
    cfg = load_tuning_config(path)
    out = tmp_path / "run"
    url = resolve_url(None, out)
    prepare_study(cfg, url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), url, str(i)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    victim, survivor = procs
    killed_trial = None
    deadline = time.time() + 60
    poll = StudyPoll(url)
    try:
        while time.time() < deadline and killed_trial is None:
            time.sleep(0.05)
            now = poll.trials()  # one read, then kill at once
            running = [
                t
                for t in now
                if t.state == TrialState.RUNNING
                and t.user_attrs.get("worker", "").endswith(f":{victim.pid}")
            ]
            if running and sum(t.state in DONE for t in now) >= 2:
                victim.kill()
                victim.wait()
                killed_trial = running[0].number
        assert survivor.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert killed_trial is not None
    trials = {t.number: t for t in _study(out).get_trials()}
    done = [t for t in trials.values() if t.state in DONE]
    assert len(done) == n and sorted(t.user_attrs["slot"] for t in done) == list(range(n))
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING]
    # the trial the victim was running (unless it finished in the instant before the kill)
    # failed, and the survivor re-ran its slot with the same parameters
    lost = [
        t
        for t in trials.values()
        if t.state == TrialState.FAIL and t.user_attrs.get("worker", "").endswith(f":{victim.pid}")
    ]
    assert len(lost) <= 1
    for t in lost:
        retry = [d for d in done if d.system_attrs.get("failed_trial") == t.number]
        assert len(retry) == 1 and retry[0].user_attrs["slot"] == t.user_attrs["slot"]
        assert all(retry[0].params[k] == v for k, v in t.params.items())
