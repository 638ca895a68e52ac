"""``dspark simulate --workers N [--storage URL]``: the run folder is the serial one, byte for
byte; a finished study's points are read back, not run again; bad values are one line."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from dspark import cli
from tuning.storage import make_storage, resolve_url

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.toml")
FILES = ("results.csv", "requests.csv", "summary.json", "config.toml")


def _simulate(out: Path, *extra: str) -> None:
    assert cli.main(["simulate", TINY, "--loads", "1,2", "--out", str(out), "--quiet", *extra]) == 0


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serial") / "run"
    _simulate(out)
    return out


def _same(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_workers_2_writes_the_serial_run_folder_byte_for_byte(serial, tmp_path):
    _simulate(tmp_path / "run", "--workers", "2")
    _same(serial, tmp_path / "run")


def test_a_study_sweep_writes_the_serial_run_folder_and_a_second_command_reads_it_back(
    serial, tmp_path
):
    out = tmp_path / "run"
    _simulate(out, "--workers", "2", "--storage", "journal")
    _same(serial, out)
    url = resolve_url(None, out)
    (summary,) = optuna.get_all_study_summaries(make_storage(url))
    assert summary.study_name.startswith("sweep-tiny-")
    assert summary.n_trials == 8  # 2 controllers and 2 baselines at each of 2 loads
    # the same command elsewhere, once every point is done: the folder from the stored points
    _simulate(tmp_path / "again", "--storage", url)
    _same(serial, tmp_path / "again")
    (summary,) = optuna.get_all_study_summaries(make_storage(url))
    assert summary.n_trials == 8  # nothing ran again


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--workers", "0"], "--workers 0: allowed an integer >= 1"),
        (
            ["--workers", "2", "--storage", "memory"],
            "--workers 2 with --storage needs a shared storage (journal or database), not 'memory'",
        ),
        (["--no-out", "--storage", "journal"], "storage 'journal' needs a run folder (--out)"),
    ],
)
def test_bad_worker_and_storage_values_are_one_line(args, msg, tmp_path, capsys):
    rc = cli.main(["simulate", TINY, "--out", str(tmp_path / "run"), "--quiet", *args])
    assert rc == 2
    assert capsys.readouterr().err == f"dspark: error: {msg}\n"
