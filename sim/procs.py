"""Worker processes that die with the command that started them.

A process forked inside :func:`dying_with_this_process` arms ``PR_SET_PDEATHSIG`` right after
the fork (before anything else runs in the child), so it ends when its parent dies, even by
SIGKILL; where there is no ``prctl`` a thread watches the parent. Tuning workers, sweep workers
and the held-out evaluation pool all use it; the simulator's process pool
(:func:`sim.sweep.pool_map`) has each worker watch the command that made the pool
(:func:`die_with_command`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any


def _prctl() -> Any:
    """libc's ``prctl`` (None where there is none), looked up before any fork: a child must not
    load libraries between fork and its first instruction of its own."""
    if "prctl" not in _LIBC:
        try:
            import ctypes

            _LIBC["prctl"] = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _LIBC["prctl"] = None
    return _LIBC["prctl"]


_LIBC: dict[str, Any] = {}
_ARMED: dict[str, int] = {}  # {"parent": pid} while this process forks workers that die with it


def _die_with_parent(parent: int) -> None:
    """End this worker when the process that started it dies, even by SIGKILL."""
    prctl = _prctl()
    if prctl is None or prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _armed_child() -> None:
    """Right after a fork, before anything else runs in the child: a child forked while
    :func:`dying_with_this_process` is on dies with its parent."""
    parent = _ARMED.pop("parent", None)
    if parent is not None:
        _die_with_parent(parent)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_armed_child)


@contextlib.contextmanager
def dying_with_this_process() -> Iterator[None]:
    """Processes forked inside this block die with this one (``PR_SET_PDEATHSIG``, armed in
    the child right after the fork; elsewhere a thread that watches the parent)."""
    _prctl()
    _ARMED["parent"] = os.getpid()
    try:
        yield
    finally:
        _ARMED.pop("parent", None)


def die_with_command(command: int, every_s: float = 0.5) -> None:
    """A pool worker's initializer: end this worker when ``command`` (the pid of the command
    that made the pool) dies, even by SIGKILL. Its parent may be a forkserver, which outlives
    the command while any worker it forked lives (each holds the server's keep-alive pipe), so
    a thread watches the command itself; its exit then ends the server too."""
    _die_with_parent(os.getppid())

    def watch() -> None:
        while True:
            try:
                os.kill(command, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # a recycled pid, another user's: the command is gone
                os._exit(1)
            time.sleep(every_s)

    threading.Thread(target=watch, daemon=True, name="command-watch").start()
