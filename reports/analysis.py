"""Numbers a report derives from saved tables (no plotting here)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from control.metrics import half_range_pct_of_mean
from reports.style import is_baseline, is_reference

# (column in results.csv, header in the report, scale, format) of the controller comparison.
# Two ratios, two baselines: ``throughput_ratio`` is throughput over the visible no-speculation
# row of the same table (``fixed:k=0``: k = 0 with the drafter resident, so its memory is
# taken), ``speedup`` the simulator's TPOT ratio over a hidden k = 0 run without a drafter.
COMPARISON_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("role", "role", 1.0, "{}"),
    ("throughput_tokens_per_s", "throughput (tok/s)", 1.0, "{:,.0f}"),
    ("throughput_spread_pct", "± over seeds (%)", 1.0, "{:.1f}"),
    ("throughput_ratio", "throughput ÷ k = 0 with drafter (×)", 1.0, "{:.2f}"),
    ("speedup", "TPOT speedup vs k = 0 without drafter (×)", 1.0, "{:.2f}"),
    ("speedup_resident", "TPOT speedup vs k = 0 with drafter (×)", 1.0, "{:.2f}"),
    ("goodput_tokens_per_s", "SLO goodput (tok/s)", 1.0, "{:,.0f}"),
    ("slo_attainment", "SLO attainment (%)", 100.0, "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 (ms)", 1e3, "{:.1f}"),
    ("ttft_p99_s", "TTFT p99 (ms)", 1e3, "{:.1f}"),
    ("mean_tpot_s", "mean TPOT (ms)", 1e3, "{:.2f}"),
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
            df["vpr"].isna() | np.isclose(df["vpr"].astype(float).fillna(0.0), 0.0)
        )
        return by_name | no_draft
    return by_name


def modal_value(s: pd.Series):
    """Most frequent value (smallest on ties); None for an all-missing column."""
    s = s.dropna()
    if s.empty:
        return None
    counts = s.value_counts()
    return sorted(counts[counts == counts.max()].index)[0]


def at_modal_gpus(results: pd.DataFrame) -> tuple[pd.DataFrame, float | None]:
    """Rows at the most common GPU count when the table spans several (a scaling sweep), with
    that count; the table itself and None when it spans one."""
    if "num_gpus" in results.columns and results["num_gpus"].nunique() > 1:
        g = modal_value(results["num_gpus"])
        return results[results["num_gpus"] == g], g
    return results, None


def reference_slice(results: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows at the nominal operating point: the load scale closest to 1 at the most common GPU
    count; returns them with a sentence saying which point that is."""
    df, g = at_modal_gpus(results)
    where = []
    if g is not None:
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


CONTENDER, NO_SPEC, REFERENCE = "contender", "no speculation", "reference"
ROLE_ORDER = {CONTENDER: 0, NO_SPEC: 1, REFERENCE: 2}


def role(name: object) -> str:
    """``reference`` (told what no engine knows), ``no speculation`` (k = 0) or ``contender``."""
    if is_reference(name):
        return REFERENCE
    return NO_SPEC if is_baseline(name) else CONTENDER


def comparison_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean of every saved metric per controller (one row each) over the rows given (one
    operating point): contenders first by SLO goodput (by throughput when the run saved no
    goodput), then the no-speculation rows, then the references. ``throughput_ratio`` divides by the no-speculation rows' mean throughput
    (NaN when the table has none); ``throughput_spread_pct`` is half the range over seeds."""
    cols = [
        c
        for c, *_ in COMPARISON_COLUMNS
        if c in results.columns
        and pd.api.types.is_numeric_dtype(results[c])
        and results[c].notna().any()
    ]
    g = results.groupby("controller", sort=False)[cols].mean(numeric_only=True)
    g.insert(0, "seeds", results.groupby("controller", sort=False)["seed"].nunique())
    g["throughput_spread_pct"] = results.groupby("controller", sort=False)[
        "throughput_tokens_per_s"
    ].agg(half_range_pct_of_mean)
    g = g.reset_index()
    g.insert(1, "role", g["controller"].map(role))
    base = g.loc[g["role"] == NO_SPEC, "throughput_tokens_per_s"]
    g["throughput_ratio"] = g["throughput_tokens_per_s"] / base.mean() if len(base) else np.nan
    g["_o"] = g["role"].map(ROLE_ORDER)
    key = (
        "goodput_tokens_per_s" if "goodput_tokens_per_s" in g.columns else "throughput_tokens_per_s"
    )
    return (
        g.sort_values(["_o", key], ascending=[True, False])
        .drop(columns="_o")
        .reset_index(drop=True)
    )


# -- the answer first: winner per scenario and load (the ranking: reports/answer.py) -----------
#: a leader ahead of the runner-up by less than this fraction is a tie: the answer breaks it by
#: mean TPOT (as it does where throughput is capped by the offered load).
SEPARATION = 0.01


def kept_up(rows: pd.DataFrame) -> bool | None:
    """Did plain decoding (the no-speculation row, else the slowest contender) keep up with the
    arrivals at this point: every request finished, the last within 25% of the arrival window
    (N / offered rate)? Then throughput is capped by the offered load. None when unknown."""
    need = {"requests_finished", "requests_unfinished", "offered_rps", "sim_time_s"}
    if not need <= set(rows.columns):
        return None
    base = rows[rows["controller"].map(role) == NO_SPEC]
    if base.empty:
        base = rows[rows["throughput_tokens_per_s"] == rows["throughput_tokens_per_s"].min()]
    r = base.mean(numeric_only=True)
    if not np.isfinite(r["offered_rps"]) or r["offered_rps"] <= 0:
        return False  # capacity mode: every request at t = 0, never capped
    window = (r["requests_finished"] + r["requests_unfinished"]) / r["offered_rps"]
    return bool(r["requests_unfinished"] == 0 and r["sim_time_s"] <= 1.25 * window)


def operating_points(results: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(description, rows) per load scale at the most common GPU count, in load order."""
    df, g = at_modal_gpus(results)
    where = f", {g:g} GPUs" if g is not None else ""
    out = []
    for ls, rows in df.groupby("load_scale", sort=True):
        out.append((f"load scale {float(ls):g}{where}", rows))
    return out


def full_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean per (controller, GPU count, load scale) over seeds: the CSV behind every plot."""
    keys = ["controller"] + (["num_gpus"] if "num_gpus" in results.columns else []) + ["load_scale"]
    cols = [
        c
        for c in results.columns
        if c not in keys and c != "seed" and pd.api.types.is_numeric_dtype(results[c])
    ]
    return results.groupby(keys)[cols].mean().reset_index()


SPECULATION_METRICS = (
    "vpr",
    "du",
    "mean_accepted_length",
    "acceptance_rate",
    "gpu_busy_fraction",
    "bandwidth_utilization",
    "lossy_accept_fraction",
)


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
        if col == "role" and col in table.columns:
            out[header] = table[col].astype(str)
        elif col in table.columns:
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
            rows.append(
                {
                    "controller": str(name),
                    "position": i,
                    "drafted": drafted,
                    "reached": reached,
                    "accepted": acc,
                    "p_accepted": acc / drafted if drafted else np.nan,
                    "p_accepted_given_prefix": acc / reached if reached else np.nan,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "controller",
            "position",
            "drafted",
            "reached",
            "accepted",
            "p_accepted",
            "p_accepted_given_prefix",
        ],
    )


def ecdf(values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF (i / n)."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[np.isfinite(x)]
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def _constraint_values(v) -> list[float]:
    """Constraint values of one cell: a number, a list, or a list saved as text ("[0.01]")."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return []
    if isinstance(v, (list, tuple, np.ndarray)):
        return [float(x) for x in v]
    if isinstance(v, (int, float, np.floating, np.integer)):
        return [float(v)]
    out = []
    for part in str(v).strip("[]() ").split(","):
        try:
            out.append(float(part))
        except ValueError:
            continue
    return out


def constraint_columns(df: pd.DataFrame) -> list[str]:
    """Columns of a trials table holding constraint values (feasible when all are <= 0):
    Optuna's ``system_attrs_constraints`` / ``system_attrs_constraints:NAME`` and the tuning
    objective's ``user_attrs_constraint``."""
    return [
        c for c in df.columns if c.startswith(("system_attrs_constraints", "user_attrs_constraint"))
    ]


def feasible_mask(df: pd.DataFrame) -> pd.Series:
    """True per trial whose every recorded constraint value is <= 0 (no record: feasible)."""
    cols = constraint_columns(df)
    if not cols:
        return pd.Series(True, index=df.index)
    return (
        df[cols]
        .apply(lambda row: all(x <= 0 for v in row for x in _constraint_values(v)), axis=1)
        .astype(bool)
    )


def objective_columns(df: pd.DataFrame) -> list[str]:
    """Objective columns of an Optuna trials/Pareto table: ``value`` or ``values_0..`` (or,
    for a study with metric names, ``value_NAME`` / ``values_NAME``)."""
    if "value" in df.columns:
        return ["value"]
    named = [c for c in df.columns if c.startswith("value_")]
    if len(named) == 1:
        return named
    vals = sorted((c for c in df.columns if c.startswith("values_")), key=lambda c: (len(c), c))
    if vals:
        return vals
    return [
        c
        for c in df.columns
        if c not in ("number", "state")
        and not c.startswith(("params_", "user_attrs_", "system_attrs_", "datetime_", "duration"))
        and pd.api.types.is_numeric_dtype(df[c])
    ][:2]


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


def heldout_sentence(ev: pd.DataFrame, metric: str = "throughput_tokens_per_s") -> str:
    """The held-out evaluation in one sentence: the tuned controller's mean over every
    held-out workload and seed, its margin over the best other contender (overall and the
    range over workloads), the spread over seeds, and on how many workloads it wins."""
    if metric not in ev.columns or ev.empty:
        return ""
    ev = ev[ev["controller"].map(role) == CONTENDER]
    if ev.empty:
        return ""
    mean = ev.groupby("controller")[metric].mean().sort_values(ascending=False)
    tuned = next((c for c in mean.index if str(c).endswith("-tuned")), mean.index[0])
    mine = ev[ev["controller"] == tuned]
    others = mean.drop(tuned)
    per_wl = ev.pivot_table(index="workload", columns="controller", values=metric, aggfunc="mean")
    wins = int((per_wl.idxmax(axis=1) == tuned).sum())
    n_wl, n_seed = ev["workload"].nunique(), ev["seed"].nunique()
    text = (
        f"by throughput (output tokens/s, mean over {_held_out(ev)}), "
        f"**{tuned}** {fmt_num(mine[metric].mean(), '{:,.0f}')} tok/s"
    )
    if len(others):
        best = others.index[0]
        text += ", " + _over_best_other(mine[metric].mean(), others, "{:,.0f}")
        r = (per_wl[tuned] / per_wl[best] - 1) * 100
        if len(r) > 1:
            text += (
                f", per workload {fmt_num(r.min(), '{:+.1f}%')} to {fmt_num(r.max(), '{:+.1f}%')}"
            )
    spread = mine.groupby("workload")[metric].agg(half_range_pct_of_mean).mean()
    sure = (
        f"spread over seeds ±{fmt_num(spread, '{:.1f}')}%"
        if n_seed > 1 and np.isfinite(spread)
        else "one seed: no spread measured"
    )
    return text + f"; {sure}; it wins on {wins} of {n_wl} workload{'s' if n_wl != 1 else ''}."


def heldout_capacity_sentence(
    cap: pd.DataFrame, compare: dict | None = None, best_is_default: bool = False
) -> str:
    """The held-out evaluation of a study tuned for capacity at SLO, on that measure
    (``heldout_capacity.csv``): the tuned controller's capacity (mean over the held-out
    workloads and seeds); its gain over the default as the study computed it
    (``summary.json``'s ``tuned_vs_default``: mean over pairs, their range, the spread over
    seeds, the workloads it wins, and whether it beats the spread); its margin over the best
    other contender."""
    metric = "capacity_load_scale"
    if metric not in cap.columns or cap.empty:
        return ""
    cap = cap[cap["controller"].map(role) == CONTENDER]
    mean = cap.groupby("controller")[metric].mean().sort_values(ascending=False)
    tuned = next((c for c in mean.index if str(c).endswith("-tuned")), None)
    if tuned is None:
        return ""
    text = (
        f"by capacity at SLO (the study's measure: load scale, mean over {_held_out(cap)}), "
        f"**{tuned}** {fmt_num(mean[tuned], '{:.3g}')}"
    )
    c = compare or {}
    default = c.get("default")
    if c.get("gain") is not None:
        wins = sum(g > 0 for g in c.get("workload_gains", {}).values())
        text += (
            f", {c['gain']:+.1%} over {default} (pairs {c['gain_min']:+.1%} to "
            f"{c['gain_max']:+.1%}, spread over seeds ±{c['spread']:.1%}; better on {wins} of "
            f"{len(c.get('workload_gains', {}))} workloads)"
        )
        if c.get("within_spread"):
            text += "; tuning does not beat the default by more than the spread"
    if best_is_default:
        text += "; the best trial is the untuned default"
    others = mean.drop([tuned, default], errors="ignore")
    if len(others):
        text += "; " + _over_best_other(mean[tuned], others, "{:.3g}")
    return text + "."


def _held_out(df: pd.DataFrame) -> str:
    """ "N held-out workloads × S seeds" of an evaluation table."""
    n_wl, n_seed = df["workload"].nunique(), df["seed"].nunique()
    return (
        f"{n_wl} held-out workload{'s' if n_wl != 1 else ''} × "
        f"{n_seed} seed{'s' if n_seed != 1 else ''}"
    )


def _over_best_other(value: float, others: pd.Series, fmt: str) -> str:
    """The margin of ``value`` over the first of ``others`` (sorted, best first), a tie
    within :data:`SEPARATION`."""
    m = value / others.iloc[0] - 1
    tie = " — a tie" if abs(m) < SEPARATION else ""
    return (
        f"{fmt_num(m * 100, '{:+.1f}%')} over the best other contender ({others.index[0]}, "
        f"{fmt_num(others.iloc[0], fmt)}{tie})"
    )
