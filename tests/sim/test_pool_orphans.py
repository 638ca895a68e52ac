"""A killed command leaves no simulator pool worker running (sim.sweep.pool_map)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.proctable import descendants
from tuning.locks import pid_alive

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table in /proc"),
]

# the command: a pool of two workers that each sleep 60 s; it prints its pid and waits
COMMAND = """
import os, sys, time
from sim.sweep import pool_map
print(os.getpid(), flush=True)
pool_map(time.sleep, [(60,), (60,)], 2)
"""


def test_sigkilled_command_leaves_no_pool_worker():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pid = int(proc.stdout.readline())
        assert pid == proc.pid
        # the forkserver and the two sleeping workers under it
        deadline = time.monotonic() + 60
        while len(descendants(pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        spawned = descendants(pid)
        assert len(spawned) >= 3, spawned
        os.kill(pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(pid_alive(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in spawned if pid_alive(p)], (
            "pool processes outlived the killed command"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
