"""``benchmarks/slo_value.py``'s controller specs: a tuned ``best_config.toml`` enters as the
controller name and its checked config, the entry the simulator's capacity search takes."""

import importlib.util
import math
import sys
from pathlib import Path

from control.dspark import DSparkConfig
from sim import load_scenario
from sim.api import resolve_controller_config

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("slo_value", _ROOT / "benchmarks" / "slo_value.py")
sv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sv)


def test_a_tuned_config_is_a_name_and_its_config(tmp_path):
    best = tmp_path / "best_config.toml"
    best.write_text("[controller.dspark]\nslo_spread = 0.2\nk_max = 9\n")
    name, cfg, label = sv.parse_spec("dspark-tuned", str(best))
    assert (name, label) == ("dspark", "dspark-tuned")
    assert isinstance(cfg, DSparkConfig) and (cfg.slo_spread, cfg.k_max) == (0.2, 9)
    scn = load_scenario(_ROOT / "configs" / "tiny.toml")
    assert resolve_controller_config(scn, name, cfg) == cfg


def test_plain_and_keyed_specs():
    assert sv.parse_spec("fixed", None) == ("fixed", None, "fixed")
    assert sv.parse_spec("fixed:k=3", None) == ("fixed", {"k": 3}, "fixed:k=3")


def test_the_shipped_knee_config_is_a_spec_of_its_own():
    # configs/dspark_knee.toml as its results entry runs it: the calibrated prediction, the
    # narrow spread, the history over a sequence's expected remaining output and the wide view
    # while prompts queue, the TTFT value cap it was measured with, every other key at its
    # default
    name, cfg, label = sv.parse_spec(f"dspark@{_ROOT / 'configs' / 'dspark_knee.toml'}", None)
    assert (name, label) == ("dspark", "dspark@dspark_knee")
    assert cfg == {
        "slo_calibrate": True,
        "slo_spread": 0.1,
        "slo_life_horizon": 1.0,
        "slo_congested_wait": 0.5,
        "ttft_value_max": 8.0,
        "slo_rank_hurdle": 0.0,
    }
    scn = load_scenario(_ROOT / "configs" / "standard.toml")
    checked = resolve_controller_config(scn, name, cfg)
    assert checked == DSparkConfig(
        slo_calibrate=True,
        slo_spread=0.1,
        slo_life_horizon=1.0,
        slo_congested_wait=0.5,
        ttft_value_max=8.0,
        slo_rank_hurdle=0.0,
    )


def test_specs_split_on_semicolons_when_one_holds_commas():
    assert sv.split_specs("fixed:k=1,dspark") == ["fixed:k=1", "dspark"]
    assert sv.split_specs("fixed:k=1;dspark:slo_calibrate=true,slo_spread=0.1;") == [
        "fixed:k=1",
        "dspark:slo_calibrate=true,slo_spread=0.1",
    ]
    name, cfg, _ = sv.parse_spec("dspark:slo_calibrate=true,slo_spread=0.1", None)
    assert (name, cfg) == ("dspark", {"slo_calibrate": True, "slo_spread": 0.1})


def test_a_bad_spec_is_one_line_naming_it_before_any_run():
    import pytest

    from control.errors import DSparkError

    assert [i[2] for i in sv.parse_specs(["fixed:k=1", "dspark"], None)] == ["fixed:k=1", "dspark"]
    for bad, says in (
        ("dspark:k_max=1", "k_min = 3 > k_max = 1"),  # (k_min's default is 3)
        ("dspark:no_such_key=2", "no_such_key"),
        ("no-such-controller", "no-such-controller"),
    ):
        with pytest.raises(DSparkError) as e:
            sv.parse_specs(["fixed:k=1", bad], None)
        msg = str(e.value)
        assert "\n" not in msg and repr(bad) in msg and says in msg


def test_the_paired_line_compares_seed_by_seed():
    line = sv.paired_line({1: 1.2, 2: 1.5, 3: 1.0}, {3: 1.0, 1: 1.25, 2: 1.5})
    assert line == "by seed 0.960 1.000 1.000 (below on 1, level on 2, above on 0 of 3)"
    assert sv.paired_line({1: 1.3, 4: 1.0}, {1: 1.2}).endswith(
        "(below on 0, level on 0, above on 1 of 1)"
    )


def test_paired_ratio_is_the_ratio_of_means_with_an_interval_inside_the_seeds_ratios():
    mine = {1: 90.0, 2: 200.0, 3: 120.0, 4: 50.0}
    theirs = {1: 100.0, 2: 180.0, 3: 120.0, 4: 60.0, 5: 70.0}  # seed 5: only the other ran it
    r, lo, hi = sv.paired_ratio(mine, theirs)
    assert r == (90 + 200 + 120 + 50) / (100 + 180 + 120 + 60)
    by_seed = [mine[s] / theirs[s] for s in mine]
    # a ratio of sums lies between the smallest and largest of its terms' ratios
    assert min(by_seed) <= lo <= r <= hi <= max(by_seed) and lo < hi
    assert sv.paired_ratio(mine, theirs) == (r, lo, hi)  # seeded
    assert sv.paired_ratio({1: 2.0, 2: 4.0}, {1: 1.0, 2: 2.0}) == (2.0, 2.0, 2.0)
    assert sv.paired_ratio({7: 3.0}, {7: 2.0}) == (1.5, 1.5, 1.5)
    assert all(math.isnan(x) for x in sv.paired_ratio({1: 3.0}, {1: 0.0}))
    assert all(math.isnan(x) for x in sv.paired_ratio({1: 3.0}, {2: 1.0}))


def test_paired_ratio_of_medians_reads_the_seeds_as_the_capacity_table_does():
    mine = {1: 1.20, 2: 1.25, 3: 1.10, 4: 1.30, 5: 1.22}
    theirs = {1: 1.25, 2: 1.25, 3: 1.15, 4: 1.25, 5: 1.20}
    r, lo, hi = sv.paired_ratio(mine, theirs, "median")
    assert r == 1.22 / 1.25  # the medians' ratio, not the mean of the seeds' ratios
    assert lo <= r <= hi and lo < hi
    # resampled medians stay among the seeds' own values
    assert min(mine.values()) / max(theirs.values()) <= lo
    assert hi <= max(mine.values()) / min(theirs.values())
    # a controller ahead by the same factor on every seed: no spread at all
    scaled = {s: 1.02 * v for s, v in theirs.items()}
    r2, lo2, hi2 = sv.paired_ratio(scaled, theirs, "median")
    assert math.isclose(r2, 1.02) and math.isclose(lo2, 1.02) and math.isclose(hi2, 1.02)
