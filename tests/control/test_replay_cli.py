"""``dspark replay`` and the CLI's one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.types import RECORD_COLUMNS
from dspark.cli import main
from dspark.cmd_replay import TABLE_COLUMNS
from tests.control.helpers import CONTROLLER_NAMES

TRACE = Path(__file__).parents[2] / "examples" / "trace_small.csv"


def test_example_trace_is_reproducible(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_trace", TRACE.with_name("make_trace.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.write(tmp_path / "t.csv")
    assert out.read_text() == TRACE.read_text()
    recs = mod.make()
    assert 60 <= len(recs) <= 100 and any(r.sentence_ends for r in recs)
    easy = [r.accepted for r in recs[:30]]
    hard = [r.accepted for r in recs[30:60]]
    assert sum(easy) > 2 * sum(hard)


def test_replay_prints_table(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[controller.dspark]\nblock_tokens = 32\nwarmup_rounds = 4\n")
    assert main(["replay", str(TRACE), "--config", str(cfg), "--every", "10"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == list(TABLE_COLUMNS)
    assert out[-1].startswith("90 rounds replayed through dspark;")
    ends = int(out[-1].split(";")[1].split()[0])
    assert ends >= 5 and sum(1 for line in out if line.endswith("yes")) == ends


def test_replay_other_controllers(capsys):
    for name in ("hf-heuristic", "clairvoyant", "fixed"):
        assert main(["replay", str(TRACE), "--controller", name, "--every", "30"]) == 0
    out = capsys.readouterr().out
    assert "through clairvoyant" in out


def test_replay_is_deterministic(capsys):
    main(["replay", str(TRACE)])
    a = capsys.readouterr().out
    main(["replay", str(TRACE)])
    assert capsys.readouterr().out == a


def one_line_error(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dspark: error: ")
    assert needle in err and "Traceback" not in err


def test_cli_errors_are_one_line(capsys, tmp_path):
    for name, text, needle in [
        ("bad.toml", "[controller.dspark\nalpha0 = ", "malformed TOML"),
        (
            "u.toml",
            "[controller.dspark]\nalpha_gain = 1.0\n",
            "unknown key 'controller.dspark.alpha_gain'",
        ),
        (
            "r.toml",
            "[controller.dspark]\nbeta_ki = 99.0\n",
            "controller.dspark.beta_ki = 99.0 is out of range; allowed [0.0, 10.0]",
        ),
        ("n.toml", "[controller]\ndspark = 3\n", "must be a table"),
    ]:
        cfg = tmp_path / name
        cfg.write_text(text)
        one_line_error(capsys, ["replay", str(TRACE), "--config", str(cfg)], needle)
    one_line_error(capsys, ["replay", str(tmp_path / "none.csv")], "file not found")
    one_line_error(
        capsys, ["replay", str(TRACE), "--controller", "nope"], "unknown controller 'nope'"
    )
    one_line_error(capsys, ["replay", str(TRACE), "--every", "0"], "--every must be >= 1")
    one_line_error(
        capsys, ["replay", str(TRACE), "--config", str(tmp_path / "x.toml")], "file not found"
    )


def test_cli_trace_errors(capsys, tmp_path):
    missing = tmp_path / "m.csv"
    cols = [c for c in RECORD_COLUMNS if c != "accepted"]
    missing.write_text(",".join(cols) + "\n")
    one_line_error(capsys, ["replay", str(missing)], "missing column 'accepted'")
    header_only = tmp_path / "h.csv"
    header_only.write_text(",".join(RECORD_COLUMNS) + "\n")
    one_line_error(capsys, ["replay", str(header_only)], "trace has no rounds")
    lines = TRACE.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[1].split(",")
    row[header.index("accepted")] = "9"  # accepted > drafted
    badrow = tmp_path / "b.csv"
    badrow.write_text(lines[0] + "\n" + ",".join(row) + "\n")
    one_line_error(capsys, ["replay", str(badrow)], "trace row 1")
    row[header.index("accepted")] = "lots"
    badval = tmp_path / "v.csv"
    badval.write_text(lines[0] + "\n" + ",".join(row) + "\n")
    one_line_error(capsys, ["replay", str(badval)], "bad value")
    empty = tmp_path / "e.csv"
    empty.write_text("")
    one_line_error(capsys, ["replay", str(empty)], "cannot read trace")


@pytest.mark.parametrize("name", CONTROLLER_NAMES)
def test_configio_round_trip(name):
    import tomllib

    from control.configio import from_mapping, to_toml
    from control.registry import controller_config_class

    cls = controller_config_class(name)
    cfg = cls()
    assert from_mapping(cls, tomllib.loads(to_toml(cfg))) == cfg
