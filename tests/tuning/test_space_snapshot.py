"""The search space read from ``param(...)`` metadata equals the one recorded in
``space_snapshot.json`` (captured from the table-and-heuristics space it replaced), for every
registry controller. A deliberate change of the space: regenerate with

    DSPARK_UPDATE_SPACE_SNAPSHOT=1 .venv/bin/pytest tests/tuning/test_space_snapshot.py
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from control import controller_names
from tuning.space import space

SNAPSHOT = Path(__file__).with_name("space_snapshot.json")


def _as_json(controller: str) -> list[dict]:
    """The dimensions as JSON, without their docs (wording is not part of the space)."""
    dims = [
        {k: v for k, v in dataclasses.asdict(d).items() if k != "doc"} for d in space(controller)
    ]
    return json.loads(json.dumps(dims))


def _dumps(snap: dict[str, list[dict]]) -> str:
    """One line per dimension."""
    return (
        "{\n"
        + ",\n".join(
            f" {json.dumps(c)}: [\n" + ",\n".join("  " + json.dumps(d) for d in dims) + "\n ]"
            for c, dims in snap.items()
        )
        + "\n}\n"
    )


def test_snapshot_covers_every_controller():
    if os.environ.get("DSPARK_UPDATE_SPACE_SNAPSHOT"):
        SNAPSHOT.write_text(_dumps({c: _as_json(c) for c in controller_names()}))
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(controller_names())


@pytest.mark.parametrize("controller", controller_names())
def test_space_equals_snapshot(controller):
    assert _as_json(controller) == json.loads(SNAPSHOT.read_text())[controller]
