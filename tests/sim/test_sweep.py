"""``compare_runs`` as independent points (sim/sweep.py): on a process pool, or through a runner
that stores each point as text, the run folder is byte for byte the serial one."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pandas as pd
import pytest

from control.errors import ConfigError
from sim import load_scenario, sweep
from sim.api import BASELINE, BASELINE_RESIDENT, SimWarning
from sim.compare import compare_runs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"
FILES = (
    "results.csv",
    "requests.csv",
    "summary.json",
    "config.toml",
    "rounds.csv",
    "controller_trace.csv",
)


@pytest.fixture(scope="module")
def scn():
    return load_scenario(TINY)


def _same_folders(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _through_text(sw: sweep.Sweep) -> list[sweep.PointResult]:
    """Every point run here and passed through its stored text, as a storage would."""
    return [
        sweep.decode_point(sw, i, sweep.encode_point(sweep.run_point(sw, i)))
        for i in range(len(sw.points()))
    ]


@pytest.fixture(scope="module")
def serial(scn, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    compare_runs(scn, ("fixed", "dspark"), load_scales=(1.0, 2.0), trace=True, out_dir=out)
    return out


def test_a_pool_of_two_writes_the_serial_run_folder(scn, serial, tmp_path):
    compare_runs(
        scn, ("fixed", "dspark"), load_scales=(1.0, 2.0), trace=True, out_dir=tmp_path, workers=2
    )
    _same_folders(serial, tmp_path)


def test_points_stored_as_text_give_the_serial_run_folder(scn, serial, tmp_path):
    compare_runs(
        scn,
        ("fixed", "dspark"),
        load_scales=(1.0, 2.0),
        trace=True,
        out_dir=tmp_path,
        runner=_through_text,
    )
    _same_folders(serial, tmp_path)


def test_without_baselines_the_pool_gives_the_serial_rows(scn):
    kw = {"controllers": ("fixed", ("fixed", {"k": 2})), "load_scales": (1.0,), "baseline": False}
    a = compare_runs(scn, **kw)
    b = compare_runs(scn, **kw, workers=2)
    pd.testing.assert_frame_equal(a.results, b.results)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.results["speedup"].isna().all()


def test_points_are_each_controller_then_the_two_baselines_per_load(scn):
    sw = sweep.Sweep.of(scn, 3, [("fixed", None, "fixed"), ("dspark", None, "dspark")], [1, 2])
    got = [(p.load_scale, p.label, p.is_baseline, p.resident) for p in sw.points()]
    assert got == [
        (1.0, "fixed", False, False),
        (1.0, "dspark", False, False),
        (1.0, BASELINE, True, False),
        (1.0, BASELINE_RESIDENT, True, True),
        (2.0, "fixed", False, False),
        (2.0, "dspark", False, False),
        (2.0, BASELINE, True, False),
        (2.0, BASELINE_RESIDENT, True, True),
    ]
    no_base = dataclasses.replace(sw, baseline=False)
    assert [p.label for p in no_base.points()] == ["fixed", "dspark", "fixed", "dspark"]


def test_the_digest_names_the_sweep_not_the_folder_it_was_read_from(scn):
    items = [("fixed", None, "fixed")]
    sw = sweep.Sweep.of(scn, 0, items, [1.0])
    assert sw.digest() == sweep.Sweep.of(scn, 0, items, [1.0]).digest()
    assert sw.digest() != sweep.Sweep.of(scn, 1, items, [1.0]).digest()
    assert sw.digest() != sweep.Sweep.of(scn, 0, items, [1.0, 2.0]).digest()
    assert sw.digest() != sweep.Sweep.of(scn, 0, [("fixed", {"k": 2}, "fixed")], [1.0]).digest()
    moved = dataclasses.replace(sw, scn=dataclasses.replace(scn, base_dir="/elsewhere/x"))
    assert moved.digest() == sw.digest()
    text = 'name = "s"\nbase_dir = "/a/b"\ntrace_path = "/a/c/t.csv"\nk = 3'
    assert sweep._portable(text, "/a/b") == 'name = "s"\ntrace_path = "../c/t.csv"\nk = 3'


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_workers_must_be_an_integer_of_at_least_one(scn, bad):
    with pytest.raises(ConfigError, match=rf"workers {bad!r}: allowed an integer >= 1"):
        compare_runs(scn, ("fixed",), workers=bad)


def test_pool_map_keeps_task_order_and_raises_the_first_failure_in_order():
    assert sweep.pool_map(int, [("3",), ("1",), ("2",)], 2) == [3, 1, 2]
    with pytest.raises(ValueError, match="'a'"):
        sweep.pool_map(int, [("1",), ("a",), ("b",), ("4",)], 2)
    seen: list[int] = []
    assert sweep.pool_map(int, [("5",), ("6",)], 1, seen.append) == [5, 6]
    assert seen == [0, 1]


def test_a_points_warning_is_raised_again_where_the_sweep_runs(scn):
    big = scn.with_overrides(
        {
            "workload.prompt": {
                "dist": "lognormal",
                "mean_tokens": 100000,
                "sigma": 2.5,
                "max_tokens": 9000000,
            }
        }
    )
    for kw in ({}, {"workers": 2}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compare_runs(big, ("fixed",), **kw)
        msgs = [(w.category, str(w.message)) for w in caught]
        assert msgs == [
            (
                SimWarning,
                (
                    "scenario 'tiny': 2 of 30 requests can never fit in KV memory (over the "
                    "323136 tokens a replica holds): rejected, counted in requests_rejected "
                    "and requests_unfinished"
                ),
            )
        ], kw
