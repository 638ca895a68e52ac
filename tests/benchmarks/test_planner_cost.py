"""``benchmarks/planner_cost.py``: its last line parses, and its synthetic batch keeps B."""

import importlib.util
import math
from pathlib import Path

import pytest

from sim import load_scenario

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "planner_cost.py"
_spec = importlib.util.spec_from_file_location("planner_cost", _PATH)
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)


def test_the_last_line_is_the_four_keys_in_order_and_parses_back():
    values = {
        "planner_us_b16": 87.25,
        "planner_us_b256": 291.0,
        "planner_share_h100": 0.00412,
        "sim_dspark_vs_fixed": 0.5312,
    }
    line = pc.last_line(values)
    assert line == (
        "planner_us_b16=87.2 planner_us_b256=291.0 planner_share_h100=0.004120 "
        "sim_dspark_vs_fixed=0.5312"
    )
    assert pc.parse_last_line(line) == {**values, "planner_us_b16": 87.2}
    big = pc.last_line({**values, "planner_us_b256": 14353.26})
    assert "planner_us_b256=14353.3 " in big  # no exponent


@pytest.mark.parametrize(
    "bad",
    [
        "planner_us_b16=1 planner_us_b256=2 planner_share_h100=3",
        "planner_us_b256=2 planner_us_b16=1 planner_share_h100=3 sim_dspark_vs_fixed=4",
        "planner_us_b16=1 planner_us_b256=2 planner_share_h100=x sim_dspark_vs_fixed=4",
        "planner_us_b16 planner_us_b256=2 planner_share_h100=3 sim_dspark_vs_fixed=4",
    ],
)
def test_other_lines_are_refused(bad):
    with pytest.raises(ValueError):
        pc.parse_last_line(bad)


def test_tau_stops_drafting_at_the_first_confidence_below_it():
    assert pc.drafted([0.9, 0.8, 0.2, 0.95], 0.5) == 2
    assert pc.drafted([0.9, 0.8, 0.2, 0.95], 0.0) == 4
    assert pc.drafted([0.1], 0.5) == 0


@pytest.mark.parametrize("pattern", pc.PATTERNS)
def test_the_synthetic_batch_stays_full_and_its_sequences_come_and_go(pattern):
    scn = load_scenario(pc.SCENARIO)
    batch = pc.Batch(scn, 8, pattern, seed=1)
    first = list(batch.members)  # held, so that no new member takes a freed one's id
    for _ in range(200):
        ctx = sum(batch.context)
        times = batch.round()
        assert len(batch.members) == len(batch.context) == len(batch.left) == 8
        assert all(t >= 0 and math.isfinite(t) for t in times)
        assert min(batch.left) >= 1 and batch.now > 0
    # some finished and were replaced
    assert ctx > 0 and set(map(id, first)) - set(map(id, batch.members))


def test_set_reaches_the_planner_and_its_members_and_a_bad_key_is_one_line(capsys):
    scn = load_scenario(pc.SCENARIO)
    batch = pc.Batch(scn, 4, "engine", seed=1, cfg={"replan_backoff": 3})
    assert batch.planner.config.replan_backoff == 3
    assert all(m.config.replan_backoff == 3 for m in batch.members)
    assert pc.main(["--set", "no_such_key=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_key" in err[0]


def test_the_planner_timed_apart_is_part_of_the_run_and_changes_nothing():
    import sim_speed

    from control.dspark_planner import DSparkPlanner

    before = {n: DSparkPlanner.__dict__[n] for n in pc.PLANNER_CALLS}
    scn = load_scenario(pc.SCENARIO)
    part = pc.planner_part(scn, 0.003)
    plain = sim_speed.measure(scn, "dspark", None, 0.003)
    assert {n: DSparkPlanner.__dict__[n] for n in pc.PLANNER_CALLS} == before  # put back
    assert 0.0 < part["planner_s"] < part["cpu_s"]
    assert part["tokens"] == plain["tokens"] > 0  # the same run, timed by parts
