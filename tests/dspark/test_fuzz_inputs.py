"""Fuzz: several hundred generated inputs to ``dspark simulate / tune / replay / report`` (a seeded
generator: the same cases every run). Every case ends in a run (exit 0, stderr only one-line
warnings) or in one ``dspark: error:`` line with exit 2 (argparse's own usage error, exit 2, is
allowed for flags it cannot parse): never a traceback, never a hang. Cases of issue 14's known-bad
classes must be refused.
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

from dspark.cli import main

ROOT = Path(__file__).resolve().parents[2]
N_CASES = 600
CASE_LIMIT_S = 20  # a case still running after this is a hang

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


@pytest.mark.filterwarnings("ignore")
def test_fuzzed_inputs_end_in_a_run_or_one_line(tmp_path, monkeypatch):
    rng = random.Random(14)
    makers = [
        (_simulate_case, 0.55),
        (_replay_case, 0.25),
        (_tune_case, 0.08),
        (_report_case, 0.12),
    ]
    problems = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(N_CASES):
            d = tmp_path / f"c{i}"
            d.mkdir()
            monkeypatch.chdir(d)
            maker = rng.choices([m for m, _ in makers], [w for _, w in makers])[0]
            argv, bad = maker(rng, d)
            signal.alarm(CASE_LIMIT_S)
            try:
                rc, err = _run(argv)
            except _Hang:
                problems.append((i, argv, "hang"))
                continue
            except Exception as e:
                problems.append((i, argv, f"{type(e).__name__}: {e}"))
                continue
            finally:
                signal.alarm(0)
            if err.startswith("argparse:"):
                if rc != 2:
                    problems.append((i, argv, f"argparse exit {rc}"))
                continue
            lines = err.splitlines()
            if rc == 2:
                if len(lines) != 1 or not lines[0].startswith("dspark: error: "):
                    problems.append((i, argv, f"not one error line: {err!r}"))
            elif rc == 0:
                if bad:
                    problems.append((i, argv, "known-bad input accepted"))
                if any(not x.startswith("dspark: warning: ") for x in lines):
                    problems.append((i, argv, f"stderr beyond one-line warnings: {err!r}"))
            else:
                problems.append((i, argv, f"exit {rc}: {err!r}"))
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not problems, "\n".join(map(str, problems[:20]))
