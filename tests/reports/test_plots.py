"""Every plot function on small synthetic tables: a non-empty figure with labelled axes, a title,
a legend, drawn data; and the numbers behind the acceptance plot are exact."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.category import StrCategoryConverter
from matplotlib.collections import Collection
from matplotlib.figure import Figure

from reports import plots
from reports.analysis import acceptance_by_position, comparison_table, ecdf, reference_slice
from reports.loader import load_runs
from reports.style import KNOWN_COLORS, controller_colors


@pytest.fixture(scope="module")
def runs(run_root):
    return {r.name: r for r in load_runs([run_root])}


def check_figure(fig: Figure, min_axes: int = 1) -> None:
    assert isinstance(fig, Figure)
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) >= min_axes
    has_legend = fig.legends or any(a.get_legend() is not None for a in axes)
    assert has_legend, "every plot needs a legend"
    title = fig._suptitle.get_text() if fig._suptitle else ""
    for ax in axes:
        assert ax.get_xlabel().strip() or ax.get_shared_x_axes().get_siblings(ax) != [ax]
        assert ax.get_ylabel().strip(), f"axis without y label in {fig}"
        title = title or ax.get_title()
        drawn = (
            ax.get_lines() + ax.patches + [c for c in ax.collections if isinstance(c, Collection)]
        )
        assert drawn, "axes with nothing drawn"
    assert title.strip(), "figure without a title"
    # units in the axis labels (a parenthesised unit or a probability/fraction/count axis)
    for ax in axes:
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            if label and not isinstance(axis.get_converter(), StrCategoryConverter):
                assert "(" in label or label in ("probability",) or "fraction" in label, label
    png = plots.figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_throughput_vs_load(runs):
    res = runs["sim"].tables["results"]
    fig = plots.plot_throughput_vs_load(res)
    check_figure(fig)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == set(res["controller"])
    x, y = lines["dspark"].get_data()
    want = res[res.controller == "dspark"].groupby("load_scale")
    assert np.allclose(x, want["offered_rps"].mean().to_numpy())
    assert np.allclose(y, want["throughput_tokens_per_s"].mean().to_numpy())


def test_colors_are_consistent_across_plots(runs):
    colors = controller_colors(["dspark", "fixed", "ar", "oracle", "hf-heuristic", "analytic"])
    a = plots.plot_throughput_vs_load(runs["sim"].tables["results"], colors)
    b = plots.plot_latency_cdfs(runs["sim"].tables["requests"], colors)
    for fig in (a, b):
        for ln in fig.axes[0].get_lines():
            if ln.get_label() in colors:
                assert ln.get_color() == colors[ln.get_label()]
    assert colors["dspark"] == KNOWN_COLORS["dspark"]
    # unknown names get distinct colours, and the same ones every time
    c1 = controller_colors(["fixed-k4", "fixed-k8", "mine"])
    assert len(set(c1.values())) == 3 and c1 == controller_colors(["mine", "fixed-k8", "fixed-k4"])


def test_latency_cdfs_use_finished_requests(runs):
    req = runs["sim"].tables["requests"]
    fig = plots.plot_latency_cdfs(req)
    check_figure(fig, 2)
    tpot = {
        ln.get_label(): ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")
    }
    x, y = tpot["ar"].get_data()
    fin = req[(req.controller == "ar") & req.finished]
    assert len(x) == len(fin) == 39
    assert np.allclose(np.sort(fin["tpot_s"] * 1e3), x) and y[-1] == 1.0


def test_controller_traces(runs):
    trace = runs["sim"].tables["trace"]
    fig = plots.plot_controller_traces(trace)
    check_figure(fig, 4)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert any("α" in lab for lab in labels) and any("β" in lab for lab in labels)
    assert any("block end" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    # dspark's longest request (0, 30 rows) is shown, with its 3 block ends marked
    dsp = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "|" and len(ln.get_xdata())]
    assert sorted(len(ln.get_xdata()) for ln in dsp) == [3]


def test_acceptance_by_position_is_exact(runs):
    rounds = runs["sim"].tables["rounds"]
    t = acceptance_by_position(rounds)
    d = t[t.controller == "dspark"].set_index("position")
    # pattern (drafted, accepted): (4,4) (4,2) (4,0) (2,2) (4,3), repeated 4 times
    # position 1: drafted in 5 rounds/rep, accepted when n >= 1: 4 of 5
    assert d.loc[1, "p_accepted"] == pytest.approx(4 / 5)
    assert d.loc[2, "p_accepted"] == pytest.approx(4 / 5)  # n >= 2: (4,4),(4,2),(2,2),(4,3)
    assert d.loc[3, "p_accepted"] == pytest.approx(2 / 4)  # drafted >= 3 in 4 rounds; n>=3: 2
    assert d.loc[4, "p_accepted"] == pytest.approx(1 / 4)
    assert d.loc[3, "p_accepted_given_prefix"] == pytest.approx(2 / 3)  # reached (n>=2): 3 rounds
    assert d.loc[1, "drafted"] == 20
    # acceptance is a prefix: P(token i accepted) never rises with i
    assert (np.diff(d["p_accepted"].to_numpy()) <= 1e-12).all()
    fig = plots.plot_acceptance_by_position(rounds, min_rounds=16)
    check_figure(fig, 2)
    y = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "dspark").get_ydata()
    assert np.allclose(y, [0.8, 0.8, 0.5, 0.25])
    # positions drafted in fewer rounds than the minimum are hollow and not joined
    assert list(d["drafted"]) == [20, 20, 16, 16]
    fig = plots.plot_acceptance_by_position(rounds, min_rounds=20)
    lines = fig.axes[0].get_lines()
    y = next(ln for ln in lines if ln.get_label() == "dspark").get_ydata()
    assert np.allclose(y, [0.8, 0.8])
    hollow = [ln for ln in lines if ln.get_markerfacecolor() == "none" and len(ln.get_xdata())]
    assert any(np.allclose(ln.get_ydata(), [0.5, 0.25]) for ln in hollow)
    assert any("fewer than 20 rounds" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_scaling(runs):
    res = runs["scaling"].tables["results"]
    fig = plots.plot_scaling(res)
    check_figure(fig, 2)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    x = next(ln for ln in ax.get_lines() if ln.get_label() == "dspark").get_xdata()
    assert list(x) == [1, 2, 8, 64, 256, 1024]


def test_tuning_history_single_and_multi(runs):
    t = runs["tune"].tables["trials"]
    fig = plots.plot_tuning_history(t, ["maximize"], ["throughput_tokens_per_s"])
    check_figure(fig)
    best = next(ln for ln in fig.axes[0].get_lines() if "best feasible so far" in ln.get_label())
    done = t[t.state == "COMPLETE"].sort_values("number")
    assert np.allclose(best.get_ydata(), done["value"].cummax())
    assert "tokens/s" in fig.axes[0].get_ylabel()
    fig2 = plots.plot_tuning_history(runs["tune-mo"].tables["trials"], ["maximize", "minimize"])
    check_figure(fig2, 2)
    best2 = next(ln for ln in fig2.axes[1].get_lines() if "best feasible so far" in ln.get_label())
    done2 = runs["tune-mo"].tables["trials"].query("state == 'COMPLETE'").sort_values("number")
    assert np.allclose(best2.get_ydata(), done2["values_1"].cummin())


def test_importances(runs):
    imp = runs["tune"].tables["importances"]
    fig = plots.plot_importances(imp)
    check_figure(fig)
    widths = sorted(p.get_width() for p in fig.axes[0].patches)
    assert widths == pytest.approx(sorted(imp["importance"]))


def test_pareto(runs):
    r = runs["tune-mo"]
    fig = plots.plot_pareto(
        r.tables["pareto"],
        r.tables["trials"],
        ["maximize", "minimize"],
        ["throughput_tokens_per_s", "tpot_p99_s"],
    )
    check_figure(fig)
    front = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "Pareto front")
    assert len(front.get_xdata()) == len(r.tables["pareto"])
    with pytest.raises(ValueError):
        plots.plot_pareto(pd.DataFrame({"number": [1], "value": [2.0]}))


def test_parity_error_bars_are_real_spread(runs):
    e = runs["validate"].tables["errors"]
    fig = plots.plot_parity(e)
    check_figure(fig, 5)
    ax = fig.axes[0]  # throughput
    g = e[e.metric == "throughput_tokens_per_s"]
    bars = list(ax.containers)
    assert len(bars) == len(g)
    # the first container is (dspark, code): half-width = real * spread% / 200
    row = g.sort_values(["controller", "workload"]).iloc[0]
    seg = bars[0].lines[2][0].get_segments()[0]
    assert seg[1][1] - seg[0][1] == pytest.approx(row.real * row.real_spread / 100)


def test_comparison_table_means(runs):
    res = runs["sim"].tables["results"]
    ref, where = reference_slice(res)
    assert set(ref.load_scale) == {1.0} and "load scale 1" in where and "2 seeds" in where
    t = comparison_table(ref).set_index("controller")
    want = res[(res.controller == "dspark") & (res.load_scale == 1.0)]
    assert t.loc["dspark", "throughput_tokens_per_s"] == pytest.approx(
        want.throughput_tokens_per_s.mean()
    )
    # contenders first (best throughput first), then no speculation, then the references
    assert t.index[0] == "dspark" and t.loc["dspark", "seeds"] == 2
    assert list(t["role"].iloc[-2:]) == ["no speculation", "reference"]
    assert t.loc["ar", "throughput_ratio"] == pytest.approx(1.0)
    assert t.loc["dspark", "throughput_ratio"] == pytest.approx(
        t.loc["dspark", "throughput_tokens_per_s"] / t.loc["ar", "throughput_tokens_per_s"]
    )


def test_ecdf():
    x, y = ecdf([3.0, 1.0, np.nan, 2.0])
    assert list(x) == [1.0, 2.0, 3.0] and np.allclose(y, [1 / 3, 2 / 3, 1.0])
