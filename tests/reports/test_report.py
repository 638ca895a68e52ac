"""The full report from a fixed set of synthetic runs, and the seed-claims audit."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from reports.build import SECTION_TITLES
from reports.claims import (
    CANNOT,
    DOES_NOT_HOLD,
    HOLDS_UNDER,
    IMPOSSIBLE,
    VERDICTS,
    audit,
    leviathan_speedup,
    min_acceptance_for,
)
from reports.loader import load_runs


def test_every_section_present(built_report):
    out = built_report.parent
    md = (out / "report.md").read_text()
    html = built_report.read_text()
    for title in SECTION_TITLES:
        assert f"## {title}" in md, title
        assert f"<h2>{title}</h2>" in html, title
    assert "None: every section had data." in md


def test_outputs_written(built_report):
    out = built_report.parent
    figs = sorted(p.name for p in (out / "figures").glob("*.png"))
    for stem in (
        "throughput_vs_load_sim",
        "latency_cdfs_sim",
        "controller_traces_sim",
        "acceptance_by_position_sim",
        "acceptance_by_position_real",
        "scaling_scaling",
        "tuning_history_tune",
        "tuning_history_tune-mo",
        "importances_tune",
        "pareto_tune-mo",
        "parity_validate",
    ):
        assert f"{stem}.png" in figs
    claims = pd.read_csv(out / "tables" / "claims_audit.csv")
    assert len(claims) == 8
    comp = pd.read_csv(out / "tables" / "comparison_sim.csv")
    assert {
        "throughput_tokens_per_s",
        "speedup",
        "goodput_tokens_per_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "e2e_p99_s",
        "vpr",
        "du",
        "mean_accepted_length",
        "acceptance_rate",
        "gpu_busy_fraction",
        "lossy_accept_fraction",
    } <= set(comp.columns)


def test_html_is_self_contained(built_report):
    html = built_report.read_text()
    srcs = re.findall(r'(?:src|href)="([^"#][^"]*)"', html)
    assert srcs and all(s.startswith("data:") for s in srcs), [s[:40] for s in srcs]
    assert "<script" not in html and "http://" not in html and "https://" not in html
    n_img = html.count("<img ")
    assert n_img == len(list((built_report.parent / "figures").glob("*.png")))
    assert "<style>" in html


@pytest.fixture(scope="module")
def claims(run_root):
    return audit(load_runs([run_root])).set_index("claim")


def test_audit_rows_and_verdicts(claims):
    assert len(claims) == 8 and set(claims["verdict"]) <= set(VERDICTS)
    assert list(claims.columns) == ["seed says", "lab finds", "verdict", "assumptions or why"]
    t4 = claims.loc["accept T4 after rejecting T3"]
    assert t4["verdict"] == IMPOSSIBLE and "prefix" in t4["assumptions or why"]
    assert "50 recorded rounds" in t4["lab finds"]  # 40 sim rounds + 10 real rounds


def test_audit_numbers_come_from_results(claims):
    # best deployable speedup in the fixtures: dspark 2.6× on A100 (clairvoyant 3.1× is a bound)
    tp = claims.loc["4.2× throughput"]
    # judged by the throughput ratio over the k = 0 row at points not capped by offered load
    assert "best throughput ratio 2.60× over k = 0 (dspark" in tp["lab finds"]
    a100 = (
        "On A100: 2.60× (dspark, scenario 8xA100 70B+8B on A100-SXM-80GB, 8 GPUs, load scale 1.5)"
    )
    assert a100 in tp["lab finds"]
    assert "TPOT ratio vs k = 0 without a drafter, not throughput" in tp["lab finds"]
    assert "Metric: throughput ÷ the k = 0 row's" in tp["assumptions or why"]
    assert tp["verdict"] == DOES_NOT_HOLD
    # p99: dspark e2e p99 = 12 / 2.6 vs 12 at k = 0 -> -61.5%
    p99 = claims.loc["−67% p99 latency"]
    assert f"{(1 / 2.6 - 1) * 100:+.1f}%" in p99["lab finds"] and p99["verdict"] == DOES_NOT_HOLD
    # busy fraction 0.5 at k = 0 -> 0.65 for dspark (not < 30% -> > 85%)
    util = claims.loc["GPU utilization 30% → 85%"]
    assert "50% at k = 0 → 65%" in util["lab finds"] and util["verdict"] == DOES_NOT_HOLD
    q = claims.loc["quality within ±0.3%"]
    assert "β = 0.85 +0.21%" in q["lab finds"] and "every measured row" in q["lab finds"]
    assert q["verdict"] == HOLDS_UNDER
    short = claims.loc["no gain under 32 tokens"]
    assert "≤ 32 output tokens" in short["lab finds"] and short["verdict"] == DOES_NOT_HOLD
    size = claims.loc["target ≥ 10B"]
    assert "12M" in size["lab finds"] and "70B" in size["lab finds"]
    assert size["verdict"] == DOES_NOT_HOLD
    sc = claims.loc["1 to 1024 GPUs"]
    assert "1 to 1024 GPUs" in sc["lab finds"] and sc["verdict"] == HOLDS_UNDER


def test_audit_without_results_says_what_run_would_check():
    c = audit([]).set_index("claim")
    for claim in c.index:
        if claim == "accept T4 after rejecting T3":
            assert c.loc[claim, "verdict"] == IMPOSSIBLE
        else:
            assert c.loc[claim, "verdict"] == CANNOT, claim
            assert "`dspark " in c.loc[claim, "assumptions or why"], claim


def test_leviathan_bound_used_by_the_audit():
    from control.leviathan import expected_speedup

    assert leviathan_speedup is expected_speedup  # one definition of the formula
    assert leviathan_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    a = min_acceptance_for(4.2, 0.05)
    best = max(leviathan_speedup(a, k, 0.05) for k in range(1, 16))
    assert best == pytest.approx(4.2, rel=1e-6)
    assert max(leviathan_speedup(a - 0.01, k, 0.05) for k in range(1, 16)) < 4.2
    assert min_acceptance_for(20.0, 0.1) is None  # (k+1)/(k c+1) <= 16/2.5 at k <= 15


@pytest.mark.slow
def test_reports_imports_no_engine_or_simulator():
    import subprocess
    import sys

    code = (
        "import sys, reports, reports.build, dspark.cmd_report; "
        "bad = {'torch', 'simpy', 'sim', 'real', 'tuning'} & set(sys.modules); "
        "assert not bad, bad"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


#: the summary fields of a small real-engine run on the conv drafter and copy-friendly code
SMALL_CODE_RUN = dict(
    drafter="conv",
    copyable_fraction=0.85,
    bench_config={"prompts": 4, "new_tokens": 96, "repeats": 1, "workload": "code"},
)


def _real(tmp, rows, **summary):
    import json

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "summary.json").write_text(json.dumps({"kind": "real", "rows": rows, **summary}))
    return tmp


def test_quality_verdict_judges_every_row(tmp_path):
    rows = [
        dict(
            controller="dspark",
            tokens_per_s=100.0,
            speedup_vs_ar=1.5,
            mode="strict",
            nll_change_pct=0.0,
        ),
        dict(controller="threshold-beta0.95", tokens_per_s=0, beta=0.95, nll_change_pct=0.08),
        dict(controller="threshold-beta0.85", tokens_per_s=0, beta=0.85, nll_change_pct=0.41),
        dict(controller="threshold-beta0.7", tokens_per_s=0, beta=0.7, nll_change_pct=1.2),
    ]
    run = _real(tmp_path / "real", rows, prompts=4, **SMALL_CODE_RUN)
    q = audit(load_runs([run])).set_index("claim").loc["quality within ±0.3%"]
    for cell in (
        "dspark (strict) +0.00% ✓",
        "β = 0.95 +0.08% ✓",
        "β = 0.85 +0.41% ✗",
        "β = 0.7 +1.20% ✗",
    ):
        assert cell in q["lab finds"], cell
    assert q["verdict"] == HOLDS_UNDER
    assert "holds for β ≥ 0.95 and not for β = 0.85, 0.7" in q["assumptions or why"]
    # the run's size and its warning stand beside the numbers
    assert "4 prompts × 96 tokens × 1 repeat" in q["lab finds"]
    assert "85% of the target's output copyable" in q["lab finds"] and "⚠" in q["lab finds"]
    rows[1]["nll_change_pct"] = 0.5
    run = _real(tmp_path / "real2", rows)
    q = audit(load_runs([run])).set_index("claim").loc["quality within ±0.3%"]
    assert q["verdict"] == DOES_NOT_HOLD


def test_real_engine_speedup_states_its_size(tmp_path):
    rows = [
        dict(controller="target-only", tokens_per_s=40.0, speedup_vs_ar=1.0),
        dict(controller="hf-heuristic", tokens_per_s=180.0, speedup_vs_ar=4.5),
        dict(controller="dspark", tokens_per_s=64.0, speedup_vs_ar=1.6),
    ]
    run = _real(tmp_path / "real", rows, target_dtype="bfloat16", **SMALL_CODE_RUN)
    tp = audit(load_runs([run])).set_index("claim").loc["4.2× throughput"]
    f = tp["lab finds"]
    assert "best 4.50× (hf-heuristic), dspark 1.60×" in f
    assert "drafter conv, code prompts, 4 prompts × 96 tokens × 1 repeat, bfloat16 target" in f
    assert "⚠ too small or too copy-friendly" in f and "384 tokens per method" in f


def test_real_section_states_its_size_and_no_fake_spread(tmp_path):
    from reports.build import Builder

    rows = [
        dict(
            controller="target-only",
            tokens_per_s=40.0,
            tokens_per_s_p10=40.0,
            tokens_per_s_p90=40.0,
            speedup_vs_ar=1.0,
        ),
        dict(
            controller="dspark",
            tokens_per_s=60.3,
            tokens_per_s_p10=60.3,
            tokens_per_s_p90=60.3,
            speedup_vs_ar=1.5,
        ),
    ]
    run = _real(tmp_path / "real", rows, **SMALL_CODE_RUN)
    sec = Builder(load_runs([run])).real()
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert "Measured: drafter conv, code prompts, 4 prompts × 96 tokens × 1 repeat" in text
    assert "85% of the target's output copyable" in text and "⚠" in text
    table = next(b for b in sec.blocks if hasattr(b, "shown")).shown
    col = next(c for c in table.columns if c.startswith("p10–p90"))
    assert "60.3–60.3" not in set(table[col]) and "— (one repeat: no spread)" in set(table[col])
