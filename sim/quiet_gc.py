"""``quiet_gc``: fewer garbage collections while a simulation runs (speed only, never results)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_GC_LOCK = threading.Lock()
_GC_STATE: list = [0, None, False]  # runs in progress, thresholds to restore, we froze


@contextlib.contextmanager
def quiet_gc(gen0: int = 50_000) -> Iterator[None]:
    """During a run: freeze the heap that exists before it (collections then skip the
    libraries' objects; only when nothing is frozen already, so a caller's own freeze is left
    alone) and collect the young generation less often (the loop makes many short-lived
    containers). Collection stays on (nothing changes when the caller disabled it); settings
    are restored when the last concurrent run ends. Results do not depend on it, only speed."""
    with _GC_LOCK:
        if _GC_STATE[0] == 0 and gc.isenabled():
            _GC_STATE[1] = gc.get_threshold()
            _GC_STATE[2] = gc.get_freeze_count() == 0
            if _GC_STATE[2]:
                gc.freeze()
            gc.set_threshold(max(gen0, _GC_STATE[1][0]), *_GC_STATE[1][1:])
        _GC_STATE[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE[0] -= 1
            if _GC_STATE[0] == 0 and _GC_STATE[1] is not None:
                gc.set_threshold(*_GC_STATE[1])
                if _GC_STATE[2]:
                    gc.unfreeze()
                _GC_STATE[1], _GC_STATE[2] = None, False
