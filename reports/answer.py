"""The answer first: who wins at one operating point of a simulate run, by which measure.

The ranking (docs/design.md, "The user's question: capacity at their SLOs"):

1. **SLO goodput** (output tokens/s of the requests meeting both SLOs) decides, when the run
   saved it; runs without it fall back to throughput.
2. Where plain decoding keeps up with the arrivals (:func:`reports.analysis.kept_up`), goodput is
   capped by the offered load and only measures how fast the last requests drain: **SLO
   attainment** (the share of requests meeting both SLOs) decides instead.
3. Leaders within :data:`~reports.analysis.SEPARATION` of each other (within one point of
   attainment) are a tie, broken by **mean TPOT** among the tied.
4. A contender whose SLO attainment is below :data:`~reports.slo.MIN_ATTAINMENT` can never win by
   mean TPOT or by throughput. References are quoted, never ranked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from control.metrics import half_range_pct_of_mean
from reports.analysis import (
    CONTENDER,
    NO_SPEC,
    REFERENCE,
    SEPARATION,
    fmt_num,
    kept_up,
    role,
)
from reports.slo import MIN_ATTAINMENT, Slo
from reports.style import family

#: two attainments closer than this (a share of requests) are a tie.
ATTAINMENT_TIE = 0.01

METRIC_COLUMNS = {
    "goodput": "goodput_tokens_per_s",
    "attainment": "slo_attainment",
    "throughput": "throughput_tokens_per_s",
}
METRIC_WORDS = {
    "goodput": (
        "SLO goodput (output tokens/s of requests meeting both SLOs, higher is better)",
        1.0,
        "{:,.0f} tok/s",
    ),
    "attainment": (
        "SLO attainment (share of requests meeting both SLOs, higher is better)",
        100.0,
        "{:.1f}%",
    ),
    "throughput": ("throughput (output tokens/s, higher is better)", 1.0, "{:,.0f} tok/s"),
    "tpot": ("mean TPOT (ms per output token, lower is better)", 1e3, "{:.2f} ms"),
}


def tpot_column(df: pd.DataFrame) -> str | None:
    """The TPOT a ranking uses: the token-weighted mean when saved, else the median."""
    for c in ("mean_tpot_s", "tpot_p50_s"):
        if c in df.columns and df[c].notna().any():
            return c
    return None


def _has(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


@dataclass
class Answer:
    """Who wins at one operating point, by which measure, by how much, how sure."""

    metric: str  # "goodput", "attainment", "throughput" or "tpot"
    column: str
    winner: str
    value: float
    seeds: int
    spread_pct: float  # the winner's half-range over seeds, % (NaN with one seed)
    runner_up: tuple[str, float] | None
    best_fixed: tuple[str, float] | None
    no_spec: tuple[str, float] | None  # the visible k = 0 row (drafter resident)
    tpot_speedup: float  # the winner's TPOT ratio over k = 0 without a drafter (``speedup``)
    references: dict[str, float]
    why: str  # why the first measure did not decide ("" when it did)
    capped: bool | None  # plain decoding kept up with the arrivals
    slo: Slo | None = None
    primary: str = "goodput"  # the measure that would decide without a tie or a cap
    notes: list[str] = field(default_factory=list)
    attainment: float = np.nan  # the winner's SLO attainment (NaN when not saved)

    @property
    def higher_is_better(self) -> bool:
        return self.metric != "tpot"

    def margin(self, other: float) -> float:
        """The winner's advantage over ``other`` as a ratio (> 1 is better)."""
        if not other or not np.isfinite(other) or not self.value:
            return np.nan
        return self.value / other if self.higher_is_better else other / self.value


def _words(metric: str, x: float) -> str:
    _, scale, fmt = METRIC_WORDS[metric]
    return fmt_num(x * scale, fmt)


def _decide(
    cont: pd.DataFrame, capped: bool | None, tcol: str | None
) -> tuple[str, list[str], str, str]:
    """(measure, candidates, why, first measure) per the module's ranking; candidates are the
    contenders the measure ranks (all of them, or the tied leaders when mean TPOT breaks a tie
    of the first measure)."""
    att = cont["slo_attainment"] if _has(cont, "slo_attainment") else None
    eligible = [n for n in cont.index if att is None or not att[n] < MIN_ATTAINMENT]
    primary = "goodput" if _has(cont, METRIC_COLUMNS["goodput"]) else "throughput"
    measure = primary
    if capped and primary == "goodput" and att is not None:
        measure = "attainment"
        best = att.max()
        tied = [n for n in att.index if att[n] >= best - ATTAINMENT_TIE]
        why = (
            "plain decoding keeps up with the arrivals, so SLO goodput is capped by the offered "
            "load and only measures how fast the last requests drain"
        )
        how = f"{len(tied)} contenders meet both SLOs for {_words('attainment', best)} of requests"
        why_tie = f"{why}; {how} (within {ATTAINMENT_TIE * 100:g} point)"
    elif capped:
        tied = list(cont.index)
        why = why_tie = (
            f"plain decoding keeps up with the arrivals, so {primary.replace('goodput', 'SLO goodput')}"
            " is capped by the offered load and only measures how fast the last requests drain"
        )
    else:
        v = cont[METRIC_COLUMNS[primary]]
        if primary == "throughput":
            v = v[eligible]
        v = v.sort_values(ascending=False)
        tied = [n for n in v.index if v.iloc[0] > 0 and v[n] * (1 + SEPARATION) >= v.iloc[0]]
        why = ""
        why_tie = f"the {METRIC_WORDS[primary][0].split(' (')[0]} leaders are within " + (
            f"{SEPARATION * 100:g}% of each other ("
            + ", ".join(f"{n} {_words(primary, v[n])}" for n in tied[:3])
            + ")"
        )
    tied_ok = [n for n in tied if n in eligible]
    if tcol is not None and tied_ok and (len(tied) > 1 or (capped and primary == "throughput")):
        return "tpot", tied_ok, why_tie, measure
    if measure == "throughput":
        return measure, eligible, "", measure
    return measure, list(cont.index), why if measure == "attainment" else "", measure


def answer(rows: pd.DataFrame, metric: str | None = None, slo: Slo | None = None) -> Answer | None:
    """The winner among the contenders of ``rows`` (one operating point, several seeds), ranked
    as the module says; ``metric`` forces one measure (among the contenders it may rank). None
    when the rows hold no contender, or none that may win by the measure."""
    roles = rows["controller"].map(role)
    if not (roles == CONTENDER).any():
        return None
    mean = rows.groupby("controller").mean(numeric_only=True)
    cont = mean[mean.index.map(role) == CONTENDER]
    capped = kept_up(rows)
    tcol = tpot_column(rows)
    primary = "goodput" if _has(cont, METRIC_COLUMNS["goodput"]) else "throughput"
    first = primary
    if metric is None:
        metric, cands, why, first = _decide(cont, capped, tcol)
    else:
        low = cont["slo_attainment"] < MIN_ATTAINMENT if _has(cont, "slo_attainment") else None
        cands = [
            n
            for n in cont.index
            if metric not in ("tpot", "throughput") or low is None or not low[n]
        ]
        why = ""
    col = tcol if metric == "tpot" else METRIC_COLUMNS[metric]
    if col is None or not cands:
        return None
    order = cont.loc[cands, col].sort_values(ascending=metric == "tpot")
    win = str(order.index[0])
    notes = _notes(cont, cands, metric, first)
    fixed = [n for n in order.index if family(n) == "fixed"]
    base = mean[mean.index.map(role) == NO_SPEC]
    refs = mean[mean.index.map(role) == REFERENCE]
    return Answer(
        metric=metric,
        column=col,
        winner=win,
        value=float(order.iloc[0]),
        seeds=int(rows.loc[rows["controller"] == win, "seed"].nunique()),
        spread_pct=half_range_pct_of_mean(rows.loc[rows["controller"] == win, col]),
        runner_up=(str(order.index[1]), float(order.iloc[1])) if len(order) > 1 else None,
        best_fixed=(fixed[0], float(order[fixed[0]])) if fixed else None,
        no_spec=(str(base.index[0]), float(base[col].iloc[0])) if len(base) else None,
        tpot_speedup=float(cont.loc[win, "speedup"]) if "speedup" in cont.columns else np.nan,
        references={str(n): float(v) for n, v in refs[col].items()},
        why=why,
        capped=capped,
        slo=slo,
        primary=primary,
        notes=notes,
        attainment=float(cont.loc[win, "slo_attainment"])
        if _has(cont, "slo_attainment")
        else np.nan,
    )


def _notes(cont: pd.DataFrame, cands: list[str], metric: str, first: str) -> list[str]:
    """Contenders the measure did not rank, and why: below the attainment floor, or behind the
    tied leaders on the first measure."""
    out = []
    if _has(cont, "slo_attainment"):
        low = cont.index[cont["slo_attainment"] < MIN_ATTAINMENT]
        if len(low) and metric in ("tpot", "throughput"):
            out.append(
                f"below {MIN_ATTAINMENT:.0%} SLO attainment, so never the winner by "
                f"{METRIC_WORDS[metric][0].split(' (')[0]}: "
                + ", ".join(
                    f"{n} ({_words('attainment', cont.loc[n, 'slo_attainment'])})" for n in low
                )
            )
    if metric == "tpot":
        behind = [n for n in cont.index if n not in cands]
        fixed = [n for n in behind if family(n) == "fixed"]
        col = METRIC_COLUMNS[first]
        if fixed and col in cont.columns:
            best = max(fixed, key=lambda n: cont.loc[n, col])
            out.append(
                f"no fixed k is among the tied leaders (the best, {best}, has "
                f"{METRIC_WORDS[first][0].split(' (')[0]} {_words(first, cont.loc[best, col])})"
            )
    return out


def answer_row(scenario: str, where: str, a: Answer) -> dict:
    """The answer at one point as a table row (text cells)."""
    words, scale, fmt = METRIC_WORDS[a.metric]

    def pct(other):
        if other is None:
            return "—"
        return fmt_num((a.margin(other[1]) - 1) * 100, "{:+.1f}%") + f" ({other[0]})"

    return {
        "scenario": scenario,
        "point": where,
        "ranked by": words.split(" (")[0] + (f" ({a.primary} capped)" if a.capped else ""),
        "winner": a.winner,
        "value": fmt_num(a.value * scale, fmt),
        "vs best fixed k": "is a fixed k"
        if a.best_fixed and a.best_fixed[0] == a.winner
        else pct(a.best_fixed),
        "vs runner-up": pct(a.runner_up),
        "vs no speculation": (fmt_num(a.margin(a.no_spec[1]), "{:.2f}×") if a.no_spec else "—"),
        "seeds": f"{a.seeds}"
        + (
            f" (±{fmt_num(a.spread_pct, '{:.1f}')}%)"
            if a.seeds > 1 and np.isfinite(a.spread_pct)
            else ""
        ),
    }


def no_spec_words(name: str) -> str:
    """What a no-speculation row is: ``fixed:k=0`` keeps the drafter resident (loaded, its
    memory taken, never used); other names (``ar``) are plain decoding."""
    return "k = 0, drafter resident" if family(name) == "fixed" else "k = 0"


def _measure_words(a: Answer) -> str:
    """The deciding measure's words with the SLOs inside their parenthesis."""
    words = METRIC_WORDS[a.metric][0]
    if a.slo is not None:
        return f"{words[:-1]}; SLOs {a.slo.words()})"
    if a.metric in ("goodput", "attainment") or a.primary == "goodput":
        return f"{words[:-1]}; SLOs not saved with the run)"
    return words


def answer_sentence(a: Answer) -> str:
    """The measure that decided and the SLOs, the winner and its value, its margin over the
    best fixed k, the runner-up and no speculation, the seed spread; why an earlier measure did
    not decide; who could not win and why; the references apart."""

    def v(x: float) -> str:
        return _words(a.metric, x)

    def pct(ratio: float) -> str:
        return fmt_num((ratio - 1) * 100, "{:+.1f}%")

    def tie(x: float) -> str:
        return " — a tie" if a.margin(x) - 1 < SEPARATION else ""

    parts = [f"by {_measure_words(a)}: **{a.winner}** {v(a.value)}"]
    if a.metric != "attainment" and np.isfinite(a.attainment):
        parts[0] += f" (SLO attainment {_words('attainment', a.attainment)})"
    if a.best_fixed and a.best_fixed[0] != a.winner:
        parts.append(
            f"{pct(a.margin(a.best_fixed[1]))} over the best fixed k "
            f"({a.best_fixed[0]}, {v(a.best_fixed[1])}{tie(a.best_fixed[1])})"
        )
    elif a.best_fixed:
        parts.append("the winner is a fixed k")
    if a.runner_up and (not a.best_fixed or a.runner_up[0] != a.best_fixed[0]):
        parts.append(
            f"{pct(a.margin(a.runner_up[1]))} over the runner-up ({a.runner_up[0]}, "
            f"{v(a.runner_up[1])}{tie(a.runner_up[1])})"
        )
    if a.no_spec:
        parts.append(
            f"{fmt_num(a.margin(a.no_spec[1]), '{:.2f}')}× over no speculation "
            f"({a.no_spec[0]}: {no_spec_words(a.no_spec[0])}, {v(a.no_spec[1])})"
        )
    if a.metric == "tpot" and np.isfinite(a.tpot_speedup):
        parts.append(
            f"TPOT {fmt_num(a.tpot_speedup, '{:.2f}')}× better than k = 0 without a drafter"
        )
    sure = (
        f"spread over {a.seeds} seeds ±{fmt_num(a.spread_pct, '{:.1f}')}%"
        if a.seeds > 1 and np.isfinite(a.spread_pct)
        else "one seed: no spread measured"
    )
    text = "; ".join(parts + a.notes) + f"; {sure}."
    if a.why:
        lead = "the tied leaders are" if a.metric == "tpot" else ""
        first = a.primary.replace("goodput", "SLO goodput")
        text = f"{first[0].upper()}{first[1:]} does not decide here ({a.why}), so " + (
            f"{lead + ' ' if lead else ''}ranked " + text
        )
    else:
        text = "Ranked " + text
    if a.references:
        text += (
            " References (told what no engine knows; not contenders): "
            + ", ".join(f"{n} {v(x)}" for n, x in a.references.items())
            + "."
        )
    return text
