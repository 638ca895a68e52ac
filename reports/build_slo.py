"""Report sections of the user's question: the answer first, latency against the SLOs, and
capacity at SLO. Each takes the report's ``Any`` (its runs and colours) and returns a
section, or a line saying why it was skipped."""

from __future__ import annotations

from typing import Any

import pandas as pd

from reports import slo_plots
from reports.analysis import (
    CONTENDER,
    heldout_capacity_sentence,
    heldout_sentence,
    operating_points,
    role,
)
from reports.answer import answer, answer_row, answer_sentence
from reports.loader import Run
from reports.plots import figure_png
from reports.render import FigureBlock, Section, TableBlock, slug
from reports.slo import (
    MIN_ATTAINMENT,
    attainment_target,
    capacity_answer,
    capacity_question,
    capacity_row,
    capacity_sentence,
    capacity_table,
    format_capacity,
    slo_of,
)

ANSWER_TITLE = "The answer first"
SLO_TITLE = "Tail latency against the SLOs"
CAPACITY_TITLE = "Capacity at SLO"


#: the held-out evaluation's tables (run table, column, caption head, number format): the
#: study's capacity at SLO first, where saved, then throughput and speedup
HELDOUT_TABLES = (
    ("heldout_capacity", "capacity_load_scale", "capacity at SLO (load scale)", "{:.3g}"),
    ("evaluation", "throughput_tokens_per_s", "throughput (tokens/s)", "{:,.0f}"),
    ("evaluation", "speedup", "speedup over k = 0 (×)", "{:.2f}"),
)


def _with(runs: list[Run], kind: str, table: str) -> list[Run]:
    return [r for r in runs if r.kind == kind and table in r.tables]


def _points(results: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Operating points of one simulate run for the answer: every load at the common GPU count;
    a GPU-count sweep: its smallest and largest cluster."""
    if "num_gpus" in results.columns and results["num_gpus"].nunique() > 2:
        g = results["num_gpus"]
        pts = []
        for n in (g.min(), g.max()):
            for where, rows in operating_points(results[g == n]):
                pts.append((f"{n:g} GPU{'s' if n != 1 else ''}, {where}", rows))
        return pts
    return operating_points(results)


ANSWER_INTRO = (
    "Which controller, by how much, how sure — per scenario and load, computed from the runs "
    "below. Contenders are the deployable controllers; no speculation is the visible k = 0 row "
    "(the drafter resident, never used); references (clairvoyant, rate-oracle) are told what no "
    "engine knows and are never the winner. A capacity run ranks by capacity at SLO (the "
    "highest load at which the target share of requests meets both SLOs; median over seeds, "
    "with the seeds' range). At one load the winner is ranked by SLO goodput (output tokens/s "
    "of the requests meeting both SLOs); where plain decoding keeps up with the arrivals, by "
    "SLO attainment; leaders within 1% (one point of attainment) are a tie broken by mean "
    f"TPOT, and a controller meeting both SLOs for fewer than {MIN_ATTAINMENT:.0%} of its "
    "requests never wins by mean TPOT or throughput. Each sentence names the measure that "
    "decided and the SLOs. The table is the short form; one sentence per row follows it."
)


def answer_section(b: Any) -> Section | str:
    sims = _with(b.runs, "simulate", "results")
    caps = _with(b.runs, "capacity", "capacity")
    tunes = _with(b.runs, "tune", "evaluation")
    if not sims and not caps and not tunes:
        return (
            "no simulate, capacity or tune run given (run `dspark capacity`, `dspark simulate` "
            "or `dspark tune`)."
        )
    sec = Section("answer", ANSWER_TITLE)
    sec.p(ANSWER_INTRO)
    table, lines = [], []
    for r in caps:
        sc = str(r.summary.get("scenario") or r.name)
        ca = capacity_answer(r)
        if ca is None:
            lines.append(f"**{sc}** (capacity run `{r.name}`): no contender reached the target.")
            continue
        table.append(capacity_row(r, ca))
        lines.append(f"**{sc}** (capacity run `{r.name}`): {capacity_sentence(r, ca)}")
    for r in sims:
        sc = str(r.summary.get("scenario") or r.name)
        slo = slo_of(r)
        for where, rows in _points(r.tables["results"]):
            a = answer(rows, slo=slo)
            if a is not None:
                table.append(answer_row(sc, where, a))
                lines.append(f"**{sc}** (run `{r.name}`), {where}: {answer_sentence(a)}")
            elif (rows["controller"].map(role) == CONTENDER).any():
                lines.append(
                    f"**{sc}** (run `{r.name}`), {where}: no winner — no contender meets both "
                    f"SLOs for {MIN_ATTAINMENT:.0%} of its requests, and the run saved no SLO "
                    "goodput to rank them by."
                )
    if table:
        sec.blocks.append(
            TableBlock(
                "answer",
                "winner per scenario and operating point (margins in the ranking measure)",
                pd.DataFrame(table),
            )
        )
    for line in lines:
        sec.p(line)
    for r in tunes:
        if "heldout_capacity" in r.tables:  # the study's own measure
            text = heldout_capacity_sentence(
                r.tables["heldout_capacity"],
                r.summary.get("tuned_vs_default"),
                bool(r.summary.get("best_is_default")),
            )
        else:
            text = heldout_sentence(r.tables["evaluation"])
        if text:
            sec.p(f"**Held-out evaluation** (tune run `{r.name}`): {text}")
    return sec


def _label(run: Run) -> str:
    sc = run.summary.get("scenario")
    return f"run `{run.name}`" + (f" — {sc}" if sc else "")


def slo_section(b: Any) -> Section | str:
    runs = [
        r
        for r in _with(b.runs, "simulate", "results")
        if {"ttft_p99_s", "tpot_p99_s"} <= set(r.tables["results"].columns)
    ]
    if not runs:
        return "no simulate run saved ttft_p99_s and tpot_p99_s."
    sec = Section("slo", SLO_TITLE)
    sec.p(
        "The trade-off a user chooses on: each controller's TTFT p99 against its TPOT p99 at "
        "every load (mean over seeds), with the SLOs of the run's config.toml `[slo]` drawn as "
        "lines. Left of and below both lines, 99% of requests meet each SLO on its own; the "
        "answer's SLO goodput and attainment count the requests meeting both."
    )
    for r in runs:
        if len(runs) > 1:
            sec.h3(_label(r))
        slo = slo_of(r)
        if slo is not None:
            sec.p(f"SLOs: {slo.words()}.")
        sec.blocks.append(
            FigureBlock(
                f"slo_scatter_{_slug(r.name)}",
                f"TTFT p99 against TPOT p99 per controller and load ({_label(r)})",
                figure_png(slo_plots.plot_slo_scatter(r.tables["results"], slo, b.colors)),
            )
        )
        pts = slo_plots.latency_points(r.tables["results"])
        sec.blocks.append(
            TableBlock(
                f"slo_scatter_{_slug(r.name)}",
                "the points of the scatter",
                pts,
                show=False,
            )
        )
    return sec


def capacity_section(b: Any) -> Section | str:
    runs = _with(b.runs, "capacity", "capacity")
    if not runs:
        return "no capacity run given (run `dspark capacity SCENARIO.toml`)."
    sec = Section("capacity", CAPACITY_TITLE)
    sec.p(
        "Capacity at SLO per controller: the highest load scale (× the scenario's arrival "
        "rate, same arrivals per seed) at which the target share of requests meets both SLOs, "
        "found by bisection per seed; the median over seeds, the lowest and highest seed, and "
        "the spread (range ÷ median). The plot shows every probe of the search."
    )
    for r in runs:
        if len(runs) > 1:
            sec.h3(_label(r))
        slug = _slug(r.name)
        sec.p(f"Capacity here is {capacity_question(r)}.")
        t = capacity_table(r)
        sec.blocks.append(
            TableBlock(f"capacity_{slug}", f"capacity at SLO — {_label(r)}", format_capacity(t), t)
        )
        if "probes" in r.tables:
            sec.blocks.append(
                FigureBlock(
                    f"capacity_probes_{slug}",
                    f"SLO attainment against load, per controller ({_label(r)})",
                    figure_png(
                        slo_plots.plot_capacity_probes(
                            r.tables["probes"], attainment_target(r), t, b.colors
                        )
                    ),
                )
            )
    return sec


def _slug(text: str) -> str:
    return slug(text)
