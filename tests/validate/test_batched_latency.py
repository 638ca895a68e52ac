"""The batched part's latency model: the calibration load's rounds correct the profile's table
exactly where they fall, and the prompt catch-up of a newly admitted row is not read as a slow
drafter step."""

import numpy as np
import pandas as pd
import pytest

from validate.batched_latency import correct_from_calibration, latency_check, round_phases

K_MAX = 3
CTX = (0, 256)


def _table() -> pd.DataFrame:
    """Target rows at batch 1, 2, 4 for 1..k_max+1 tokens a row (and one prefill row that the
    correction must not touch), drafter steps and draft phases (a fixed cost plus a cost per
    step, unlike the step rows) at the same sizes; linear in context."""
    rows = []
    for b in (1, 2, 4):
        for n in (*range(1, K_MAX + 2), 64):
            for c in CTX:
                s = 1e-3 * (2 + b * n * 0.5 + c / 256)
                rows.append(("target", b, n, c, s))
        for c in CTX:
            rows.append(("drafter", b, 1, c, 1e-4 * (3 + b + c / 128)))
            for k in range(1, K_MAX + 1):
                rows.append(("draft-phase", b, k, c, 1e-4 * (6 + 3 * k + b + c / 128)))
    df = pd.DataFrame(rows, columns=["model", "batch", "new_tokens", "context_tokens", "seconds"])
    df["seconds_mean"] = df["seconds"] * 1.01
    return df


def _trace(path, v_scale, d_scale, rng) -> pd.DataFrame:
    """Rounds at batch 1, 2, 4 whose verify pass takes v_scale x the table and whose draft phase
    takes d_scale x the table's draft-phase row; the round after each prefill also feeds the
    new row's 100-token prompt catch-up (50 ms more)."""
    from sim.latency import Table

    T, P = Table(path, "target"), Table(path, "draft-phase")
    ev, t = [], 0.0
    for i in range(60):
        b = (1, 2, 4)[i % 3]
        if i % 10 == 0:
            t += 0.01
            ev.append({"kind": "prefill", "end_s": t, "batch_size": 1})
        k = int(rng.integers(1, K_MAX + 1))
        ctx = float(rng.uniform(0, 256)) * b
        d = d_scale * P.seconds(b, b * k, ctx)
        if ev[-1]["kind"] == "prefill":
            d += 0.05
        v = v_scale * T.seconds(b, b * (k + 1), ctx)
        t += d + v + 1e-4
        ev.append(
            {
                "kind": "round",
                "end_s": t,
                "batch_size": b,
                "drafting": b,
                "draft_steps": k,
                "verify_tokens": b * (k + 1),
                "context_tokens": ctx,
                "draft_s": d,
                "verify_s": v,
            }
        )
    return pd.DataFrame(ev)


def test_correction_makes_the_calibration_rounds_exact(tmp_path):
    lat = _table()
    path = tmp_path / "latency.csv"
    lat.to_csv(path, index=False)
    bt = _trace(path, 1.1, 1.3, np.random.default_rng(0))
    before = latency_check(bt, path)
    assert before["verify_ratio"] == pytest.approx(1.1)
    assert before["draft_ratio"] > 1.3  # catch-up rounds read as slow steps

    fixed, info = correct_from_calibration(path, [bt], K_MAX)
    assert info["verify_scale"] == pytest.approx({1: 1.1, 2: 1.1, 4: 1.1})
    assert info["drafter_scale"] == pytest.approx({1: 1.3, 2: 1.3, 4: 1.3})  # catch-up left out
    assert info["drafting_rounds_used"] == 60 - 6
    _, pooled = correct_from_calibration(path, [bt], K_MAX, per_size=False)
    assert pooled["verify_scale"] == pytest.approx(info["verify_scale"])
    assert pooled["drafter_scale"] == pytest.approx(info["drafter_scale"])
    prefill = fixed["new_tokens"] == 64
    assert fixed[prefill].equals(lat[prefill])  # prefill rows untouched
    assert (fixed["seconds_mean"] / fixed["seconds"]).to_numpy() == pytest.approx(1.01)

    out = tmp_path / "fixed.csv"
    fixed.to_csv(out, index=False)
    r = round_phases(bt, out)
    assert (r["verify_s"] / r["table_verify_s"]).to_numpy() == pytest.approx(1.0)
    steady = ~r["after_prefill"]
    got = r["draft_s"][steady] / r["table_draft_s"][steady]
    assert got.to_numpy() == pytest.approx(1.0)


def test_sizes_without_rounds_take_the_pooled_ratio_and_no_rounds_change_nothing(tmp_path):
    lat = _table()
    path = tmp_path / "latency.csv"
    lat.to_csv(path, index=False)
    bt = _trace(path, 1.2, 0.9, np.random.default_rng(1))
    only_small = bt[(bt["kind"] == "prefill") | (bt["batch_size"] < 4)]
    _, info = correct_from_calibration(path, [only_small], K_MAX)
    assert info["verify_scale"][4] == pytest.approx(1.2)  # pooled over sizes 1 and 2
    assert info["drafter_scale"][4] == pytest.approx(0.9)
    same, info = correct_from_calibration(path, [], K_MAX)
    assert same.equals(lat) and info["rounds"] == 0
