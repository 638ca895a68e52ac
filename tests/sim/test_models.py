"""Workload and acceptance-model distributions; routing; CLI and run folder."""

import json

import numpy as np
import pytest
from conftest import CONFIGS

from sim.acceptance import AcceptanceConfig, AcceptanceModel
from sim.workload import LengthConfig, WorkloadConfig, draw_lengths, generate


def streams(seed=0):
    return {n: np.random.default_rng(seed + i) for i, n in enumerate(("arrivals", "lengths"))}


def test_poisson_and_gamma_arrivals():
    for arrival, cv in (("poisson", 1.0), ("gamma", 2.5)):
        w = WorkloadConfig(arrival=arrival, rate_rps=5.0, gamma_cv=cv, num_requests=40000)
        r = generate(w, streams(), load_scale=2.0)
        gaps = np.diff(r.arrival_s)
        assert gaps.mean() == pytest.approx(0.1, rel=0.03)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_lognormal_mean_and_empirical_values():
    x = draw_lengths(
        LengthConfig(mean_tokens=200, sigma=0.8, max_tokens=10**6),
        100000,
        np.random.default_rng(0),
        "w",
    )
    assert x.mean() == pytest.approx(200, rel=0.02)
    e = draw_lengths(
        LengthConfig(dist="empirical", values=(3, 7)), 1000, np.random.default_rng(0), "w"
    )
    assert set(e) == {3, 7}


def run_lengths(cfg, n=20000, pos=0):
    m = AcceptanceModel(cfg, n, np.random.default_rng(1), np.random.default_rng(2))
    ids = np.arange(n)
    return m, m.run_lengths(ids, np.full(n, pos))


def test_iid_and_decay_run_lengths():
    _, L = run_lengths(AcceptanceConfig(model="iid", rate=0.8))
    for j in (1, 3, 6):
        assert (L >= j).mean() == pytest.approx(0.8**j, abs=0.01)
    _, L = run_lengths(AcceptanceConfig(model="decay", rate=0.9, decay=0.9))
    for j in (1, 2, 4):
        assert (L >= j).mean() == pytest.approx(np.prod([0.9 * 0.9**i for i in range(j)]), abs=0.01)


def test_beta_rates_and_markov_stationary():
    m, _ = run_lengths(AcceptanceConfig(model="beta", beta_mean=0.7, beta_concentration=20.0))
    assert m.rate.mean() == pytest.approx(0.7, abs=0.01)
    assert m.rate.std() == pytest.approx(np.sqrt(0.7 * 0.3 / 21), rel=0.05)
    cfg = AcceptanceConfig(
        model="markov", easy_rate=0.9, hard_rate=0.3, p_easy_to_hard=0.02, p_hard_to_easy=0.06
    )
    m, _ = run_lengths(cfg)
    ids = np.arange(20000)
    for _ in range(20):
        m.advance(ids, np.full(20000, 3))
    assert m.easy.mean() == pytest.approx(0.75, abs=0.015)


def test_confidence_predicts_acceptance_and_sentence_rate():
    m, L = run_lengths(AcceptanceConfig(model="iid", rate=0.6, sentence_end_rate=0.1))
    ids = np.arange(len(L))
    conf = m.confidences(ids, np.zeros(len(L), dtype=int), L, 4)
    acc = np.arange(4)[None, :] < L[:, None]
    assert conf[acc].mean() > conf[~acc].mean() + 0.3
    ends = m.sentence_ends(ids, np.zeros(len(L), dtype=int), np.full(len(L), 10))
    assert sum(len(e) for e in ends) / (10 * len(L)) == pytest.approx(0.1, rel=0.05)
    assert all(all(0 <= o < 10 for o in e) for e in ends)


def test_the_requests_table_holds_each_requests_own_acceptance_rate(tiny):
    from sim import simulate

    scn = tiny.with_overrides(
        {"acceptance.model": "beta", "acceptance.beta_mean": 0.6, "workload.num_requests": 40}
    )
    rr = simulate(scn, "fixed", baseline=False).requests
    # the requests' Beta draws: distinct, in (0, 1), and what a fresh model draws from the seed
    rates = rr["acceptance_rate"].to_numpy()
    assert len(set(rates.tolist())) == 40 and ((rates > 0) & (rates < 1)).all()
    again = simulate(scn, "fixed", baseline=False).requests["acceptance_rate"].to_numpy()
    assert np.array_equal(rates, again)
    iid = simulate(tiny.with_overrides({"acceptance.model": "iid"}), "fixed", baseline=False)
    assert (iid.requests["acceptance_rate"] == tiny.acceptance.rate).all()
    cfg = AcceptanceConfig(model="markov")
    m = AcceptanceModel(cfg, 5, np.random.default_rng(1), np.random.default_rng(2))
    assert np.isnan(m.request_rates()).all()  # its rate moves within a request


def test_routing_policies(tiny):
    from sim import simulate

    scn = tiny.with_overrides({"deployment.replicas": 3, "workload.num_requests": 30})
    rr = simulate(scn, "fixed", baseline=False).requests
    assert list(rr["replica"]) == [i % 3 for i in range(30)]
    lo = simulate(
        scn.with_overrides({"deployment.routing": "least-outstanding"}), "fixed", baseline=False
    ).requests
    assert set(lo["replica"]) == {0, 1, 2} and lo["finished"].all()


def test_least_pending_tokens_routes_by_prefill_work(tiny, tmp_path):
    """A long prompt, then three short ones within 3 ms (before any prefill ends), on two
    replicas: by outstanding requests the third ties and goes to replica 0, behind the long
    prefill; by pending prompt tokens it goes to replica 1, whose short prompt is ~8000 tokens
    less work, and so does the fourth."""
    from sim import simulate

    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,8000,20\n0.001,50,20\n0.002,60,20\n0.003,70,20\n"
    )
    scn = tiny.with_overrides(
        {
            "deployment.replicas": 2,
            "workload.arrival": "trace",
            "workload.trace_path": str(trace),
            "workload.trace_timestamp_unit": "s",
            "workload.num_requests": 4,
        }
    )
    by = {
        r: simulate(scn.with_overrides({"deployment.routing": r}), "fixed", baseline=False).requests
        for r in ("least-outstanding", "least-pending-tokens")
    }
    assert list(by["least-outstanding"]["replica"]) == [0, 1, 0, 1]
    assert list(by["least-pending-tokens"]["replica"]) == [0, 1, 1, 1]
    for q in by.values():
        assert q["finished"].all() and (q["emitted_tokens"] == q["output_tokens"]).all()
    # the third request no longer waits behind the 8000-token prefill
    ttft = {r: q["ttft_s"].to_numpy() for r, q in by.items()}
    assert ttft["least-pending-tokens"][2] * 5 < ttft["least-outstanding"][2]


def test_separate_drafter_gpus(tiny):
    from sim import simulate

    sep = tiny.with_overrides({"deployment.drafter_placement": "separate"})
    s = simulate(sep, "fixed", baseline=False).summary
    assert s["num_gpus"] == 2
    assert simulate(tiny, "fixed", baseline=False).summary["num_gpus"] == 1


def test_cli_json_and_run_folder(tmp_path, capsys):
    from dspark.cli import main

    rc = main(
        [
            "simulate",
            str(CONFIGS / "tiny.toml"),
            "--controller",
            "fixed",
            "--json",
            "--out",
            str(tmp_path / "run"),
            "--trace",
            "--quiet",
        ]
    )
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)  # always a list, one object per row
    for key in (
        "throughput_tokens_per_s",
        "mean_accepted_length",
        "acceptance_rate",
        "speedup",
        "tpot_p99_s",
    ):
        assert isinstance(row[key], float)
    run = tmp_path / "run"
    for f in (
        "results.csv",
        "summary.json",
        "requests.csv",
        "config.toml",
        "rounds.csv",
        "controller_trace.csv",
    ):
        assert (run / f).is_file()
    summ = json.loads((run / "summary.json").read_text())
    assert summ["kind"] == "simulate" and summ["rows"][0]["controller"] == "fixed"
    # the resolved config loads back
    from sim import load_scenario

    back = load_scenario(run / "config.toml")
    assert back.controller["fixed"]["k"] == 4


def test_cli_errors_are_one_line(tmp_path, capsys):
    from dspark.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[deployment]\ntp = 3\n")
    assert main(["simulate", str(bad), "--no-out"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dspark: error: {bad}: impossible cluster") and "\n" not in err
    assert main(["simulate", str(CONFIGS / "tiny.toml"), "--loads", "1,x"]) == 2
