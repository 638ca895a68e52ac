"""Bad inputs are one-line errors naming file and column; greedy position-trace replay is exact."""

import numpy as np
import pandas as pd
import pytest
from conftest import CONFIGS, scenario

from control.errors import ConfigError, DSparkError
from sim import load_scenario, simulate
from sim.latency import Table
from sim.workload import read_trace

GOOD = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
)


def one_line(e):
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "text,needle",
    [
        (GOOD.replace("GeneratedTokens", "Generated"), "lacks column 'GeneratedTokens'"),
        (GOOD.replace(",374,", ",abc,"), "column 'ContextTokens' has a garbled value at row 2"),
        (
            GOOD.replace("2023-11-16 18:15:50.9951690", "yesterday"),
            "column 'TIMESTAMP' has a garbled",
        ),
        (GOOD.replace(",109", ",-3"), "column 'GeneratedTokens' has a garbled value at row 3"),
    ],
)
def test_trace_errors(tmp_path, text, needle):
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(DSparkError) as e:
        read_trace(str(f))
    msg = one_line(e)
    assert needle in msg and str(f) in msg


def test_trace_scaling_and_limit(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(GOOD + "2023-11-16 18:15:56.6805900,10,5\n")
    scn = scenario(
        {
            "workload": {
                "arrival": "trace",
                "trace_path": "t.csv",
                "time_scale": 0.5,
                "max_requests": 2,
            }
        },
        base=tmp_path,
    )
    res = simulate(scn, "fixed", baseline=False)
    r = res.requests
    assert list(r["arrival_s"]) == pytest.approx([0.0, 4.314579 * 0.5])
    assert list(r["prompt_tokens"]) == [374, 396] and list(r["output_tokens"]) == [44, 109]


def test_missing_trace_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        scenario({"workload": {"arrival": "trace", "trace_path": "nope.csv"}}, base=tmp_path)
    assert "workload.trace_path: file not found" in one_line(e)


def test_bad_scenario_keys(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[deployment]\nreplicas = 2\nroutng = 'x'\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    assert "deployment.routng" in one_line(e) and str(f) in str(e.value)
    f.write_text("[deployment]\ntp = 0\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    assert "deployment.tp = 0 is out of range" in one_line(e)


def test_latency_table(tmp_path):
    rows = []
    for b in (1, 4):
        for n in (1, 8):
            for c in (0, 1000):
                rows.append(("target", b, n, c, 0.01 + 0.001 * b + 0.0005 * n + 1e-6 * c))
    f = tmp_path / "latency.csv"
    pd.DataFrame(
        rows, columns=["model", "batch", "new_tokens", "context_tokens", "seconds"]
    ).to_csv(f, index=False)
    t = Table(f, "target")
    assert t.seconds(2, 2 * 4, 2 * 500) == pytest.approx(0.01 + 0.002 + 0.002 + 5e-4)
    assert t.seconds(64, 64, 0) == pytest.approx(0.01 + 0.004 + 0.0005)  # clamped to the grid
    with pytest.raises(DSparkError) as e:
        Table(f, "drafter")
    assert "no rows for model 'drafter'" in one_line(e)
    pd.read_csv(f).drop(columns="context_tokens").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DSparkError) as e:
        Table(tmp_path / "bad.csv", "target")
    assert "lacks column 'context_tokens'" in one_line(e)


def make_positions(path, n_req=6, length=60, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_req):
        for p in range(length):
            L = int(rng.geometric(0.3) - 1)
            conf = rng.uniform(0.05, 1.0, min(L + 1, 16))
            rows.append((r, p, L, " ".join(repr(float(x)) for x in conf), bool(rng.random() < 0.1)))
    df = pd.DataFrame(
        rows, columns=["request_id", "position", "run_length", "confidences", "sentence_end"]
    )
    df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_position_replay_is_exact(tmp_path, k):
    rec = make_positions(tmp_path / "positions.csv")
    scn = load_scenario(CONFIGS / "tiny.toml").with_overrides(
        {
            "acceptance.model": "replay",
            "acceptance.replay_path": str(tmp_path / "positions.csv"),
            "workload.num_requests": 6,
        }
    )
    res = simulate(scn, "fixed", {"k": k}, trace=True, baseline=False)
    rd = res.rounds.merge(res.requests[["request_id", "prompt_tokens"]], on="request_id")
    rd["position"] = rd["context_tokens"] - rd["prompt_tokens"]
    L = rec.set_index(["request_id", "position"])["run_length"]
    want = np.minimum(k, L.loc[list(zip(rd["request_id"], rd["position"]))].to_numpy())
    assert (rd["accepted"].to_numpy() == want).all()
    assert (res.requests["output_tokens"] == 60).all() and res.requests["finished"].all()
    # recorded confidences are handed to the controller
    first = rd.iloc[0]
    conf = (
        rec.set_index(["request_id", "position"])
        .loc[(first.request_id, first.position), "confidences"]
        .split()
    )
    got = str(first["confidences"]).split()
    m = min(len(conf), k)
    assert [float(x) for x in got[:m]] == [float(x) for x in conf[:m]]
    # sentence ends are the recorded ones
    ends = rec.set_index(["request_id", "position"])["sentence_end"]
    for row in rd.itertuples():
        want_ends = [
            o for o in range(row.emitted) if ends.get((row.request_id, row.position + o), False)
        ]
        got_ends = (
            [int(x) for x in str(row.sentence_ends).split()]
            if isinstance(row.sentence_ends, str) and row.sentence_ends
            else []
        )
        assert got_ends == want_ends


def test_confidence_stop_cut_in_replay(tmp_path):
    """n = min(k_eff, L) with k_eff cut at the first recorded confidence below τ."""
    rec = make_positions(tmp_path / "positions.csv", seed=3)
    scn = load_scenario(CONFIGS / "tiny.toml").with_overrides(
        {
            "acceptance.model": "replay",
            "acceptance.replay_path": str(tmp_path / "positions.csv"),
            "workload.num_requests": 6,
        }
    )
    res = simulate(scn, "confidence-stop", trace=True, baseline=False)
    rd = res.rounds.merge(res.requests[["request_id", "prompt_tokens"]], on="request_id")
    recs = rec.set_index(["request_id", "position"])
    for row in rd.itertuples():
        pos = row.context_tokens - row.prompt_tokens
        L = int(recs.loc[(row.request_id, pos), "run_length"])
        conf = [float(x) for x in recs.loc[(row.request_id, pos), "confidences"].split()]
        keff = row.k
        for j in range(min(row.k, len(conf))):
            if conf[j] < row.tau:
                keff = j
                break
        if keff <= len(conf):  # k_eff is determined by recorded confidences
            assert row.drafted == keff
            assert row.accepted == min(keff, L)
