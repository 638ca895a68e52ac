"""``benchmarks/controller_value.py``: the B = 256 target's bound on the clairvoyant cells."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "controller_value.py"
_spec = importlib.util.spec_from_file_location("controller_value", _PATH)
cv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cv)


def _cell(regime: str, load: str, glob_value: float, best: float, rate: float, tuned: float, clv):
    fixed = dict.fromkeys(cv.FIXED_K, 0.5)
    fixed[2] = glob_value
    return {
        "regime": regime,
        "load": load,
        "metric": "throughput",
        "fixed": fixed,
        "best": best,
        "v": {"rate-oracle": rate, "dspark-tuned": tuned, "clairvoyant": clv},
    }


def test_needed_share_is_the_target_over_what_the_held_cells_and_the_clairvoyant_give():
    cells = [
        _cell("iid-0.75", "B=256", 100.0, 101.0, 103.0, 102.0, 110.0),  # causal best 1.03
        _cell("markov", "B=256", 100.0, 100.0, 100.0, 100.0, 120.0),
        _cell("decay", "B=256", 100.0, 100.0, 100.0, 100.0, 105.0),
        _cell("markov", "B=1", 100.0, 100.0, 100.0, 100.0, 999.0),  # other loads do not count
    ]
    share = cv.b256_needed_share(cells, 2, ("iid",))
    want = (cv.B256_TARGET**3 / 1.03 / (1.20 * 1.05)) ** 0.5
    assert share == pytest.approx(want)
    # every cell held: nothing left to ask of
    assert cv.b256_needed_share(cells, 2, ("iid", "markov", "decay")) is None


def test_tpot_cells_count_lower_as_better():
    c = _cell("iid-0.75", "B=256", 2.0, 1.0, 1.0, 1.0, 1.0)
    c["metric"] = "tpot"
    assert cv._vs_glob(c, 1.0, 2) == pytest.approx(2.0)  # half the TPOT: twice as good


def _peer_cell(load: str, dspark: list[float], peer: list[float]) -> dict:
    seeds = {"dspark-default": ";".join(map(str, dspark)), "vllm-dsd": ";".join(map(str, peer))}
    v = {"dspark-default": sum(dspark) / len(dspark), "vllm-dsd": sum(peer) / len(peer)}
    return {"regime": "r", "load": load, "metric": "throughput", "v": v, "per_seed": seeds}


def test_a_peer_ahead_is_told_apart_from_seed_noise_by_the_paired_standard_error(capsys):
    """A cell where the peer leads by 2% on every seed is ahead by more than two standard
    errors; one where it leads by 1.5% on average but trails on a seed is not."""
    steady = _peer_cell("B=1", [98.0, 98.0, 98.0], [100.0, 100.0, 100.0])
    noisy = _peer_cell("B=2", [96.0, 101.5, 98.0], [100.0, 100.0, 100.0])
    even = _peer_cell("B=3", [100.0, 100.0], [100.0, 100.0])
    cv.peers_line([steady, noisy, even])
    line = capsys.readouterr().out.splitlines()[0]
    assert "below 0.99 in 2 of 3 cells" in line
    assert "r B=1 0.9800 ± 0.0000" in line and "r B=2 0.9850 ± 0.0161" in line
    assert line.endswith("by more than two standard errors in 1")


def test_a_load_no_regime_has_is_one_line_before_any_run(capsys):
    assert cv.main(["--regimes", "beta-0.75", "--loads", "B=100"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["error: no cell has a regime in 'beta-0.75' and a load in 'B=100'"]
