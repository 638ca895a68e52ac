"""compare_runs: the tables it returns are the run folder's, and summary.json records the
deployment (what reports read instead of parsing configs)."""

import json

import pandas as pd

from reports import load_runs
from reports.claims import hardware_of, target_params_of
from sim import compare_runs


def test_tables_and_provenance(tiny, tmp_path):
    c = compare_runs(tiny, ["fixed", ("fixed", {"k": 0})], seed=2, out_dir=tmp_path / "run")
    pd.testing.assert_frame_equal(
        c.requests, pd.read_csv(tmp_path / "run" / "requests.csv"), check_exact=False, rtol=1e-15
    )
    assert list(c.results["controller"]) == ["fixed#1", "fixed#2"] and c.names == ["fixed"] * 2
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["hardware"], s["target"], s["drafter"]) == (
        "H100-SXM",
        "Llama-3.1-8B",
        "Llama-3.2-1B",
    )
    assert (s["tensor_parallel"], s["num_gpus"], s["replicas"]) == (1, 1, 1)
    assert s["target_params"] > 7e9 and s["drafter_params"] < 2e9
    run = load_runs([tmp_path / "run"])[0]
    assert hardware_of(run) == "H100-SXM" and target_params_of(run) == s["target_params"]


def test_no_tables_without_trace(tiny):
    c = compare_runs(tiny, ["fixed"], seed=0)
    assert c.rounds is None and c.controller_trace is None
    assert len(c.requests) == tiny.workload.num_requests
