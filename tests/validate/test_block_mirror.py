"""The mirror of a block drafter's engine (validate.mirror): its scenario says draft kind block
with the engine's B, and the acceptance fitted on calibration rounds is the per-position curve."""

from __future__ import annotations

import pytest

from control.configio import read_toml
from control.types import RoundRecord
from validate.mirror import fit_acceptance, position_rates, write_scenario


def _rec(drafted: int, accepted: int) -> RoundRecord:
    return RoundRecord(
        request_id=0,
        round=0,
        now_s=0.0,
        k=drafted,
        drafted=drafted,
        accepted=accepted,
        emitted=accepted + 1,
        draft_s=0.0,
        verify_s=0.0,
        context_tokens=10,
        confidences=(0.9,) * drafted,
    )


def test_position_rates_are_conditional_acceptance_per_block_position():
    # position 1 decided by all 4 rounds, 3 passed; position 2 by the 3 that passed 1 (one
    # of which drafted only 1: not decided there), so 2 decided, 1 passed; position 3 by 1,
    # passed 0; position 4 never reached: the last rate repeats
    recs = [_rec(3, 0), _rec(1, 1), _rec(3, 1), _rec(3, 2)]
    assert position_rates(recs, 4) == pytest.approx((3 / 4, 1 / 2, 0.0, 0.0))
    fit = fit_acceptance(recs, block=4)
    assert fit["model"] == "curve"
    assert fit["position_rates"] == pytest.approx([3 / 4, 1 / 2, 0.0, 0.0])
    assert fit["rate"] == pytest.approx(4 / (4 + 3))  # the i.i.d. MLE is still reported
    assert fit_acceptance(recs)["model"] == "iid"
    assert "position_rates" not in fit_acceptance(recs)


def test_block_engine_scenario_says_kind_block_with_its_block_size(tmp_path):
    table = tmp_path / "latency.csv"
    table.write_text("model,batch,new_tokens,context_tokens,seconds\ntarget,1,1,0,0.01\n")
    args = (tmp_path, "x", table, 0.0, 16, [50, 60], [8, 8], None, {"model": "iid", "rate": 0.5})
    block = read_toml(write_scenario(tmp_path / "b", *args[1:], {"fixed": {"k": 3}}, 7))
    assert block["draft"] == {"kind": "block", "block_size": 7}
    ar = read_toml(write_scenario(tmp_path / "a", *args[1:], {"fixed": {"k": 3}}))
    assert "draft" not in ar
