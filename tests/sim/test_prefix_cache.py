"""Prefix caching from a JSONL trace's hash_ids (issue 13 item 6): exact event times, memory
accounting under eviction and preemption, conservation, determinism."""

import json

import numpy as np
import pandas as pd
import pytest
from conftest import h100_8b_scenario, prefill_pass

import sim.engine
from control.errors import DSparkError
from control.registry import make_config
from sim import simulate
from sim.api import _run
from sim.cluster import Cluster
from sim.replica import Replica

H = 512  # tokens per hash block (Mooncake's traces)


def jsonl_scenario(tmp_path, records, **sections):
    """One H100 serving Llama-3.1-8B (Llama-3.2-1B drafter) on a JSONL trace of ``records``
    (timestamp ms, input tokens, output tokens, hash ids)."""
    lines = [
        json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": h})
        for t, p, o, h in records
    ]
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    return h100_8b_scenario(tmp_path, "trace.jsonl", **sections)


# request 0 makes blocks 1, 2 resident (1100 tokens: 2 full blocks); each later request arrives
# after the previous one finished and finds: 1 + 2 (1024 tokens), 1 (512), nothing, and its
# whole prompt (1024 tokens = blocks 1, 2: one block is computed again, for the logits)
RECORDS = [
    (0, 1100, 2, [1, 2, 3]),
    (2000, 1200, 2, [1, 2, 4]),
    (4000, 900, 2, [1, 9]),
    (6000, 700, 2, [7, 8]),
    (8000, 1024, 2, [1, 2]),
]
CACHED = [0, 1024, 512, 0, 512]


@pytest.mark.parametrize("scheduler", ["chunked", "prefill-first"])
def test_a_cached_prefix_is_not_prefilled_again(tmp_path, scheduler):
    scn = jsonl_scenario(tmp_path, RECORDS, deployment={"scheduler": scheduler})
    res = simulate(scn, "fixed", {"k": 0}, baseline=False)
    cl = Cluster(scn)
    ttft = res.requests["ttft_s"].to_numpy()
    for j, ((_, p, _, _), s) in enumerate(zip(RECORDS, CACHED)):
        assert ttft[j] == pytest.approx(prefill_pass(cl, p - s, s), rel=1e-12), j
    assert res.summary["prefix_cache_hit_tokens"] == sum(CACHED)
    off = simulate(
        scn.with_overrides({"deployment.prefix_caching": False}), "fixed", {"k": 0}, baseline=False
    )
    for j, (_, p, _, _) in enumerate(RECORDS):
        assert off.requests["ttft_s"].iloc[j] == pytest.approx(prefill_pass(cl, p, 0), rel=1e-12)
    assert off.summary["prefix_cache_hit_tokens"] == 0


def test_full_reservation_has_no_prefix_cache(tmp_path):
    scn = jsonl_scenario(tmp_path, RECORDS, deployment={"kv_allocation": "reserve"})
    assert simulate(scn, "fixed", {"k": 0}, baseline=False).summary["prefix_cache_hit_tokens"] == 0


def shared_prefix_records(n=80, seed=5):
    """Requests in bursts, each opening with one of four shared system prompts (2-5 blocks),
    then its own blocks."""
    rng = np.random.default_rng(seed)
    groups = [[100 * g + j for j in range(2 + g)] for g in range(4)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.exponential(40.0)
        g = groups[int(rng.integers(4))]
        own = int(rng.integers(1, 4))
        prompt = (len(g) + own - 1) * H + int(rng.integers(1, H))
        out.append(
            (
                round(t),
                prompt,
                int(rng.integers(20, 120)),
                g + [10_000 + 10 * i + j for j in range(own)],
            )
        )
    return out


def small_memory(scn, blocks):
    """``scn`` with KV room for ``blocks`` KV blocks of 16 tokens."""
    c = Cluster(scn)
    weights = c.hw.mem_bytes * 0.9 - c.kv_budget_bytes
    return scn.with_overrides(
        {
            "hardware.mem_gb": (weights + (blocks + 0.5) * 16 * c.kv_bytes_per_token) / 1e9,
            "deployment.kv_memory_fraction": 1.0,
        }
    )


@pytest.mark.parametrize("scheduler", ["chunked", "prefill-first"])
@pytest.mark.parametrize("ctrl", [("fixed", {"k": 4}), ("dspark", None)])
def test_eviction_and_preemption_conserve_tokens_and_memory(tmp_path, monkeypatch, scheduler, ctrl):
    replicas = []

    class Kept(Replica):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            replicas.append(self)

    monkeypatch.setattr(sim.engine, "Replica", Kept)
    records = shared_prefix_records()
    scn = small_memory(
        jsonl_scenario(tmp_path, records, deployment={"scheduler": scheduler}), 3 * 6 * H // 16
    )
    cfg = make_config(ctrl[0], ctrl[1] or {})
    runs = [_run(scn, ctrl[0], cfg, 0, 1.0, False, "x", True) for _ in range(2)]
    s, rd, _ = runs[0]
    c = rd.counters
    assert s["prefix_cache_hit_tokens"] > 0 and c.prefix_cache_evictions > 0
    assert s["preemptions"] > 0
    assert np.all(~np.isnan(rd.finish_s)) and (rd.emitted == rd.reqs.output_tokens).all()
    assert c.round_tokens + c.prefill_tokens == rd.reqs.output_tokens.sum()
    # every prompt token is prefilled once, less the cached ones, plus the recomputed ones
    assert c.prefill_computed == (
        rd.reqs.prompt_tokens.sum() + c.recomputed_tokens - c.prefix_cache_hit_tokens
    )
    # nothing leaks: every block is free or resident in the cache, none referenced
    assert len(replicas) == 2
    for r in replicas[:1]:
        assert r.free_blocks + r.prefix.resident_blocks() == r.params.kv_blocks
        assert not any(r.prefix.refs.values()) and not r.prefix.pinned and not r.kv_cap
    s2, rd2, _ = runs[1]
    assert pd.Series(s).equals(pd.Series(s2))
    assert np.array_equal(rd.finish_s, rd2.finish_s)


def test_more_memory_more_hits(tmp_path):
    records = shared_prefix_records()
    scn = jsonl_scenario(tmp_path, records)
    big = simulate(scn, "fixed", {"k": 4}, baseline=False).summary
    small = simulate(small_memory(scn, 3 * 6 * H // 16), "fixed", {"k": 4}, baseline=False)
    assert big["prefix_cache_hit_tokens"] > small.summary["prefix_cache_hit_tokens"] > 0
    assert big["ttft_p50_s"] <= small.summary["ttft_p50_s"]


def test_bad_hash_ids_and_block_sizes(tmp_path):
    scn = jsonl_scenario(tmp_path, RECORDS, workload={"trace_hash_block_tokens": 100})
    with pytest.raises(DSparkError, match=r"trace_hash_block_tokens = 100 is not a multiple"):
        simulate(scn, "fixed", baseline=False)
    (tmp_path / "bad.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}\n'
    )
    scn = scn.with_overrides({"workload.trace_path": str(tmp_path / "bad.jsonl")})
    with pytest.raises(
        DSparkError, match=r"bad.jsonl: line 1: hash_ids must be a list of integers"
    ):
        simulate(scn, "fixed", baseline=False)


def test_hash_ids_follow_their_requests_when_sorted_by_time(tmp_path):
    from sim.workload import read_trace_with_hashes

    j = tmp_path / "t.jsonl"
    j.write_text(
        '{"timestamp": 2500, "input_length": 7, "output_length": 3, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1000, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 4000, "input_length": 9, "output_length": 1, "hash_ids": [1]}\n'
    )
    _, ctx, _, hashes = read_trace_with_hashes(str(j), sort=True)
    assert ctx.tolist() == [5, 7, 9] and hashes == [(), (1, 2), (1,)]
    k = tmp_path / "none.jsonl"
    k.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    assert read_trace_with_hashes(str(k))[3] is None
