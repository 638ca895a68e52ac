"""Report figures. Each function takes saved tables and returns a matplotlib ``Figure`` (no
pyplot, no global state; PNG through the Agg canvas). Every plot has units on its axes, a title
that says what it shows, and a legend; controllers keep one colour across plots (``colors``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from reports.analysis import (
    acceptance_by_position,
    at_modal_gpus,
    at_reference_load,
    ecdf,
    feasible_mask,
    objective_columns,
    objective_label,
)
from reports.style import RC, color_of, controller_colors, line_style


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure under the report's rc style."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> Figure:
        with matplotlib.rc_context(RC):
            fig = fn(*args, **kwargs)
        return fig

    return wrapper


def _legend(ax, **kw) -> None:
    ax.legend(loc=kw.pop("loc", "best"), **kw)


def _colors(colors, names) -> dict[str, str]:
    return colors if colors is not None else controller_colors(names)


@styled
def plot_throughput_vs_load(results: pd.DataFrame, colors: dict | None = None) -> Figure:
    """Throughput (mean over seeds, min–max band) against offered load, one line per controller."""
    df, g = at_modal_gpus(results)
    note = f" ({g:g} GPUs)" if g is not None else ""
    use_rps = "offered_rps" in df.columns and df["offered_rps"].notna().all()
    xcol = "offered_rps" if use_rps else "load_scale"
    colors = _colors(colors, df["controller"].unique())
    fig = Figure(figsize=(7.6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for name, g in df.groupby("controller", sort=True):
        s = (
            g.groupby("load_scale")
            .agg(
                x=(xcol, "mean"),
                y=("throughput_tokens_per_s", "mean"),
                lo=("throughput_tokens_per_s", "min"),
                hi=("throughput_tokens_per_s", "max"),
            )
            .sort_values("x")
        )
        c = color_of(colors, name)
        ax.plot(s["x"], s["y"], "o", ls=line_style(name), color=c, label=str(name), ms=4)
        if (s["hi"] > s["lo"]).any():
            ax.fill_between(s["x"], s["lo"], s["hi"], color=c, alpha=0.12, lw=0)
    ax.set_xlabel("offered load (requests/s)" if use_rps else "load scale (× nominal arrival rate)")
    ax.set_ylabel("throughput (output tokens/s)")
    ax.set_title(f"Throughput against offered load, per controller{note}")
    ax.set_ylim(bottom=0)
    _legend(ax, ncols=2 if df["controller"].nunique() > 5 else 1)
    return fig


@styled
def plot_latency_cdfs(requests: pd.DataFrame, colors: dict | None = None) -> Figure:
    """Empirical CDFs of per-request TPOT (ms) and end-to-end latency (s) per controller."""
    df, note = at_reference_load(requests)
    if "finished" in df.columns:
        df = df[df["finished"].astype(str).str.lower().isin(("true", "1", "1.0"))]
    colors = _colors(colors, df["controller"].unique())
    fig = Figure(figsize=(10, 3.9), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for name, g in df.groupby("controller", sort=True):
        c = color_of(colors, name)
        x, y = ecdf(g["tpot_s"] * 1e3)
        ax1.step(x, y, where="post", color=c, ls=line_style(name), label=str(name))
        x, y = ecdf(g["e2e_s"])
        ax2.step(x, y, where="post", color=c, ls=line_style(name), label=str(name))
    for ax in (ax1, ax2):
        ax.axhline(0.99, color="#999999", lw=0.8, ls=":")
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.01)
    ax1.set_xlabel("time per output token, TPOT (ms)")
    ax2.set_xlabel("end-to-end request latency (s)")
    fig.suptitle(
        f"Latency distributions per controller{note} (dotted line: p99)",
        fontweight="bold",
        fontsize=RC["axes.titlesize"],
    )
    ax1.set_title("TPOT")
    ax2.set_title("End-to-end latency")
    _legend(ax1, loc="lower right")
    _legend(ax2, loc="lower right")
    return fig


TRACE_PANELS = (
    ("k", "draft length k (tokens)"),
    ("alpha", "α (aggressiveness)"),
    ("beta", "β (verify threshold)"),
    ("a_hat", "â (acceptance estimate)"),
)


@styled
def plot_controller_traces(trace: pd.DataFrame, colors: dict | None = None) -> Figure:
    """k, α, β and â over time for one request, the same for every controller where it can be
    (the request with the most rounds over all controllers; arrivals are identical across
    controllers of one run), with the rounds that closed a block marked."""
    trace, note = at_reference_load(trace)
    colors = _colors(colors, trace["controller"].unique())
    fig = Figure(figsize=(10, 7.2), layout="constrained")
    axes = fig.subplots(len(TRACE_PANELS), 1, sharex=True)
    chosen = []
    common = trace.groupby("request_id").size().idxmax()
    for name, g in trace.groupby("controller", sort=True):
        has = (g["request_id"] == common).any()
        rid = common if has else g.groupby("request_id").size().idxmax()
        chosen.append((str(name), rid, g[g["request_id"] == rid].sort_values("now_s")))
    block_mark = dict(marker="|", ms=9, mew=1.4, ls="none")
    for ax, (col, label) in zip(axes, TRACE_PANELS):
        drawn = False
        for name, rid, g in chosen:
            y = pd.to_numeric(g[col], errors="coerce")
            if y.notna().sum() == 0:
                continue
            c = color_of(colors, name)
            ax.step(g["now_s"], y, where="post", color=c, label=f"{name} (request {rid})")
            ends = g["block_end"].astype(str).str.lower().isin(("true", "1", "1.0")).to_numpy()
            ax.plot(g["now_s"][ends], y[ends], color=c, **block_mark)
            for t in g["now_s"][ends]:
                ax.axvline(t, color=c, lw=0.8, ls=":", alpha=0.45)
            drawn = True
        if not drawn:
            ax.text(
                0.5,
                0.5,
                f"{col} not recorded by these controllers",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#777777",
            )
        ax.set_ylabel(label)
    axes[-1].set_xlabel("simulated time (s)")
    axes[0].set_title(
        f"Controller state over time{note} (one request per controller; | marks block ends)"
    )
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="#444444", **block_mark))
    labels.append("block end (parameters updated)")
    axes[0].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


#: a draft position's acceptance is plotted as measured only from this many rounds that drafted
#: it; positions with fewer are drawn hollow and left off the line (their rate is noise).
MIN_POSITION_ROUNDS = 20


@styled
def plot_acceptance_by_position(
    rounds: pd.DataFrame, colors: dict | None = None, min_rounds: int = MIN_POSITION_ROUNDS
) -> Figure:
    """P(token i accepted | drafted) per draft position, and the per-token rate given the
    prefix; points from fewer than ``min_rounds`` rounds are hollow and not joined."""
    table = acceptance_by_position(rounds)
    colors = _colors(colors, table["controller"].unique())
    fig = Figure(figsize=(10, 4.1), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    few = False
    for name, g in table.groupby("controller", sort=True):
        c = color_of(colors, name)
        for ax, col, count in (
            (ax1, "p_accepted", "drafted"),
            (ax2, "p_accepted_given_prefix", "reached"),
        ):
            sure = g[g[count] >= min_rounds]
            thin = g[g[count] < min_rounds]
            ax.plot(
                sure["position"], sure[col], "o", ls=line_style(name), color=c, ms=4, label=name
            )
            if len(thin):
                few = True
                ax.plot(
                    thin["position"],
                    thin[col],
                    "o",
                    ls="none",
                    mfc="none",
                    color=c,
                    ms=5,
                    alpha=0.7,
                )
    ax1.set_title("P(token i accepted | token i drafted)")
    ax2.set_title("P(token i accepted | tokens 1..i−1 accepted)")
    for ax in (ax1, ax2):
        ax.set_xlabel("draft position i (tokens)")
        ax.set_ylim(0, 1.02)
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax1.set_ylabel("probability")
    ax2.set_ylabel("probability")
    if few:
        for ax in (ax1, ax2):
            ax.plot(
                [],
                [],
                "o",
                mfc="none",
                color="#777777",
                label=f"fewer than {min_rounds} rounds (not joined)",
            )
    _legend(ax1, loc="lower left")
    _legend(ax2, loc="lower left")
    return fig


@styled
def plot_scaling(results: pd.DataFrame, colors: dict | None = None) -> Figure:
    """Throughput and speedup against GPU count (best load point per GPU count, mean over seeds)."""
    colors = _colors(colors, results["controller"].unique())
    fig = Figure(figsize=(10, 3.9), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    per = results.groupby(["controller", "num_gpus", "load_scale"], as_index=False).mean(
        numeric_only=True
    )
    best = per.loc[per.groupby(["controller", "num_gpus"])["throughput_tokens_per_s"].idxmax()]
    gpus = np.sort(best["num_gpus"].unique())
    for name, g in best.groupby("controller", sort=True):
        g = g.sort_values("num_gpus")
        c = color_of(colors, name)
        ls = line_style(name)
        ax1.plot(g["num_gpus"], g["throughput_tokens_per_s"], "o", ls=ls, color=c, ms=4, label=name)
        if "speedup" in g.columns:
            ax2.plot(g["num_gpus"], g["speedup"], "o", ls=ls, color=c, ms=4, label=name)
    ref = best.loc[best["num_gpus"] == gpus[0], "throughput_tokens_per_s"].max()
    ax1.plot(
        gpus,
        ref * gpus / gpus[0],
        ls="--",
        color="#999999",
        lw=1,
        label="linear scaling from the smallest count",
    )
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax2.set_xscale("log", base=2)
    ax2.axhline(1.0, color="#999999", lw=0.8, ls=":")
    for ax in (ax1, ax2):
        ax.set_xlabel("GPUs in the cluster (count, log scale)")
    ax1.set_ylabel("throughput (output tokens/s, log scale)")
    ax2.set_ylabel("TPOT speedup vs k = 0 without drafter (×)")
    ax1.set_title("Cluster throughput against GPU count")
    ax2.set_title("Per-token latency gain against GPU count")
    _legend(ax1, loc="upper left")
    _legend(ax2)
    return fig


@styled
def plot_tuning_history(
    trials: pd.DataFrame, directions: Sequence[str] = ("maximize",), names: Sequence[str] = ()
) -> Figure:
    """Objective value of every completed trial and the best so far over the *feasible* ones,
    per objective; trials that break the quality constraint are marked and never best."""
    cols = objective_columns(trials)
    state = trials["state"].astype(str).str.upper().str.replace("TRIALSTATE.", "", regex=False)
    feasible = feasible_mask(trials)
    # infeasible: a COMPLETE trial over the limit, or one the objective ended PRUNED for it
    # (user attribute ``infeasible``); a trial the pruner stopped early is only "pruned"
    marked = (
        trials["user_attrs_infeasible"].astype(str).str.lower().isin(("true", "1", "1.0"))
        if "user_attrs_infeasible" in trials.columns
        else pd.Series(False, index=trials.index)
    )
    infeasible = (
        ~feasible
        & ((state == "COMPLETE") | ((state == "PRUNED") & marked))
        & trials[cols[0]].notna()
    )
    done = trials[(state == "COMPLETE") & feasible]
    bad = trials[infeasible]
    pruned = int(((state == "PRUNED") & ~infeasible).sum())
    fig = Figure(figsize=(10 if len(cols) > 1 else 7.6, 3.9), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(cols)))
    for i, (ax, col) in enumerate(zip(axes, cols)):
        direction = directions[i] if i < len(directions) else "maximize"
        name = names[i] if i < len(names) else col
        d = done.sort_values("number")
        y = d[col].astype(float)
        best = y.cummax() if direction.lower().startswith("max") else y.cummin()
        ax.plot(
            d["number"], y, "o", color="#0072B2", ms=4, alpha=0.7, label="completed feasible trial"
        )
        if len(bad):
            ax.plot(
                bad["number"],
                bad[col].astype(float),
                "x",
                color="#B2182B",
                ms=6,
                mew=1.6,
                label=f"{len(bad)} infeasible (breaks the quality constraint)",
            )
        ax.step(
            d["number"],
            best,
            where="post",
            color="#D55E00",
            label=f"best feasible so far ({direction})",
        )
        if pruned:
            ax.plot([], [], "x", color="#999999", label=f"{pruned} pruned trial(s) not shown")
        ax.set_xlabel("trial number (count, in start order)")
        ax.set_ylabel(objective_label(name))
        ax.set_title(f"Tuning history: {name}")
        _legend(ax)
    return fig


@styled
def plot_importances(importances: pd.DataFrame) -> Figure:
    """Horizontal bars of parameter importance (most important on top)."""
    df = importances.sort_values("importance")
    fig = Figure(figsize=(7.6, max(2.4, 0.34 * len(df) + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    labels = [str(p).removeprefix("params_") for p in df["param"]]
    ax.barh(labels, df["importance"].astype(float), color="#0072B2", label="importance")
    ax.set_xlabel("importance (fraction of objective variance explained)")
    ax.set_ylabel("tuned parameter")
    ax.set_title("Which controller parameters matter (Optuna importance)")
    ax.grid(axis="y", visible=False)
    _legend(ax, loc="lower right")
    return fig


@styled
def plot_pareto(
    pareto: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    directions: Sequence[str] = ("maximize", "minimize"),
    names: Sequence[str] = (),
) -> Figure:
    """Pareto-optimal trials over all completed trials, for the first two objectives."""
    cols = objective_columns(pareto)[:2]
    if len(cols) < 2:
        raise ValueError("a Pareto plot needs two objective columns")
    labels = [names[i] if i < len(names) else cols[i] for i in range(2)]
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = fig.add_subplot()
    if trials is not None and all(c in trials.columns for c in cols):
        ax.plot(
            trials[cols[0]],
            trials[cols[1]],
            "o",
            color="#BBBBBB",
            ms=4,
            label="all completed trials",
        )
    p = pareto.sort_values(cols[0])
    ax.plot(
        p[cols[0]],
        p[cols[1]],
        "o-",
        color="#D55E00",
        ms=6,
        drawstyle="steps-pre",
        label="Pareto front",
    )
    ax.set_xlabel(objective_label(labels[0]) + f" — {directions[0] if directions else ''}")
    ax.set_ylabel(
        objective_label(labels[1]) + (f" — {directions[1]}" if len(directions) > 1 else "")
    )
    ax.set_title(f"Pareto front: {labels[0]} against {labels[1]}")
    _legend(ax)
    return fig


PARITY_UNITS = {
    "throughput_tokens_per_s": ("throughput", "tokens/s", 1.0),
    "mean_accepted_length": ("mean accepted length", "tokens/round", 1.0),
    "acceptance_rate": ("acceptance rate â", "probability", 1.0),
    "tpot_p50_s": ("TPOT p50", "ms", 1e3),
    "tpot_p99_s": ("TPOT p99", "ms", 1e3),
}
WORKLOAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@styled
def plot_parity(errors: pd.DataFrame, colors: dict | None = None) -> Figure:
    """Simulator prediction against real measurement per metric; error bars are the real
    run-to-run spread; the diagonal is a perfect prediction, the band ±5%."""
    metrics = list(dict.fromkeys(errors["metric"]))
    colors = _colors(colors, errors["controller"].unique())
    marker = {
        w: WORKLOAD_MARKERS[i % len(WORKLOAD_MARKERS)]
        for i, w in enumerate(sorted(errors["workload"].astype(str).unique()))
    }
    ncol = min(3, len(metrics))
    nrow = int(np.ceil(len(metrics) / ncol))
    fig = Figure(figsize=(3.5 * ncol + 1.8, 3.3 * nrow), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrow, ncol)).ravel()
    for ax, m in zip(axes, metrics):
        title, unit, scale = PARITY_UNITS.get(m, (m, "units of " + m, 1.0))
        g = errors[errors["metric"] == m]
        sim = g["sim"].astype(float) * scale
        real = g["real"].astype(float) * scale
        half = real.abs() * g["real_spread"].astype(float).fillna(0) / 200.0
        for (ctrl, wl), gg in g.assign(_s=sim, _r=real, _h=half).groupby(
            ["controller", "workload"]
        ):
            ax.errorbar(
                gg["_s"],
                gg["_r"],
                yerr=gg["_h"],
                fmt=marker[str(wl)],
                ms=6,
                color=color_of(colors, ctrl),
                capsize=3,
                lw=1,
            )
        lo = float(min(sim.min(), (real - half).min()))
        hi = float(max(sim.max(), (real + half).max()))
        pad = 0.08 * (hi - lo if hi > lo else abs(hi) or 1.0)
        xs = np.array([lo - pad, hi + pad])
        ax.plot(xs, xs, color="#555555", lw=1, label="sim = real")
        ax.fill_between(xs, xs * 0.95, xs * 1.05, color="#999999", alpha=0.15, lw=0, label="±5%")
        ax.set_xlim(*xs)
        ax.set_ylim(*xs)
        ax.set_xlabel(f"simulator ({unit})")
        ax.set_ylabel(f"real engine ({unit})")
        ax.set_title(title)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], color=color_of(colors, c), marker="o", ls="none", label=str(c))
        for c in sorted(errors["controller"].astype(str).unique())
    ]
    handles += [
        Line2D([], [], color="#444444", marker=mk, ls="none", label=f"workload {w}")
        for w, mk in marker.items()
    ]
    handles += [
        Line2D([], [], color="#555555", lw=1, label="sim = real (perfect)"),
        Line2D([], [], color="#BBBBBB", lw=6, label="±5% band"),
    ]
    fig.legend(handles=handles, loc="outside right upper")
    fig.suptitle(
        "Simulator prediction vs real engine (error bars: real run-to-run spread)",
        fontweight="bold",
        fontsize=10.5,
    )
    return fig


def figure_png(fig: Figure) -> bytes:
    """PNG bytes of a figure (Agg canvas)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()
