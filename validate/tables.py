"""The error tables of the validation parts, one home for both runners: the table itself
(``metrics.error_rows``: the prediction against the median of the real repeats, their spread,
the error), the controllers' orders by one metric, simulated and real, and the table as
aligned text."""

from __future__ import annotations

from validate import metrics as M

#: ``errors.csv`` of the batch-1 part: one row per controller x workload x metric
ERROR_COLUMNS = M.error_columns("workload")
#: ``errors_batched.csv`` of the batched part: one row per controller x load x metric
BATCHED_ERROR_COLUMNS = M.error_columns("load", ("rate_rps",))

#: column -> (header, width and alignment, format of a value) of :func:`format_table`
_TEXT = {
    "controller": ("controller", "<14", "<14"),
    "workload": ("workload", "<10", "<10"),
    "load": ("load", "<16", "<16"),
    "rate_rps": ("rate/s", ">7", ">7.3f"),
    "metric": ("metric", "<24", "<24"),
    "sim": ("sim", ">11", ">11.5g"),
    "real": ("real", ">11", ">11.5g"),
    "real_spread": ("spread%", ">8", ">8.2f"),
    "error_pct": ("error%", ">8", ">+8.2f"),
}


def error_table(preds: dict, real: dict, metrics, group: str, extra: dict | None = None):
    """The error table (DataFrame, :func:`metrics.error_columns`) of ``preds[c, g]`` against
    the real repeats ``real[c, g]``; ``extra``: column -> {group value: value}, beside the
    group."""
    import pandas as pd

    extra = extra or {}
    rows = M.error_rows(preds, real, metrics, group)
    for r in rows:
        r.update({name: by[r[group]] for name, by in extra.items()})
    return pd.DataFrame(rows, columns=list(M.error_columns(group, tuple(extra))))


def rank_orders(err, real: dict, group: str, names, metric: str, higher_is_better: bool) -> dict:
    """Per value of ``group`` in ``names``: the controllers ordered by ``metric`` (best first),
    simulated and real, whether the orders agree, each controller's real repeats and the pairs
    those tell apart (``metrics.resolved_pairs``)."""
    ranks = {}
    for g in names:
        rows = err[(err[group] == g) & (err["metric"] == metric)]
        r = {
            "sim_order": rows.sort_values("sim", ascending=not higher_is_better)[
                "controller"
            ].tolist(),
            "real_order": rows.sort_values("real", ascending=not higher_is_better)[
                "controller"
            ].tolist(),
            "real_repeats": M.repeats_of(real, rows["controller"], g, metric),
        }
        r["agree"] = r["sim_order"] == r["real_order"]
        r["told_apart"] = M.told_apart(rows, r["real_repeats"])
        ranks[g] = r
    return ranks


def format_table(err) -> str:
    """An error table as aligned text, one line per row, its columns in the table's order."""
    cols = [c for c in err.columns if c in _TEXT]
    lines = [" ".join(f"{_TEXT[c][0]:{_TEXT[c][1]}}" for c in cols)]
    for r in err[cols].itertuples(index=False):
        lines.append(" ".join(f"{v:{_TEXT[c][2]}}" for c, v in zip(cols, r)))
    return "\n".join(lines)
