"""Speculation metrics, defined once (docs/design.md) for the simulator, the engine and validation.

From per-round counts: ``n`` tokens accepted of ``k`` drafted; a round *ended in a rejection*
when ``n < k``.

- acceptance rate â = Σn / (Σn + rounds that ended in a rejection);
- mean accepted length = 1 + Σn / rounds (the bonus or correction token plus the accepted ones);
- VPR (verified-prefix ratio) = Σn / Σk;
- DU (draft utilization) = accepted drafted tokens that reached the output / Σk.

A quantity with a zero denominator is NaN. :func:`json_safe` turns values (NaN and numpy
scalars included) into what ``json.dumps`` writes as valid JSON.

Two spreads, named for what they divide: :func:`range_pct_of_median` (a validation error's
``real_spread``: the full range of the real repeats over their median) and
:func:`half_range_pct_of_mean` (a report's "± over seeds": half the range over the mean).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

NAN = float("nan")

#: The keys :func:`speculation_metrics` returns (``du`` only when it is given what it needs).
SPECULATION_KEYS = ("mean_accepted_length", "acceptance_rate", "vpr", "du")


def ratio(a: Any, b: Any) -> Any:
    """``a / b``, NaN when ``b`` is 0."""
    return a / b if b else NAN


def mean_accepted_length(accepted: Any, rounds: Any) -> Any:
    """1 + Σn / rounds."""
    return 1.0 + ratio(accepted, rounds)


def acceptance_rate(accepted: Any, rejected_rounds: Any) -> Any:
    """â = Σn / (Σn + rounds that ended in a rejection)."""
    return ratio(accepted, accepted + rejected_rounds)


def speculation_metrics(
    *, rounds: Any, accepted: Any, rejected_rounds: Any, drafted: Any, accepted_emitted: Any = None
) -> dict[str, Any]:
    """Mean accepted length, â, VPR and (given ``accepted_emitted``) DU from totals."""
    out = {
        "mean_accepted_length": mean_accepted_length(accepted, rounds),
        "acceptance_rate": acceptance_rate(accepted, rejected_rounds),
        "vpr": ratio(accepted, drafted),
    }
    if accepted_emitted is not None:
        out["du"] = ratio(accepted_emitted, drafted)
    return out


def round_totals(accepted: Iterable[int], drafted: Iterable[int]) -> dict[str, int]:
    """Totals of per-round (accepted, drafted) pairs: the inputs of :func:`speculation_metrics`."""
    rounds = acc = rej = dr = 0
    for n, k in zip(accepted, drafted):
        rounds += 1
        acc += int(n)
        dr += int(k)
        rej += n < k
    return {"rounds": rounds, "accepted": acc, "rejected_rounds": int(rej), "drafted": dr}


def record_metrics(records: Iterable[Any]) -> dict[str, Any]:
    """Speculation metrics of ``RoundRecord``-like objects (``accepted``, ``drafted``)."""
    recs = list(records)
    return speculation_metrics(
        **round_totals([r.accepted for r in recs], [r.drafted for r in recs])
    )


def range_pct_of_median(values: Any) -> float:
    """Run-to-run spread (max - min) / |median|, in % (NaN when the median is 0)."""
    v = np.asarray(values, dtype=float)
    med = float(np.median(v))
    return float((v.max() - v.min()) / abs(med) * 100.0) if med else NAN


def half_range_pct_of_mean(values: Any) -> float:
    """Spread over seeds: half the range (max - min) / 2 over |mean|, in %, of the values that
    are not NaN (NaN with fewer than two of them or a mean of 0)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) < 2 or v.mean() == 0:
        return NAN
    return float((v.max() - v.min()) / 2 / abs(v.mean()) * 100)


def json_safe(v: Any) -> Any:
    """``v`` with NaN/inf as ``None``, numpy scalars as Python ones, tuples as lists and
    non-string keys as strings, at any depth: what ``json.dumps`` writes as valid JSON."""
    if isinstance(v, dict):
        return {k if isinstance(k, str) else str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, int):
        return int(v)
    item = getattr(v, "item", None)  # a numpy scalar (np.float64, np.int64, np.bool_)
    if item is not None and getattr(v, "shape", None) == ():
        return json_safe(item())
    return v
