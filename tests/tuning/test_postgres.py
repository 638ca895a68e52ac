"""Two workers on a private PostgreSQL server (RDB storage with heartbeat)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tuning.config import load_tuning_config
from tuning.study import run_study

from .conftest import TINY

pytestmark = pytest.mark.postgres

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _bin() -> Path | None:
    for d in BIN_DIRS:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(cmd: list[str]) -> tuple[list[str], str | None]:
    """PostgreSQL refuses to run as root: run it as 'postgres' (or 'nobody') via runuser."""
    if os.geteuid() != 0:
        return cmd, None
    import pwd

    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", user, "--", *cmd], user
    pytest.skip("running as root and no runuser/postgres user to start PostgreSQL as")


@pytest.fixture
def pg_url():
    bindir = _bin()
    if bindir is None:
        pytest.skip(
            "PostgreSQL binaries (initdb, pg_ctl) not found under /usr/lib/postgresql "
            "or on PATH; .ci/run installs them"
        )
    # a folder of its own (pytest's tmp folders are private to root, the server is not root)
    root = Path(tempfile.mkdtemp(prefix="dspark-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    _, user = _as_user(["true"])
    if user:
        import pwd

        pw = pwd.getpwnam(user)
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    cmd, _ = _as_user(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]
    )
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    cmd, _ = _as_user(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            opts,
            "-l",
            str(root / "log.txt"),
            "-w",
            "-t",
            "60",
            "start",
        ]
    )
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:] + (root / "log.txt").read_text()[-2000:]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        cmd, _ = _as_user(
            [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
        )
        subprocess.run(cmd, check=False, capture_output=True, env=env, timeout=60)
        deadline = time.time() + 10
        while time.time() < deadline:  # the port is free again: the server is gone
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.1)
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_on_postgresql(pg_url):
    cfg = load_tuning_config(TINY, n_trials=8)
    study = run_study(cfg, pg_url, workers=2)
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(done) == 8
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(8))
    assert len({t.user_attrs["worker"] for t in done}) == 2
    # the RDB storage runs with a heartbeat, so a dead worker's trial would be failed and retried
    assert study._storage.get_heartbeat_interval() is not None
    # resuming with a larger total continues the same study on the server
    study = run_study(cfg, pg_url, workers=1, n_trials=10, resume=True)
    assert len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))) == 10
