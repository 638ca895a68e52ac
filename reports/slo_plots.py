"""Figures of the user's question: latency against the SLOs, and SLO attainment against load.

Same conventions as :mod:`reports.plots` (a matplotlib ``Figure``, no pyplot, units on the axes,
controllers keep their colour). The SLO and target lines carry a ``gid`` (``slo-ttft``,
``slo-tpot``, ``target``) so their positions can be read back from the figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from reports.analysis import at_modal_gpus
from reports.plots import _colors, styled
from reports.slo import Slo
from reports.style import color_of, line_style

#: marker per load scale, in load order (cycled past the last)
LOAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
#: an axis whose values (and SLO line) span more than this ratio is drawn on a log scale
LOG_SPAN = 20.0
SLO_COLOR = "#B22222"


def _log_axis(axis) -> None:
    """Log scale with plain numbers at 1, 2 and 5 per decade."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def _span(values) -> float:
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], dtype=float)
    return float(v.max() / v.min()) if len(v) else 1.0


def latency_points(results: pd.DataFrame) -> pd.DataFrame:
    """Mean TTFT p99 (s) and TPOT p99 (s) over seeds per controller and load scale (at the
    most common GPU count): the points of :func:`plot_slo_scatter`."""
    df, _ = at_modal_gpus(results)
    return (
        df.groupby(["controller", "load_scale"], sort=True)[["ttft_p99_s", "tpot_p99_s"]]
        .mean()
        .reset_index()
    )


@styled
def plot_slo_scatter(results: pd.DataFrame, slo: Slo | None, colors: dict | None = None) -> Figure:
    """TTFT p99 against TPOT p99 per controller (colour) and load scale (marker), each
    controller's points joined in load order; the SLOs as a vertical (TTFT) and a horizontal
    (TPOT) line. A point left of and below both lines keeps 99% of its requests within each SLO
    separately (attainment counts requests meeting both)."""
    pts = latency_points(results)
    colors = _colors(colors, pts["controller"].unique())
    loads = sorted(pts["load_scale"].unique())
    marker = {x: LOAD_MARKERS[i % len(LOAD_MARKERS)] for i, x in enumerate(loads)}
    fig = Figure(figsize=(8.4, 5.0), layout="constrained")
    ax = fig.add_subplot()
    handles: list[Line2D] = []
    for name, g in pts.groupby("controller", sort=True):
        g = g.sort_values("load_scale")
        c = color_of(colors, name)
        ax.plot(g["ttft_p99_s"], g["tpot_p99_s"] * 1e3, color=c, ls=line_style(name), lw=1.5)
        for _, r in g.iterrows():
            ax.plot(r["ttft_p99_s"], r["tpot_p99_s"] * 1e3, marker[r["load_scale"]], color=c, ms=8)
        handles.append(Line2D([], [], color=c, ls=line_style(name), label=str(name)))
    handles += [
        Line2D([], [], color="#555555", marker=marker[x], ls="none", label=f"load scale {x:g}")
        for x in loads
    ]
    xs, ys = list(pts["ttft_p99_s"]), list(pts["tpot_p99_s"] * 1e3)
    if slo is not None:
        ax.axvline(slo.ttft_s, color=SLO_COLOR, ls="--", lw=1.2, gid="slo-ttft")
        ax.axhline(slo.tpot_s * 1e3, color=SLO_COLOR, ls="-.", lw=1.2, gid="slo-tpot")
        handles += [
            Line2D([], [], color=SLO_COLOR, ls="--", label=f"TTFT SLO {slo.ttft_s:g} s"),
            Line2D([], [], color=SLO_COLOR, ls="-.", label=f"TPOT SLO {slo.tpot_s * 1e3:g} ms"),
        ]
        xs.append(slo.ttft_s)
        ys.append(slo.tpot_s * 1e3)
    if _span(xs) > LOG_SPAN:
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
    if _span(ys) > LOG_SPAN:
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    ax.set_xlabel("TTFT p99 (s)")
    ax.set_ylabel("TPOT p99 (ms per output token)")
    slo_note = "red lines: the SLOs" if slo is not None else "the run saved no SLOs"
    ax.set_title(f"Tail latency per controller and load ({slo_note}; lower left is better)")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


@styled
def plot_capacity_probes(
    probes: pd.DataFrame,
    target: float,
    capacity: pd.DataFrame | None = None,
    colors: dict | None = None,
) -> Figure:
    """SLO attainment against load scale for every probe of a capacity search, one line per
    controller and seed (seeds share the controller's colour), the attainment target as a
    horizontal line and each controller's median capacity (``capacity`` rows) as a dotted
    vertical line."""
    colors = _colors(colors, probes["controller"].unique())
    fig = Figure(figsize=(8.4, 4.6), layout="constrained")
    ax = fig.add_subplot()
    for (name, _seed), g in probes.groupby(["controller", "seed"], sort=True):
        g = g.sort_values("load_scale")
        c = color_of(colors, name)
        ax.plot(
            g["load_scale"], g["slo_attainment"], "o", ls=line_style(name), color=c, ms=5, lw=1.5
        )
    handles = [
        Line2D([], [], color=color_of(colors, n), ls=line_style(n), marker="o", ms=5, label=str(n))
        for n in sorted(probes["controller"].unique())
    ]
    ax.axhline(target, color=SLO_COLOR, ls="--", lw=1.2, gid="target")
    handles.append(Line2D([], [], color=SLO_COLOR, ls="--", label=f"target {target:.0%}"))
    if capacity is not None:
        for _, r in capacity.iterrows():
            x = pd.to_numeric(r["capacity_load_scale"], errors="coerce")
            if np.isfinite(x):
                c = color_of(colors, r["controller"])
                ax.axvline(x, color=c, ls=":", lw=1.0, gid=f"capacity {r['controller']}")
        handles.append(Line2D([], [], color="#555555", ls=":", label="median capacity"))
    ax.set_xscale("log")
    _log_axis(ax.xaxis)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("load scale (× the scenario's arrival rate, log)")
    ax.set_ylabel("SLO attainment (fraction of requests)")
    ax.set_title("SLO attainment against load, every probe of the capacity search")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
