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
    for stem in ("throughput_vs_load_sim", "latency_cdfs_sim", "controller_traces_sim",
                 "acceptance_by_position_sim", "acceptance_by_position_real", "scaling_scaling",
                 "tuning_history_tune", "tuning_history_tune-mo", "importances_tune",
                 "pareto_tune-mo", "parity_validate"):
        assert f"{stem}.png" in figs
    claims = pd.read_csv(out / "tables" / "claims_audit.csv")
    assert len(claims) == 8
    comp = pd.read_csv(out / "tables" / "comparison_sim.csv")
    assert {"throughput_tokens_per_s", "speedup", "goodput_tokens_per_s", "ttft_p99_s",
            "tpot_p50_s", "e2e_p99_s", "vpr", "du", "mean_accepted_length", "acceptance_rate",
            "gpu_busy_fraction", "lossy_accept_fraction"} <= set(comp.columns)


def test_html_is_self_contained(built_report):
    html = built_report.read_text()
    srcs = re.findall(r'(?:src|href)="([^"#][^"]*)"', html)
    assert srcs and all(s.startswith("data:") for s in srcs), [s[:40] for s in srcs]
    assert "<script" not in html and "http://" not in html and "https://" not in html
    n_img = html.count('<img ')
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
    assert "50 recorded rounds" in t4["lab finds"]   # 40 sim rounds + 10 real rounds


def test_audit_numbers_come_from_results(claims):
    # best deployable speedup in the fixtures: dspark 2.6× on A100 (clairvoyant 3.1× is a bound)
    tp = claims.loc["4.2× throughput"]
    assert "best speedup 2.60× (dspark" in tp["lab finds"] and "A100" in tp["lab finds"]
    assert "not a deployable controller): 3.10×" in tp["lab finds"]
    assert tp["verdict"] == DOES_NOT_HOLD
    # p99: dspark e2e p99 = 12 / 2.6 vs 12 at k = 0 -> -61.5%
    p99 = claims.loc["−67% p99 latency"]
    assert f"{(1 / 2.6 - 1) * 100:+.1f}%" in p99["lab finds"] and p99["verdict"] == DOES_NOT_HOLD
    # busy fraction 0.5 at k = 0 -> 0.65 for dspark (not < 30% -> > 85%)
    util = claims.loc["GPU utilization 30% → 85%"]
    assert "50% at k = 0 → 65%" in util["lab finds"] and util["verdict"] == DOES_NOT_HOLD
    q = claims.loc["quality within ±0.3%"]
    assert "+0.21%" in q["lab finds"] and "β = 0.85" in q["lab finds"]
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
    assert leviathan_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    a = min_acceptance_for(4.2, 0.05)
    best = max(leviathan_speedup(a, k, 0.05) for k in range(1, 16))
    assert best == pytest.approx(4.2, rel=1e-6)
    assert max(leviathan_speedup(a - 0.01, k, 0.05) for k in range(1, 16)) < 4.2
    assert min_acceptance_for(20.0, 0.1) is None  # (k+1)/(k c+1) <= 16/2.5 at k <= 15


def test_reports_imports_no_engine_or_simulator():
    import subprocess
    import sys
    code = ("import sys, reports, reports.build, dspark.cmd_report; "
            "bad = {'torch', 'simpy', 'sim', 'real', 'tuning'} & set(sys.modules); "
            "assert not bad, bad")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
