"""`dspark validate --fast` (tiny random models) runs end to end and writes the error table."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from control.errors import ConfigError
from control.types import PositionRecord, records_from_rows
from dspark.cli import main
from real.trace_correction import draft_phases
from real.tracing import replay_accepted
from tests.built_once import built_once
from validate.config import load_validate
from validate.metrics import METRICS


def _validate(out: Path) -> list:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        # a tolerance no run meets: the full report, then exit status 1
        rc = main(["validate", "--fast", "--out", str(out), "--quiet", "--max-error", "1e-9"])
    return [rc, buf.getvalue()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(exit status, run folder, stdout)`` of one validation (one per test run, shared)."""
    out, (rc, stdout) = built_once(tmp_path_factory, "validate", _validate)
    return rc, out, stdout


def test_error_table_columns_and_finite(run):
    rc, out, stdout = run
    assert rc == 1  # the headline is above the (impossible) tolerance of --max-error 1e-9
    err = pd.read_csv(out / "errors.csv")
    assert list(err.columns) == [
        "controller",
        "workload",
        "metric",
        "sim",
        "real",
        "real_spread",
        "error_pct",
    ]
    assert set(err.metric) == set(METRICS)
    assert set(err.controller) == {"fixed", "hf-heuristic", "dspark"}
    assert set(err.workload) == {"random-b", "random-c"}
    assert len(err) == 3 * 2 * len(METRICS)
    # on the random tiny models a load-aware controller may draft rarely enough that no drafted
    # token is accepted (real acceptance rate 0, relative error undefined) or, in a repeat or in
    # the simulator, that it drafts nothing at all (acceptance rate 0/0): every other value is a
    # number, and a simulated rate is undefined only where its accepted length is exactly 1
    rate = err.metric == "acceptance_rate"
    undefined = rate & (err["real"].isna() | err["sim"].isna())
    assert set(err.loc[undefined, "controller"]) <= {"dspark"}
    length = err[err.metric == "mean_accepted_length"].set_index(["controller", "workload"])["sim"]
    for _, row in err[rate & err["sim"].isna()].iterrows():
        assert length[(row.controller, row.workload)] == 1.0
    assert np.isfinite(err.loc[~(rate & err["sim"].isna()), "sim"].to_numpy()).all()
    assert np.isfinite(err.loc[~undefined, "real"].to_numpy()).all()
    nonzero = (err["real"] != 0) & ~undefined
    assert np.isfinite(err.loc[nonzero, ["real_spread", "error_pct"]].to_numpy()).all()
    assert nonzero[err.metric == "throughput_tokens_per_s"].all()
    # errors.csv is the PREDICTED variant; the replay (latency-only) diagnostic beside it:
    # acceptance replayed exactly from the greedy position traces (float64 tiny models) for
    # controllers whose decisions do not read time; the goodput dspark plans from the costs it
    # measures (real) or is modelled to see (sim), so its rounds follow the latency model too
    rep = pd.read_csv(out / "errors_replay.csv")
    assert list(rep.columns) == list(err.columns) and len(rep) == len(err)
    acc = rep[
        rep.metric.isin(["mean_accepted_length", "acceptance_rate"]) & (rep.controller != "dspark")
    ]
    assert np.abs(acc.error_pct).max() < 1e-9
    s = json.loads((out / "summary.json").read_text())
    assert s["kind"] == "validate" and set(s["rank_agreement"]) == {"random-b", "random-c"}
    # the headline: predicted throughput and accepted length; latency-only: replay throughput
    head = err[err.metric.isin(["throughput_tokens_per_s", "mean_accepted_length"])]
    assert s["max_abs_error_pct"] == pytest.approx(np.abs(head.error_pct).max())
    lat = rep[rep.metric == "throughput_tokens_per_s"]
    assert s["latency_only_max_abs_error_pct"] == pytest.approx(np.abs(lat.error_pct).max())
    # rankings: the pairs told apart are judged on the real repeats (metrics.resolved_pairs)
    from validate.metrics import resolved_pairs

    for w, r in s["rank_orders"].items():
        tp = err[(err.workload == w) & (err.metric == "throughput_tokens_per_s")]
        for c, v in zip(tp.controller, tp.real):
            assert np.median(r["real_repeats"][c]) == pytest.approx(v)
        assert r["told_apart"] == resolved_pairs(
            dict(zip(tp.controller, tp.sim)), r["real_repeats"]
        )
    # the noise floor covers the same rows as each headline (metrics.noise_floor_of)
    nf = s["noise_floor"]
    assert nf["predictive"]["rows"] == len(head) and nf["latency_only"]["rows"] == len(lat)
    assert nf["predictive"]["repeats"] == s["repeats"]
    # the prompt sample's replay is the real fixed k's accepted length (greedy: exactly)
    fixed = err[(err.controller == "fixed") & (err.metric == "mean_accepted_length")]
    for w, real in zip(fixed.workload, fixed.real):
        assert s["prompt_sample"][w]["accepted_length"] == pytest.approx(real, rel=1e-12)
    # "within spread" counts only rows whose spread is above zero
    spread = head[head.real_spread > 0]
    assert s["headline_errors_with_spread"] == len(spread)
    assert s["headline_errors_within_real_spread"] == int(
        (np.abs(spread.error_pct) <= spread.real_spread).sum()
    )
    last = stdout.strip().splitlines()[-1]
    assert last == (
        f"validate_max_abs_error_pct={s['max_abs_error_pct']:.3f} "
        f"validate_latency_only_max_abs_error_pct={s['latency_only_max_abs_error_pct']:.3f}"
    )
    assert all(
        v["replay_exact_requests"] == 1.0
        for k, v in s["diagnostics"].items()
        if not k.startswith("dspark")
    )
    assert (out / "errors_fitted.csv").is_file() and (out / "profile" / "latency.csv").is_file()
    # the profile was corrected by the engine's own k-cycling rounds (every k, exactly 1 after)
    tc = json.loads((out / "profile" / "summary.json").read_text())["trace_correction"]
    for k in tc["verify_scale_by_k"]:
        assert tc["after"][k]["verify_ratio"] == pytest.approx(1.0, rel=1e-9)
    # the per-k check reads every held-out real round but a generation's first draft phase
    # (it feeds the prompt, which the simulator charges at the prefill)
    rounds = pd.read_csv(out / "rounds.csv")
    first = draft_phases(records_from_rows(rounds.to_dict("records")))[2]
    counts = rounds[~first].groupby("drafted").size()
    lc = s["latency_check_by_k"]["by_k"]
    assert {int(k): v["rounds"] for k, v in lc.items()} == counts.to_dict()


def test_predicted_positions_are_drawn_from_the_rollout(run):
    _, out, _ = run
    cfg = load_validate(out / "config.toml")
    w = "random-b"
    roll = pd.read_csv(out / "traces" / w / "rollout.csv")
    pos = pd.read_csv(out / "sim" / w / "predicted" / "positions_predicted.csv")
    n = cfg.workloads[w].n_prompts
    assert roll.request_id.nunique() == n
    assert pos.request_id.nunique() == n * cfg.predict.samples
    # run lengths are runs of drawn acceptance bits: L(t) = L(t+1) + 1 whenever L(t) >= 1
    for _, g in pos.groupby("request_id"):
        L = g.sort_values("position").run_length.to_numpy()
        ok = (L[:-1] == 0) | (L[:-1] == np.minimum(L[1:] + 1, cfg.engine.k_max + 1))
        assert ok.all()


def test_one_value_against_an_independent_computation(run):
    _, out, _ = run
    err = pd.read_csv(out / "errors_replay.csv")
    cfg = load_validate(out / "config.toml")
    k = cfg.controller["fixed"]["k"]
    # sim: walk the recorded position trace with fixed k (no simulator involved)
    pos = records_from_rows(
        pd.read_csv(
            out / "traces" / "random-b" / "positions.csv", dtype={"confidences": str}
        ).to_dict("records"),
        PositionRecord,
    )
    n_new = cfg.workloads["random-b"].max_new_tokens
    acc, rounds = 0, 0
    for rid in sorted({p.request_id for p in pos}):
        recs = [p for p in pos if p.request_id == rid]
        pred = replay_accepted(recs, [k] * n_new, [0.0] * n_new, cfg.engine.k_max, n_new)
        acc += sum(n for _, n in pred)
        rounds += len(pred)
    row = err[
        (err.controller == "fixed")
        & (err.workload == "random-b")
        & (err.metric == "mean_accepted_length")
    ].iloc[0]
    assert row.sim == pytest.approx(1 + acc / rounds, rel=1e-12)
    # real: throughput of each repeat from requests.csv, the table holds their median
    rq = pd.read_csv(out / "requests.csv")
    rq = rq[(rq.controller == "fixed") & (rq.workload == "random-b")]
    per_rep = rq.groupby("repeat").apply(
        lambda g: g.output_tokens.sum() / g.seconds.sum(), include_groups=False
    )
    tp = err[
        (err.controller == "fixed")
        & (err.workload == "random-b")
        & (err.metric == "throughput_tokens_per_s")
    ].iloc[0]
    assert tp.real == pytest.approx(float(np.median(per_rep)))
    assert tp.real_spread == pytest.approx((per_rep.max() - per_rep.min()) / per_rep.median() * 100)
    assert tp.error_pct == pytest.approx((tp.sim - tp.real) / tp.real * 100)


def test_bad_configs_are_one_line_errors(tmp_path):
    p = tmp_path / "v.toml"
    p.write_text('[models]\nsource = "tiny"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="bogus"):
        load_validate(p)
    p.write_text(
        '[heldout]\nworkloads = ["nope"]\nfitted_workloads = []\n'
        '[workloads.code-val]\nworkload = "code"\n'
    )
    with pytest.raises(ConfigError, match="workload 'nope'"):
        load_validate(p)
    p.write_text(
        '[calibration]\nworkload = "a"\n[heldout]\nworkloads = ["a"]\n'
        'fitted_workloads = []\n[workloads.a]\nworkload = "random"\n'
    )
    with pytest.raises(ConfigError, match="also held out"):
        load_validate(p)


def test_validation_runs_the_block_drafter_as_shipped():
    """The engine's online recalibration is off unless asked for, and asking for it is a
    one-line error: the simulator replays the head's shipped confidences."""
    tiny = Path(__file__).resolve().parents[2] / "configs" / "validate_tiny.toml"
    assert load_validate(tiny).engine.block_recalibration is False
    with pytest.raises(ConfigError, match=r"engine\.block_recalibration must be false"):
        load_validate(tiny, {"engine.block_recalibration": True})
