"""Find run folders and read their saved files (docs/results-format.md is the contract).

A path is either a run folder (it holds ``summary.json``) or a parent of several. Every read
problem — no summary.json, bad JSON, unknown kind, an unreadable CSV, a missing required column —
is one :class:`DSparkError` line that names the file.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from control.errors import DSparkError
from control.types import RoundRecord

KINDS = ("simulate", "capacity", "tune", "real", "validate")

# required columns of each table this package reads (the rest of the contract's columns are optional:
# a report shows "—" for a metric a run did not save)
SIM_RESULT_COLUMNS = ("controller", "seed", "load_scale", "throughput_tokens_per_s")
REQUEST_COLUMNS = ("controller", "request_id", "output_tokens", "tpot_s", "e2e_s")
TRACE_COLUMNS = ("controller", "request_id", "now_s", "k", "alpha", "beta", "a_hat", "block_end")
ROUND_REQUIRED = tuple(
    f.name for f in dataclasses.fields(RoundRecord) if f.default is dataclasses.MISSING
)  # RoundRecord fields without a default
ERROR_COLUMNS = ("controller", "workload", "metric", "sim", "real", "real_spread", "error_pct")
IMPORTANCE_COLUMNS = ("param", "importance")
TRIAL_COLUMNS = ("number", "state")
EVALUATION_COLUMNS = ("controller", "workload", "seed")
HELDOUT_CAPACITY_COLUMNS = ("controller", "workload", "seed", "capacity_load_scale")
REAL_ROW_KEYS = ("controller", "tokens_per_s")
CAPACITY_ROW_KEYS = ("controller", "capacity_load_scale")
CAPACITY_COLUMNS = ("controller", "seed", "capacity_load_scale")
PROBE_COLUMNS = ("controller", "seed", "load_scale", "slo_attainment")

# files that mark a folder as a run folder even when its summary.json is missing
RESULT_FILES = (
    "results.csv",
    "errors.csv",
    "trials.csv",
    "rounds.csv",
    "requests.csv",
    "study.journal",
    "evaluation.csv",
    "capacity.csv",
    "probes.csv",
)


@dataclass
class Run:
    """One run folder: its kind, summary, resolved config and the tables it saved."""

    path: Path
    kind: str
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    def table(self, name: str) -> pd.DataFrame | None:
        return self.tables.get(name)


def discover(paths: list[str | Path]) -> list[Path]:
    """Run folders under ``paths`` (each a run folder or a parent of run folders), in order."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise DSparkError(f"{p}: no such file or folder")
        if p.is_file():
            if p.name == "summary.json":
                p = p.parent
            else:
                raise DSparkError(f"{p}: not a run folder (give the folder holding summary.json)")
        if (p / "summary.json").exists():
            found.append(p)
            continue
        if any((p / f).exists() for f in RESULT_FILES):
            raise DSparkError(
                f"{p / 'summary.json'}: missing (the folder holds results but no summary.json)"
            )
        subs = _run_folders_below(p)
        if not subs:
            raise DSparkError(f"{p}: no run folder found (no summary.json in it or below it)")
        found.extend(subs)
    seen: set[Path] = set()
    out = []
    for f in found:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            out.append(f)
    return out


def _run_folders_below(p: Path) -> list[Path]:
    out: list[Path] = []
    for child in sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")):
        if (child / "summary.json").exists():
            out.append(child)
        elif any((child / f).exists() for f in RESULT_FILES):
            raise DSparkError(
                f"{child / 'summary.json'}: missing (the folder holds results but no summary.json)"
            )
        else:
            out.extend(_run_folders_below(child))
    return out


def read_summary(path: Path) -> dict[str, Any]:
    f = path / "summary.json"
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DSparkError(f"{f}: missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DSparkError(f"{f}: cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DSparkError(f"{f}: bad JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise DSparkError(f"{f}: bad summary: expected a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise DSparkError(f"{f}: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    return data


def read_csv(f: Path, required: tuple[str, ...], *, optional: bool = False) -> pd.DataFrame | None:
    """Read one CSV; ``None`` when absent and ``optional``; one-line errors name the file."""
    if not f.exists():
        if optional:
            return None
        raise DSparkError(f"{f}: missing (required for this kind of run)")
    try:
        df = pd.read_csv(f)
    except pd.errors.EmptyDataError:
        raise DSparkError(
            f"{f}: empty file (expected a header with columns {', '.join(required)})"
        ) from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as e:
        msg = " ".join(str(e).split())
        raise DSparkError(f"{f}: cannot parse CSV: {msg}") from None
    check_columns(df, required, str(f))
    return df


def check_columns(df: pd.DataFrame, required: tuple[str, ...], where: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DSparkError(
            f"{where}: missing required column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(c) for c in missing)} "
            f"(has: {', '.join(map(str, df.columns))})"
        )


def _read_config(path: Path) -> dict[str, Any]:
    f = path / "config.toml"
    if not f.exists():
        return {}
    import tomllib

    try:
        with f.open("rb") as fh:
            return tomllib.load(fh)
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as e:
        raise DSparkError(f"{f}: bad TOML: {' '.join(str(e).split())}") from None


def _rows_table(summary: dict, f: Path, required: tuple[str, ...]) -> pd.DataFrame:
    rows = summary.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DSparkError(f"{f}: bad summary: 'rows' must be a list of objects")
    df = pd.DataFrame(rows)
    check_columns(df, required, f"{f} rows")
    return df


def _trials_from_journal(run: Run) -> pd.DataFrame | None:
    f = run.path / "study.journal"
    if not f.exists():
        return None
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = JournalStorage(JournalFileBackend(str(f)))
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        name = run.summary.get("study_name") or (names[0] if names else None)
        if name not in names:
            raise DSparkError(f"{f}: no study named {name!r} (has: {', '.join(names) or 'none'})")
        study = optuna.load_study(study_name=name, storage=storage)
        df = study.trials_dataframe()
        names = study.metric_names or []  # columns under the contract's names
        if len(study.directions) == 1 and names:
            return df.rename(columns={f"value_{names[0]}": "value"})
        return df.rename(columns={f"values_{n}": f"values_{i}" for i, n in enumerate(names)})
    except DSparkError:
        raise
    except Exception as e:
        raise DSparkError(f"{f}: cannot read Optuna journal: {' '.join(str(e).split())}") from None


def _check_measured(results: pd.DataFrame, f: Path) -> None:
    """A simulate run whose every row measured nothing (throughput 0 or missing: an empty trace,
    or ``sim.warmup_s`` at or past the end of the run) has no data to report: one line."""
    tput = pd.to_numeric(results["throughput_tokens_per_s"], errors="coerce")
    if not (tput > 0).any():
        raise DSparkError(
            f"{f}: no measured output in any of its {len(results)} row(s) "
            "(throughput 0: an empty trace, or sim.warmup_s at or past the end "
            "of the run); nothing to report"
        )


def load_run(path: Path) -> Run:
    """Read one run folder, dispatching on its ``kind``."""
    summary = read_summary(path)
    run = Run(path=path, kind=summary["kind"], summary=summary, config=_read_config(path))
    t = run.tables
    if run.kind == "simulate":
        t["results"] = read_csv(path / "results.csv", SIM_RESULT_COLUMNS)
        _check_measured(t["results"], path / "results.csv")
        t["requests"] = read_csv(path / "requests.csv", REQUEST_COLUMNS, optional=True)
        t["rounds"] = read_csv(path / "rounds.csv", ROUND_REQUIRED, optional=True)
        t["trace"] = read_csv(path / "controller_trace.csv", TRACE_COLUMNS, optional=True)
    elif run.kind == "capacity":
        t["capacity"] = _rows_table(summary, path / "summary.json", CAPACITY_ROW_KEYS)
        t["capacity_seeds"] = read_csv(path / "capacity.csv", CAPACITY_COLUMNS)
        t["probes"] = read_csv(path / "probes.csv", PROBE_COLUMNS, optional=True)
    elif run.kind == "tune":
        trials = read_csv(path / "trials.csv", TRIAL_COLUMNS, optional=True)
        t["trials"] = trials if trials is not None else _trials_from_journal(run)
        t["importances"] = read_csv(path / "importances.csv", IMPORTANCE_COLUMNS, optional=True)
        t["pareto"] = read_csv(path / "pareto.csv", (), optional=True)
        t["evaluation"] = read_csv(path / "evaluation.csv", EVALUATION_COLUMNS, optional=True)
        t["heldout_capacity"] = read_csv(
            path / "heldout_capacity.csv", HELDOUT_CAPACITY_COLUMNS, optional=True
        )
    elif run.kind == "real":
        t["real"] = _rows_table(summary, path / "summary.json", REAL_ROW_KEYS)
        t["rounds"] = read_csv(path / "rounds.csv", ROUND_REQUIRED, optional=True)
    elif run.kind == "validate":
        t["errors"] = read_csv(path / "errors.csv", ERROR_COLUMNS)
    run.tables = {k: v for k, v in t.items() if v is not None}
    return run


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Discover and read every run folder under ``paths``."""
    return [load_run(p) for p in discover(paths)]
