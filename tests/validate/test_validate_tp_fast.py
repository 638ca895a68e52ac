"""`dspark validate --part tp --fast` (tiny random models, 2 gloo ranks) end to end: the TP = 1
side (rank 0) and the TP = 2 side run in one spawned group, and the simulator replays both."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dspark.cli import main
from tests.built_once import built_once

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


# 2 prompts of 32 new tokens per controller and 10 collective passes: every file and column of
# the part in ~15 s (the defaults' 3 x 48 tokens and 30 passes take ~25 s and assert nothing more)
SMALL = ("--set", "tp.prompts=2", "--set", "tp.new_tokens=32", "--set", "tp.collective_repeats=10")


def _validate_tp(folder: Path) -> list:
    for attempt in range(2):
        out = folder / f"attempt{attempt}"
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            rc = main(
                ["validate", "--part", "tp", "--fast", "--repeats", "2", *SMALL, "--out", str(out)]
            )
        # a gloo rank dying by a signal while the group forms (seen once in ~5 loaded CI runs of
        # tests/real/test_tp.py) gets one fresh start; any other failure is the test's
        if rc == 0 or attempt or "a rank failed" not in err.getvalue():
            return [rc, out.name, buf.getvalue()]
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(exit status, run folder, stdout)`` of one TP validation (one per test run, shared)."""
    folder, (rc, name, stdout) = built_once(tmp_path_factory, "validate_tp", _validate_tp)
    return rc, folder / name, stdout


def test_rows_complete_and_headline_is_the_worst_tp_row(run):
    rc, out, stdout = run
    assert rc == 0
    err = pd.read_csv(out / "errors_tp.csv")
    assert sorted(zip(err.controller, err.metric)) == sorted(
        (c, m) for c in ("fixed", "dspark") for m in ("tpot_s", "throughput_tokens_per_s")
    )
    for col in ("tp1_measured", "tp1_predicted", "tp_measured", "tp_predicted"):
        assert np.isfinite(err[col]).all() and (err[col] > 0).all()
    summary = json.loads((out / "tp" / "summary.json").read_text())
    assert summary["max_abs_error_pct"] == pytest.approx(err["abs_error_pct"].max())
    # measured = the median of the repeats, spread (max - min) / median, as the other parts
    reps = json.loads((out / "tp" / "measure_tp.json").read_text())["measure"]
    for _, row in err.iterrows():
        vals = np.array(
            reps[row.controller]["tps" if row.metric.startswith("throughput") else "tpot"]
        )
        assert len(vals) == 2 and row.tp_measured == pytest.approx(np.median(vals), rel=1e-12)
        spread = (vals.max() - vals.min()) / np.median(vals) * 100
        assert row.real_spread_pct == pytest.approx(spread, rel=1e-9, abs=1e-12)
        err_pct = (row.tp_predicted - row.tp_measured) / row.tp_measured * 100
        assert row.error_pct == pytest.approx(err_pct, rel=1e-9)
    assert stdout.strip().splitlines()[-1] == (
        f"validate_tp_max_abs_error_pct={err['abs_error_pct'].max():.3f}"
    )


def test_fixed_k_replays_the_measured_rounds_exactly(run):
    """Fixed k ignores timings: the simulator, fed the TP = 1 engine's greedy positions, drafts
    what that engine drafted (every repeat the same rounds), at any TP; the TP = 2 column is the
    mean of the TP = 2 rounds (float32 tiny models: a near-tie may break differently there)."""
    _, out, _ = run
    err = pd.read_csv(out / "errors_tp.csv")
    fixed = err[err.controller == "fixed"].iloc[0]
    one = pd.read_csv(out / "tp" / "rounds_tp1.csv")
    assert fixed.tp_mean_k_predicted == pytest.approx(
        one[one.controller == "fixed"]["drafted"].mean(), rel=1e-12
    )
    two = pd.read_csv(out / "tp" / "rounds_tp2.csv")
    assert fixed.tp_mean_k_measured == pytest.approx(
        two[two.controller == "fixed"]["drafted"].mean(), rel=1e-12
    )


def test_profile_holds_every_kind_the_model_reads(run):
    _, out, _ = run
    coll = pd.read_csv(out / "tp" / "collectives.csv")
    kinds = set(coll["kind"])
    assert {"all_reduce", "sharded", "local", "layer", "broadcast", "replicated"} <= kinds
    table = pd.read_csv(out / "tp" / "latency_tp1.csv")
    # measured passes take time; a drafter row derived from differences of timings is floored
    # at 0 (real.profile: under heavy load a 63-token prefill less a one-token propose was)
    assert (table.loc[table["model"] == "target", "seconds"] > 0).all()
    assert (table["seconds"] >= 0).all()
    summary = json.loads((out / "tp" / "summary.json").read_text())
    # the replicated drafter timed on both ranks at once over rank 0 alone: a positive ratio
    # (its rows of the TP = 2 table are the TP = 1 rows times it)
    f = summary["drafter_side_by_side_factor"]
    assert np.isfinite(f) and f > 0
    one = pd.read_csv(out / "tp" / "sim_tp1" / "latency.csv")
    two = pd.read_csv(out / "tp" / "sim_tp2" / "latency.csv")
    d1, d2 = (t[t.model == "drafter"]["seconds"].to_numpy() for t in (one, two))
    assert len(d1) and d2 == pytest.approx(f * d1, rel=1e-9)
