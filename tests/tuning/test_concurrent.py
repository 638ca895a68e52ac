"""Concurrent commands on one study, the journal's lock, and workers that die with their parent.

- Creating a study and queueing its slots is atomic on the journal, SQLite and PostgreSQL: of two
  identical commands without ``--resume`` one runs and the other exits 2 with one line; two with
  ``--resume`` on a new study queue each slot once and leave no failed record.
- A journal lock left by a killed process is broken at once (well within 2 s); a live holder's
  lock is never broken; one whose holder cannot be checked is broken after the grace period.
- Workers die with a SIGKILLed ``dspark tune`` wherever the kill lands (10 kills).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from control.errors import ConfigError
from tests.proctable import children
from tuning.config import load_tuning_config
from tuning.locks import JournalLock, pid_alive
from tuning.storage import make_storage, resolve_url
from tuning.study import prepare_study

from .conftest import ROOT, TINY, StudyPoll
from .test_postgres import pg_url  # noqa: F401  (fixture: a private PostgreSQL server)

DONE = (TrialState.COMPLETE, TrialState.PRUNED)
WHERE = ["journal", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

# `dspark tune` with the simulator replaced by an instant stand-in deterministic in the config
# (the command line, storage, study and workers are the real ones).
FAKE_CLI = """
import sys
import tuning.objective as o
def fake(scn, controller, config, seed, baseline, load_scale=1.0):
    x = sum(float(v) for v in vars(config).values() if isinstance(v, (int, float)))
    v = 100.0 + (x * 7919.0 + seed) % 50.0
    return {"throughput_tokens_per_s": v, "goodput_tokens_per_s": v, "tpot_p99_s": 1.0 / v,
            "mean_accepted_length": 2.0, "acceptance_rate": 0.7, "lossy_accept_fraction": 0.0}
o.default_simulate = fake
from dspark.cli import main
sys.exit(main(["tune", *sys.argv[1:], "--quiet", "--no-eval"]))
"""


def _url(where: str, tmp_path: Path, request) -> str:
    if where == "postgres":
        return request.getfixturevalue("pg_url")
    if where == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return resolve_url(None, tmp_path / "run")


def _fake_tune(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", FAKE_CLI, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _load(url: str, name: str = "dspark-throughput") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=make_storage(url))


# ---- two commands at once ----------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
def test_two_prepares_at_once_queue_each_slot_once(tmp_path, where, request, monkeypatch):
    """Two resuming prepares of a new study in two threads, each on its own storage object,
    with the window between "does it exist" and "queue the slots" widened to 0.3 s: without
    the study's lock both would queue all n slots."""
    url = _url(where, tmp_path, request)
    n = 6
    cfg = load_tuning_config(TINY, n_trials=n)
    real = optuna.get_all_study_summaries

    def slow_summaries(storage, include_best_trial=True):
        out = real(storage, include_best_trial)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(optuna, "get_all_study_summaries", slow_summaries)
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            prepare_study(cfg, url, n, resume=True, storage=make_storage(url))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    trials = _load(url).get_trials()
    assert len(trials) == n and all(t.state == TrialState.WAITING for t in trials)
    assert sorted(t.user_attrs["slot"] for t in trials) == list(range(n))


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_two_identical_new_studies_at_once_one_runs_the_other_exits_2(tmp_path, where, request):
    url = _url(where, tmp_path, request)
    out = tmp_path / "run"
    n = 4
    args = [str(TINY), "--trials", str(n), "--out", str(out), "--storage", url]
    procs = [_fake_tune(args) for _ in range(2)]
    res = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    codes = sorted(rc for rc, _, _ in res)
    assert codes == [0, 2], [(rc, err[-1500:]) for rc, _, err in res]
    err = next(err for rc, _, err in res if rc == 2)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), err
    assert "already" in lines[0] and "--resume" in lines[0]
    trials = _load(url).get_trials()
    assert sorted(t.user_attrs["slot"] for t in trials if t.state in DONE) == list(range(n))
    assert len(trials) == n  # nothing failed, nothing queued twice


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_two_resumes_of_a_new_study_leave_no_failed_record(tmp_path, where, request):
    url = _url(where, tmp_path, request)
    n = 10
    args = [str(TINY), "--trials", str(n), "--out", str(tmp_path / "run"), "--storage", url]
    procs = [_fake_tune([*args, "--resume", "--workers", "2"]) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
    trials = _load(url).get_trials()
    assert [t.number for t in trials if t.state == TrialState.FAIL] == []
    assert sorted(t.user_attrs["slot"] for t in trials) == list(range(n))
    assert all(t.state in DONE for t in trials)


# ---- the journal's lock ------------------------------------------------------------------

HOLD = """
import sys, time
from tuning.locks import JournalLock
JournalLock(sys.argv[1], 10.0).acquire()
print("held", flush=True)
time.sleep(120)
"""


def _acquire_in(lock: JournalLock) -> tuple[threading.Thread, dict]:
    got: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        lock.acquire()
        got["s"] = time.monotonic() - t0
        lock.release()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, got


@pytest.mark.slow
def test_a_killed_holders_lock_is_broken_at_once(tmp_path):
    journal = str(tmp_path / "study.journal")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, journal], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        text = Path(journal + ".lock").read_text()
        assert text.startswith(f"{socket.gethostname()}:{holder.pid}:")
        lock = JournalLock(journal, grace_s=10.0)
        th, got = _acquire_in(lock)
        th.join(0.5)
        assert th.is_alive(), "a live holder's lock was broken"
        holder.kill()
        holder.wait()
        th.join(5)
        assert not th.is_alive() and "s" in got
    finally:
        if holder.poll() is None:
            holder.kill()
    # broken within 2 s of the kill (in practice within one poll, 50 ms)
    assert got["s"] - 0.5 < 2.0, got
    assert not Path(journal + ".lock").exists()


def test_a_journal_append_after_a_killed_holder_takes_well_under_2_s(tmp_path):
    """The storage itself: a worker killed while holding the lock; the next write goes on."""
    url = resolve_url(None, tmp_path / "run")
    cfg = load_tuning_config(TINY, n_trials=2)
    prepare_study(cfg, url, 2)
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = url.removeprefix("journal:")
    Path(path + ".lock").write_text(f"{socket.gethostname()}:{dead.pid}:x")
    t0 = time.monotonic()
    study = _load(url)
    study.set_user_attr("touched", True)
    assert time.monotonic() - t0 < 2.0
    assert _load(url).user_attrs["touched"] is True


def test_an_unknown_holder_is_waited_for_the_grace_period(tmp_path):
    journal = str(tmp_path / "study.journal")
    os.symlink(journal, journal + ".lock")  # Optuna's own symlink lock: no holder to check
    lock = JournalLock(journal, grace_s=0.4)
    t0 = time.monotonic()
    lock.acquire()
    waited = time.monotonic() - t0
    assert 0.4 <= waited < 2.0
    lock.release()


def test_the_lock_is_reentrant_and_releases_only_its_own(tmp_path):
    journal = str(tmp_path / "study.journal")
    lock = JournalLock(journal, grace_s=10.0)
    lock.acquire()
    lock.acquire()
    lock.release()
    assert Path(journal + ".lock").exists()  # still held once
    lock.release()
    assert not Path(journal + ".lock").exists()
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_second_new_study_in_one_process_is_refused_in_one_line(tmp_path):
    url = resolve_url(None, tmp_path / "run")
    cfg = load_tuning_config(TINY, n_trials=2)
    prepare_study(cfg, url, 2)
    with pytest.raises(ConfigError) as e:
        prepare_study(cfg, url, 2)
    assert str(e.value) == (
        f"study 'dspark-throughput' already exists in {url}; pass --resume to continue it, "
        "or use another --out/--storage"
    )


# ---- workers die with their parent, wherever the kill lands --------------------------------

SLOW_MAIN = """
import sys, time
from tuning.config import load_tuning_config
from tuning.study import run_study
def slow(*a, **k):
    time.sleep(120)
run_study(load_tuning_config(sys.argv[1], n_trials=6), sys.argv[2], workers=3, simulate=slow)
"""


def _processes_with(token: str) -> set[int]:
    """Live processes (not zombies) whose command line holds ``token``."""
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmd and pid_alive(int(d.name)):
            found.add(int(d.name))
    return found


# (children seen, then seconds) before the kill: during the forks, right after, mid-trial
KILLS = [(1, 0.0), (1, 0.002), (1, 0.01), (2, 0.0), (2, 0.002), (2, 0.02), (3, 0.0), (3, 0.05),
         (3, 0.5), (3, 2.0)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_workers_die_with_their_killed_parent_ten_times_in_ten(tmp_path):
    orphans = []
    for i, (seen, wait_s) in enumerate(KILLS):
        url = resolve_url(None, tmp_path / f"run{i}")
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_MAIN, str(TINY), url],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 60
            while time.time() < deadline and len(children(proc.pid)) < seen:
                time.sleep(0.001)
            time.sleep(wait_s)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            deadline = time.time() + 3
            while time.time() < deadline and _processes_with(url):
                time.sleep(0.05)
            left = _processes_with(url)
            if left:
                orphans.append((i, seen, wait_s, sorted(left)))
        finally:
            if proc.poll() is None:
                proc.kill()
            for p in _processes_with(url):
                os.kill(p, signal.SIGKILL)
    assert not orphans, f"workers outlived their parent: {orphans}"


SLOW_EVAL = FAKE_CLI.replace(
    "o.default_simulate = fake",
    "o.default_simulate = fake\n"
    "import time, tuning.evaluate as ev\n"
    "ev.default_simulate = lambda *a, **k: time.sleep(120)",
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_held_out_evaluation_workers_die_with_their_killed_parent(tmp_path):
    """The pool of the held-out evaluation (--workers 2) dies with a killed `dspark tune`; before,
    its workers ran their current simulation to the end."""
    out = tmp_path / "run"
    args = [str(TINY), "--trials", "2", "--out", str(out), "--workers", "2", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_EVAL.replace(', "--no-eval"', ""), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 90
        pool: set[int] = set()
        poll = StudyPoll(resolve_url(None, out))
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
            if not (out / "study.journal").exists():  # (opening a storage would create it)
                continue
            try:
                trials = poll.trials()
            except (KeyError, ValueError):  # the journal holds no study record yet
                continue
            if len([t for t in trials if t.state in DONE]) == 2:
                tuners = {int(t.user_attrs["worker"].rpartition(":")[2]) for t in trials}
                pool = children(proc.pid) - tuners  # not the study's workers: the pool's
                if len(pool) >= 2:
                    break
        assert len(pool) >= 2, "no evaluation pool seen"
        time.sleep(0.5)  # the pool's workers are inside their 120 s simulations
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 3
        while time.time() < deadline and any(pid_alive(p) for p in pool):
            time.sleep(0.05)
        assert not [p for p in pool if pid_alive(p)], "evaluation workers outlived their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in children(proc.pid) | pool:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
