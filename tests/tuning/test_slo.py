"""The SLO objectives of the tuner (tuning.slo): knees, the bracket search, the held-out verdict."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest

from control import make_config
from control.errors import ConfigError
from sim import load_scenario, simulate
from sim.capacity import CapacityResult, search
from tuning.config import load_tuning_config
from tuning.objective import Objective
from tuning.slo import bracket_config, capacity_row, compare, knee_config

from .conftest import ROOT, run_tune

TINY = ROOT / "configs" / "tiny.toml"
#: a tiny workload that crosses 90 % attainment in a few cheap probes (seed 0: load ~10)
SMALL = (
    '{ "deployment.max_batch" = 2, "workload.num_requests" = 16, '
    '"workload.output.mean_tokens" = 48.0 }'
)
SMALL_HELDOUT = (
    '{ "deployment.max_batch" = 2, "workload.num_requests" = 20, '
    '"workload.output.mean_tokens" = 48.0 }'
)
CONFIG = f"""
[tune]
controller = "dspark"
objective = "slo-capacity"
n_trials = 2
seed = 0
n_startup_trials = 1
sim_seeds = [0]

[[tune.workloads]]
name = "small"
scenario = "{TINY}"
overrides = {SMALL}

[evaluate]
sim_seeds = [5]
controllers = ["fixed"]
baseline_trials = 0
fixed_k = [2]

[[evaluate.workloads]]
name = "small-heldout"
scenario = "{TINY}"
overrides = {SMALL_HELDOUT}

[slo]
attainment = 0.9
"""


def _cfg(tmp_path, text: str = CONFIG, name: str = "slo.toml"):
    p = tmp_path / name
    p.write_text(text)
    return load_tuning_config(p)


def _scenario(w):
    return load_scenario(w.scenario).with_overrides(w.overrides)


def test_slo_capacity_is_the_capacity_search_of_the_same_config_and_seed(tmp_path):
    cfg = _cfg(tmp_path)
    obj = Objective(cfg)
    (w,) = cfg.tune.workloads
    scn = _scenario(w)
    # the knee: the default config's capacity over the full range
    full = search(scn, "dspark", make_config("dspark"), "d", 0, knee_config(cfg.slo))
    assert full.crossed and obj.instances[0].knee == full.capacity
    # the default config's value: its capacity searched within the bracket from the knee
    cc = bracket_config(cfg.slo, full.capacity)
    want = search(scn, "dspark", make_config("dspark"), "x", 0, cc)
    assert obj.values(make_config("dspark")) == (want.capacity,)
    assert full.capacity <= want.capacity <= full.capacity * (1 + cfg.slo.bracket)
    # another controller and config, the same knee (the study's controller's defaults set it)
    fixed = Objective(cfg, controller="fixed")
    assert fixed.instances[0].knee == full.capacity
    inside = 0
    for k in (1, 2, 3, 4):
        cfg_k = make_config("fixed", {"k": k})
        r = search(scn, "fixed", cfg_k, "fixed", 0, cc)
        got = fixed.values(cfg_k)
        assert got == (capacity_row(r, cc)["slo_capacity_load_scale"],)
        if not math.isnan(r.capacity):  # met the target inside the bracket
            assert got == (r.capacity,)
            inside += 1
    assert inside >= 1


def test_bracket_is_centred_on_the_knee():
    from tuning.config import SloSection

    cc = bracket_config(SloSection(bracket=0.2, rel_tol=0.03, attainment=0.8), 2.5)
    assert (cc.start, cc.lo, cc.hi, cc.rel_tol, cc.attainment) == (2.5, 2.0, 3.0, 0.03, 0.8)
    k = knee_config(SloSection(knee_lo=0.5, knee_hi=4.0), start=10.0)
    assert (k.start, k.lo, k.hi) == (4.0, 0.5, 4.0)


def _result(probes: list[tuple[float, float]], capacity: float, missed: float) -> CapacityResult:
    rows = [{"load_scale": x, "slo_attainment": a, "goodput_tokens_per_s": 1.0} for x, a in probes]
    crossed = not (math.isnan(capacity) or math.isnan(missed))
    return CapacityResult("c", 0, capacity, missed, crossed, 1.0, rows)


def test_capacity_row_inside_above_and_below_the_bracket():
    from tuning.config import SloSection

    cc = bracket_config(SloSection(bracket=0.2, attainment=0.9), 1.0)
    inside = capacity_row(_result([(1.0, 0.95), (1.2, 0.5), (1.1, 0.92)], 1.1, 1.2), cc)
    assert inside["slo_capacity_load_scale"] == 1.1 and inside["load_scale"] == 1.1
    assert inside["slo_capacity_below_bracket"] == inside["slo_capacity_above_bracket"] == 0.0
    above = capacity_row(_result([(1.0, 0.95), (1.2, 0.91)], 1.2, math.nan), cc)
    assert above["slo_capacity_load_scale"] == 1.2 and above["slo_capacity_above_bracket"] == 1
    # below: the bracket's bottom times attainment there over the target
    below = capacity_row(_result([(1.0, 0.6), (0.8, 0.45)], math.nan, 0.8), cc)
    assert below["slo_capacity_load_scale"] == pytest.approx(0.8 * 0.45 / 0.9, rel=1e-15)
    assert below["slo_capacity_below_bracket"] == 1.0 and below["load_scale"] == 0.8
    nothing = capacity_row(_result([(1.0, math.nan), (0.8, math.nan)], math.nan, 0.8), cc)
    assert nothing["slo_capacity_load_scale"] == 0.0


def test_knee_goodput_is_slo_goodput_at_the_knee(tmp_path):
    cfg = _cfg(tmp_path, CONFIG.replace('"slo-capacity"', '"slo-knee-goodput"'))
    cfg = dataclasses.replace(cfg, slo=dataclasses.replace(cfg.slo, knee_load=1.1))
    obj = Objective(cfg)
    (w,) = cfg.tune.workloads
    knee = obj.instances[0].knee
    s = simulate(
        _scenario(w), "dspark", make_config("dspark"), seed=0, baseline=False, load_scale=knee * 1.1
    ).summary
    assert obj.values(make_config("dspark")) == (s["goodput_tokens_per_s"],)


def _rows(values: dict[tuple[str, int], tuple[float, float]]) -> pd.DataFrame:
    """(workload, seed) -> (tuned, default) as evaluation rows."""
    out = []
    for (w, s), (t, d) in values.items():
        out.append({"controller": "x-tuned", "workload": w, "seed": s, "m": t})
        out.append({"controller": "x-default", "workload": w, "seed": s, "m": d})
        out.append({"controller": "fixed-best", "workload": w, "seed": s, "m": 99.0})
    return pd.DataFrame(out)


SENTENCE = "tuning does not beat the default by more than the spread"


def test_verdict_beats_the_spread():
    # gains +6 %, +8 % on a; +5 %, +7 % on b: mean 6.5 %, seed spread ±1 %
    rows = _rows({("a", 1): (1.06, 1.0), ("a", 2): (2.16, 2.0), ("b", 1): (1.05, 1.0),
                  ("b", 2): (1.07, 1.0)})  # fmt: skip
    v = compare(rows, "x-tuned", "x-default", "m", floor=0.02)
    assert v["gain"] == pytest.approx(0.065, abs=1e-12)
    assert v["spread"] == pytest.approx(0.01, abs=1e-12) and v["threshold"] == 0.02
    assert v["within_spread"] is False and v["pairs"] == 4
    assert not any(SENTENCE in line for line in v["lines"])
    assert "+6.5%" in v["lines"][-1] and "better on 2 of 2 workloads" in v["lines"][-1]


def test_verdict_within_the_spread():
    # gains -4 % and +8 % on one workload: mean +2 %, seed spread ±6 %
    v = compare(_rows({("a", 1): (0.96, 1.0), ("a", 2): (1.08, 1.0)}), "x-tuned", "x-default", "m")
    assert v["gain"] == pytest.approx(0.02, abs=1e-12)
    assert v["spread"] == pytest.approx(0.06, abs=1e-12) and v["within_spread"] is True
    assert v["lines"][-1].startswith(SENTENCE) and "+2.0% against ±6.0%" in v["lines"][-1]
    assert sum(SENTENCE in line for line in v["lines"]) == 1


def test_verdict_floor_and_direction():
    # one seed: no spread, but a gain below the search's precision is no gain
    small = _rows({("a", 1): (1.015, 1.0)})
    assert compare(small, "x-tuned", "x-default", "m", floor=0.02)["within_spread"] is True
    assert compare(small, "x-tuned", "x-default", "m", floor=0.01)["within_spread"] is False
    # lower is better (p99 TPOT): tuned 0.08 s against default 0.1 s is a +25 % gain
    lower = compare(_rows({("a", 1): (0.08, 0.1)}), "x-tuned", "x-default", "m", maximize=False)
    assert lower["gain"] == pytest.approx(0.25, abs=1e-12) and lower["within_spread"] is False
    # a loss is never beyond the spread
    loss = compare(_rows({("a", 1): (0.9, 1.0)}), "x-tuned", "x-default", "m")
    assert loss["within_spread"] is True and loss["lines"][-1].startswith(SENTENCE)
    # a pair without a value is left out and said so
    gap = compare(
        _rows({("a", 1): (1.2, 1.0), ("a", 2): (math.nan, 1.0)}), "x-tuned", "x-default", "m"
    )
    assert gap["pairs"] == 1 and gap["left_out"] == 1 and "1 pair(s) left out" in gap["lines"][-1]


@pytest.mark.parametrize(
    "line, key",
    [
        ("ttft_s = 0.0", "slo.ttft_s = 0.0 is out of range"),
        ("tpot_s = -0.05", "slo.tpot_s = -0.05 is out of range"),
        ("attainment = 0.0", "slo.attainment = 0.0 is out of range"),
        ("attainment = 1.5", "slo.attainment = 1.5 is out of range"),
        ("knee_hi = 0.01", "slo.knee_lo = 0.05 must be below slo.knee_hi = 0.01"),
    ],
)
def test_bad_slo_table_is_one_line_naming_the_key(tmp_path, line, key):
    text = CONFIG.replace("attainment = 0.9", line)
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, text)
    assert key in str(e.value) and "\n" not in str(e.value)
    assert str(tmp_path / "slo.toml") in str(e.value)


def test_slo_times_reach_every_workload_and_are_needed(tmp_path):
    cfg = _cfg(tmp_path, CONFIG.replace("attainment = 0.9", "ttft_s = 3.0\ntpot_s = 0.04"))
    for w in (*cfg.tune.workloads, *cfg.evaluate.workloads):
        assert (_scenario(w).slo.ttft_s, _scenario(w).slo.tpot_s) == (3.0, 0.04)
    # a workload's own override wins
    own = CONFIG.replace("attainment = 0.9", "ttft_s = 3.0").replace(
        '"workload.output.mean_tokens" = 48.0 }', '"workload.output.mean_tokens" = 48.0, '
        '"slo.ttft_s" = 0.5 }'
    )  # fmt: skip
    assert _scenario(_cfg(tmp_path, own).tune.workloads[0]).slo.ttft_s == 0.5
    # a scenario without [slo] under an SLO objective: one line naming the workload
    bare = CONFIG.replace(f'scenario = "{TINY}"\noverrides = {SMALL_HELDOUT}',
                          f'scenario = "{ROOT / "configs" / "a100_70b.toml"}"')  # fmt: skip
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, bare)
    msg = str(e.value)
    assert "evaluate.workloads[0] ('small-heldout')" in msg and "has no [slo] table" in msg


def test_knee_outside_the_range_is_one_line(tmp_path):
    cfg = _cfg(tmp_path, CONFIG.replace("attainment = 0.9", "knee_lo = 0.01\nknee_hi = 0.1"))
    with pytest.raises(ConfigError) as e:
        Objective(cfg)
    msg = str(e.value)
    assert "workload 'small' (seed 0)" in msg and "range searched [0.01, 0.1]" in msg
    assert "met the 0.9 attainment target at load scale 0.1" in msg and "\n" not in msg


def test_tune_reports_tuned_against_default_on_capacity(tmp_path):
    from tuning.run import tune

    cfg = _cfg(tmp_path)
    s = tune(cfg, tmp_path / "run", storage="memory", workers=1)
    cap = pd.read_csv(tmp_path / "run" / "heldout_capacity.csv")
    assert set(cap["controller"]) == {"dspark-tuned", "dspark-default", "fixed-best"}
    (w,) = cfg.evaluate.workloads
    row = cap[cap["controller"] == "dspark-default"]
    d = row["capacity_load_scale"].item()
    full = search(_scenario(w), "dspark", make_config("dspark"), "d", 5, knee_config(cfg.slo))
    assert d == full.capacity and row["probes"].item() == len(full.probes)
    assert row["capacity_rps"].item() == full.offered_rps
    v = s["tuned_vs_default"]
    t = cap[cap["controller"] == "dspark-tuned"]["capacity_load_scale"].item()
    assert v["gain"] == pytest.approx(t / d - 1.0, rel=1e-12)
    assert v["within_spread"] == (t / d - 1.0 <= cfg.slo.knee_rel_tol)
    assert any(SENTENCE in line for line in v["lines"]) == v["within_spread"]
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["tuned_vs_default"]["lines"] == v["lines"]
    # trial 0 is the default config: its value is its bracket search from the knee
    assert s["objective"] == "slo-capacity"


@pytest.mark.slow
def test_cli_bad_slo_is_one_line_exit_2(tmp_path):
    p = tmp_path / "slo.toml"
    p.write_text(CONFIG.replace("attainment = 0.9", "tpot_s = 0"))
    r = run_tune(str(p), "--out", str(tmp_path / "o"), "--quiet", timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("dspark: error: ") and "slo.tpot_s = 0.0 is out of range" in lines[0]


def test_standard_config_asks_the_slo_question_on_open_loop_workloads():
    cfg = load_tuning_config(ROOT / "configs" / "tune_standard.toml")
    assert cfg.tune.objective == "slo-capacity" and cfg.slo.attainment == 0.9
    for w in cfg.tune.workloads:
        assert _scenario(w).workload.arrival == "poisson"  # open loop, not capacity mode
    slos = {
        w.name: (_scenario(w).slo.ttft_s, _scenario(w).slo.tpot_s) for w in cfg.evaluate.workloads
    }
    assert slos["a100-70b"] == slos["azure-conv"] == (2.0, 0.05)


def test_fork_map_keeps_the_order_of_the_serial_map():
    from tuning.slo import fork_map

    jobs = [-3, 2, -1, 0, 5]
    assert fork_map(abs, jobs, 2) == fork_map(abs, jobs, 1) == [3, 2, 1, 0, 5]


@pytest.mark.slow
def test_cli_tune_prints_the_verdict_on_the_studys_measure(tmp_path):
    tiny = ROOT / "configs" / "tune_tiny.toml"
    out = tmp_path / "o"
    r = run_tune(str(tiny), "--trials", "3", "--storage", "memory", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    v = json.loads((out / "summary.json").read_text())["tuned_vs_default"]
    assert v["metric"] == "throughput_tokens_per_s" and v["lines"]
    printed = r.stdout.splitlines()
    assert all(line in printed for line in v["lines"])
    assert any(SENTENCE in line for line in printed) == v["within_spread"]
