"""Numbers a report derives from saved tables (no plotting here)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.style import is_baseline

# (column in results.csv, header in the report, scale, format) of the controller comparison
COMPARISON_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("throughput_tokens_per_s", "throughput (tok/s)", 1.0, "{:,.0f}"),
    ("speedup", "speedup vs k=0 (×)", 1.0, "{:.2f}"),
    ("goodput_tokens_per_s", "goodput (tok/s)", 1.0, "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50 (ms)", 1e3, "{:.1f}"),
    ("ttft_p99_s", "TTFT p99 (ms)", 1e3, "{:.1f}"),
    ("tpot_p50_s", "TPOT p50 (ms)", 1e3, "{:.2f}"),
    ("tpot_p99_s", "TPOT p99 (ms)", 1e3, "{:.2f}"),
    ("e2e_p50_s", "e2e p50 (s)", 1.0, "{:.2f}"),
    ("e2e_p99_s", "e2e p99 (s)", 1.0, "{:.2f}"),
    ("vpr", "VPR", 1.0, "{:.3f}"),
    ("du", "DU", 1.0, "{:.3f}"),
    ("mean_accepted_length", "mean accepted length", 1.0, "{:.2f}"),
    ("acceptance_rate", "â", 1.0, "{:.3f}"),
    ("gpu_busy_fraction", "GPU busy (%)", 100.0, "{:.1f}"),
    ("bandwidth_utilization", "bandwidth util. (%)", 100.0, "{:.1f}"),
    ("lossy_accept_fraction", "lossy accepts (%)", 100.0, "{:.2f}"),
)


def baseline_mask(df: pd.DataFrame) -> pd.Series:
    """Rows of the plain autoregressive (k = 0) run: by name, or by a mean accepted length of
    exactly 1 (no drafted token was ever accepted because none was drafted)."""
    by_name = df["controller"].astype(str).map(is_baseline)
    if "mean_accepted_length" in df.columns and "vpr" in df.columns:
        no_draft = np.isclose(df["mean_accepted_length"].astype(float), 1.0) & (
            df["vpr"].isna() | np.isclose(df["vpr"].astype(float).fillna(0.0), 0.0))
        return by_name | no_draft
    return by_name


def modal_value(s: pd.Series):
    """Most frequent value (smallest on ties); None for an all-missing column."""
    s = s.dropna()
    if s.empty:
        return None
    counts = s.value_counts()
    return sorted(counts[counts == counts.max()].index)[0]


def reference_slice(results: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows at the nominal operating point: the load scale closest to 1 at the most common GPU
    count; returns them with a sentence saying which point that is."""
    df = results
    where = []
    if "num_gpus" in df.columns and df["num_gpus"].nunique() > 1:
        g = modal_value(df["num_gpus"])
        df = df[df["num_gpus"] == g]
        where.append(f"{g:g} GPU{'s' if g != 1 else ''}")
    if df["load_scale"].nunique() > 1:
        scales = np.array(sorted(df["load_scale"].dropna().unique()), dtype=float)
        ref = scales[np.argmin(np.abs(scales - 1.0))]
        df = df[np.isclose(df["load_scale"].astype(float), ref)]
        where.append(f"load scale {ref:g}")
    elif len(df):
        where.append(f"load scale {float(df['load_scale'].iloc[0]):g}")
    seeds = df["seed"].nunique()
    where.append(f"mean over {seeds} seed{'s' if seeds != 1 else ''}")
    return df, ", ".join(where)


def at_reference_load(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows of a per-request/per-round table at the load scale closest to 1 when the table
    holds several (the simulator adds a ``load_scale`` column); with a note for titles."""
    if "load_scale" not in df.columns or df["load_scale"].nunique() <= 1:
        return df, ""
    scales = np.array(sorted(df["load_scale"].dropna().unique()), dtype=float)
    ref = scales[np.argmin(np.abs(scales - 1.0))]
    return df[np.isclose(df["load_scale"].astype(float), ref)], f" at load scale {ref:g}"


def comparison_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean of every saved metric per controller (one row each), best throughput first."""
    cols = [c for c, *_ in COMPARISON_COLUMNS if c in results.columns]
    g = results.groupby("controller", sort=False)[cols].mean(numeric_only=True)
    g.insert(0, "seeds", results.groupby("controller", sort=False)["seed"].nunique())
    return g.sort_values("throughput_tokens_per_s", ascending=False).reset_index()


def full_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean per (controller, GPU count, load scale) over seeds: the CSV behind every plot."""
    keys = ["controller"] + (["num_gpus"] if "num_gpus" in results.columns else []) + ["load_scale"]
    cols = [c for c in results.columns if c not in keys and c != "seed"
            and pd.api.types.is_numeric_dtype(results[c])]
    return results.groupby(keys)[cols].mean().reset_index()


SPECULATION_METRICS = ("vpr", "du", "mean_accepted_length", "acceptance_rate", "gpu_busy_fraction",
                       "bandwidth_utilization", "lossy_accept_fraction")


def format_comparison(table: pd.DataFrame, part: str = "all") -> pd.DataFrame:
    """The comparison with report headers, units applied and numbers as text; ``part``
    ``speed`` (throughput and latency), ``speculation`` (acceptance, utilization, quality) or
    ``all``."""
    out = pd.DataFrame({"controller": table["controller"].astype(str)})
    if part != "speculation":
        out["seeds"] = table["seeds"].astype(int).astype(str)
    for col, header, scale, fmt in COMPARISON_COLUMNS:
        if part == "speed" and col in SPECULATION_METRICS:
            continue
        if part == "speculation" and col not in SPECULATION_METRICS:
            continue
        if col in table.columns:
            out[header] = [fmt_num(v * scale, fmt) for v in table[col]]
    return out


def fmt_num(v, fmt: str = "{:.3g}") -> str:
    try:
        if v is None or not np.isfinite(float(v)):
            return "—"
    except (TypeError, ValueError):
        return str(v)
    return fmt.format(float(v))


def acceptance_by_position(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per controller and draft position i (1-based): rounds that drafted at least i tokens,
    how many of them accepted token i (acceptance is a prefix: token i is kept iff n >= i),
    P(token i accepted | drafted) and the per-token rate given tokens 1..i-1 were accepted."""
    df = rounds
    if "controller" not in df.columns:
        df = df.assign(controller="(all)")
    rows = []
    for name, g in df.groupby("controller", sort=True):
        d = g["drafted"].to_numpy(int)
        n = g["accepted"].to_numpy(int)
        for i in range(1, int(d.max(initial=0)) + 1):
            drafted = int((d >= i).sum())
            reached = int(((d >= i) & (n >= i - 1)).sum())
            acc = int(((d >= i) & (n >= i)).sum())
            rows.append({"controller": str(name), "position": i, "drafted": drafted,
                         "reached": reached, "accepted": acc,
                         "p_accepted": acc / drafted if drafted else np.nan,
                         "p_accepted_given_prefix": acc / reached if reached else np.nan})
    return pd.DataFrame(rows, columns=["controller", "position", "drafted", "reached", "accepted",
                                       "p_accepted", "p_accepted_given_prefix"])


def ecdf(values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF (i / n)."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[np.isfinite(x)]
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def objective_columns(df: pd.DataFrame) -> list[str]:
    """Objective columns of an Optuna trials/Pareto table: ``value`` or ``values_0..``."""
    if "value" in df.columns:
        return ["value"]
    vals = sorted((c for c in df.columns if c.startswith("values_")),
                  key=lambda c: (len(c), c))
    if vals:
        return vals
    return [c for c in df.columns if c not in ("number", "state") and not c.startswith(
        ("params_", "user_attrs_", "system_attrs_", "datetime_", "duration"))
        and pd.api.types.is_numeric_dtype(df[c])][:2]


def objective_label(name: str) -> str:
    """Axis label with a unit guessed from the objective's name."""
    n = str(name).lower()
    if "tokens_per_s" in n or "throughput" in n or "goodput" in n:
        unit = "tokens/s"
    elif n.endswith("_ms"):
        unit = "ms"
    elif n.endswith("_s") or "latency" in n or "tpot" in n or "ttft" in n:
        unit = "s"
    elif "pct" in n or "loss" in n:
        unit = "%"
    else:
        unit = "objective units"
    return f"{name} ({unit})"
