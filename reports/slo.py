"""The user's question, from saved files: the SLOs a run was measured against, and capacity at
SLO (docs/design.md, "The user's question: capacity at their SLOs").

Capacity at SLO is the highest load scale at which at least the target share of requests met
both the TTFT and the TPOT SLO (``dspark capacity``; bisection per seed on identical arrivals).
A capacity run's answer ranks the contenders by the median over seeds, quotes the seeds' range,
and counts on how many seeds the winner was ahead: the seeds share their arrivals across
controllers, so a per-seed comparison is paired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from control.errors import DSparkError
from reports.analysis import CONTENDER, NO_SPEC, REFERENCE, fmt_num, role
from reports.loader import Run
from reports.style import family

#: below this SLO attainment at a load a controller cannot win that load by mean TPOT or by
#: throughput: it misses the SLOs for most of its requests.
MIN_ATTAINMENT = 0.5


@dataclass(frozen=True)
class Slo:
    """The SLOs a run was measured against."""

    ttft_s: float
    tpot_s: float

    def words(self) -> str:
        return f"TTFT ≤ {self.ttft_s:g} s and TPOT ≤ {self.tpot_s * 1e3:g} ms"


def slo_of(run: Run) -> Slo | None:
    """The run's SLOs: its summary's ``slo`` object, else its config.toml ``[slo]`` table;
    None when neither is saved. A malformed table is one line naming the file."""
    for src, where in (
        (run.summary.get("slo"), f"{run.path / 'summary.json'}: 'slo'"),
        (run.config.get("slo"), f"{run.path / 'config.toml'}: [slo]"),
    ):
        if src is None:
            continue
        try:
            t, p = float(src["ttft_s"]), float(src["tpot_s"])
        except (KeyError, TypeError, ValueError):
            raise DSparkError(
                f"{where}: expected numbers ttft_s and tpot_s (got {src!r})"
            ) from None
        if not (math.isfinite(t) and math.isfinite(p) and t > 0 and p > 0):
            raise DSparkError(f"{where}: ttft_s and tpot_s must be > 0 (got {t:g}, {p:g})")
        return Slo(t, p)
    return None


def attainment_target(run: Run) -> float:
    """The attainment a capacity run searched for (its summary's ``search.attainment``)."""
    search = run.summary.get("search") or {}
    try:
        x = float(search.get("attainment", 0.9))
    except (TypeError, ValueError):
        x = math.nan
    if not 0.0 < x <= 1.0:
        raise DSparkError(
            f"{run.path / 'summary.json'}: search.attainment must be in (0, 1] "
            f"(got {search.get('attainment')!r})"
        )
    return x


def capacity_question(run: Run) -> str:
    """What the capacity of this run means, in words (target share and SLOs)."""
    slo = slo_of(run)
    return f"the highest load scale at which ≥ {attainment_target(run):.0%} of requests meet " + (
        slo.words() if slo else "both SLOs"
    )


@dataclass
class CapacityAnswer:
    """The winner of a capacity run: median capacity over seeds, its range, the paired count."""

    winner: str
    median: float
    low: float
    high: float
    rps: float
    seeds: int
    runner_up: tuple[str, float] | None
    best_fixed: tuple[str, float] | None
    no_spec: tuple[str, float] | None
    references: dict[str, float]
    ahead: dict[str, tuple[int, int]]  # other contender -> (seeds the winner is ahead, seeds)
    overlaps: dict[str, bool]  # other contender -> do the seed ranges overlap
    not_crossed: list[str]  # contenders whose search never crossed the target


def capacity_answer(run: Run) -> CapacityAnswer | None:
    """Rank a capacity run's contenders by median capacity at SLO (references and the
    no-speculation row are quoted, never ranked). None when no contender crossed the target."""
    rows = run.tables["capacity"].set_index("controller")
    cap = pd.to_numeric(rows["capacity_load_scale"], errors="coerce")
    roles = pd.Series(rows.index.map(role), index=rows.index)
    cont = cap[(roles == CONTENDER) & cap.notna()].sort_values(ascending=False)
    if cont.empty:
        return None
    win = str(cont.index[0])
    per_seed = run.tables["capacity_seeds"].pivot_table(
        index="seed", columns="controller", values="capacity_load_scale", aggfunc="first"
    )

    def col(name: str, default: float = math.nan) -> float:
        return float(rows.loc[win, name]) if name in rows.columns else default

    ahead, overlaps = {}, {}
    for other in cont.index[1:]:
        if win in per_seed.columns and other in per_seed.columns:
            pair = per_seed[[win, other]].dropna()
            ahead[str(other)] = (int((pair[win] > pair[other]).sum()), len(pair))
        if {"capacity_min", "capacity_max"} <= set(rows.columns):
            overlaps[str(other)] = bool(rows.loc[other, "capacity_max"] >= col("capacity_min"))
    fixed = [n for n in cont.index if family(n) == "fixed"]
    base = cap[(roles == NO_SPEC) & cap.notna()]
    return CapacityAnswer(
        winner=win,
        median=float(cont.iloc[0]),
        low=col("capacity_min"),
        high=col("capacity_max"),
        rps=col("capacity_rps"),
        seeds=int(col("seeds", float(per_seed[win].notna().sum()))),
        runner_up=(str(cont.index[1]), float(cont.iloc[1])) if len(cont) > 1 else None,
        best_fixed=(str(fixed[0]), float(cont[fixed[0]])) if fixed else None,
        no_spec=(str(base.index[0]), float(base.iloc[0])) if len(base) else None,
        references={str(n): float(v) for n, v in cap[roles == REFERENCE].items()},
        ahead=ahead,
        overlaps=overlaps,
        not_crossed=[str(n) for n in cap.index[(roles == CONTENDER) & cap.isna()]],
    )


def _pct(a: CapacityAnswer, other: float) -> str:
    return fmt_num((a.median / other - 1) * 100 if other else np.nan, "{:+.1f}%")


def _vs(a: CapacityAnswer, other: tuple[str, float], label: str) -> str:
    """The margin over one other contender, with the paired seed count and the overlap."""
    name, v = other
    text = f"{_pct(a, v)} over {label} ({name}, {fmt_num(v, '{:.3g}')}"
    if name in a.ahead:
        k, n = a.ahead[name]
        text += f"; ahead on {k} of {n} seed{'s' if n != 1 else ''}"
    if a.overlaps.get(name):
        text += "; the seeds' ranges overlap"
    return text + ")"


def capacity_sentence(run: Run, a: CapacityAnswer) -> str:
    """One paragraph: the measure and the SLOs, the winner with its range, its margins."""
    parts = [
        f"Ranked by capacity at SLO ({capacity_question(run)}; median over {a.seeds} "
        f"seed{'s' if a.seeds != 1 else ''}, higher is better): **{a.winner}** "
        f"{fmt_num(a.median, '{:.3g}')}× the scenario's load (seeds "
        f"{fmt_num(a.low, '{:.3g}')}–{fmt_num(a.high, '{:.3g}')}"
        + (f", {fmt_num(a.rps, '{:.3g}')} requests/s" if np.isfinite(a.rps) else "")
        + ")"
    ]
    if a.best_fixed and a.best_fixed[0] != a.winner:
        parts.append(_vs(a, a.best_fixed, "the best fixed k"))
    elif a.best_fixed:
        parts.append("the winner is a fixed k")
    if a.runner_up and (not a.best_fixed or a.runner_up[0] != a.best_fixed[0]):
        parts.append(_vs(a, a.runner_up, "the runner-up"))
    if a.no_spec:
        parts.append(
            f"{fmt_num(a.median / a.no_spec[1], '{:.2f}')}× no speculation "
            f"({a.no_spec[0]}, {fmt_num(a.no_spec[1], '{:.3g}')})"
        )
    text = "; ".join(parts) + "."
    if a.seeds < 2:
        text += " One seed: no spread measured."
    if a.not_crossed:
        text += f" No capacity in the range searched: {', '.join(a.not_crossed)}."
    if a.references:
        text += (
            " References (told what no engine knows; not contenders): "
            + ", ".join(f"{n} {fmt_num(v, '{:.3g}')}" for n, v in a.references.items())
            + "."
        )
    return text


def capacity_row(run: Run, a: CapacityAnswer) -> dict:
    """The capacity answer as a row of the answer table (text cells)."""
    target = attainment_target(run)

    def vs(other: tuple[str, float] | None) -> str:
        return "—" if other is None else f"{_pct(a, other[1])} ({other[0]})"

    return {
        "scenario": str(run.summary.get("scenario") or run.name),
        "point": f"capacity at ≥ {target:.0%} SLO attainment",
        "ranked by": "capacity at SLO (load scale)",
        "winner": a.winner,
        "value": f"{fmt_num(a.median, '{:.3g}')} ({fmt_num(a.low, '{:.3g}')}–"
        f"{fmt_num(a.high, '{:.3g}')})",
        "vs best fixed k": "is a fixed k"
        if a.best_fixed and a.best_fixed[0] == a.winner
        else vs(a.best_fixed),
        "vs runner-up": vs(a.runner_up),
        "vs no speculation": fmt_num(a.median / a.no_spec[1], "{:.2f}×") if a.no_spec else "—",
        "seeds": str(a.seeds),
    }


def capacity_table(run: Run) -> pd.DataFrame:
    """Per controller: role, median capacity, range, spread, requests/s (numbers)."""
    t = run.tables["capacity"].copy()
    t.insert(1, "role", t["controller"].map(role))
    order = {CONTENDER: 0, NO_SPEC: 1, REFERENCE: 2}
    t["_o"] = t["role"].map(order)
    t = t.sort_values(["_o", "capacity_load_scale"], ascending=[True, False])
    return t.drop(columns="_o").reset_index(drop=True)


def format_capacity(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`capacity_table` with text cells and units."""
    out = pd.DataFrame({"controller": t["controller"].astype(str), "role": t["role"]})
    out["seeds"] = [fmt_num(v, "{:.0f}") for v in t.get("seeds", pd.Series(np.nan, t.index))]
    out["capacity (load scale, median)"] = [fmt_num(v, "{:.3g}") for v in t["capacity_load_scale"]]
    for c, head, f in (
        ("capacity_min", "lowest seed", "{:.3g}"),
        ("capacity_max", "highest seed", "{:.3g}"),
        ("capacity_spread", "spread (range ÷ median, %)", "{:.1f}"),
        ("capacity_rps", "capacity (requests/s)", "{:.3g}"),
    ):
        if c in t.columns:
            scale = 100.0 if c == "capacity_spread" else 1.0
            out[head] = [fmt_num(v * scale, f) for v in t[c]]
    return out
