"""Tuning configs and storage URLs: bad input is a one-line error naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.errors import ConfigError
from tuning.config import load_tuning_config
from tuning.storage import make_storage, redact, resolve_url

from .conftest import ROOT, TINY, run_tune


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tune.toml"
    p.write_text(text)
    return p


BASE = f'''
[tune]
controller = "dspark"
[[tune.workloads]]
name = "a"
scenario = "{ROOT}/configs/tiny.toml"
overrides = {{ "workload.rate_rps" = 40.0 }}
[[evaluate.workloads]]
name = "b"
scenario = "{ROOT}/configs/tiny.toml"
'''


def test_tiny_config_loads_with_resolved_paths(tiny_cfg):
    assert tiny_cfg.tune.controller == "dspark"
    assert all(Path(w.scenario).is_absolute() for w in tiny_cfg.tune.workloads)
    assert tiny_cfg.study_name() == "dspark-throughput"
    assert tiny_cfg.pinned() == {}
    q = load_tuning_config(ROOT / "configs" / "tune_quality.toml")
    assert q.multi_objective and q.pinned() == {"mode": "threshold"}


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda s: s.replace('controller = "dspark"', 'controller = "dspark"\nbogus = 1'),
            "unknown key 'tune.bogus'",
        ),
        (
            lambda s: s.replace('controller = "dspark"', 'controller = "nope"'),
            "tune.controller = 'nope' is unknown",
        ),
        (
            lambda s: s.replace(
                'controller = "dspark"', 'controller = "dspark"\nobjective = "speed"'
            ),
            "tune.objective = 'speed' is not allowed",
        ),
        (
            lambda s: s.replace('controller = "dspark"', 'controller = "dspark"\nn_trials = 0'),
            "tune.n_trials = 0 is out of range",
        ),
        (
            lambda s: s.replace(
                f'scenario = "{ROOT}/configs/tiny.toml"\noverrides',
                'scenario = "missing.toml"\noverrides',
            ),
            "file not found",
        ),
        (
            lambda s: s.replace(
                'name = "b"\nscenario = "' + f'{ROOT}/configs/tiny.toml"',
                'name = "b"\nscenario = "' + f'{ROOT}/configs/tiny.toml"\n'
                'overrides = { "workload.rate_rps" = 40.0 }',
            ),
            "held-out workload 'b' is the same as tuning workload 'a'",
        ),
        (
            lambda s: s.replace(
                'controller = "dspark"',
                'controller = "dspark"\nobjective = "throughput-p99"\nsampler = "cmaes"',
            ),
            "'cmaes' is single-objective",
        ),
        (
            lambda s: s.replace(
                'controller = "dspark"', 'controller = "analytic"\nmode = "strict"'
            ),
            "no verification mode to pin",
        ),
        (lambda s: s.replace('name = "a"', 'name = "a b"'), "needs a name"),
    ],
)
def test_bad_tuning_config_is_one_line_error(tmp_path, edit, message):
    p = _write(tmp_path, edit(BASE))
    with pytest.raises(ConfigError) as e:
        load_tuning_config(p)
    assert message in str(e.value)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.slow
def test_cli_bad_config_prints_one_line_and_exits_2(tmp_path):
    p = _write(tmp_path, BASE.replace('controller = "dspark"', 'controller = "dspark"\nx = 1'))
    r = run_tune(str(p), "--out", str(tmp_path / "o"), timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: ") and "tune.x" in lines[0]


@pytest.mark.slow
def test_cli_refuses_memory_storage_with_workers(tmp_path):
    r = run_tune(
        str(TINY),
        "--storage",
        "memory",
        "--workers",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        timeout=60,
    )
    assert r.returncode == 2 and "needs a shared storage" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_storage_urls(tmp_path):
    j = tmp_path / "study.journal"
    assert resolve_url(None, tmp_path) == f"journal:{j}"
    assert resolve_url("journal", tmp_path) == f"journal:{j}"
    assert resolve_url(f"journal:{j}", None) == f"journal:{j}"
    assert resolve_url(f"journal://{j}", None) == f"journal:{j}"
    assert resolve_url(str(j), None) == f"journal:{j}"
    assert resolve_url("memory", None) == "memory"
    assert resolve_url("postgresql://u:pw@h:5/db", None) == "postgresql://u:pw@h:5/db"
    assert resolve_url("postgresql+psycopg2://u@h/db", None).startswith("postgresql+psycopg2")
    assert redact("postgresql://u:secret@h:5/db") == "postgresql://u@h:5/db"
    for bad, msg in [
        ("ftp://x/y", "unknown scheme 'ftp'"),
        ("whatever", "not understood"),
        ("journal:", "needs a file path"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            resolve_url(bad, tmp_path)
    with pytest.raises(ConfigError, match="needs a run folder"):
        resolve_url(None, None)
    st = make_storage(f"journal:{j}")
    assert j.exists() and type(st).__name__ == "JournalStorage"
    assert type(make_storage("memory")).__name__ == "InMemoryStorage"


def test_unreachable_database_is_one_line_error():
    with pytest.raises(ConfigError) as e:
        make_storage("postgresql://nobody:pw@127.0.0.1:1/none")
    assert "cannot be opened" in str(e.value) and "pw" not in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_tune_prints_the_final_table(tmp_path):
    out = tmp_path / "o"
    r = run_tune(str(TINY), "--trials", "3", "--storage", "memory", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "3 trials" in r.stdout and "held-out evaluation" in r.stdout
    rows = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    for label in (
        "dspark-tuned",
        "dspark-seed",
        "dspark-default",
        "fixed-best",
        "clairvoyant",
        "rate-oracle",
    ):
        assert label in rows
    assert (out / "evaluation.csv").exists() and not (out / "study.journal").exists()
