"""CLI polish: --version, --json always a list, a closed pipe ends quietly, a new run folder per
run (an existing one refused without --overwrite), human units in the table, "did you mean",
no reST markup in help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.toml")


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("dspark ")


def test_json_is_always_a_list(capsys):
    assert main(["simulate", TINY, "--controller", "fixed", "--json", "--no-out", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) == 1 and rows[0]["controller"] == "fixed"


def test_table_has_units_and_human_numbers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", TINY, "--controller", "fixed", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "throughput (tok/s)" in out and "TPOT p99 (ms)" in out
    assert "e+0" not in out and "throughput_tokens_per_s" not in out
    # a new run folder per run, named in the output
    first = out.strip().splitlines()[-1].removeprefix("run folder: ")
    assert main(["simulate", TINY, "--controller", "fixed", "--quiet"]) == 0
    second = capsys.readouterr().out.strip().splitlines()[-1].removeprefix("run folder: ")
    assert first != second and (Path(first) / "summary.json").exists()
    assert (Path(second) / "summary.json").exists()
    # --out naming an existing run is refused unless --overwrite
    assert main(["simulate", TINY, "--controller", "fixed", "--quiet", "--out", first]) == 2
    assert "--overwrite" in capsys.readouterr().err
    args = ["simulate", TINY, "--controller", "fixed", "--quiet", "--out", first, "--overwrite"]
    assert main(args) == 0


def test_did_you_mean(capsys):
    with pytest.raises(SystemExit):
        main(["simulat"])
    assert "did you mean 'simulate'?" in capsys.readouterr().err
    assert main(["simulate", TINY, "--controller", "dsprak", "--no-out", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown controller 'dsprak'" in err and "did you mean 'dspark'?" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "cmd",
    [
        ["simulate"],
        ["tune"],
        ["report"],
        ["replay"],
        ["validate"],
        ["real", "bench"],
        ["real", "generate"],
        ["real", "serve"],
    ],
)
def test_help_has_no_rest_markup(cmd, capsys):
    with pytest.raises(SystemExit):
        main([*cmd, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":class:" not in out


@pytest.mark.slow
def test_closed_pipe_ends_quietly():
    code = (
        "import sys, dspark.cmd_report as r, dspark.cli as c\n"
        "r.run = lambda a: [print('x' * 200) for _ in range(20000)] and 0\n"
        "sys.exit(c.main(['report', 'anything']))\n"
    )
    p = subprocess.run(
        f'{sys.executable} -c "{code}" | head -1',
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.stdout.strip() == "x" * 200
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_set_can_fix_a_path(tmp_path, monkeypatch):
    """--set overrides are applied before paths resolve; a relative one is relative to where
    it was typed."""
    from sim import load_scenario

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{10 + i:02d}.0,{100 + i},{20 + i}\n" for i in range(12))
    )
    scn = (ROOT / "configs" / "tiny.toml").read_text()
    bad = tmp_path / "cfg" / "s.toml"
    bad.parent.mkdir()
    bad.write_text(
        scn.replace('arrival = "poisson"', 'arrival = "trace"\ntrace_path = "no/such/file.csv"', 1)
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_scenario(bad, {"workload.trace_path": "data/t.csv"})
    assert Path(cfg.workload.trace_path) == (tmp_path / "data" / "t.csv").resolve()
    rc = main(
        [
            "simulate",
            str(bad),
            "--controller",
            "fixed",
            "--no-out",
            "--quiet",
            "--set",
            "workload.trace_path=data/t.csv",
        ]
    )
    assert rc == 0
