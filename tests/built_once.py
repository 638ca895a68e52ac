"""Expensive fixtures built once per test run, however many pytest-xdist workers share it.

A module fixture is built once per worker that runs one of its tests, and xdist hands the tests
of one module to both workers. :func:`built_once` builds into a folder under the run's base
temporary folder, which the workers share (``tmp_path_factory.getbasetemp().parent``, the
pattern pytest-xdist documents): the first worker builds it while holding a file lock, the
others wait for the lock and read what it built. Without xdist it is a fresh temporary folder.

The folder is shared: a test that writes into it copies it first (``shutil.copytree`` to its
own ``tmp_path``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]
) -> tuple[Path, Any]:
    """``(folder, result)`` of ``build(folder)``, run once per test run; ``result`` must be
    JSON (it is what the other workers read back, so every worker sees the same value)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        return out, json.loads(json.dumps(build(out)))
    shared = tmp_path_factory.getbasetemp().parent
    out, done = shared / f"built-once-{name}", shared / f"built-once-{name}.json"
    with FileLock(str(shared / f"built-once-{name}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # what a build that raised left behind
            out.mkdir()
            done.write_text(json.dumps(build(out)))
    return out, json.loads(done.read_text())
