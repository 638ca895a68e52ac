"""Fuzz: several hundred generated inputs to every ``dspark`` command that reads user input
(simulate, tune, replay, report, and where they exist capacity, export, calibrate, sweeps with
workers or a storage), one parametrized case each, seeded by its family and number (the same cases
every run). Every case ends in a run (exit 0, stderr only one-line warnings) or in one ``dspark:
error:`` line with exit 2 (argparse's own usage error, exit 2, is allowed for flags it cannot
parse): never a traceback, never a hang. A case of a known-bad class must be refused (naming what
its needle says), a known-good one must run, and a trace read with an assumed unit must say so in
a warning line: nothing is accepted silently. Issue 14's generators (simulate, replay, tune,
report) are kept; issue 39's are in :mod:`tests.dspark.fuzz_cases`.

Cases run in-process; every 11th runs in the fast set (``make test-fast``), the rest are marked
slow, and a sample of one case per family also runs as a subprocess (the real interpreter's
stderr).
"""

from __future__ import annotations

import contextlib
import io
import random
import signal
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from dspark.cli import build_parser, main

from .fuzz_cases import (
    calibrate_case,
    capacity_case,
    export_case,
    horizon_case,
    peer_case,
    slo_case,
    sweep_case,
    trace_case,
)

ROOT = Path(__file__).resolve().parents[2]
CASE_LIMIT_S = 30  # a case still running after this is a hang (a capacity search: 120)

NAN, INF = float("nan"), float("inf")
VALUES = [
    0,
    -1,
    1,
    2,
    0.5,
    3.7,
    1e9,
    -1e9,
    NAN,
    INF,
    -INF,
    "x",
    "",
    [],
    {},
    True,
    [1, "a"],
    2**70,
    ["fixed"],
    {"k": 1},
]
# values a user might mean: half of the mutations, so that many cases run
PLAUSIBLE = [
    1,
    2,
    3,
    0.5,
    0.9,
    10,
    100,
    1000,
    0.01,
    "fixed",
    "dspark",
    "poisson",
    "gamma",
    "sinusoid",
    "capacity",
    "trace",
    "lognormal",
    "constant",
    "empirical",
    "iid",
    "markov",
    "mixture",
    "replay",
    "H100-SXM",
    "Llama-3.1-8B",
    "custom",
    "separate",
    "least-outstanding",
    "fp8",
    "table",
    "constant",
    ["fixed", "analytic"],
    [1, 2, 3],
]
SCENARIO_KEYS = [
    "name",
    "sim.horizon_s",
    "sim.warmup_s",
    "sim.controllers",
    "workload.arrival",
    "workload.rate_rps",
    "workload.gamma_cv",
    "workload.swing_amplitude",
    "workload.swing_period_s",
    "workload.horizon_s",
    "workload.time_scale",
    "workload.max_requests",
    "workload.trace_lengths",
    "workload.prompt",
    "workload.output",
    "workload.prompt.dist",
    "workload.prompt.mean_tokens",
    "workload.prompt.sigma",
    "workload.prompt.min_tokens",
    "workload.prompt.max_tokens",
    "workload.output.min_tokens",
    "workload.output.max_tokens",
    "workload.output.values",
    "workload.output.path",
    "deployment.tp",
    "deployment.max_batch",
    "deployment.kv_memory_fraction",
    "deployment.drafter_placement",
    "deployment.routing",
    "deployment.max_draft_tokens",
    "acceptance.model",
    "acceptance.beta_mean",
    "acceptance.beta_concentration",
    "acceptance.rate",
    "slo.ttft_s",
    "slo.tpot_s",
    "hardware.preset",
    "target.preset",
    "target.layers",
    "drafter.dtype",
    "latency.backend",
    "latency.round_overhead_s",
    "controller.fixed",
    "controller.fixed.k",
    "controller.dspark.alpha_ki",
    "controller.dsprak.alpha",
    "controller.analytic.nope",
    "controller",
    "sim",
    "workload",
]
CONTROLLER_SPECS = [
    "fixed",
    "dspark",
    "analytic",
    "nope",
    "fixed:k=0",
    "fixed:k=-1",
    "fixed:k=x",
    "fixed:",
    "dspark:alpha_ki=nan",
    "dspark@c.toml",
    "fixed@c.toml",
    "fixed@missing.toml",
    "@c.toml",
    ":",
]
LOADS = ["1", "0.5,2", "nan", "inf", "-inf", "0", "-1", "", "abc", "1,,2", "1e300", "1e-3", "2,nan"]
SEEDS = ["0", "7", "-1", "-5", str(2**40), "abc", "1.5"]
TRACE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
TRACE_ROWS = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.1,10,5",
]
TRACE_BAD_ROWS = [
    "2023-11-16 18:15:46.68+00:00,374,44",
    "not a time,1,1",
    ",1,1",
    "2023-11-16 18:15:46,-3,4",
    "2023-11-16 18:15:46,3.5,4",
    "2023-11-16 18:15:46,3,99999999999999999999999",
    "2023-11-16 18:15:46,3",
    "2023-11-16 18:15:46,3,4,5",
    "2023-11-16 18:15:46,nan,4",
    "2023-11-16 18:15:46,inf,4",
    "2023-11-16 18:15:46Z,3,4",
]


def _set(d: dict, key: str, value) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[parts[-1]] = value


def _table(data: dict, key: str) -> dict:
    if not isinstance(data.get(key), dict):
        data[key] = {}
    return data[key]


def _scenario(rng: random.Random, d: Path) -> tuple[dict, bool]:
    """The tiny scenario (6 requests), mutated; True when a mutation is a known-bad class."""
    data = tomllib.loads((ROOT / "configs" / "tiny.toml").read_text())
    data["workload"]["num_requests"] = 6
    bad = False
    for _ in range(rng.randint(0, 3)):
        _set(
            data, rng.choice(SCENARIO_KEYS), rng.choice(VALUES if rng.random() < 0.5 else PLAUSIBLE)
        )
    known = rng.random()
    if known < 0.25:  # one of issue 14's classes, on top
        cls = rng.randrange(7)
        if cls == 0:
            _table(data, "sim")["horizon_s"] = 0
        elif cls == 1:
            _table(data, "sim")["controllers"] = []
        elif cls == 2:
            _table(data, "sim")["warmup_s"] = 1e6
        elif cls == 3:
            _table(data, "workload")["output"] = {"min_tokens": 500, "max_tokens": 400}
        elif cls == 4:
            data["controller"] = {"dsprak": {"alpha": 0.5}}
        elif cls == 5:
            data["controller"] = {"analytic": {"not_a_key": 1}}
        else:
            data["sim"] = {"horizon_s": 3.0, "warmup_s": 3.0}
        bad = True
    elif known < 0.45:  # an Azure-format trace, maybe broken
        rows = list(TRACE_ROWS)
        for _ in range(rng.randint(0, 2)):
            rows.insert(rng.randrange(len(rows) + 1), rng.choice(TRACE_BAD_ROWS))
        if rng.random() < 0.15:
            rows = []
            bad = True
        head = TRACE_HEAD if rng.random() > 0.1 else "TIMESTAMP,ContextTokens"
        (d / "t.csv").write_text("\n".join([head, *rows]) + "\n")
        _table(data, "workload").update(arrival="trace", trace_path="t.csv")
    return data, bad


def _simulate_case(rng: random.Random, d: Path) -> tuple[list[str], bool]:
    data, bad = _scenario(rng, d)
    try:
        (d / "s.toml").write_text(tomli_w.dumps(data))
    except (TypeError, ValueError):
        (d / "s.toml").write_text("[sim]\nhorizon_s = 0\n")
        bad = True
    if rng.random() < 0.3:
        c = {
            "controller": rng.choice(
                [
                    3,
                    {"dspark": 3},
                    {"dspark": {"alpha_ki": 0.1}},
                    {"fixed": {"k": 2}},
                    {"fixed": {"k": "x"}},
                ]
            )
        }
        (d / "c.toml").write_text(tomli_w.dumps(c))
    argv = ["simulate", "s.toml", "--no-out", "--quiet"]
    if rng.random() < 0.4:
        for _ in range(rng.randint(1, 2)):
            argv += ["--controller", rng.choice(CONTROLLER_SPECS)]
    if rng.random() < 0.3:
        loads = rng.choice(LOADS)
        argv += ["--loads", loads]
        bad |= loads in ("nan", "inf", "-inf", "0", "-1", "2,nan")
    if rng.random() < 0.3:
        seed = rng.choice(SEEDS)
        argv += [f"--seed={seed}"]
        bad |= seed.startswith("-")
    if rng.random() < 0.2:
        argv += [
            "--set",
            f"{rng.choice(SCENARIO_KEYS)}={rng.choice(['0', '-1', 'nan', 'inf', 'x', '[]', '{}', '1e9', '3'])}",
        ]
    return argv, bad


def _replay_case(rng: random.Random, d: Path) -> tuple[list[str], bool]:
    df = pd.read_csv(ROOT / "examples" / "trace_small.csv").head(30)
    bad = False
    for _ in range(rng.randint(0, 2)):
        col = rng.choice(list(df.columns))
        df[col] = df[col].astype(object)
        v = rng.choice([NAN, INF, -1, 0.5, "x", "", 2**70, "maybe", True, 3])
        df.loc[rng.randrange(len(df)), col] = v
    kind = rng.random()
    if kind < 0.1:
        df = df.drop(columns=[rng.choice(["now_s", "k", "request_id", "mode"])])
    elif kind < 0.2:
        df = df.head(0)
    elif kind < 0.45:  # issue 14's classes: must be refused
        col, v = rng.choice(
            [("now_s", NAN), ("request_id", 0.5), ("block_end", "maybe"), ("block_end", 2)]
        )
        df[col] = df[col].astype(object)
        df.loc[3, col] = v
        bad = True
    df.to_csv(d / "r.csv", index=False)
    argv = ["replay", "r.csv", "--controller", rng.choice(["dspark", "fixed", "analytic", "nope"])]
    if rng.random() < 0.3:
        argv += ["--every", rng.choice(["1", "0", "-3", "x", "5"])]
    if rng.random() < 0.3:
        (d / "c.toml").write_text(
            rng.choice(
                [
                    "controller = 3\n",
                    "[controller]\ndspark = 1\n",
                    "[controller.dspark]\nalpha_ki = -1.0\n",
                    "[controller.fixed]\nk = 2\n",
                    "bad toml [",
                ]
            )
        )
        argv += ["--config", "c.toml"]
    return argv, bad


def _tune_case(rng: random.Random, d: Path) -> tuple[list[str], bool]:
    text = (
        (ROOT / "configs" / "tune_tiny.toml")
        .read_text()
        .replace('scenario = "tiny.toml"', f'scenario = "{ROOT / "configs" / "tiny.toml"}"')
    )
    data = tomllib.loads(text)
    bad = False
    r = rng.random()
    if r < 0.2:
        data["tune"] = rng.choice([3, "x", [1]])
        bad = True
    elif r < 0.35:
        data["evaluate"] = rng.choice([3, [1]])
        bad = True
    elif r < 0.7:
        key = rng.choice(
            [
                "n_trials",
                "seed",
                "sim_seeds",
                "controller",
                "objective",
                "sampler",
                "workloads",
                "pruner",
                "n_startup_trials",
                "mode",
            ]
        )
        data["tune"][key] = rng.choice(VALUES if rng.random() < 0.5 else PLAUSIBLE)
    (d / "t.toml").write_text(tomli_w.dumps(data))
    argv = ["tune", "t.toml", "--storage", "memory", "--no-eval", "--quiet", "--trials", "1"]
    if rng.random() < 0.4:
        seed = rng.choice(SEEDS)
        argv += [f"--seed={seed}"]
        bad |= seed.startswith("-")
    return argv, bad


def _report_case(rng: random.Random, d: Path) -> tuple[list[str], bool]:
    run = d / "run"
    run.mkdir()
    rows = [
        {
            "controller": "fixed",
            "seed": 0,
            "load_scale": 1.0,
            "throughput_tokens_per_s": rng.choice([0.0, NAN, 100.0]),
        }
    ]
    bad = not rows[0]["throughput_tokens_per_s"] > 0
    summary = rng.choice(
        [
            '{"kind": "simulate", "rows": []}',
            "{bad json",
            '{"kind": "nope"}',
            "[]",
            '{"kind": "simulate"}',
        ]
    )
    (run / "summary.json").write_text(summary)
    if rng.random() < 0.8:
        pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    return ["report", "run", "--out", "rep"], bad


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: a flag it cannot parse (usage + error)
            rc = e.code if isinstance(e.code, int) else 2
            return (rc, "argparse:" + err.getvalue())
    return rc, err.getvalue()


def _issue14(maker):
    """One of issue 14's generators as a case: ``(argv, bad)`` -> ``(argv, expect, needle)``."""

    def case(rng: random.Random, d: Path):
        argv, bad = maker(rng, d)
        return argv, ("bad" if bad else "any"), ""

    return case


def _commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


# (family, generator, cases, the command it needs: left out until that command exists)
FAMILIES = [
    ("simulate", _issue14(_simulate_case), 200, "simulate"),
    ("replay", _issue14(_replay_case), 90, "replay"),
    ("tune", _issue14(_tune_case), 30, "tune"),
    ("report", _issue14(_report_case), 40, "report"),
    ("trace", trace_case, 110, "simulate"),
    ("slo", slo_case, 40, "simulate"),
    ("horizon", horizon_case, 30, "simulate"),
    ("peer", peer_case, 40, "simulate"),
    ("export", export_case, 50, "export"),
    ("calibrate", calibrate_case, 70, "calibrate"),
    ("capacity", capacity_case, 14, "capacity"),
    ("sweep", sweep_case, 12, "simulate"),
]
SLOW_FAMILIES = {"capacity", "sweep"}  # seconds a case: never in the fast set
COMMANDS = _commands()
CASES = [
    pytest.param(
        fam,
        i,
        id=f"{fam}-{i:03d}",
        marks=() if k % 11 == 0 and fam not in SLOW_FAMILIES else (pytest.mark.slow,),
    )
    for k, (fam, i) in enumerate(
        (fam, i) for fam, _, n, cmd in FAMILIES if cmd in COMMANDS for i in range(n)
    )
]
MAKERS = {fam: maker for fam, maker, _, _ in FAMILIES}


def _case(fam: str, i: int, d: Path) -> tuple[list[str], str, str]:
    return MAKERS[fam](random.Random(f"{fam}:{i}"), d)


def _judge(argv: list[str], rc: int, err: str, expect: str, needle: str) -> str | None:
    """What is wrong with the outcome of a case (None: nothing)."""
    if err.startswith("argparse:"):
        if rc != 2:
            return f"argparse exit {rc}"
        return "a good input refused by argparse" if expect in ("ok", "warn") else None
    lines = err.splitlines()
    if rc == 2:
        if len(lines) != 1 or not lines[0].startswith("dspark: error: "):
            return f"not one error line: {err!r}"
        if expect in ("ok", "warn"):
            return f"a good input refused: {lines[0]}"
        if expect == "bad" and needle and needle not in lines[0]:
            return f"refused without naming {needle!r}: {lines[0]}"
        return None
    if rc != 0:
        return f"exit {rc}: {err!r}"
    if expect == "bad":
        return f"known-bad input accepted (stderr {err!r})"
    if any(not x.startswith("dspark: warning: ") for x in lines):
        return f"stderr beyond one-line warnings: {err!r}"
    if expect == "warn" and not any(needle in x for x in lines):
        return f"accepted without the warning {needle!r}: {err!r}"
    return None


@pytest.mark.filterwarnings("always::UserWarning")
@pytest.mark.parametrize("fam, i", CASES)
def test_fuzzed_input_ends_in_a_run_or_one_line(fam, i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, expect, needle = _case(fam, i, tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_LIMIT_S * (4 if fam in SLOW_FAMILIES else 1))
    try:
        rc, err = _run(argv)
    except _Hang:
        pytest.fail(f"{argv}: hang")
    except Exception as e:
        pytest.fail(f"{argv}: traceback: {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    problem = _judge(argv, rc, err, expect, needle)
    assert problem is None, f"{argv} ({expect}): {problem}"


def test_there_are_at_least_500_cases_and_every_new_command_has_a_family():
    assert len(CASES) >= 500
    fuzzed = {cmd for _, _, _, cmd in FAMILIES}
    # the commands that read user input; `real`, `validate` and `demo` need models or GPUs
    assert COMMANDS - fuzzed <= {"real", "validate", "demo"}, COMMANDS - fuzzed


# one case of each family in a fresh interpreter: its real stderr, tracebacks included
SAMPLE = [(fam, 7) for fam, _, _, cmd in FAMILIES if cmd in COMMANDS]


@pytest.mark.slow
@pytest.mark.parametrize("fam, i", SAMPLE, ids=[f"{f}-{i:03d}" for f, i in SAMPLE])
def test_a_sample_in_a_subprocess(fam, i, tmp_path):
    import subprocess
    import sys

    argv, expect, needle = _case(fam, i, tmp_path)
    limit = CASE_LIMIT_S * (4 if fam in SLOW_FAMILIES else 2)
    r = subprocess.run(
        [sys.executable, "-m", "dspark", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=limit,
        check=False,
    )
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    usage = r.returncode == 2 and r.stderr.startswith("usage:")
    err = ("argparse:" + r.stderr) if usage else r.stderr
    problem = _judge(argv, r.returncode, err, expect, needle)
    assert problem is None, f"{argv} ({expect}): {problem}"


def test_the_judge_flags_every_kind_of_wrong_outcome():
    argv = ["simulate", "s.toml"]
    err1 = "dspark: error: s.toml: sim.horizon_s = inf is out of range\n"
    assert _judge(argv, 2, err1, "bad", "horizon_s") is None
    assert "without naming" in _judge(argv, 2, err1, "bad", "warmup_s")
    assert "known-bad input accepted" in _judge(argv, 0, "", "bad", "")
    assert "good input refused" in _judge(argv, 2, err1, "ok", "")
    assert "not one error line" in _judge(argv, 2, err1 + "more\n", "any", "")
    assert "not one error line" in _judge(
        argv, 2, "Traceback (most recent call last):\n", "any", ""
    )
    assert "beyond one-line warnings" in _judge(argv, 0, "Traceback\n", "any", "")
    assert "without the warning" in _judge(argv, 0, "", "warn", "read as seconds")
    assert (
        _judge(argv, 0, "dspark: warning: t.csv: read as seconds\n", "warn", "read as seconds")
        is None
    )
    assert "exit 1" in _judge(argv, 1, "", "any", "")
    assert _judge(argv, 2, "argparse:usage: ...", "bad", "") is None
    assert "refused by argparse" in _judge(argv, 2, "argparse:usage: ...", "ok", "")
