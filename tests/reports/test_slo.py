"""The report answers the user's question: capacity at their SLOs. A controller that misses the
SLOs never wins by throughput or mean TPOT; a capacity run ranks by capacity at SLO; the
latency scatter and the capacity plot draw the SLO and target lines where the run says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from control.errors import DSparkError
from reports.answer import answer, answer_sentence
from reports.build import Builder
from reports.build_slo import answer_section
from reports.loader import load_run, load_runs
from reports.slo import Slo, capacity_answer, capacity_row, capacity_sentence, slo_of
from reports.slo_plots import latency_points, plot_capacity_probes, plot_slo_scatter
from tests.reports.fixtures import (
    CAPACITY,
    SLO_TPOT_S,
    SLO_TTFT_S,
    sim_row,
    write_capacity_run,
)
from tests.reports.test_plots import check_figure

SLO = "[slo]\nttft_s = 1.0\ntpot_s = 0.02\n"


def _row(controller: str, seed: int, **kw) -> dict:
    """A simulate row that did not keep up (throughput not capped by the offered load)."""
    r = sim_row("dspark", seed, 1.5)
    r.update(controller=controller, requests_unfinished=5, sim_time_s=90.0, **kw)
    return r


def _sim_folder(root: Path, name: str, rows: list[dict], config: str = SLO) -> Path:
    d = root / name
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "results.csv", index=False)
    (d / "summary.json").write_text(json.dumps({"kind": "simulate", "scenario": name}))
    (d / "config.toml").write_text(config)
    return d


def _answer_text(folder: Path) -> str:
    sec = answer_section(Builder([load_run(folder)]))
    return " ".join(b for b in sec.blocks if isinstance(b, str))


# controller -> (throughput, SLO goodput, attainment, mean TPOT s): the throughput and TPOT
# leader (fixed:k=4) misses the SLOs for most of its requests
MISSES = {
    "fixed:k=0": (1500.0, 1400.0, 0.93, 0.030),
    "fixed:k=4": (3000.0, 900.0, 0.30, 0.010),
    "fixed:k=1": (2400.0, 2200.0, 0.90, 0.016),
    "dspark": (2500.0, 2300.0, 0.92, 0.015),
    "clairvoyant": (3200.0, 3000.0, 0.99, 0.009),
}


def _misses_rows(table=MISSES, drop=()) -> list[dict]:
    rows = []
    for c, (tp, gp, att, tpot) in table.items():
        for s in (0, 1):
            r = _row(
                c,
                s,
                throughput_tokens_per_s=tp * (1 + 0.01 * s),
                goodput_tokens_per_s=gp * (1 + 0.01 * s),
                slo_attainment=att,
                mean_tpot_s=tpot,
            )
            rows.append({k: v for k, v in r.items() if k not in drop})
    return rows


def test_the_throughput_winner_that_misses_the_slo_does_not_win(tmp_path):
    from reports import make_report

    run = _sim_folder(tmp_path / "runs", "misses", _misses_rows())
    index = make_report([run], tmp_path / "report")
    t = pd.read_csv(index.parent / "tables" / "answer.csv")
    assert list(t["winner"]) == ["dspark"] and list(t["ranked by"]) == ["SLO goodput"]
    assert t["value"].iloc[0] == "2,312 tok/s"  # mean over seeds: 2300 and 2323
    assert t["vs best fixed k"].iloc[0] == f"{(2311.5 / 2211 - 1) * 100:+.1f}% (fixed:k=1)"
    md = (index.parent / "report.md").read_text()
    assert (
        "Ranked by SLO goodput (output tokens/s of requests meeting both SLOs, higher is "
        "better; SLOs TTFT ≤ 1 s and TPOT ≤ 20 ms): **dspark** 2,312 tok/s (SLO attainment "
        "92.0%)"
    ) in md
    assert "clairvoyant 3,015 tok/s" in md  # quoted as a reference, never the winner


def test_a_goodput_tie_is_never_won_by_tpot_below_half_attainment(tmp_path):
    tie = {
        "fixed:k=4": (3000.0, 2000.0, 0.45, 0.010),  # best TPOT, in the tie, misses the SLOs
        "dspark": (2100.0, 2005.0, 0.95, 0.014),
        "fixed:k=1": (2050.0, 1990.0, 0.93, 0.015),
    }
    text = _answer_text(_sim_folder(tmp_path, "tie", _misses_rows(tie)))
    assert "SLO goodput does not decide here (the SLO goodput leaders are within 1%" in text
    assert (
        "ranked by mean TPOT (ms per output token, lower is better; SLOs TTFT ≤ 1 s and "
        "TPOT ≤ 20 ms): **dspark** 14.00 ms"
    ) in text
    assert "below 50% SLO attainment, so never the winner by mean TPOT: fixed:k=4 (45.0%)" in text
    assert "over the best fixed k (fixed:k=1, 15.00 ms)" in text


def test_without_saved_goodput_throughput_ranks_only_controllers_meeting_the_slo(tmp_path):
    rows = _misses_rows(drop=("goodput_tokens_per_s",))
    a = answer(pd.DataFrame(rows), slo=Slo(1.0, 0.02))
    assert (a.metric, a.winner) == ("throughput", "dspark")
    text = answer_sentence(a)
    assert "never the winner by throughput: fixed:k=4 (30.0%)" in text
    assert "SLOs TTFT ≤ 1 s and TPOT ≤ 20 ms" in text
    # every contender below the floor and no goodput: no winner, and the section says why
    low = {c: (tp, gp, 0.2, tpot) for c, (tp, gp, _, tpot) in MISSES.items()}
    rows = _misses_rows(low, drop=("goodput_tokens_per_s",))
    assert answer(pd.DataFrame(rows)) is None
    text = _answer_text(_sim_folder(tmp_path, "all-low", rows))
    assert "no winner — no contender meets both SLOs for 50% of its requests" in text


def test_a_capacity_run_ranks_by_capacity_at_slo(tmp_path):
    run = load_run(write_capacity_run(tmp_path / "cap"))
    assert set(run.tables) == {"capacity", "capacity_seeds", "probes"}
    a = capacity_answer(run)
    med = {c: float(np.median(v)) for c, v in CAPACITY.items()}
    assert (a.winner, a.median, a.low, a.high) == ("dspark", med["dspark"], 1.5, 1.6)
    assert a.references == {"clairvoyant": med["clairvoyant"]}  # the highest, not a contender
    assert a.best_fixed == ("fixed:k=2", med["fixed:k=2"]) and a.no_spec == ("fixed:k=0", 0.9)
    # paired per seed (same arrivals): dspark is ahead of fixed:k=2 on seeds 1 and 2, not 3
    assert a.ahead == {"fixed:k=2": (2, 3)} and a.overlaps == {"fixed:k=2": True}
    text = capacity_sentence(run, a)
    assert text.startswith(
        f"Ranked by capacity at SLO (the highest load scale at which ≥ 90% of requests meet "
        f"TTFT ≤ {SLO_TTFT_S:g} s and TPOT ≤ {SLO_TPOT_S * 1e3:g} ms; median over 3 seeds, "
        "higher is better): **dspark** 1.55× the scenario's load (seeds 1.5–1.6, 3.1 requests/s)"
    )
    pct = (med["dspark"] / med["fixed:k=2"] - 1) * 100
    assert (
        f"{pct:+.1f}% over the best fixed k (fixed:k=2, 1.4; ahead on 2 of 3 seeds; the "
        "seeds' ranges overlap)"
    ) in text
    assert "clairvoyant 2.1" in text and "not contenders" in text
    row = capacity_row(run, a)
    assert row["value"] == "1.55 (1.5–1.6)" and row["ranked by"] == "capacity at SLO (load scale)"
    assert row["vs no speculation"] == f"{1.55 / 0.9:.2f}×"


def test_the_report_answers_capacity_first_and_draws_its_probes(built_report, run_root):
    out = built_report.parent
    t = pd.read_csv(out / "tables" / "answer.csv")
    cap = t[t["scenario"] == "capacity 70B"]
    assert list(cap["winner"]) == ["dspark"] and t.index[t["scenario"] == "capacity 70B"][0] == 0
    table = pd.read_csv(out / "tables" / "capacity_capacity.csv")
    assert list(table["controller"]) == ["dspark", "fixed:k=2", "fixed:k=0", "clairvoyant"]
    assert (out / "figures" / "capacity_probes_capacity.png").stat().st_size > 5000
    comp = pd.read_csv(out / "tables" / "comparison_sim.csv")
    assert np.allclose(comp["slo_attainment"], 0.97)


def _lines_by_gid(fig) -> dict:
    return {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}


def test_latency_scatter_draws_the_slo_lines_and_every_point(run_root, built_report):
    res = next(r for r in load_runs([run_root]) if r.name == "sim").tables["results"]
    fig = plot_slo_scatter(res, Slo(SLO_TTFT_S, SLO_TPOT_S))
    check_figure(fig)
    gid = _lines_by_gid(fig)
    assert list(gid["slo-ttft"].get_xdata()) == [SLO_TTFT_S, SLO_TTFT_S]
    assert list(gid["slo-tpot"].get_ydata()) == [SLO_TPOT_S * 1e3, SLO_TPOT_S * 1e3]
    pts = latency_points(res)
    assert len(pts) == res["controller"].nunique() * res["load_scale"].nunique()
    drawn = {
        (float(ln.get_xdata()[0]), round(float(ln.get_ydata()[0]), 9))
        for ln in fig.axes[0].get_lines()
        if len(ln.get_xdata()) == 1
    }
    want = res.groupby(["controller", "load_scale"])[["ttft_p99_s", "tpot_p99_s"]].mean()
    assert drawn == {(x, round(y * 1e3, 9)) for x, y in want.itertuples(index=False)}
    assert fig.axes[0].get_xscale() == "linear"  # TTFT 0.5 s to the 2 s SLO: no log needed
    # the report draws it with the run's own [slo] and saves its points
    assert (built_report.parent / "figures" / "slo_scatter_sim.png").stat().st_size > 5000
    saved = pd.read_csv(built_report.parent / "tables" / "slo_scatter_sim.csv")
    assert np.allclose(saved["tpot_p99_s"], pts["tpot_p99_s"])
    md = (built_report.parent / "report.md").read_text()
    assert f"SLOs: TTFT ≤ {SLO_TTFT_S:g} s and TPOT ≤ {SLO_TPOT_S * 1e3:g} ms." in md
    # tails spanning decades go on log axes; no SLOs saved: no lines, and the title says so
    wide = res.assign(ttft_p99_s=res["load_scale"] ** 6)
    fig = plot_slo_scatter(wide, None)
    assert fig.axes[0].get_xscale() == "log" and not _lines_by_gid(fig)
    assert "the run saved no SLOs" in fig.axes[0].get_title()


def test_capacity_plot_draws_the_target_and_each_probe(tmp_path):
    run = load_run(write_capacity_run(tmp_path / "cap"))
    probes = run.tables["probes"]
    fig = plot_capacity_probes(probes, 0.9, run.tables["capacity"])
    check_figure(fig)
    gid = _lines_by_gid(fig)
    assert list(gid["target"].get_ydata()) == [0.9, 0.9]
    for c, caps in CAPACITY.items():
        assert list(gid[f"capacity {c}"].get_xdata()) == [float(np.median(caps))] * 2
    series = [ln for ln in fig.axes[0].get_lines() if not ln.get_gid()]
    assert len(series) == len(CAPACITY) * 3  # one per controller and seed
    for ln in series:  # attainment falls to exactly the target at each seed's capacity
        x, y = np.asarray(ln.get_xdata()), np.asarray(ln.get_ydata())
        assert np.all(np.diff(x) > 0) and np.isclose(y[1], 0.9)


def test_capacity_folder_errors_are_one_line(tmp_path):
    d = write_capacity_run(tmp_path / "cap")
    (d / "capacity.csv").unlink()
    with pytest.raises(DSparkError, match=r"capacity\.csv: missing") as e:
        load_run(d)
    assert "\n" not in str(e.value)
    d = write_capacity_run(tmp_path / "cap2")
    summary = json.loads((d / "summary.json").read_text())
    summary["slo"] = {"ttft_s": 1.0, "tpot_s": 0}
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DSparkError, match=r"summary\.json: 'slo': ttft_s and tpot_s must be > 0"):
        slo_of(load_run(d))
    summary["slo"] = {"ttft_s": "fast"}
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DSparkError, match=r"'slo': expected numbers ttft_s and tpot_s"):
        slo_of(load_run(d))
