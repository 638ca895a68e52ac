"""Every bad input to ``dspark simulate / tune / replay / report`` is one line naming what is wrong
and where, exit status 2: never a traceback, never silently accepted (issue 14's classes).

Each case writes its files into a fresh folder, runs the command in-process and compares the
whole of stderr with the expected line (``{d}`` is the case's folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from dspark.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "configs" / "tiny.toml").read_text()
CONTROLLERS = (
    "fixed, hf-heuristic, confidence-stop, ema-hysteresis, analytic, dspark, "
    "clairvoyant, rate-oracle, vllm-dsd, vllm-adaptive-k, vllm-adaptive-verification, "
    "sglang-adaptive"
)
TRACE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def tiny(sim: str = "", extra: str = "", workload: str = "") -> str:
    """tiny.toml with lines added to [sim] / [workload] and tables appended."""
    text = TINY.replace("[sim]\n", f"[sim]\n{sim}\n") if sim else TINY
    if workload:
        text = text.replace('arrival = "poisson"\n', workload + "\n")
    return text + "\n" + extra


def trace_scenario(name: str) -> str:
    return tiny(workload=f'arrival = "trace"\ntrace_path = "{name}"')


def _rounds() -> pd.DataFrame:
    return pd.read_csv(ROOT / "examples" / "trace_small.csv")


def _write_rounds(d: Path, name: str, edit) -> None:
    df = _rounds()
    edit(df)
    df.to_csv(d / name, index=False)


def _unmeasured_run(d: Path, name: str, tput: float) -> None:
    """A simulate run folder as an older `dspark simulate` wrote it from an empty trace or a
    warm-up past the run: every row measured nothing."""
    run = d / name
    run.mkdir()
    rows = [
        {
            "controller": c,
            "seed": 0,
            "load_scale": 1.0,
            "throughput_tokens_per_s": tput,
            "tpot_p50_s": None,
        }
        for c in ("fixed", "dspark")
    ]
    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    (run / "summary.json").write_text(
        json.dumps({"kind": "simulate", "scenario": "tiny", "seed": 0, "rows": rows})
    )


def _mixed_nan(df):
    df["now_s"] = df["now_s"].astype(float)
    df.loc[3, "now_s"] = float("nan")


def _fractional_id(df):
    df["request_id"] = df["request_id"].astype(float)
    df.loc[5, "request_id"] = 0.5


def _bad_block_end(df):
    df["block_end"] = df["block_end"].astype(object)
    df.loc[2, "block_end"] = "maybe"


# (id, files {name: text or callable(folder)}, argv, expected stderr line)
CASES = [
    (
        "horizon-zero",
        {"s.toml": tiny("horizon_s = 0")},
        ["simulate", "s.toml", "--no-out"],
        (
            "s.toml: sim.horizon_s = 0.0 is out of range; allowed a finite number > 0 (leave it "
            "out to run until every request finished)"
        ),
    ),
    (
        "controllers-empty",
        {"s.toml": tiny().replace('controllers = ["fixed", "dspark"]', "controllers = []")},
        ["simulate", "s.toml", "--no-out"],
        "s.toml: sim.controllers = []: name at least one controller; allowed: " + CONTROLLERS,
    ),
    (
        "controllers-unknown",
        {"s.toml": tiny().replace('controllers = ["fixed", "dspark"]', 'controllers = ["dspak"]')},
        ["simulate", "s.toml", "--no-out"],
        "s.toml: sim.controllers[0] = 'dspak' is unknown; allowed: " + CONTROLLERS,
    ),
    (
        "trace-mixed-timezones",
        {
            "s.toml": trace_scenario("t.csv"),
            "t.csv": TRACE_HEAD + "2023-11-16 18:15:46.6805900+00:00,374,44\n"
            "2023-11-16 18:15:50.9951690,396,109\n",
        },
        ["simulate", "s.toml", "--no-out"],
        (
            "{d}/t.csv: column 'TIMESTAMP' mixes timezone-aware and naive times (row 2: "
            "'2023-11-16 18:15:46.6805900+00:00', row 3: '2023-11-16 18:15:50.9951690'); give every "
            "time a UTC offset or none"
        ),
    ),
    (
        "seed-negative",
        {"s.toml": TINY},
        ["simulate", "s.toml", "--no-out", "--seed", "-1"],
        "--seed -1: allowed an integer >= 0",
    ),
    (
        "controller-file-not-a-table",
        {"s.toml": TINY, "c.toml": "controller = 3\n"},
        ["simulate", "s.toml", "--no-out", "--controller", "dspark@c.toml"],
        (
            "c.toml: controller = 3: expected a table [controller.dspark] for --controller "
            "'dspark@c.toml'"
        ),
    ),
    (
        "controller-file-entry-not-a-table",
        {"s.toml": TINY, "c.toml": "[controller]\ndspark = 3\n"},
        ["simulate", "s.toml", "--no-out", "--controller", "dspark@c.toml"],
        (
            "c.toml: controller.dspark = 3: expected a table [controller.dspark] for --controller "
            "'dspark@c.toml'"
        ),
    ),
    (
        "tune-not-a-table",
        {"t.toml": "tune = 3\n"},
        ["tune", "t.toml", "--storage", "memory"],
        "t.toml: tune = 3: expected a table [tune]",
    ),
    (
        "evaluate-not-a-table",
        {"t.toml": "evaluate = [1]\n"},
        ["tune", "t.toml"],
        "t.toml: evaluate = [1]: expected a table [evaluate]",
    ),
    (
        "tune-seed-negative",
        {},
        ["tune", str(ROOT / "configs" / "tune_tiny.toml"), "--seed", "-1", "--storage", "memory"],
        f"{ROOT}/configs/tune_tiny.toml: tune.seed = -1 is out of range; allowed [0, 2147483647]",
    ),
    (
        "tune-workload-measures-nothing",
        {
            "s.toml": tiny("warmup_s = 500"),
            "t.toml": '[tune]\nsim_seeds = [0]\n[[tune.workloads]]\nname = "w"\nscenario = "s.toml"\n',
        },
        ["tune", "t.toml", "--storage", "memory", "--no-eval"],
        (
            "{d}/s.toml: workload 'w': sim.warmup_s = 500.0 leaves no request to measure (the last of 30 "
            "arrives at 8.186 s); allowed below the last arrival"
        ),
    ),
    (
        "report-empty-trace-run",
        {"run": lambda d: _unmeasured_run(d, "run", 0.0)},
        ["report", "run", "--out", "rep"],
        (
            "run/results.csv: no measured output in any of its 2 row(s) (throughput 0: an empty "
            "trace, or sim.warmup_s at or past the end of the run); nothing to report"
        ),
    ),
    (
        "report-warmup-past-run",
        {"run": lambda d: _unmeasured_run(d, "run", float("nan"))},
        ["report", "run", "--out", "rep"],
        (
            "run/results.csv: no measured output in any of its 2 row(s) (throughput 0: an empty "
            "trace, or sim.warmup_s at or past the end of the run); nothing to report"
        ),
    ),
    (
        "controller-table-misspelled",
        {"s.toml": tiny(extra="[controller.dsprak]\nalpha = 0.5\n")},
        ["simulate", "s.toml", "--no-out"],
        "s.toml: [controller.dsprak] names no controller; allowed: " + CONTROLLERS,
    ),
    (
        "controller-table-unused-bad-key",
        {"s.toml": tiny(extra="[controller.analytic]\nnot_a_key = 0.5\n")},
        ["simulate", "s.toml", "--no-out", "--controller", "fixed"],
        (
            "s.toml: unknown key 'controller.analytic.not_a_key'; allowed keys: a_prior, c_prior, "
            "k_max, k_min, min_trials, update_rounds, window_rounds"
        ),
    ),
    (
        "controller-table-unused-out-of-range",
        {"s.toml": tiny(extra="[controller.dspark]\nalpha_ki = -1.0\n")},
        ["simulate", "s.toml", "--no-out", "--controller", "fixed"],
        "s.toml: controller.dspark.alpha_ki = -1.0 is out of range; allowed [0.0, 10.0]",
    ),
    (
        "warmup-longer-than-run",
        {"s.toml": tiny("warmup_s = 1000")},
        ["simulate", "s.toml", "--no-out"],
        (
            "s.toml: sim.warmup_s = 1000.0 leaves no request to measure (the last of 30 arrives at "
            "8.186 s); allowed below the last arrival"
        ),
    ),
    (
        "horizon-before-any-token",
        {"s.toml": tiny("horizon_s = 0.001")},
        ["simulate", "s.toml", "--no-out"],
        (
            "s.toml: sim.horizon_s = 0.001 ends the run before any output token after sim.warmup_s = "
            "0.0 (controller 'fixed'): nothing to measure; allowed a longer horizon"
        ),
    ),
    (
        "warmup-at-horizon",
        {"s.toml": tiny("horizon_s = 5\nwarmup_s = 5")},
        ["simulate", "s.toml", "--no-out"],
        (
            "s.toml: sim.warmup_s = 5.0 is not before the end of the run (sim.horizon_s = 5.0); "
            "allowed < sim.horizon_s"
        ),
    ),
    (
        "warmup-override",
        {"s.toml": TINY},
        ["simulate", "s.toml", "--no-out", "--set", "sim.warmup_s=1e9"],
        (
            "s.toml: sim.warmup_s = 1000000000.0 leaves no request to measure (the last of 30 "
            "arrives at 8.186 s); allowed below the last arrival"
        ),
    ),
    (
        "min-above-max",
        {"s.toml": TINY.replace("max_tokens = 400", "max_tokens = 400, min_tokens = 500")},
        ["simulate", "s.toml", "--no-out"],
        (
            "s.toml: workload.output: min_tokens = 500 is above max_tokens = 400; allowed "
            "min_tokens <= max_tokens"
        ),
    ),
    (
        "trace-header-only",
        {"s.toml": trace_scenario("t.csv"), "t.csv": TRACE_HEAD},
        ["simulate", "s.toml", "--no-out"],
        "{d}/t.csv: trace has no requests (only a header); need at least one row",
    ),
    (
        "trace-int64-overflow",
        {
            "s.toml": trace_scenario("t.csv"),
            "t.csv": TRACE_HEAD + "2023-11-16 18:15:46.68,374,99999999999999999999999\n"
            "2023-11-16 18:15:50.99,396,109\n",
        },
        ["simulate", "s.toml", "--no-out"],
        (
            "{d}/t.csv: column 'GeneratedTokens' = 99999999999999999999999 at row 2 is out of range; "
            "allowed 0 to 10000000 tokens"
        ),
    ),
    (
        "loads-nan",
        {"s.toml": TINY},
        ["simulate", "s.toml", "--no-out", "--loads", "nan"],
        "--loads 'nan': load scales must be finite numbers > 0",
    ),
    (
        "loads-inf",
        {"s.toml": TINY},
        ["simulate", "s.toml", "--no-out", "--loads", "1,inf"],
        "--loads '1,inf': load scales must be finite numbers > 0",
    ),
    (
        "loads-zero",
        {"s.toml": TINY},
        ["simulate", "s.toml", "--no-out", "--loads", "0"],
        "--loads '0': load scales must be finite numbers > 0",
    ),
    (
        "replay-now-nan",
        {"r.csv": lambda d: _write_rounds(d, "r.csv", _mixed_nan)},
        ["replay", "r.csv"],
        "r.csv: row 5: bad value now_s = nan; allowed a finite number",
    ),
    (
        "replay-fractional-id",
        {"r.csv": lambda d: _write_rounds(d, "r.csv", _fractional_id)},
        ["replay", "r.csv"],
        "r.csv: row 7: bad value request_id = 0.5; allowed a whole number >= 0",
    ),
    (
        "replay-block-end-not-bool",
        {"r.csv": lambda d: _write_rounds(d, "r.csv", _bad_block_end)},
        ["replay", "r.csv"],
        "r.csv: row 4: bad value block_end = 'maybe'; allowed true or false",
    ),
    (
        "kv-nothing-fits",
        {"s.toml": TINY},
        [
            "simulate",
            "s.toml",
            "--no-out",
            "--set",
            'workload.output={dist="constant",mean_tokens=5000000,max_tokens=6000000}',
        ],
        (  # paged KV: whole 16-token blocks, 20196 of them
            "s.toml: no request fits in KV memory: the smallest needs 5000031 tokens, a replica "
            "holds 323136 (raise deployment.tp or deployment.kv_memory_fraction, or shorten workload "
            "lengths)"
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    _, files, argv, expected = case
    for name, body in files.items():
        if callable(body):
            body(tmp_path)
        else:
            (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("dspark: error: "), err
    assert "Traceback" not in err
    assert err == "dspark: error: " + expected.format(d=os.path.realpath(tmp_path)) + "\n"


def test_requests_that_never_fit_are_counted_and_warned_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    # a long-tailed prompt: a few requests need more KV than a replica holds
    rc = main(
        [
            "simulate",
            str(ROOT / "configs" / "tiny.toml"),
            "--out",
            str(out),
            "--quiet",
            "--set",
            ('workload.prompt={dist="lognormal",mean_tokens=100000,sigma=2.5,max_tokens=9000000}'),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0
    assert err == (
        "dspark: warning: scenario 'tiny': 2 of 30 requests can never fit in KV memory "
        "(over the 323136 tokens a replica holds): rejected, counted in "
        "requests_rejected and requests_unfinished\n"
    )
    res = pd.read_csv(out / "results.csv")
    assert list(res["requests_rejected"]) == [2, 2]
    assert (res["requests_unfinished"] >= 2).all()
    summary = json.loads((out / "summary.json").read_text())
    assert all(r["requests_rejected"] == 2 for r in summary["rows"])
