"""``dspark simulate --controller NAME@best_config.toml`` runs on the scenario keys the study
tuned (its ``[scenario]`` table), the same for every controller of the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark import cli

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.toml")


def _best(tmp_path: Path, name: str, requests: int) -> str:
    p = tmp_path / name
    p.write_text(f'[controller.fixed]\nk = 2\n\n[scenario]\n"workload.num_requests" = {requests}\n')
    return str(p)


def _rows(capsys, argv: list[str]) -> list[dict]:
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_tuned_scenario_is_the_run_s_scenario(tmp_path, capsys):
    best = _best(tmp_path, "best.toml", 9)
    base = ["simulate", TINY, "--no-out", "--quiet", "--json"]
    tuned = _rows(capsys, [*base, "--controller", f"fixed@{best}", "--controller", "fixed:k=0"])
    by_set = _rows(
        capsys,
        [
            *base,
            "--set",
            "workload.num_requests=9",
            "--controller",
            "fixed:k=2",
            "--controller",
            "fixed:k=0",
        ],
    )
    plain = _rows(capsys, [*base, "--controller", "fixed:k=2"])
    drop = ("controller",)
    # the tuned file's [scenario] is exactly --set of its keys, for every controller of the run
    assert [{k: v for k, v in r.items() if k not in drop} for r in tuned] == [
        {k: v for k, v in r.items() if k not in drop} for r in by_set
    ]
    assert tuned[0]["requests_finished"] == 9 != plain[0]["requests_finished"]


def test_contradicting_tuned_scenarios_are_one_line(tmp_path, capsys):
    a, b = _best(tmp_path, "a.toml", 9), _best(tmp_path, "b.toml", 11)
    argv = ["simulate", TINY, "--no-out", "--quiet", "--controller", f"fixed@{a}"]
    assert cli.main([*argv, "--controller", f"fixed@{b}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "b.toml" in err and "workload.num_requests" in err
    assert cli.main([*argv, "--set", "workload.num_requests=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "contradicts --set" in err


@pytest.mark.parametrize(
    "text",
    [
        '[controller.fixed]\nk = 2\n\n[scenario]\n"no.such_key" = 1\n',
        "scenario = 3\n\n[controller.fixed]\nk = 2\n",
    ],
)
def test_a_bad_scenario_table_names_the_file(tmp_path, capsys, text):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    assert cli.main(["simulate", TINY, "--no-out", "--controller", f"fixed@{p}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.toml" in err
