"""What every claim of the seed-claims audit (:mod:`reports.claims`) reads: the verdicts, the
seed's figures, one claim's row, the simulate runs' rows and a real-engine run's provenance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from control.leviathan import expected_speedup as leviathan_speedup
from reports.analysis import baseline_mask
from reports.loader import Run
from reports.style import is_reference

HOLDS = "holds"

HOLDS_UNDER = "holds under assumptions"

DOES_NOT_HOLD = "does not hold"

CANNOT = "cannot be checked here"

IMPOSSIBLE = "impossible"

VERDICTS = (HOLDS, HOLDS_UNDER, DOES_NOT_HOLD, CANNOT, IMPOSSIBLE)


CLAIMED_SPEEDUP = 4.2

CLAIMED_P99_CUT_PCT = 67.0

CLAIMED_UTIL_BEFORE = 0.30

CLAIMED_UTIL_AFTER = 0.85

CLAIMED_QUALITY_PCT = 0.3

MIN_USEFUL_TOKENS = 32

CLAIMED_TARGET_PARAMS = 10e9

CLAIMED_GPUS = (1, 1024)

GAIN = 1.05  # a speedup above 5% counts as "a gain" (below: within noise of a model)

SCALING_EFFICIENCY = 0.8  # per-GPU throughput kept from the smallest to the largest cluster


@dataclass(frozen=True)
class Claim:
    claim: str
    seed_says: str
    lab_finds: str
    verdict: str
    why: str


COLUMNS = ("claim", "seed says", "lab finds", "verdict", "assumptions or why")


def min_acceptance_for(speedup: float, c: float, k_max: int = 15) -> float | None:
    """Smallest i.i.d. acceptance a for which some k <= k_max reaches ``speedup`` (bisection);
    None when even a = 1 cannot."""

    def best(a: float) -> float:
        return max(leviathan_speedup(a, k, c) for k in range(1, k_max + 1))

    if best(1.0) < speedup:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best(mid) < speedup else (lo, mid)
    return hi


def hardware_of(run: Run) -> str | None:
    """The GPU the run's ``summary.json`` records (``hardware``)."""
    h = run.summary.get("hardware")
    return str(h) if h else None


def target_params_of(run: Run) -> float | None:
    """The target's parameter count the run's ``summary.json`` records (``target_params``)."""
    p = run.summary.get("target_params")
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else None


def sim_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.kind == "simulate" and "results" in r.tables]


def sim_rows(runs: list[Run]) -> pd.DataFrame:
    frames = []
    for r in sim_runs(runs):
        df = r.tables["results"].copy()
        df["run"] = r.name
        df["scenario"] = str(r.summary.get("scenario", r.name))
        df["hardware"] = hardware_of(r) or "unknown GPU"
        if "num_gpus" not in df.columns:
            df["num_gpus"] = np.nan
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def deployable(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of real contenders: neither the k = 0 baseline nor a reference (the clairvoyant
    and the rate oracle are told what no engine knows)."""
    if rows.empty:
        return rows
    ref = rows["controller"].map(is_reference).astype(bool)
    return rows[~baseline_mask(rows) & ~ref]


def point(row: pd.Series) -> str:
    g = row.get("num_gpus")
    gpus = f", {g:g} GPU{'s' if g != 1 else ''}" if pd.notna(g) else ""
    return (
        f"{row['controller']}, scenario {row['scenario']} on {row['hardware']}{gpus}, "
        f"load scale {row['load_scale']:g}"
    )


def mean_over_seeds(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["run", "scenario", "hardware", "controller", "load_scale", "num_gpus"]
    return df.groupby(keys, dropna=False).mean(numeric_only=True).reset_index()


#: a real-engine run smaller than this (prompts × new tokens per method per repeat), with fewer
#: repeats, or with more of its output copyable than this, gets a warning beside its figure
REAL_MIN_TOKENS = 1000

REAL_MIN_REPEATS = 3

REAL_MAX_COPYABLE = 0.5


def real_provenance(run: Run) -> tuple[str, str]:
    """(what the real-engine run measured — drafter, prompt set, size, dtype, copyable share —,
    a warning when it is too small or too copy-friendly to support a general claim, else "")."""
    sm = run.summary
    bc = sm.get("bench_config") or {}
    ec = sm.get("engine_config") or {}
    prompts = sm.get("prompts", bc.get("prompts"))
    tokens, repeats = bc.get("new_tokens"), bc.get("repeats")
    copy = sm.get("copyable_fraction")
    parts = []
    if sm.get("drafter"):
        parts.append(f"drafter {sm['drafter']}")
    if bc.get("workload"):
        parts.append(f"{bc['workload']} prompts")
    if prompts and tokens and repeats:
        parts.append(
            f"{prompts} prompts × {tokens} tokens × {repeats} repeat{'s' if repeats != 1 else ''}"
        )
    dtype = sm.get("target_dtype") or ec.get("target_dtype")
    if dtype:
        parts.append(f"{dtype} target")
    if isinstance(copy, (int, float)):
        parts.append(f"{copy * 100:.0f}% of the target's output copyable from earlier 4-grams")
    why = []
    if prompts and tokens and prompts * tokens < REAL_MIN_TOKENS:
        why.append(f"{prompts * tokens} tokens per method")
    if repeats is not None and repeats < REAL_MIN_REPEATS:
        why.append(f"{repeats} repeat{'s' if repeats != 1 else ''} (no spread)")
    if isinstance(copy, (int, float)) and copy > REAL_MAX_COPYABLE:
        why.append(f"{copy * 100:.0f}% copyable output, which lookup drafters exploit")
    if not parts:
        parts.append("size not recorded")
        why.append("size not recorded")
    warn = (
        (
            "⚠ too small or too copy-friendly to support a general claim ("
            + "; ".join(why)
            + "; `python benchmarks/real_speed.py` measures 8 prompts × 128 "
            "tokens × 3 repeats)"
        )
        if why
        else ""
    )
    return ", ".join(parts), warn
