"""The serving loop (``real.serve``): wall-clock arrivals through the batched engine conserve
requests and tokens; too-long requests are rejected with a one-line message, never dropped."""

import dataclasses

import numpy as np
import pytest

from control import make_controller
from control.errors import DSparkError
from real.serve import REQUEST_COLUMNS, ServeConfig, arrivals, serve
from tests.real.conftest import CFG, V, make_engine

SCFG = ServeConfig(
    rate_rps=400.0,
    duration_s=0.06,
    workload="random",
    prompt_tokens_min=3,
    prompt_tokens_max=14,
    output_tokens_min=2,
    max_new_tokens=24,
    seed=5,
)


def _check_conservation(res, stream):
    req = res.requests
    assert list(req.columns) == list(REQUEST_COLUMNS)
    assert len(req) == len(stream)  # every request is reported
    assert sorted(req.request_id) == sorted(a.request_id for a in stream)
    s = res.summary
    assert s["requests_finished"] + s["requests_unfinished"] == len(stream)
    fin = req[req.finished]
    assert (fin.emitted_tokens == fin.output_tokens).all()
    assert (req.emitted_tokens <= req.output_tokens).all()
    assert (fin.first_token_s >= fin.arrival_s).all() and (fin.finish_s >= fin.first_token_s).all()
    assert np.allclose(fin.ttft_s, fin.first_token_s - fin.arrival_s)
    by_req: dict = {}
    for r in res.records:
        by_req[r.request_id] = by_req.get(r.request_id, 0) + r.emitted
    for rid, n in zip(req.request_id, req.emitted_tokens):
        assert by_req.get(rid, 0) == n
    rounds = res.batches[res.batches.kind == "round"]
    assert rounds.emitted.sum() == req.emitted_tokens.sum() == s["output_tokens"]
    assert rounds.batch_size.max() <= 3


def test_poisson_serving_conserves_requests_and_tokens():
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=3))
    stream = arrivals(SCFG, vocab_size=V)
    assert len(stream) >= 8 and stream[0].arrival_s == 0.0
    assert all(3 <= len(a.prompt) <= 14 and 2 <= a.output_tokens <= 24 for a in stream)
    res = serve(eng, stream, lambda: make_controller("fixed", {"k": 3}), label="fixed")
    _check_conservation(res, stream)
    assert res.summary["requests_finished"] == len(stream) and not res.rejected
    assert res.summary["mean_batch_size"] > 1.5  # queueing happened: batches were full
    assert eng.free_slots == 3 and not eng.running


def test_too_long_request_is_rejected_with_one_line():
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=2, max_len=30))
    stream = arrivals(
        dataclasses.replace(SCFG, prompt_tokens_max=20, max_new_tokens=20, output_tokens_min=12),
        vocab_size=V,
    )
    res = serve(eng, stream, lambda: make_controller("fixed", {"k": 2}))
    too_long = [a for a in stream if len(a.prompt) + a.output_tokens > 30]
    assert too_long and len(res.rejected) == len(too_long)
    for msg, a in zip(res.rejected, too_long):
        assert "\n" not in msg and f"request {a.request_id} rejected" in msg
        assert "exceeds max_len 30" in msg
    req = res.requests.set_index("request_id")
    assert not req.loc[[a.request_id for a in too_long], "finished"].any()
    assert res.summary["requests_rejected"] == len(too_long)
    _check_conservation(res, stream)


def test_drain_limit_reports_unfinished_requests():
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=2))
    stream = arrivals(
        dataclasses.replace(SCFG, output_tokens_min=60, max_new_tokens=80), vocab_size=V
    )
    res = serve(
        eng, stream, lambda: make_controller("fixed", {"k": 1}), duration_s=0.0, drain_s=0.02
    )
    assert res.summary["requests_unfinished"] > 0
    _check_conservation(res, stream)
    assert eng.free_slots == 2 and not eng.running


def test_trace_replay_is_time_scaled_and_capped(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0000000,374,44\n"
        "2023-11-16 18:15:47.0000000,2,500\n"
        "2023-11-16 18:15:48.5000000,1000,1\n"
        "2023-11-16 18:15:56.0000000,90,7\n"
    )
    cfg = dataclasses.replace(SCFG, rate_rps=None, trace=str(p), time_scale=0.01, duration_s=0.05)
    got = arrivals(cfg, vocab_size=V)
    assert [a.arrival_s for a in got] == pytest.approx([0.0, 0.01, 0.025])
    assert [len(a.prompt) for a in got] == [14, 3, 14]
    assert [a.output_tokens for a in got] == [24, 24, 2]
    eng = make_engine("ngram", cfg=dataclasses.replace(CFG, slots=2))
    res = serve(eng, got, lambda: make_controller("fixed", {"k": 2}))
    _check_conservation(res, got)
    with pytest.raises(DSparkError, match="exactly one"):
        arrivals(dataclasses.replace(cfg, rate_rps=3.0))


def test_cli_serve_writes_the_run_folder(tmp_path, capsys):
    import json

    import pandas as pd

    from dspark.cli import main

    rc = main(
        [
            "real",
            "serve",
            "--tiny",
            "--rate",
            "60",
            "--duration",
            "0.15",
            "--slots",
            "3",
            "--controller",
            "fixed:k=2",
            "--controller",
            "hf-heuristic",
            "--prompt-tokens-min",
            "4",
            "--prompt-tokens-max",
            "16",
            "--max-new-tokens",
            "10",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    req = pd.read_csv(tmp_path / "requests.csv")
    assert list(req.columns) == list(REQUEST_COLUMNS)
    assert set(req.controller) == {"fixed:k=2", "hf-heuristic"}
    assert req.finished.all()
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert [r["requests"] for r in runs] == [len(req) // 2] * 2
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds.emitted.sum() == req.emitted_tokens.sum()
    assert (tmp_path / "batches.csv").is_file() and (tmp_path / "config.toml").is_file()


def test_the_serving_loop_tells_the_planner_and_every_controller_its_slos():
    from control.batch import Slo
    from control.registry import make_planner

    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=3))
    stream = arrivals(SCFG, vocab_size=V)
    built = []

    def make():
        c = make_controller("dspark")
        built.append(c)
        return c

    planner = make_planner("dspark")
    slo = dataclasses.replace(SCFG, slo_ttft_s=1.5, slo_tpot_s=0.04).slo()
    assert slo == Slo(1.5, 0.04)
    res = serve(eng, stream, make, planner, label="dspark", slo=slo)
    _check_conservation(res, stream)
    assert planner.slo == slo and planner.serves_slo()
    assert built and all(c.slo == slo for c in built)
    # unset SLOs are infinite: nothing is planned against them
    assert not SCFG.slo().active
