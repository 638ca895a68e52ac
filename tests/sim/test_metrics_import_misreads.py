"""Scrapes that would calibrate silently wrong are refused in one line: a series exposed twice
(it was summed, doubling the counter), more tokens accepted than drafted, and --num-steps 0 (it
fell back to the file's value)."""

from __future__ import annotations

import json

import pytest

from control.errors import DSparkError
from sim.metrics_import import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    SpecCounts,
    calibrate_sglang,
    calibrate_vllm,
    vllm_scrape,
)

BASE = SpecCounts(10.0, 30.0, 17.0, (8.0, 6.0, 3.0))
MORE = SpecCounts(20.0, 60.0, 34.0, (16.0, 12.0, 6.0))


def _pair(tmp_path, before: str, after: str) -> tuple[str, str]:
    b, a = tmp_path / "b.prom", tmp_path / "a.prom"
    b.write_text(before)
    a.write_text(after)
    return str(b), str(a)


def test_a_series_exposed_twice_is_refused(tmp_path):
    after = vllm_scrape(MORE)
    line = next(x for x in after.splitlines() if x.startswith(DRAFTS))
    b, a = _pair(tmp_path, vllm_scrape(BASE), after + line + "\n")
    with pytest.raises(DSparkError) as e:
        calibrate_vllm(b, a)
    assert str(e.value) == f'{a}: {DRAFTS}{{engine="0",model_name="model"}} appears twice'
    # two engines are two series: summed, as before
    b, a = _pair(
        tmp_path,
        vllm_scrape(BASE) + vllm_scrape(BASE, engine="1").replace("# TYPE", "#"),
        vllm_scrape(MORE) + vllm_scrape(MORE, engine="1").replace("# TYPE", "#"),
    )
    assert calibrate_vllm(b, a).counts == SpecCounts(20.0, 60.0, 34.0, (16.0, 12.0, 6.0))


def test_more_accepted_than_drafted_is_refused(tmp_path):
    odd = SpecCounts(20.0, 40.0, 34.0, (16.0, 12.0, 6.0))  # 17 accepted of 10 drafted
    b, a = _pair(tmp_path, vllm_scrape(BASE), vllm_scrape(odd))
    with pytest.raises(DSparkError) as e:
        calibrate_vllm(b, a)
    assert str(e.value) == (
        f"{b} -> {a}: {ACCEPTED} moved by 17, more than {DRAFT_TOKENS} (10): more tokens "
        "accepted than drafted"
    )


def test_num_steps_below_1_is_refused(tmp_path):
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"avg_spec_accept_length": 1.875, "speculative_num_steps": 3}))
    assert calibrate_sglang(str(info)) == pytest.approx((0.5, 1.875, 3))
    with pytest.raises(DSparkError, match=r"^--num-steps 0: allowed an integer >= 1$"):
        calibrate_sglang(str(info), num_steps=0)
