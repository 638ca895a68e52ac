"""tests/built_once.py: a fixture's build runs once per test run, whichever worker asks."""

import json

import pytest

from tests.built_once import built_once


class _Factory:
    """A ``tmp_path_factory`` stand-in: the workers' base folders under one run folder."""

    def __init__(self, run, worker):
        self.base = run / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)
        self.made = 0

    def getbasetemp(self):
        return self.base

    def mktemp(self, name):
        self.made += 1
        out = self.base / f"{name}{self.made}"
        out.mkdir()
        return out


def test_workers_of_one_run_share_one_build(tmp_path, monkeypatch):
    calls = []

    def build(out):
        calls.append(out)
        (out / "made.txt").write_text("x")
        return {"n": len(calls), "t": (1, 2)}

    got = []
    for worker in ("gw0", "gw1", "gw0"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        got.append(built_once(_Factory(tmp_path, worker), "thing", build))
    assert len(calls) == 1
    # one folder, under the run's folder, and one JSON result (a tuple reads back as a list)
    assert [g[0] for g in got] == [tmp_path / "built-once-thing"] * 3
    assert [g[1] for g in got] == [{"n": 1, "t": [1, 2]}] * 3
    assert (tmp_path / "built-once-thing" / "made.txt").read_text() == "x"


def test_a_build_that_raised_is_built_again_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")

    def fails(out):
        (out / "half.txt").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        built_once(_Factory(tmp_path, "gw0"), "thing", fails)
    # the next worker builds again, from an empty folder
    out, result = built_once(
        _Factory(tmp_path, "gw1"), "thing", lambda o: sorted(p.name for p in o.iterdir())
    )
    assert result == [] and out.is_dir()
    assert json.loads((tmp_path / "built-once-thing.json").read_text()) == []


def test_without_workers_each_fixture_builds_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _Factory(tmp_path, "master")
    a = built_once(factory, "thing", lambda o: str(o))
    b = built_once(factory, "thing", lambda o: str(o))
    assert a[0] != b[0] and a[1] == str(a[0]) and b[1] == str(b[0])
    assert not (tmp_path / "built-once-thing").exists()
