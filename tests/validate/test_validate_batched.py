"""`dspark validate --fast --part batched`: the batched part end to end on tiny random models
(continuous batching under Poisson arrivals, replayed in wall-clock time; seconds)."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from control.errors import ConfigError
from control.types import PositionRecord, records_from_rows
from dspark.cli import main
from real.tracing import replay_accepted
from tests.built_once import built_once
from validate.batched import poisson_stream
from validate.batched_latency import overhead_by_batch, overhead_residuals, sim_table
from validate.config import load_validate
from validate.metrics import SERVING_METRICS, SERVING_TARGETS, resolved_pairs, serving
from validate.tables import BATCHED_ERROR_COLUMNS

LOADS = ("light", "near-saturation", "overloaded")


def _validate_batched(out: Path) -> list:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["validate", "--fast", "--part", "batched", "--out", str(out), "--quiet"])
    return [rc, buf.getvalue()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(exit status, run folder, stdout)`` of one batched validation (one per test run: the
    folder is shared, a test that reanalyzes copies it)."""
    out, (rc, stdout) = built_once(tmp_path_factory, "validate_batched", _validate_batched)
    return rc, out, stdout


def test_error_table_columns_and_finite(run):
    rc, out, stdout = run
    assert rc == 0
    err = pd.read_csv(out / "errors_batched.csv")
    assert list(err.columns) == list(BATCHED_ERROR_COLUMNS)
    assert set(err.metric) == set(SERVING_METRICS)
    assert set(err.controller) == {"fixed", "hf-heuristic", "dspark"}
    assert set(err.load) == set(LOADS)
    assert len(err) == 3 * 3 * len(SERVING_METRICS)
    assert np.isfinite(
        err[["rate_rps", "sim", "real", "real_spread", "error_pct"]].to_numpy(dtype=float)
    ).all()
    # loads in increasing order of arrival rate
    rates = err.groupby("load")["rate_rps"].first()
    assert rates["light"] < rates["near-saturation"] < rates["overloaded"]
    s = json.loads((out / "summary.json").read_text())["batched"]
    head = err[err.metric.isin(list(SERVING_TARGETS))]
    assert s["max_abs_error_pct"] == pytest.approx(np.abs(head.error_pct).max())
    assert set(s["rank_agreement"]) == set(LOADS)
    assert s["noise_floor"]["rows"] == len(head) and s["noise_floor"]["repeats"] == s["repeats"]
    for ld, r in s["rank_orders"].items():
        assert sorted(r["sim_order"]) == sorted(r["real_order"]) == sorted(err.controller.unique())
        # the pairs told apart are judged on this load's TPOT rows (metrics.resolved_pairs)
        t = err[(err.load == ld) & (err.metric == "tpot_p50_s")]
        # against the real repeats, whose median is the table's real value
        reps = r["real_repeats"]
        for c, v in zip(t.controller, t.real):
            assert np.median(reps[c]) == pytest.approx(v)
        assert r["told_apart"] == resolved_pairs(dict(zip(t.controller, t.sim)), reps)
    last = stdout.strip().splitlines()[-1]
    assert last == f"validate_batched_max_abs_error_pct={s['max_abs_error_pct']:.3f}"
    # >= 2 real repeats per controller x load, every request finished, greedy replay exact for
    # the controllers whose decisions do not read time (float64 tiny models)
    rq = pd.read_csv(out / "batched" / "requests.csv")
    held = rq[rq.load != "calibration"]
    assert held.groupby(["controller", "load"])["repeat"].nunique().min() >= 2
    assert rq.finished.all() and (rq.emitted_tokens == rq.output_tokens).all()
    acc = err[(err.metric == "mean_accepted_length") & (err.controller != "dspark")]
    assert np.abs(acc.error_pct).max() < 1e-9
    assert (out / "batched" / "profile" / "latency.csv").is_file()
    # diagnostics: each real run's rounds against the latency table, and its speed-corrected
    # prediction
    lc = pd.read_csv(out / "batched" / "latency_check.csv")
    assert len(lc) == 3 * 3 * 2 and (lc.round_ratio > 0).all() and np.isfinite(lc.round_ratio).all()
    sc = pd.read_csv(out / "errors_batched_speed_corrected.csv")
    assert len(sc) == 3 * 3 * 2 * len(SERVING_METRICS) and np.isfinite(sc.error_pct).all()


def test_one_value_against_an_independent_computation(run):
    _, out, _ = run
    err = pd.read_csv(out / "errors_batched.csv")
    cfg = load_validate(out / "config.toml")
    b = cfg.batched
    k = cfg.controller["fixed"]["k"]
    streams = pd.read_csv(out / "batched" / "streams.csv")
    pos = records_from_rows(
        pd.read_csv(out / "batched" / "pool_positions.csv", dtype={"confidences": str}).to_dict(
            "records"
        ),
        PositionRecord,
    )
    by_prompt: dict = {}
    for p in pos:
        by_prompt.setdefault(p.request_id, []).append(p)
    # sim: walk each request's pool-prompt position trace with fixed k (no simulator involved)
    st = streams[streams.load == "light"]
    acc = rounds = 0
    for r in st.itertuples(index=False):
        n = int(r.output_tokens)
        pred = replay_accepted(by_prompt[int(r.pool_index)][:n], [k] * n, [0.0] * n, b.k_max, n)
        acc += sum(x for _, x in pred)
        rounds += len(pred)
    row = err[
        (err.controller == "fixed") & (err.load == "light") & (err.metric == "mean_accepted_length")
    ].iloc[0]
    assert row.sim == pytest.approx(1 + acc / rounds, rel=1e-12)
    # real: throughput of each repeat from requests.csv, the table holds their median; the
    # replayed arrivals are the stream's
    rq = pd.read_csv(out / "batched" / "requests.csv")
    rq = rq[(rq.controller == "fixed") & (rq.load == "light")]
    for _, g in rq.groupby("repeat"):
        g = g.sort_values("request_id")
        assert np.allclose(g.arrival_s.to_numpy(), st.sort_values("request_id").arrival_s)
    per_rep = [
        g.emitted_tokens.sum() / (g.finish_s.max() - g.arrival_s.min())
        for _, g in rq.groupby("repeat")
    ]
    row = err[
        (err.controller == "fixed")
        & (err.load == "light")
        & (err.metric == "throughput_tokens_per_s")
    ].iloc[0]
    assert row.real == pytest.approx(float(np.median(per_rep)), rel=1e-9)
    spread = (max(per_rep) - min(per_rep)) / np.median(per_rep) * 100
    assert row.real_spread == pytest.approx(spread, rel=1e-9, abs=1e-12)


def test_serving_metrics_by_hand():
    # two requests: arrivals 0 and 1, admitted 0.1 and 1.5, first tokens 0.2 and 1.6,
    # finishes 1.2 (11 tokens) and 2.6 (5 tokens); 6 accepted over 4 rounds
    m = serving([0, 1], [0.1, 1.5], [0.2, 1.6], [1.2, 2.6], [11, 5], 6, 4)
    assert m["throughput_tokens_per_s"] == pytest.approx(16 / 2.6)
    assert m["tpot_p50_s"] == pytest.approx((0.1 + 0.25) / 2)
    assert m["ttft_p50_s"] == pytest.approx((0.2 + 0.6) / 2)
    assert m["queue_mean_s"] == pytest.approx((0.1 + 0.5) / 2)
    assert m["e2e_p50_s"] == pytest.approx((1.2 + 1.6) / 2)
    assert m["mean_accepted_length"] == pytest.approx(2.5)


def test_overhead_residuals_and_sim_table():
    bt = pd.DataFrame(
        [
            {
                "kind": "prefill",
                "end_s": 1.0,
                "batch_size": 2,
                "draft_s": np.nan,
                "verify_s": np.nan,
            },
            {"kind": "round", "end_s": 1.1, "batch_size": 2, "draft_s": 0.02, "verify_s": 0.07},
            {"kind": "round", "end_s": 1.2, "batch_size": 2, "draft_s": 0.03, "verify_s": 0.06},
            {"kind": "round", "end_s": 1.25, "batch_size": 1, "draft_s": 0.01, "verify_s": 0.03},
        ]
    )
    res = overhead_residuals(bt)
    assert res[2] == pytest.approx([0.01, 0.01]) and res[1] == pytest.approx([0.01])
    ov = overhead_by_batch({1: [0.01] * 5, 3: [0.03] * 5}, [1, 2, 4])
    assert ov == pytest.approx({1: 0.01, 2: 0.02, 4: 0.04})
    lat = pd.DataFrame(
        {
            "model": ["target", "target", "target", "drafter"],
            "batch": [2, 2, 4, 2],
            "new_tokens": [3, 40, 3, 1],
            "context_tokens": [0, 0, 0, 0],
            "seconds": [1.0, 2.0, 3.0, 0.5],
        }
    )
    t = sim_table(lat, 4, {2: 0.1, 4: 0.2})
    assert t.seconds.tolist() == pytest.approx([1.1, 2.0, 3.2, 0.5])


def test_poisson_stream_deterministic():
    pool = [[1, 2, 3], [4, 5, 6, 7]]
    a, ia = poisson_stream(5.0, 10.0, pool, 2, 6, 3)
    b, ib = poisson_stream(5.0, 10.0, pool, 2, 6, 3)
    assert [x.arrival_s for x in a] == [x.arrival_s for x in b] and ia == ib
    assert a[0].arrival_s == 0.0 and all(x.arrival_s < 10.0 for x in a)
    assert all(2 <= x.output_tokens <= 6 and x.prompt == pool[j] for x, j in zip(a, ia))
    assert 20 < len(a) < 90


@pytest.mark.parametrize(
    "key,value,msg",
    [
        ("batched.calibration_load", 0.9, "also a held-out load"),
        ("batched.load_names", ["a", "b"], "2 names for 3 loads"),
        ("batched.pool", "nope", "has no [workloads.nope] table"),
        ("batched.controllers", ["nope"], "batched.controllers has 'nope'"),
        ("parts", ["batch2"], "parts = ['batch2']"),
    ],
)
def test_bad_batched_config(key, value, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        load_validate(None, {"parts": ["batched"], key: value})


def test_reanalyze_writes_the_same_table_and_headline(run, capsys, tmp_path):
    _, src, stdout = run
    out = tmp_path / "again"
    shutil.copytree(src, out)
    before = pd.read_csv(out / "errors_batched.csv")
    # the prediction again from the saved measurements (no engine): the same table
    assert (
        main(["validate", "--reanalyze", "--out", str(out), "--quiet", "--max-error", "1e9"]) == 0
    )
    after = pd.read_csv(out / "errors_batched.csv")
    pd.testing.assert_frame_equal(before, after)
    assert capsys.readouterr().out.strip().splitlines()[-1] == stdout.strip().splitlines()[-1]


def test_a_pooled_reanalysis_reads_the_corrected_profile_and_exits_1_above_tolerance(
    run, tmp_path, capsys
):
    """The simulator reads the profile corrected by the calibration load; the same reanalysis,
    run with a tolerance no run meets, shows the exit status above it."""
    _, src, _ = run
    out = tmp_path / "pooled"
    shutil.copytree(src, out)
    argv = ["validate", "--reanalyze", "--out", str(out), "--quiet", "--max-error", "1e-9"]
    # above the tolerance: the full report, then exit status 1 and one line on stderr
    assert main([*argv, "--set", "batched.profile_correction=pooled"]) == 1
    cap = capsys.readouterr()
    assert cap.out.strip().splitlines()[-1].startswith("validate_batched_max_abs_error_pct=")
    assert "is above the tolerance 1e-09%" in cap.err
    summary = json.loads((out / "batched" / "summary.json").read_text())
    s, k_max = summary["profile_correction"], summary["engine"]["k_max"]
    assert s["mode"] == "pooled" and s["rounds"] > 0
    assert json.loads((src / "batched" / "summary.json").read_text())["profile_correction"] == {
        "mode": "off"
    }
    pdir = out / "batched" / "profile"
    raw = pd.read_csv(pdir / "latency_profile_mean.csv")
    used = pd.read_csv(pdir / "latency_mean.csv")
    for model, scales in (("target", s["verify_scale"]), ("drafter", s["drafter_scale"])):
        (scale,) = set(scales.values())  # pooled: one ratio per phase
        sel = raw["model"] == model
        if model == "target":
            sel &= raw["new_tokens"] <= k_max + 1  # verify rows only, not prefill chunks
        # used = raw x the phase's ratio (a row measured at 0.0 s on a loaded machine stays 0)
        want = raw.loc[sel, "seconds"].to_numpy() * scale
        assert used.loc[sel, "seconds"].to_numpy() == pytest.approx(want, rel=1e-9, abs=0.0)
