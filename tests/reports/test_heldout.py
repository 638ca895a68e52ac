"""The held-out evaluation of a study tuned for capacity at SLO is reported on that measure."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from control.errors import DSparkError
from reports.analysis import heldout_capacity_sentence
from reports.loader import load_run

COMPARE = {  # summary.json's tuned_vs_default, as tuning.slo.compare writes it
    "measure": "capacity at SLO",
    "default": "dspark-default",
    "gain": 0.025,
    "gain_min": -0.01,
    "gain_max": 0.06,
    "spread": 0.03,
    "within_spread": True,
    "workload_gains": {"a": 0.05, "b": 0.0},
}


def _capacity() -> pd.DataFrame:
    rows = []
    for c, base in (("dspark-tuned", 2.0), ("dspark-default", 1.9), ("fixed-best", 1.6)):
        for w, dw in (("a", 0.0), ("b", 1.0)):
            for seed, ds in ((100, -0.1), (101, 0.1)):
                rows.append((c, w, seed, base + dw + ds))
    rows.append(("clairvoyant", "a", 100, 9.0))  # a reference: never the runner-up
    return pd.DataFrame(rows, columns=["controller", "workload", "seed", "capacity_load_scale"])


def test_the_sentence_states_the_studys_measure_and_its_comparison():
    text = heldout_capacity_sentence(_capacity(), COMPARE, best_is_default=False)
    assert text == (
        "by capacity at SLO (the study's measure: load scale, mean over 2 held-out workloads × "
        "2 seeds), **dspark-tuned** 2.5, +2.5% over dspark-default (pairs -1.0% to +6.0%, "
        "spread over seeds ±3.0%; better on 1 of 2 workloads); tuning does not beat the "
        "default by more than the spread; +19.0% over the best other contender (fixed-best, "
        "2.1)."
    )
    beat = {**COMPARE, "within_spread": False}
    text = heldout_capacity_sentence(_capacity(), beat, best_is_default=True)
    assert "does not beat" not in text and "; the best trial is the untuned default;" in text


def test_the_loader_reads_heldout_capacity(tmp_path):
    (tmp_path / "summary.json").write_text(
        json.dumps({"kind": "tune", "tuned_vs_default": COMPARE, "best_is_default": False})
    )
    _capacity().to_csv(tmp_path / "heldout_capacity.csv", index=False)
    run = load_run(tmp_path)
    got = run.tables["heldout_capacity"]
    assert got["capacity_load_scale"].tolist() == _capacity()["capacity_load_scale"].tolist()
    _capacity().drop(columns="seed").to_csv(tmp_path / "heldout_capacity.csv", index=False)
    with pytest.raises(DSparkError, match=r"heldout_capacity\.csv: missing required column 'seed'"):
        load_run(tmp_path)


def test_the_answer_and_the_evaluation_section_read_the_capacity_of_a_slo_study(tmp_path):
    from reports import make_report
    from tests.reports.fixtures import write_tune_run

    folder = write_tune_run(tmp_path / "tune")
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(objective="slo-capacity", tuned_vs_default=COMPARE, best_is_default=False)
    (folder / "summary.json").write_text(json.dumps(summary))
    _capacity().to_csv(folder / "heldout_capacity.csv", index=False)
    make_report([folder], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert (
        "**Held-out evaluation** (tune run `tune`): by capacity at SLO (the study's measure" in md
    )
    sec = md[md.index("## Held-out evaluation") :]
    assert sec.index("capacity at SLO (load scale) per controller") < sec.index(
        "throughput (tokens"
    )
    # without heldout_capacity.csv (a study tuned for throughput): by throughput, as before
    (folder / "heldout_capacity.csv").unlink()
    make_report([folder], tmp_path / "report2")
    md = (tmp_path / "report2" / "report.md").read_text()
    assert "**Held-out evaluation** (tune run `tune`): by throughput (output tokens/s" in md
