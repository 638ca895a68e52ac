"""Capacity at SLO: attainment per run, the bisection, the command's refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from control.errors import ConfigError
from sim import capacity as cap
from sim import load_scenario
from sim.capacity import CapacityConfig, search, summarize_capacity
from sim.metrics import slo_attainment


def test_attainment_counts_both_slos_and_unfinished_requests_as_misses():
    class Slo:
        ttft_s, tpot_s = 1.0, 0.05

    m = {
        "finished": np.array([True, True, True, True, False, True]),
        "ttft": np.array([0.5, 1.5, 0.5, 0.5, np.nan, 0.2]),
        "tpot": np.array([0.04, 0.01, 0.06, np.nan, np.nan, 0.05]),
    }
    measured = np.array([True, True, True, True, True, False])
    # request 0 meets both, 1 misses TTFT, 2 misses TPOT, 3 has one token (no TPOT) and meets,
    # 4 never finished, 5 is not measured (warm-up)
    assert slo_attainment(m, measured, Slo) == pytest.approx(2 / 5)
    assert math.isnan(slo_attainment(m, np.zeros(6, dtype=bool), Slo))


def _fake(monkeypatch, knee: float):
    calls = []

    def probe(scn, name, cfg, label, seed, x):
        calls.append(x)
        a = 1.0 if x <= knee else 0.5
        return dict.fromkeys(cap.PROBE_KEYS, 0.0) | {
            "slo_attainment": a,
            "load_scale": x,
            "offered_rps": 10.0 * x,
        }

    monkeypatch.setattr(cap, "_probe", probe)
    return calls


@pytest.mark.parametrize("knee", [0.07, 0.4, 1.0, 1.37, 9.9])
def test_bisection_brackets_the_knee_within_the_tolerance(monkeypatch, knee):
    calls = _fake(monkeypatch, knee)
    cc = CapacityConfig(rel_tol=0.01)
    r = search(None, "fixed", None, "x", 0, cc)
    assert r.crossed
    assert r.capacity <= knee < r.missed
    assert r.missed / r.capacity - 1.0 <= 0.01
    assert r.offered_rps == pytest.approx(10.0 * r.capacity)
    assert len(r.probes) == len(calls)
    # doubling or halving to the bracket, then halving its log-width each probe
    assert len(calls) <= 2 + abs(math.log2(knee)) + math.log2(math.log(2.0) / math.log(1.01)) + 1


def test_a_range_that_never_crosses_is_reported_not_crossed(monkeypatch):
    _fake(monkeypatch, 100.0)
    r = search(None, "fixed", None, "x", 0, CapacityConfig(hi=20.0))
    assert not r.crossed and r.capacity == 20.0 and math.isnan(r.missed)
    _fake(monkeypatch, 0.001)
    r = search(None, "fixed", None, "x", 0, CapacityConfig(lo=0.05))
    assert not r.crossed and math.isnan(r.capacity) and r.missed == 0.05
    rows = summarize_capacity([r])
    assert rows[0]["crossed"] is False and math.isnan(rows[0]["capacity_load_scale"])


def test_config_refuses_attainment_outside_0_1_and_a_start_outside_the_range():
    with pytest.raises(ConfigError, match="attainment"):
        CapacityConfig(attainment=1.5)
    with pytest.raises(ConfigError, match="attainment"):
        CapacityConfig(attainment=0.0)
    with pytest.raises(ConfigError, match="start"):
        CapacityConfig(start=30.0, hi=20.0)


def test_the_real_search_on_the_tiny_scenario_meets_the_target_at_its_capacity():
    scn = load_scenario(
        "configs/tiny.toml",
        {"workload.num_requests": 120, "slo.ttft_s": 0.5, "slo.tpot_s": 0.02},
    )
    r = search(scn, "fixed", {"k": 1}, "fixed:k=1", 3, CapacityConfig(rel_tol=0.05))
    assert r.crossed
    by = {p["load_scale"]: p["slo_attainment"] for p in r.probes}
    assert by[r.capacity] >= 0.9 > by[r.missed]
    # the probes ran on identical arrivals: offered rate proportional to the load scale
    rates = {p["load_scale"]: p["offered_rps"] for p in r.probes}
    ratio = [v / k for k, v in rates.items()]
    assert max(ratio) == pytest.approx(min(ratio))


def _dspark(*args):
    return subprocess.run(
        [sys.executable, "-m", "dspark", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_capacity_command_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path):
    text = open("configs/tiny.toml").read()
    head, _, tail = text.partition("[slo]")
    rest = tail.split("\n[", 1)
    noslo = tmp_path / "noslo.toml"
    noslo.write_text(head + ("[" + rest[1] if len(rest) > 1 else ""))
    out = tmp_path / "run"
    cases = [
        ([str(noslo)], "no [slo] table"),
        (["configs/tiny.toml", "--attainment", "1.5"], "--attainment"),
        (["configs/tiny.toml", "--range", "2,1"], "--range"),
        (["configs/tiny.toml", "--set", "slo.tpot_s=0"], "slo.tpot_s"),
        (
            ["configs/tiny.toml", "--controller", "fixed:k=1", "--range", "0.5,0.6"],
            "never crosses",
        ),
    ]
    for args, needle in cases:
        r = _dspark("capacity", *args, "--out", str(out))
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert not out.exists()


@pytest.mark.slow
def test_capacity_command_writes_a_run_folder(tmp_path):
    scn = "configs/tiny.toml"
    out = tmp_path / "run"
    r = _dspark(
        "capacity",
        str(scn),
        "--controller",
        "fixed:k=1",
        "--seeds",
        "1",
        "--set",
        "workload.num_requests=120",
        "--set",
        "slo.ttft_s=0.5",
        "--set",
        "slo.tpot_s=0.02",
        "--rel-tol",
        "0.1",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "capacity" and summary["slo"] == {"ttft_s": 0.5, "tpot_s": 0.02}
    (row,) = summary["rows"]
    assert row["controller"] == "fixed:k=1" and row["crossed"]
    import pandas as pd

    probes = pd.read_csv(out / "probes.csv")
    at = probes.loc[probes.load_scale == row["capacity_load_scale"], "slo_attainment"]
    assert float(at.iloc[0]) >= 0.9
