"""Conservation: every request ends with exactly its output length, or is reported unfinished;
no token lost or counted twice (per-round emissions add up)."""

import numpy as np
import pytest

from sim import simulate


@pytest.mark.parametrize("model", ["iid", "decay", "markov", "beta"])
@pytest.mark.parametrize(
    "ctrl",
    [("fixed", {"k": 5}), ("fixed", {"k": 3, "mode": "threshold", "beta": 0.7}), ("dspark", None)],
)
def test_tokens_conserved(tiny, model, ctrl):
    scn = tiny.with_overrides({"acceptance.model": model})
    res = simulate(scn, ctrl[0], ctrl[1], seed=2, trace=True, baseline=False)
    req, rd, s = res.requests, res.rounds, res.summary
    assert req["finished"].all()
    assert (req["emitted_tokens"] == req["output_tokens"]).all()
    per_req = rd.groupby("request_id")["emitted"].sum()
    assert (per_req + 1 == req.set_index("request_id").loc[per_req.index, "output_tokens"]).all()
    assert s["output_tokens"] == req["output_tokens"].sum()
    assert (rd["accepted"] <= rd["drafted"]).all() and (rd["emitted"] <= rd["accepted"] + 1).all()
    # each request's rounds are numbered 0..R-1 in time order
    for _, g in rd.groupby("request_id"):
        assert list(g["round"]) == list(range(len(g)))
        assert np.all(np.diff(g["now_s"].to_numpy()) > 0)
    if ctrl[1] and ctrl[1].get("mode") == "threshold":
        assert s["lossy_accept_fraction"] > 0
        assert (rd["lossy_accepts"] <= rd["accepted"]).all()
    else:
        assert s["lossy_accept_fraction"] == 0


def test_horizon_reports_unfinished(tiny):
    scn = tiny.with_overrides({"sim.horizon_s": 3.0})
    res = simulate(scn, "fixed", seed=0, baseline=False)
    req, s = res.requests, res.summary
    fin = req["finished"]
    assert 0 < fin.sum() < len(req)
    assert (req.loc[fin, "emitted_tokens"] == req.loc[fin, "output_tokens"]).all()
    assert (req.loc[~fin, "emitted_tokens"] < req.loc[~fin, "output_tokens"]).all()
    assert (req.loc[fin, "finish_s"] <= 3.0).all()
    assert s["requests_unfinished"] == (~fin).sum()
    assert s["output_tokens"] == req["emitted_tokens"].sum()
    assert s["sim_time_s"] == 3.0


def test_threshold_mode_raises_acceptance(tiny):
    strict = simulate(tiny, "fixed", {"k": 6}, seed=1, baseline=False).summary
    lossy = simulate(
        tiny, "fixed", {"k": 6, "mode": "threshold", "beta": 0.7}, seed=1, baseline=False
    ).summary
    strictish = simulate(
        tiny, "fixed", {"k": 6, "mode": "threshold", "beta": 0.99}, seed=1, baseline=False
    ).summary
    assert lossy["mean_accepted_length"] > strict["mean_accepted_length"] + 0.3
    assert strictish["lossy_accept_fraction"] == 0
    assert strictish["mean_accepted_length"] == strict["mean_accepted_length"]


def test_kv_memory_limit_caps_the_batch(tiny):
    from sim.cluster import Cluster

    base = simulate(tiny, "fixed", seed=0, baseline=False)
    req = base.requests
    c = Cluster(tiny)
    weights = c.hw.mem_bytes * 0.9 - c.kv_budget_bytes  # per GPU (tp = 1)
    need = ((req["prompt_tokens"] + req["output_tokens"]) * c.kv_bytes_per_token).max()
    # KV room for 1.5 of the largest requests: they run nearly one at a time
    small = tiny.with_overrides(
        {"hardware.mem_gb": (weights + 1.5 * need) / 1e9, "deployment.kv_memory_fraction": 1.0}
    )
    res = simulate(small, "fixed", seed=0, baseline=False)
    assert res.requests["finished"].all()
    assert res.summary["ttft_p99_s"] > 3 * base.summary["ttft_p99_s"]
    # a request larger than the whole KV budget is reported unfinished, never deadlocks
    smaller = tiny.with_overrides(
        {"hardware.mem_gb": (weights + 0.5 * need) / 1e9, "deployment.kv_memory_fraction": 1.0}
    )
    res = simulate(smaller, "fixed", seed=0, baseline=False)
    too_big = (req["prompt_tokens"] + req["output_tokens"]) * c.kv_bytes_per_token > 0.5 * need
    assert (res.requests["finished"] == ~too_big).all() and too_big.any()
