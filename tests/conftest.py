"""The fast test path: which tests are ``slow`` (``make test-fast`` runs ``-m "not slow"``).

Slow, by folder: ``tests/real`` (the PyTorch engine and the project's models) and
``tests/validate`` (the simulator against the engine). Slow, by marker: ``postgres`` and
``browser`` (they start a database server or a headless browser). Elsewhere a test that starts
subprocesses or runs a whole command end to end carries ``@pytest.mark.slow`` itself. CI
(``make test``) runs every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: Test folders whose every test is slow.
SLOW_FOLDERS = frozenset({"real", "validate"})
#: Markers that make a test slow wherever it is.
SLOW_MARKERS = ("postgres", "browser")
#: Test folders that run first, in this order: those with the longest tests (whole validations,
#: killed tuning studies, the engine). ``make test``'s workers steal work from each other's
#: queues (``--dist worksteal``), so tests taken early leave the short ones to balance the end.
FIRST_FOLDERS = ("validate", "tuning", "real")


def _folder(item: pytest.Item) -> str:
    try:
        return item.path.resolve().relative_to(TESTS).parts[0]
    except ValueError:  # a test outside tests/ (e.g. given by path)
        return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {f: i for i, f in enumerate(FIRST_FOLDERS)}
    folders = {}
    for item in items:
        folder = folders[item.nodeid] = _folder(item)
        if folder in SLOW_FOLDERS or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
    # stable: each folder's own order (and each module's tests together) is kept
    items.sort(key=lambda it: rank.get(folders[it.nodeid], len(FIRST_FOLDERS)))
