"""Chunked prefill, causal prefill attention, paged KV with preemption, the two speedup
baselines (issue 13)."""

import numpy as np
import pandas as pd
import pytest
from conftest import h100_8b_scenario, prefill_pass

from control.registry import make_config
from sim import compare, simulate
from sim.api import _run
from sim.cluster import Cluster
from sim.latency import causal_pairs

BUDGET = 2048


def trace_scenario(tmp_path, rows, **sections):
    """One H100 serving Llama-3.1-8B (Llama-3.2-1B drafter) on a trace of ``rows``
    (arrival s, prompt tokens, output tokens)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in rows:
        stamp = pd.Timestamp("2024-01-01") + pd.Timedelta(seconds=t)
        lines.append(f"{stamp.isoformat(sep=' ')},{p},{o}")
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")
    return h100_8b_scenario(tmp_path, "trace.csv", **sections)


def test_causal_pairs_add_up_over_chunks():
    assert causal_pairs(5000, 0) == 5000 * 5001 // 2
    chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    assert sum(causal_pairs(n, p) for n, p in chunks) == causal_pairs(5000, 0)


def test_prefill_includes_causal_attention():
    from sim.hardware import hardware_preset
    from sim.latency import Roofline
    from sim.models import ModelConfig

    m = ModelConfig(preset="Llama-3.1-70B").resolved()
    roof = Roofline(m, hardware_preset("H100-SXM"), 8)
    p = 126_000
    with_attn = roof.pass_seconds(0, 0, 0.0, 1, p, causal_pairs(p, 0), 0)
    without = roof.pass_seconds(0, 0, 0.0, 1, p, 0, 0)
    # compute-bound: the difference is exactly the attention FLOPs of every layer
    assert with_attn - without == pytest.approx(
        m.layers * roof.attn_flops * causal_pairs(p, 0) / roof.flops_s, rel=1e-9
    )
    assert with_attn / without > 1.6  # the issue: a 126k prefill was ~2.2x too fast
    # a 2k prefill: attention is a few percent
    assert (
        1.0
        < (
            roof.pass_seconds(0, 0, 0.0, 1, 2048, causal_pairs(2048, 0), 0)
            / roof.pass_seconds(0, 0, 0.0, 1, 2048, 0, 0)
        )
        < 1.15
    )


@pytest.mark.parametrize("scheduler", ["chunked", "prefill-first"])
def test_single_prefill_ttft_is_the_analytic_chunk_sum(tmp_path, scheduler):
    scn = trace_scenario(tmp_path, [(0.0, 5000, 3)], deployment={"scheduler": scheduler})
    res = simulate(scn, "fixed", {"k": 0}, baseline=False)
    cl = Cluster(scn)
    if scheduler == "chunked":
        chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    else:
        chunks = [(5000, 0)]
    expected = sum(prefill_pass(cl, n, p) for n, p in chunks)
    assert res.requests.loc[0, "ttft_s"] == pytest.approx(expected, rel=1e-12)


def test_long_prompt_stalls_decodes_one_budget_at_most(tmp_path):
    long_prompt = 30_000
    rows = [(0.0, 100, 400), (0.05, long_prompt, 2)]
    gaps = {}
    for scheduler in ("chunked", "prefill-first"):
        scn = trace_scenario(tmp_path, rows, deployment={"scheduler": scheduler})
        res = simulate(scn, "fixed", {"k": 0}, trace=True, baseline=False)
        rd = res.rounds
        t = rd.loc[rd["request_id"] == 0, "now_s"].to_numpy()
        gaps[scheduler] = float(np.diff(t).max())
        assert res.requests["finished"].all()
    cl = Cluster(scn)
    # the costliest step of the chunked run: the decode row with the last full chunk
    prefix = long_prompt - long_prompt % BUDGET - BUDGET
    pairs = causal_pairs(BUDGET, prefix)
    step = cl.lat_t.pass_seconds(1, 1, 500.0, 1, BUDGET, pairs, prefix) + cl.lat_d.pass_seconds(
        0, 0, 0.0, 1, BUDGET, pairs, prefix
    )
    whole = prefill_pass(cl, long_prompt, 0)
    assert gaps["chunked"] <= step * (1 + 1e-9)
    assert gaps["prefill-first"] >= whole
    assert gaps["chunked"] < 0.2 * gaps["prefill-first"]


def small_memory(tiny, factor):
    """tiny at 5x its arrival rate with KV room for ``factor`` of its largest request
    (prompt + output)."""
    base = simulate(tiny, "fixed", seed=0, baseline=False).requests
    c = Cluster(tiny)
    weights = c.hw.mem_bytes * 0.9 - c.kv_budget_bytes
    need = ((base["prompt_tokens"] + base["output_tokens"]) * c.kv_bytes_per_token).max()
    return tiny.with_overrides(
        {
            "hardware.mem_gb": (weights + factor * need) / 1e9,
            "deployment.kv_memory_fraction": 1.0,
            "workload.rate_rps": 20.0,
        }
    )


@pytest.mark.parametrize(
    "scheduler,order",
    [("chunked", "fcfs"), ("prefill-first", "fcfs"), ("chunked", "shortest-first")],
)
@pytest.mark.parametrize("ctrl", [("fixed", {"k": 4}), ("dspark", None)])
def test_preemption_conserves_tokens_and_counts_the_recompute(tiny, scheduler, order, ctrl):
    scn = small_memory(tiny, 1.5).with_overrides(
        {"deployment.scheduler": scheduler, "deployment.prefill_order": order}
    )
    cfg = make_config(ctrl[0], ctrl[1] or {})
    runs = [_run(scn, ctrl[0], cfg, 0, 1.0, True, "x", True) for _ in range(2)]
    s, rd, _ = runs[0]
    c = rd.counters
    assert s["preemptions"] > 0 and s["recomputed_tokens"] > 0
    assert np.all(~np.isnan(rd.finish_s))
    out = rd.reqs.output_tokens
    assert (rd.emitted == out).all()
    assert c.round_tokens + c.prefill_tokens == out.sum() == s["output_tokens"]
    # every prompt is prefilled once, and every preempted token once more
    assert c.prefill_computed == rd.reqs.prompt_tokens.sum() + c.recomputed_tokens
    # deterministic with preemptions: the second run is identical
    s2, rd2, _ = runs[1]
    assert pd.Series(s).equals(pd.Series(s2))
    assert np.array_equal(rd.finish_s, rd2.finish_s)


def test_full_reservation_never_preempts(tiny):
    scn = small_memory(tiny, 1.5)
    paged = simulate(scn, "fixed", seed=0, baseline=False).summary
    reserve = simulate(
        scn.with_overrides({"deployment.kv_allocation": "reserve"}), "fixed", seed=0, baseline=False
    )
    assert reserve.requests["finished"].all()
    assert reserve.summary["preemptions"] == 0 == reserve.summary["recomputed_tokens"]
    # paged memory holds more requests at once than a reservation of their whole output
    assert paged["ttft_p50_s"] < reserve.summary["ttft_p50_s"]


def test_two_speedup_baselines(tiny):
    df = compare(tiny, [("fixed", {"k": 0}), ("fixed", {"k": 4})], seed=1)
    k0, k4 = df.iloc[0], df.iloc[1]
    # fixed:k=0 against itself with the drafter resident: exactly 1
    assert k0["speedup_resident"] == 1.0
    # against plain serving it pays the drafter's prefill (and memory)
    assert k0["speedup"] < 1.0
    assert k4["speedup_resident"] == pytest.approx(k4["speedup"] / k0["speedup"], rel=1e-12)
    # simulate alone runs the plain baseline only, unless asked
    s = simulate(tiny, "fixed", {"k": 0}, seed=1).summary
    assert np.isnan(s["speedup_resident"]) and s["speedup"] == k0["speedup"]


def test_queueing_and_prefill_add_up_to_ttft(tmp_path):
    """Head-of-line under the token budget: a short prompt arriving with a long one is admitted
    only when the long one's last chunk leaves room in a step (vLLM's FCFS order)."""
    scn = trace_scenario(tmp_path, [(0.0, 5000, 3), (0.0, 100, 3)])
    res = simulate(scn, "fixed", {"k": 0}, baseline=False)
    cl = Cluster(scn)
    r = res.requests
    step1, step2 = prefill_pass(cl, BUDGET, 0), prefill_pass(cl, BUDGET, BUDGET)
    pairs = causal_pairs(904, 2 * BUDGET) + causal_pairs(100, 0)
    step3 = cl.lat_t.pass_seconds(0, 0, 0.0, 2, 1004, pairs, 2 * BUDGET) + cl.lat_d.pass_seconds(
        0, 0, 0.0, 2, 1004, pairs, 2 * BUDGET
    )
    assert r["admitted_s"].tolist() == pytest.approx([0.0, step1 + step2], rel=1e-12)
    assert r["first_token_s"].tolist() == pytest.approx([step1 + step2 + step3] * 2, rel=1e-12)
    queueing = r["admitted_s"] - r["arrival_s"]
    prefill = r["first_token_s"] - r["admitted_s"]
    assert (queueing + prefill).to_numpy() == pytest.approx(r["ttft_s"].to_numpy(), rel=1e-12)


def test_shortest_first_lets_a_short_prompt_pass_a_long_prefill(tmp_path):
    """'shortest-first': a short prompt arriving while a long one is being prefilled is admitted
    in the next step, ahead of the long prompt's next chunk, which gets what is left of the
    budget; under FCFS it waits for the long prefill's last chunk. Exact event times."""
    rows = [(0.0, 10_000, 3), (0.001, 500, 3)]
    r = {}
    for order in ("fcfs", "shortest-first"):
        scn = trace_scenario(tmp_path, rows, deployment={"prefill_order": order})
        r[order] = simulate(scn, "fixed", {"k": 0}, baseline=False).requests
    cl = Cluster(scn)
    step1 = prefill_pass(cl, BUDGET, 0)
    pairs = causal_pairs(500, 0) + causal_pairs(BUDGET - 500, BUDGET)
    step2 = cl.lat_t.pass_seconds(0, 0, 0.0, 2, BUDGET, pairs, BUDGET) + cl.lat_d.pass_seconds(
        0, 0, 0.0, 2, BUDGET, pairs, BUDGET
    )
    sf, fc = r["shortest-first"], r["fcfs"]
    assert sf.loc[1, "admitted_s"] == pytest.approx(step1, rel=1e-12)
    assert sf.loc[1, "first_token_s"] == pytest.approx(step1 + step2, rel=1e-12)
    # FCFS: the short prompt enters beside the long one's last chunk (10_000 = 4 x 2048 + 1808:
    # 240 tokens of room) and finishes its prefill a pass after the long one's first token
    assert fc.loc[1, "admitted_s"] > 4 * step1
    assert fc.loc[1, "first_token_s"] > fc.loc[0, "first_token_s"] > sf.loc[1, "first_token_s"]
    # the long prompt pays for it: its first token comes later
    assert sf.loc[0, "first_token_s"] > fc.loc[0, "first_token_s"]
    for g in (sf, fc):
        assert g["output_tokens"].tolist() == [3, 3] and g["finish_s"].notna().all()
