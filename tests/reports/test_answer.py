"""The report answers first and honestly: the headline names the metric it ranks by and quotes
that metric; throughput and TPOT ratios are separate and name their baselines; no two
controllers share a colour; no figure has overlapping titles."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from dspark.demo import SIM_CONTROLLERS
from reports import plots
from reports.analysis import comparison_table, kept_up
from reports.answer import answer, answer_sentence
from reports.build import ANSWER_TITLE
from reports.slo import Slo
from reports.style import (
    BASELINE_COLOR,
    KNOWN_COLORS,
    MIN_COLOR_DISTANCE,
    color_distance,
    controller_colors,
    family,
    is_baseline,
    line_style,
)
from tests.reports.fixtures import sim_row

DEMO_NAMES = [
    *SIM_CONTROLLERS,
    "dspark@best_config",
    "dspark:policy=seed",
    "clairvoyant",
    "rate-oracle",
    "rate-oracle:a_prior=0.5",
    "ar",
    "dspark-tuned",
    "fixed#2",
    "mine",
    "yours",
]


def test_spec_forms_map_to_their_family():
    assert family("dspark@best_config") == "dspark"
    assert family("fixed:k=2") == "fixed"
    assert family("rate-oracle:a_prior=0.5") == "rate-oracle"
    assert family("dspark-tuned") == "dspark" and family("hf-heuristic") == "hf-heuristic"
    assert is_baseline("fixed:k=0") and is_baseline("fixed-k0") and not is_baseline("fixed:k=2")
    assert line_style("dspark@best_config") == "--" and line_style("dspark") == "-"
    assert line_style("clairvoyant") == ":" and line_style("rate-oracle:x=1") == ":"


def test_no_two_controllers_share_a_colour():
    for names in (DEMO_NAMES, DEMO_NAMES[:11], ["dspark", "dspark@a", "dspark@b", "dspark:x=1"]):
        c = controller_colors(names)
        for a, b in itertools.combinations(names, 2):
            assert color_distance(c[a], c[b]) >= MIN_COLOR_DISTANCE, (a, b, c[a], c[b])
    c = controller_colors(DEMO_NAMES)
    assert c["dspark"] == KNOWN_COLORS["dspark"] and c["analytic"] == KNOWN_COLORS["analytic"]
    # variants are shades of their family's hue, not another family's colour
    import colorsys

    def hue(x):
        return colorsys.rgb_to_hls(*(int(x[i : i + 2], 16) / 255 for i in (1, 3, 5)))[0]

    for v in ("dspark@best_config", "dspark:policy=seed"):
        assert abs(hue(c[v]) - hue(KNOWN_COLORS["dspark"])) < 0.03, v
    for v in ("fixed:k=2", "fixed:k=4"):
        assert abs(hue(c[v]) - hue(KNOWN_COLORS["fixed"])) < 0.03, v
    # baselines are grey
    for b in ("fixed:k=0", "ar"):
        r, g, bl = (int(c[b][i : i + 2], 16) for i in (1, 3, 5))
        assert r == g == bl, b
    assert BASELINE_COLOR in (c["ar"], c["fixed:k=0"])


def _series_colors(fig) -> dict[str, str]:
    out = {}
    for ax in fig.axes:
        for ln in ax.get_lines():
            lab = ln.get_label()
            if lab and not lab.startswith("_") and len(ln.get_xdata()):
                out.setdefault(lab.split(" (request")[0], to_hex(ln.get_color()))
    return out


def test_report_figures_keep_controllers_apart(built_report, run_root):
    """Every figure built from the fixture runs: labelled series at least the threshold apart."""
    from reports.build import Builder
    from reports.loader import load_runs

    b = Builder(load_runs([run_root]))
    sim = next(r for r in b.runs if r.name == "sim")
    figs = [
        plots.plot_throughput_vs_load(sim.tables["results"], b.colors),
        plots.plot_latency_cdfs(sim.tables["requests"], b.colors),
        plots.plot_controller_traces(sim.tables["trace"], b.colors),
        plots.plot_acceptance_by_position(sim.tables["rounds"], b.colors),
    ]
    for fig in figs:
        cols = {k: v for k, v in _series_colors(fig).items() if k in b.colors}
        assert len(cols) >= 2
        for (n1, c1), (n2, c2) in itertools.combinations(cols.items(), 2):
            assert color_distance(c1, c2) >= MIN_COLOR_DISTANCE, (n1, n2, c1, c2)


def _overlaps(fig) -> list[tuple[str, str]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    texts = [t for t in ([fig._suptitle] if fig._suptitle else []) if t.get_text()]
    for ax in fig.axes:
        texts += [t for t in (ax.title, ax._left_title, ax._right_title) if t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in texts]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def test_no_overlapping_titles(run_root):
    from reports.loader import load_runs

    runs = {r.name: r for r in load_runs([run_root])}
    sim = runs["sim"]
    # long names, as the CLI writes them, in the two-panel plots
    req = pd.concat([sim.tables["requests"].assign(load_scale=x) for x in (0.5, 1.0)])
    figs = [
        plots.plot_latency_cdfs(
            req.assign(controller=req["controller"].replace({"dspark": "dspark@best_config"}))
        ),
        plots.plot_acceptance_by_position(sim.tables["rounds"]),
        plots.plot_scaling(runs["scaling"].tables["results"]),
        plots.plot_tuning_history(runs["tune-mo"].tables["trials"], ["maximize", "minimize"]),
    ]
    for fig in figs:
        assert not _overlaps(fig), _overlaps(fig)


def _point(speedups: dict, tputs: dict, seeds=(0, 1), kept=False, slo=True) -> pd.DataFrame:
    """One operating point; SLO goodput 0.9 × throughput, or (``slo`` False) a run that saved
    neither goodput nor attainment."""
    rows = []
    for c, tp in tputs.items():
        for s in seeds:
            r = sim_row("dspark" if c not in ("ar", "clairvoyant") else c, s, 1.0)
            r.update(
                controller=c,
                throughput_tokens_per_s=tp * (1 + 0.01 * s),
                goodput_tokens_per_s=0.9 * tp * (1 + 0.01 * s),
                speedup=speedups[c],
                mean_tpot_s=0.04 / speedups[c],
            )
            if kept:
                r.update(
                    requests_unfinished=0, offered_rps=2.0, requests_finished=100, sim_time_s=52.0
                )
            else:
                r.update(requests_unfinished=5, sim_time_s=90.0)
            if not slo:
                del r["goodput_tokens_per_s"], r["slo_attainment"]
            rows.append(r)
    return pd.DataFrame(rows)


HEADLINE_SPEEDUPS = {
    "fixed:k=0": 0.93,
    "fixed:k=2": 1.5,
    "dspark": 1.8,
    "analytic": 1.2,
    "clairvoyant": 2.0,
}
HEADLINE_TPUTS = {
    "fixed:k=0": 1000,
    "fixed:k=2": 1200,
    "dspark": 1300,
    "analytic": 1100,
    "clairvoyant": 1400,
}


def test_headline_names_its_measure_and_the_slos_and_quotes_it():
    a = answer(_point(HEADLINE_SPEEDUPS, HEADLINE_TPUTS), slo=Slo(2.0, 0.05))
    assert a.metric == "goodput" and a.winner == "dspark"  # never the reference
    text = answer_sentence(a)
    # ranked by SLO goodput, naming the SLOs, quoting goodput (tokens/s), not the TPOT speedup
    assert text.startswith(
        "Ranked by SLO goodput (output tokens/s of requests meeting both SLOs, higher is "
        "better; SLOs TTFT ≤ 2 s and TPOT ≤ 50 ms): **dspark** 1,176 tok/s"
    )
    assert f"{(1306.5 / 1206 - 1) * 100:+.1f}% over the best fixed k (fixed:k=2, 1,085" in text
    assert "1.30× over no speculation (fixed:k=0: k = 0, drafter resident, " in text
    assert "1.80×" not in text and "speedup" not in text
    assert "spread over 2 seeds ±0.5%" in text
    assert "clairvoyant 1,266 tok/s" in text and "not contenders" in text
    # without saved SLOs the sentence says so
    assert "SLOs not saved with the run)" in answer_sentence(
        answer(_point(HEADLINE_SPEEDUPS, HEADLINE_TPUTS))
    )


def test_a_run_without_slo_goodput_ranks_by_throughput():
    a = answer(_point(HEADLINE_SPEEDUPS, HEADLINE_TPUTS, slo=False))
    assert a.metric == "throughput" and a.winner == "dspark"
    text = answer_sentence(a)
    assert "by throughput (output tokens/s, higher is better): **dspark** 1,306 tok/s" in text
    assert f"{(1306.5 / 1206 - 1) * 100:+.1f}% over the best fixed k (fixed:k=2, 1,206" in text
    assert "1.30× over no speculation (fixed:k=0: k = 0, drafter resident, 1,005" in text
    assert "clairvoyant 1,407 tok/s" in text


def test_capped_goodput_ranks_by_attainment_then_tpot_and_says_why():
    sp = {"fixed:k=0": 0.93, "fixed:k=2": 1.5, "dspark": 1.8, "clairvoyant": 2.0}
    tputs = {"fixed:k=0": 1000, "fixed:k=2": 1005, "dspark": 1004, "clairvoyant": 1006}
    rows = _point(sp, tputs, kept=True)
    assert kept_up(rows)
    a = answer(rows)  # every contender at 97% attainment: a tie, broken by mean TPOT
    assert a.metric == "tpot" and a.winner == "dspark"
    text = answer_sentence(a)
    assert "SLO goodput does not decide here (plain decoding keeps up" in text
    assert "capped by the offered load" in text and "2 contenders meet both SLOs for 97.0%" in text
    assert (
        "by mean TPOT (ms per output token, lower is better; SLOs not saved with the run): "
        "**dspark** 22.22 ms"
    ) in text
    assert "TPOT 1.80× better than k = 0 without a drafter" in text
    # one contender ahead on attainment by more than a point wins by attainment
    rows.loc[rows["controller"] == "fixed:k=2", "slo_attainment"] = 0.99
    a = answer(rows)
    assert (a.metric, a.winner, a.value) == ("attainment", "fixed:k=2", 0.99)
    assert "by SLO attainment (share of requests meeting both SLOs" in answer_sentence(a)
    # a run without goodput: throughput capped, ranked by TPOT as before
    a = answer(_point(sp, tputs, kept=True, slo=False))
    assert a.metric == "tpot" and "Throughput does not decide here" in answer_sentence(a)
    # a goodput tie without a cap is also decided by TPOT, and says so
    rows = _point(sp, {"fixed:k=0": 1000, "fixed:k=2": 1302, "dspark": 1300, "clairvoyant": 1400})
    a = answer(rows)
    assert a.metric == "tpot" and "within 1% of each other" in answer_sentence(a)


def test_comparison_names_both_ratios_and_explains_k0(built_report):
    md = (built_report.parent / "report.md").read_text()
    assert md.index(f"## {ANSWER_TITLE}") < md.index("## Controller comparison")
    ans = md[md.index(f"## {ANSWER_TITLE}") : md.index("## Controller comparison")]
    lines = [ln for ln in ans.splitlines() if ln.startswith("**8xA100")]
    assert len(lines) == 3  # one per load
    for ln in lines:  # each names the metric it ranks by and quotes that metric
        assert re.search(
            r"by SLO goodput \(output tokens/s of requests meeting both SLOs, higher is "
            r"better; SLOs TTFT ≤ 2 s and TPOT ≤ 50 ms\): \*\*dspark\*\* [\d,]+ tok/s",
            ln,
        ) or re.search(
            r"ranked by mean TPOT \(ms per output token, lower is better; SLOs TTFT ≤ 2 s "
            r"and TPOT ≤ 50 ms\): \*\*dspark\*\* [\d.]+ ms",
            ln,
        ), ln
    assert "Held-out evaluation" in ans and "**dspark" in ans
    comp = pd.read_csv(built_report.parent / "tables" / "comparison_sim.csv")
    assert {"throughput_ratio", "speedup", "role", "throughput_spread_pct"} <= set(comp.columns)
    head = md[md.index("## Controller comparison") :]
    assert "throughput ÷ k = 0 with drafter (×)" in head
    assert "TPOT speedup vs k = 0 without drafter (×)" in head
    assert "speedup vs k=0" not in head


def test_comparison_explains_the_visible_k0_row():
    from reports.build import Builder
    from reports.loader import Run

    res = _point({"fixed:k=0": 0.93, "dspark": 1.8}, {"fixed:k=0": 1000, "dspark": 1300})
    run = Run(
        path=__import__("pathlib").Path("x"),
        kind="simulate",
        summary={"scenario": "s"},
        tables={"results": res},
    )
    sec = Builder([run]).comparison()
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert "`fixed:k=0` is k = 0 with the drafter resident" in text
    assert "reads 0.93×" in text and "k = 0 without a drafter" in text
    t = comparison_table(res).set_index("controller")
    assert t.loc["fixed:k=0", "throughput_ratio"] == pytest.approx(1.0)
    assert np.isclose(t.loc["dspark", "throughput_ratio"], 1.3)


def test_answer_table_one_row_per_point(built_report):
    t = pd.read_csv(built_report.parent / "tables" / "answer.csv")
    sim = t[t["scenario"] == "8xA100 70B+8B"]
    assert len(sim) == 3 and set(sim["winner"]) == {"dspark"}
    for _, r in sim.iterrows():  # the value is in the unit of the metric it is ranked by
        unit = "ms" if r["ranked by"].startswith("mean TPOT") else "tok/s"
        assert r["value"].endswith(unit), r
