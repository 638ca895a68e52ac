"""sim.collectives: the measured all-reduce fit the TP model takes instead of datasheet values."""

import pytest

from control.errors import DSparkError
from sim.collectives import LayerCost, fit_allreduce
from sim.hardware import HardwareConfig


def _csv(tmp_path, lat=2e-4, bw=5e8, tp=2):
    rows = ["kind,tp,tokens,elements,bytes,seconds"]
    for t in (1, 4, 16, 64):
        b = t * 384 * 2
        rows.append(f"all_reduce,{tp},{t},{t * 384},{b},{lat + b * 2 * (tp - 1) / tp / bw}")
        rows.append(f"layer,{tp},{t},{t * 384},{b},{1e-3 + 1e-5 * t}")
    p = tmp_path / "collectives.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_fit_recovers_latency_and_ring_bandwidth_exactly(tmp_path):
    for tp in (2, 4):
        lat, bw = fit_allreduce(_csv(tmp_path, tp=tp))
        assert lat == pytest.approx(2e-4, rel=1e-9) and bw == pytest.approx(5e8, rel=1e-9)
    hw = HardwareConfig(collectives_path=str(_csv(tmp_path))).resolved()
    assert hw.allreduce_latency_s == pytest.approx(2e-4, rel=1e-9)
    assert hw.nvlink_bytes_s * hw.nvlink_efficiency == pytest.approx(5e8, rel=1e-9)
    # an explicit latency still wins
    hw = HardwareConfig(collectives_path=str(_csv(tmp_path)), allreduce_latency_s=1e-5).resolved()
    assert hw.allreduce_latency_s == 1e-5


def test_layer_cost_interpolates_and_clamps(tmp_path):
    c = LayerCost(_csv(tmp_path))
    assert c(4) == pytest.approx(1e-3 + 4e-5) and c(10) == pytest.approx(1e-3 + 1e-4)
    assert c(0) == pytest.approx(1e-3 + 1e-5) and c(1000) == pytest.approx(1e-3 + 64e-5)


def test_bad_tables_are_one_line_errors(tmp_path):
    with pytest.raises(DSparkError, match="not found"):
        fit_allreduce(tmp_path / "nope.csv")
    p = tmp_path / "c.csv"
    p.write_text("kind,tp,tokens,bytes,seconds\nall_reduce,1,1,8,0.1\n")
    with pytest.raises(DSparkError, match="tp >= 2"):
        fit_allreduce(p)
    p.write_text("kind,tp,tokens,bytes\n")
    with pytest.raises(DSparkError, match="lacks column 'seconds'"):
        fit_allreduce(p)
