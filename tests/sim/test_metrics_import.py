"""Calibration from vLLM's Prometheus counters, its per-request summaries and SGLang's
/server_info: recovery of a simulated run's per-position acceptance from scrapes made with the
documented names and labels, the per-request spread, and one-line errors naming the metric."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from control.errors import DSparkError
from dspark.cli import main
from sim.acceptance import AcceptanceConfig, AcceptanceModel
from sim.api import simulate
from sim.config import load_scenario
from sim.metrics_import import (
    ACCEPTED,
    DRAFTS,
    PER_POS,
    SpecCounts,
    beta_concentration,
    calibrate_counts,
    calibrate_sglang,
    calibrate_vllm,
    counts_of_rounds,
    iid_rate,
    vllm_scrape,
)

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
CURVE = (0.85, 0.7, 0.6, 0.5)


def run_rates(rounds) -> list[float]:
    """The run's conditional acceptance by position from its round records: accepted at j
    over the rounds that tried j (every earlier token accepted, j drafted)."""
    d, n = rounds["drafted"].to_numpy(), rounds["accepted"].to_numpy()
    return [((n > j).sum()) / ((n >= j) & (d > j)).sum() for j in range(d.max())]


def write_pair(tmp_path, before: SpecCounts, total: SpecCounts, **kw) -> tuple[str, str]:
    b, a = tmp_path / "before.prom", tmp_path / "after.prom"
    b.write_text(vllm_scrape(before, **kw))
    a.write_text(vllm_scrape(total, **kw))
    return str(b), str(a)


def add(x: SpecCounts, y: SpecCounts) -> SpecCounts:
    return SpecCounts(
        x.drafts + y.drafts,
        x.draft_tokens + y.draft_tokens,
        x.accepted + y.accepted,
        tuple(a + b for a, b in zip(x.per_pos, y.per_pos)),
    )


@pytest.fixture(scope="module")
def curve_run():
    scn = load_scenario(
        TINY,
        {
            "acceptance.model": "curve",
            "acceptance.position_rates": list(CURVE),
            "workload.num_requests": 120,
        },
    )
    return simulate(scn, "fixed", {"k": 4}, seed=3, trace=True, baseline=False).rounds


def test_scrape_pair_recovers_the_run(tmp_path, curve_run):
    # counts of an earlier stretch of traffic in BEFORE, plus this run's in AFTER
    base = SpecCounts(500.0, 2000.0, 900.0, (400.0, 250.0, 150.0, 100.0))
    run = counts_of_rounds(curve_run["drafted"], curve_run["accepted"])
    b, a = write_pair(tmp_path, base, add(base, run))
    cal = calibrate_vllm(b, a)
    truth = run_rates(curve_run)
    # every round drafted 4: the counter ratio is the run's conditional rate exactly
    assert cal.position_rates == pytest.approx(truth, rel=1e-12)
    assert cal.mean_acceptance_length == pytest.approx(
        1 + curve_run["accepted"].sum() / len(curve_run), rel=1e-12
    )
    assert not cal.notes
    # and the configured curve, within sampling error (~3000 rounds)
    assert cal.position_rates == pytest.approx(list(CURVE), abs=0.04)
    # the table loads into a scenario and simulates
    scn = load_scenario(TINY, {f"acceptance.{k}": v for k, v in cal.table()["acceptance"].items()})
    assert scn.acceptance.position_rates == tuple(cal.position_rates)


def test_varying_draft_lengths_biased_low_and_noted(tmp_path):
    # k cut at each request's last tokens: some rounds never reach the last positions
    scn = load_scenario(
        TINY,
        {
            "acceptance.model": "curve",
            "acceptance.position_rates": list(CURVE),
            "workload.num_requests": 120,
            "deployment.draft_within_length": True,
        },
    )
    rounds = simulate(scn, "fixed", {"k": 4}, seed=4, trace=True, baseline=False).rounds
    c = counts_of_rounds(rounds["drafted"], rounds["accepted"])
    cal = calibrate_counts(c, "x")
    truth = run_rates(rounds[rounds["drafted"] > 0])
    # biased low (a round cut below position j counts against it), by about 1%: the note says so
    assert all(x <= t + 1e-12 for x, t in zip(cal.position_rates, truth))
    assert cal.position_rates == pytest.approx(truth, rel=0.02)
    assert cal.position_rates != pytest.approx(truth, rel=1e-9)
    assert "varying lengths" in cal.notes[0]


def test_counts_by_hand():
    c = counts_of_rounds([3, 3, 3, 0, 2], [3, 1, 0, 0, 2])
    assert c == SpecCounts(4.0, 11.0, 6.0, (3.0, 2.0, 1.0))
    cal = calibrate_counts(c, "x")
    assert cal.position_rates == [3 / 4, 2 / 3, 1 / 2]
    assert cal.mean_acceptance_length == 1 + 6 / 4


def _one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dspark: error: ") and "\n" not in err, err
    assert needle in err, err


def test_scrape_errors_name_the_metric(tmp_path, capsys):
    base = SpecCounts(10.0, 30.0, 17.0, (8.0, 6.0, 3.0))
    more = SpecCounts(20.0, 60.0, 34.0, (16.0, 12.0, 6.0))
    b, a = write_pair(tmp_path, base, more)
    ok = ["calibrate", "vllm-metrics", b, a]
    assert main(ok) == 0 and "0.8000, 0.7500, 0.5000" in capsys.readouterr().out
    _one_line(
        capsys,
        ["calibrate", "vllm-metrics", a, b],
        f'{DRAFTS}{{engine="0",model_name="model"}} went down',
    )
    # a counter missing from AFTER
    miss = tmp_path / "miss.prom"
    miss.write_text("\n".join(x for x in Path(a).read_text().splitlines() if ACCEPTED not in x))
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(miss)], f"counter {ACCEPTED} is missing")
    # a malformed sample
    bad = tmp_path / "bad.prom"
    bad.write_text(Path(a).read_text().replace("20.0", "twenty"))
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(bad)], f"malformed sample of {DRAFTS}")
    # another engine's series in AFTER only
    other = tmp_path / "other.prom"
    other.write_text(Path(a).read_text() + vllm_scrape(more, engine="1").replace("# TYPE", "#"))
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(other)], "is only in AFTER")
    # another model
    _one_line(
        capsys,
        ["calibrate", "vllm-metrics", b, a, "--model", "llama"],
        "no samples of model 'llama'",
    )
    two = tmp_path / "two.prom"
    two.write_text(Path(a).read_text() + vllm_scrape(more, model="other").replace("# TYPE", "#"))
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(two)], "several models")
    # per-position counts that do not add up to the accepted counter
    skew = tmp_path / "skew.prom"
    skew.write_text(vllm_scrape(SpecCounts(20.0, 60.0, 35.0, (16.0, 12.0, 6.0))))
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(skew)], f"{PER_POS} sums to")
    _one_line(capsys, ["calibrate", "vllm-metrics", b, b], f"{DRAFTS} did not move")
    _one_line(capsys, ["calibrate", "vllm-metrics", b, str(tmp_path / "nope")], "file not found")


def test_per_request_spread_by_the_method_of_moments(tmp_path):
    # 3000 requests of 60 steps, first-position rate r ~ Beta(0.8·20, 0.2·20)
    rng = np.random.default_rng(0)
    r = rng.beta(16.0, 4.0, 3000)
    zero = rng.binomial(60, 1.0 - r)
    kappa, mean, used = beta_concentration([(60, int(z)) for z in zero], "x")
    assert used == 3000 and mean == pytest.approx(0.8, abs=0.01)
    assert kappa == pytest.approx(20.0, rel=0.15)
    # no spread beyond the binomial noise: κ = 0
    flat = rng.binomial(60, 0.2, 3000)
    assert beta_concentration([(60, int(z)) for z in flat], "x")[0] == 0.0


def test_per_request_summaries_file(tmp_path, capsys):
    base = SpecCounts(10.0, 30.0, 17.0, (8.0, 6.0, 3.0))
    b, a = write_pair(tmp_path, base, add(base, base))
    rows = [[30, 70], [20, 80], [25, 75], [15, 85]]
    lines = [
        json.dumps({"metrics": {"speculative_decoding": {"acceptance_histogram": h}}}) for h in rows
    ]
    lines.append(json.dumps({"metrics": {"speculative_decoding": None}}))  # n > 1: skipped
    lines.append(
        json.dumps(
            {"acceptance_histogram_by_draft_length": {"3": [12, 20, 20, 28], "2": [10, 5, 5]}}
        )
    )
    req = tmp_path / "req.jsonl"
    req.write_text("\n".join(lines) + "\n")
    cal = calibrate_vllm(b, a, str(req))
    x = [0.7, 0.8, 0.75, 0.85, 0.78]  # 1 − steps that accepted nothing / steps (100 each)
    m = sum(x) / 5
    v = sum((y - m) ** 2 for y in x) / 4
    noise = sum(y * (1 - y) / (s - 1) for y, s in zip(x, [100] * 5)) / 5
    assert cal.concentration == pytest.approx(m * (1 - m) / (v - noise) - 1, rel=1e-9)
    assert 50 < cal.concentration < 200
    assert cal.table()["acceptance"]["position_concentration"] == cal.concentration
    out = tmp_path / "acc.toml"
    assert main(["calibrate", "vllm-metrics", b, a, "--requests", str(req), "--out", str(out)]) == 0
    assert "5 requests" in capsys.readouterr().out
    assert "position_concentration" in out.read_text()
    req.write_text(
        '{"metrics": {"speculative_decoding": {"acceptance_histogram": [1, 2]}}}\nnot json\n'
    )
    _one_line(
        capsys, ["calibrate", "vllm-metrics", b, a, "--requests", str(req)], "req.jsonl:2: not JSON"
    )
    req.write_text('{"metrics": {"speculative_decoding": {"num_spec_steps": 3}}}\n')
    _one_line(
        capsys,
        ["calibrate", "vllm-metrics", b, a, "--requests", str(req)],
        "no acceptance_histogram",
    )


def test_sglang_server_info(tmp_path, capsys):
    # a = 0.5 at k = 3: 1 + .5 + .25 + .125 = 1.875 tokens a step
    assert iid_rate(1.875, 3, "x") == pytest.approx(0.5, abs=1e-12)
    assert iid_rate(1.0, 3, "x") == 0.0 and iid_rate(4.0, 3, "x") == 1.0
    info = tmp_path / "info.json"
    info.write_text(
        json.dumps(
            {"internal_states": [{"avg_spec_accept_length": 1.875, "speculative_num_steps": 3}]}
        )
    )
    assert calibrate_sglang(str(info)) == pytest.approx((0.5, 1.875, 3))
    assert main(["calibrate", "sglang-server-info", str(info)]) == 0
    assert 'model = "iid"' in capsys.readouterr().out
    with pytest.raises(DSparkError, match=r"outside \[1, 4\]"):
        iid_rate(4.5, 3, "x")
    info.write_text(json.dumps({"avg_spec_accept_length": 2.0}))
    _one_line(capsys, ["calibrate", "sglang-server-info", str(info)], "no speculative_num_steps")
    assert main(["calibrate", "sglang-server-info", str(info), "--num-steps", "2"]) == 0
    info.write_text(json.dumps({"internal_states": [{}]}))
    _one_line(capsys, ["calibrate", "sglang-server-info", str(info)], "no avg_spec_accept_length")


def test_curve_with_a_per_request_spread():
    cfg = AcceptanceConfig(model="curve", position_rates=(1.0, 0.0), max_run_tokens=8)
    rng = np.random.default_rng
    m = AcceptanceModel(cfg, 4, rng(0), rng(1))
    assert m.run_lengths(np.arange(4), np.zeros(4, dtype=int)).tolist() == [1, 1, 1, 1]
    spread = AcceptanceConfig(
        model="curve", position_rates=(0.8, 0.5), position_concentration=20.0, max_run_tokens=8
    )
    m = AcceptanceModel(spread, 20000, rng(0), rng(1))
    assert m.rate.mean() == pytest.approx(0.8, abs=0.005)  # first-position rate ~ Beta(16, 4)
    assert m.rate.var() == pytest.approx(0.8 * 0.2 / 21, rel=0.05)
    L = m.run_lengths(np.arange(20000), np.zeros(20000, dtype=int))
    # P(L >= 1) = E[r] = 0.8; P(L >= 2 | L >= 1) = E[r · min(0.5 r / 0.8, 1)] / E[r]
    assert (L >= 1).mean() == pytest.approx(0.8, abs=0.01)
    r = m.rate
    assert (L >= 2).mean() == pytest.approx((r * np.minimum(0.5 * r / 0.8, 1.0)).mean(), abs=0.01)
