"""Request traces: the one reader of arrival times and lengths, for the simulator and the real
serving loop alike (standard library and numpy only, so both may import it).

Formats:

- Azure CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Patel et al., "Splitwise", ISCA 2024);
- JSONL, one record a line: ``timestamp``, ``input_length``, ``output_length``, optional
  ``hash_ids`` (the form public long-context traces use; their timestamps are milliseconds).

Timestamps, by ``unit``:

- ``auto`` decides from the values. ISO 8601 date-times (``2023-11-16 18:15:46.68``, optional
  ``T``, fraction and UTC offset: every value with an offset or none) are dates. Numbers are read
  in the format's unit (CSV: seconds; JSONL: milliseconds), with one :class:`TraceWarning` that
  names the unit assumed, the span it implies and the key that states it.
- ``s`` / ``ms`` / ``us`` / ``ns``: numbers in that unit (anything else is an error).

Every reading is then checked, each failure one line naming the file, column and row:

- a span above :data:`MAX_SPAN_S` (10 years), or one above 0 and below :data:`MIN_SPAN_S`
  (1 ms) over more than two requests, is not a plausible trace (requests that all arrive at
  once share one timestamp: span 0 is allowed);
- a negative number, or a time before the previous row's, is an error unless ``sort`` is set
  (then the rows are sorted by time, stably, and the first is t = 0);
- token counts are integers in ``[0, MAX_TRACE_TOKENS]``.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import warnings
from typing import NamedTuple

import numpy as np

from control.errors import DSparkError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_FIELDS = ("timestamp", "input_length", "output_length")
#: the largest token count a trace row may hold (LengthConfig's max_tokens bound).
MAX_TRACE_TOKENS = 10_000_000
#: seconds per unit of a numeric timestamp
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
UNIT_CHOICES = ("auto", *UNITS)
#: a trace spanning more than 10 years is a misread unit, not a trace.
MAX_SPAN_S = 10 * 365.25 * 86400.0
#: more than two requests within a span above 0 and below 1 ms is a misread unit.
MIN_SPAN_S = 1e-3

_ISO = re.compile(
    r"(\d{4}-\d\d-\d\d)(?:[T ](\d\d:\d\d(?::\d\d)?)(\.\d+)?)?\s*(Z|[+-]\d\d:?\d\d)?",
    re.IGNORECASE,
)


class TraceWarning(UserWarning):
    """A trace read with an assumed unit (``dspark`` prints ``dspark: warning: ...``)."""


class Trace(NamedTuple):
    """A trace sorted by time: arrival seconds from the first request, context tokens,
    generated tokens and, for a JSONL trace with ``hash_ids``, each request's ids (else None)."""

    arrival_s: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray
    hash_ids: list[tuple[int, ...]] | None


class _Raw(NamedTuple):
    """A trace file's text fields: the three columns (file order), each row's line number, and
    the hash ids (JSONL)."""

    columns: tuple[list[str], list[str], list[str]]
    lines: list[int]
    hashes: list[tuple[int, ...]] | None
    jsonl: bool


def read_trace_file(
    path: str, unit: str = "auto", sort: bool = False, prefix: str = "workload."
) -> Trace:
    """The trace at ``path`` (see the module doc); ``prefix`` is the config section whose
    ``trace_timestamp_unit`` and ``trace_sort`` keys the messages name."""
    if unit not in UNIT_CHOICES:
        raise DSparkError(
            f"{prefix}trace_timestamp_unit = {unit!r} is unknown; allowed: "
            + ", ".join(UNIT_CHOICES)
        )
    try:
        st = os.stat(path)
    except OSError:
        raise DSparkError(f"{path}: trace file not found") from None
    return _read_cached(str(path), st.st_mtime_ns, st.st_size, unit, bool(sort), prefix)


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int, unit: str, sort: bool, prefix: str) -> Trace:
    raw = _read_jsonl(path) if path.endswith(".jsonl") else _read_csv(path)
    n = len(raw.lines)
    if n == 0:
        what = "no records" if raw.jsonl else "no requests (only a header); need at least one row"
        raise DSparkError(f"{path}: trace has {what}")
    names = JSONL_FIELDS if raw.jsonl else AZURE_COLUMNS
    where = _Where(path, raw.lines, "line" if raw.jsonl else "row", prefix)
    ctx, gen = (_tokens(raw.columns[i], names[i], where) for i in (1, 2))
    t = _times(raw.columns[0], names[0], where, unit, raw.jsonl, sort)
    order = np.argsort(t, kind="stable") if sort else np.arange(n)
    t = t[order] - t.min()
    hashes = [raw.hashes[j] for j in order] if raw.hashes is not None else None
    return Trace(t, ctx[order], gen[order], hashes)


class _Where:
    """Names rows and config keys in messages."""

    def __init__(self, path: str, lines: list[int], label: str, prefix: str) -> None:
        self.path, self.lines, self.label = path, lines, label
        self.unit_key, self.sort_key = f"{prefix}trace_timestamp_unit", f"{prefix}trace_sort"

    def row(self, i: int) -> str:
        return f"{self.label} {self.lines[i]}"


def _read_csv(path: str) -> _Raw:
    """The CSV's three columns as text; a row with more fields than the header is an error."""
    cols: tuple[list[str], list[str], list[str]] = ([], [], [])
    lines: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header: list[str] = []
            for rec in reader:  # the first line that is not blank
                header = [h.strip() for h in rec]
                if any(header):
                    break
            if not any(header):
                raise DSparkError(f"{path}: cannot read trace: the file is empty")
            missing = [c for c in AZURE_COLUMNS if c not in header]
            if missing:
                raise DSparkError(
                    f"{path}: trace lacks column '{missing[0]}' (need {', '.join(AZURE_COLUMNS)})"
                )
            idx = [header.index(c) for c in AZURE_COLUMNS]
            for rec in reader:
                if not any(x.strip() for x in rec):
                    continue  # a blank line
                if len(rec) > len(header):
                    raise DSparkError(
                        f"{path}: row {reader.line_num} has {len(rec)} fields, the header "
                        f"{len(header)}"
                    )
                for col, j in zip(cols, idx):
                    col.append(rec[j] if j < len(rec) else "")
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DSparkError(f"{path}: cannot read trace: {_first_line(e)}") from None
    return _Raw(cols, lines, None, False)


def _read_jsonl(path: str) -> _Raw:
    """A JSONL trace's three fields as text, and the records' hash ids (None when no record has
    any)."""
    cols: tuple[list[str], list[str], list[str]] = ([], [], [])
    lines: list[int] = []
    hashes: list[tuple[int, ...]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    values = [rec[k] for k in JSONL_FIELDS]
                except (ValueError, TypeError) as e:
                    raise DSparkError(
                        f"{path}: line {line_no} is not a JSON record: {_first_line(e)}"
                    ) from None
                except KeyError as e:
                    raise DSparkError(
                        f"{path}: line {line_no} has no {e}; a record needs "
                        + ", ".join(JSONL_FIELDS[:-1])
                        + f" and {JSONL_FIELDS[-1]}"
                    ) from None
                for col, v in zip(cols, values):
                    col.append(_json_text(v))
                lines.append(line_no)
                hashes.append(_hash_ids(rec, path, line_no))
    except (OSError, UnicodeDecodeError) as e:
        raise DSparkError(f"{path}: cannot read trace: {_first_line(e)}") from None
    return _Raw(cols, lines, hashes if any(hashes) else None, True)


def _json_text(v: object) -> str:
    """A JSON value as the text a CSV field would hold (a bool or null is no number)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    return str(v)


def _hash_ids(rec: dict, path: str, line_no: int) -> tuple[int, ...]:
    """A record's ``hash_ids`` (one id per block of prompt tokens; () when it has none)."""
    h = rec.get("hash_ids", [])
    if not isinstance(h, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in h
    ):
        raise DSparkError(f"{path}: line {line_no}: hash_ids must be a list of integers")
    return tuple(h)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _floats(values: list[str]) -> tuple[np.ndarray, int | None]:
    """The values as floats, and the index of the first that is no number (None: all are)."""
    try:
        return np.asarray([float(v) for v in values], dtype=np.float64), None
    except ValueError:
        pass
    for i, v in enumerate(values):
        try:
            float(v)
        except ValueError:
            return np.empty(0), i
    raise AssertionError("unreachable")  # pragma: no cover


def _tokens(values: list[str], name: str, where: _Where) -> np.ndarray:
    """A token column: integers in ``[0, MAX_TRACE_TOKENS]``."""
    v, bad = _floats(values)
    if bad is None:
        wrong = ~np.isfinite(v) | (v < 0) | (v != np.round(v))
        wrong &= ~(v == np.inf)  # infinity: out of range, below
        bad = int(np.flatnonzero(wrong)[0]) if wrong.any() else None
    if bad is not None:
        raise DSparkError(
            f"{where.path}: column '{name}' has a garbled value at {where.row(bad)}: "
            f"{values[bad]!r}"
        )
    big = v > MAX_TRACE_TOKENS
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise DSparkError(
            f"{where.path}: column '{name}' = {values[i].strip()} at {where.row(i)} is out "
            f"of range; allowed 0 to {MAX_TRACE_TOKENS} tokens"
        )
    return v.astype(np.int64)


def _times(
    values: list[str], name: str, where: _Where, unit: str, jsonl: bool, sort: bool
) -> np.ndarray:
    """The timestamps as seconds (file order; any origin), checked (see the module doc)."""
    v, bad = _floats(values)
    if unit != "auto" and bad is not None:
        raise DSparkError(
            f"{where.path}: column '{name}' = {values[bad]!r} at {where.row(bad)} is not a "
            f"number; {where.unit_key} = '{unit}' needs numbers"
        )
    numeric = bad is None
    if numeric:
        wrong = ~np.isfinite(v)
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise DSparkError(
                f"{where.path}: column '{name}' has a garbled value at {where.row(i)}: "
                f"{values[i]!r}"
            )
        read_as = unit if unit != "auto" else ("ms" if jsonl else "s")
        t = (v - v.min()) * UNITS[read_as]  # from the earliest, in the unit: no rounding
        neg = v < 0
        if neg.any() and not sort:
            i = int(np.flatnonzero(neg)[0])
            raise DSparkError(
                f"{where.path}: column '{name}' = {values[i].strip()} at {where.row(i)} is "
                f"negative; times count from the trace's start (set {where.sort_key} = true to "
                "sort the rows and start at the earliest)"
            )
    else:
        t, read_as = _dates(values, name, where), "dates"
    _check_order(t, values, name, where, sort)
    span = float(t.max() - t.min())
    _check_span(span, len(t), name, where, read_as)
    if numeric and unit == "auto":
        warnings.warn(
            f"{where.path}: column '{name}' holds numbers, read as {_UNIT_NAMES[read_as]}: the "
            f"trace spans {_human(span)} over {len(t)} request{'s' if len(t) != 1 else ''}; "
            f"set {where.unit_key} = 's', 'ms', 'us' or 'ns' to state the unit",
            TraceWarning,
            stacklevel=4,
        )
    return t


_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def _check_order(t: np.ndarray, values: list[str], name: str, where: _Where, sort: bool) -> None:
    """No row before the previous one, unless ``sort``."""
    if sort or len(t) < 2:
        return
    back = np.diff(t) < 0
    if back.any():
        i = int(np.flatnonzero(back)[0]) + 1
        raise DSparkError(
            f"{where.path}: column '{name}' goes back in time at {where.row(i)} "
            f"({values[i].strip()!r} after {values[i - 1].strip()!r}); sort the trace by time "
            f"or set {where.sort_key} = true"
        )


def _check_span(span: float, n: int, name: str, where: _Where, read_as: str) -> None:
    """A plausible span: at most 10 years; 0 or at least 1 ms when more than two requests."""
    too_long = span > MAX_SPAN_S
    too_short = 0 < span < MIN_SPAN_S and n > 2
    if not (too_long or too_short):
        return
    limit = "more than 10 years" if too_long else f"under 1 ms for {n} requests"
    if read_as == "dates":
        fix = "check its dates"
    else:
        fix = (
            f"read as {_UNIT_NAMES[read_as]}; set {where.unit_key} to the unit of its numbers "
            "(s, ms, us or ns)"
        )
    raise DSparkError(
        f"{where.path}: column '{name}' spans {_human(span)} ({limit}): not a plausible "
        f"trace; {fix}"
    )


def _human(span_s: float) -> str:
    """A span in seconds, with a larger unit beside it when one reads better."""
    if span_s < 1:
        return f"{span_s * 1e3:.4g} ms" if span_s > 0 else "0 s"
    text = f"{span_s:.6g} s"
    for size, label in ((365.25 * 86400, "years"), (86400, "days"), (3600, "h"), (60, "min")):
        if span_s >= 2 * size:
            return f"{text} ({span_s / size:.3g} {label})"
    return text


def _dates(values: list[str], name: str, where: _Where) -> np.ndarray:
    """ISO 8601 date-times as seconds since 1970 (UTC when they carry offsets)."""
    parts = []
    for i, v in enumerate(values):
        m = _ISO.fullmatch(v.strip())
        if m is None:
            raise DSparkError(
                f"{where.path}: column '{name}' has a garbled value at {where.row(i)}: {v!r} "
                f"(need ISO 8601 date-times, e.g. 2023-11-16 18:15:46.68, or numbers: see "
                f"{where.unit_key})"
            )
        parts.append(m.groups())
    aware = np.array([p[3] is not None for p in parts])
    if aware.any() and not aware.all():
        i = int(np.flatnonzero(aware != aware[0])[0])
        raise DSparkError(
            f"{where.path}: column '{name}' mixes timezone-aware and naive times "
            f"({where.row(0)}: {values[0].strip()!r}, {where.row(i)}: {values[i].strip()!r}); "
            "give every time a UTC offset or none"
        )
    text = [d if hm is None else f"{d}T{hm}" for d, hm, _, _ in parts]
    try:
        whole = np.array(text, dtype="datetime64[s]")
    except ValueError:
        for i, x in enumerate(text):
            try:
                np.datetime64(x, "s")
            except ValueError as e:
                raise DSparkError(
                    f"{where.path}: column '{name}' has a garbled value at {where.row(i)}: "
                    f"{values[i]!r} ({_first_line(e)})"
                ) from None
        raise  # pragma: no cover
    sec = whole.astype(np.int64)
    t = (sec - sec.min()).astype(np.float64)
    t += np.array([float(f) if f else 0.0 for _, _, f, _ in parts])
    if aware.any():
        t -= np.array([_offset_s(p[3]) for p in parts])
    return t


def _offset_s(tz: str) -> float:
    """A UTC offset (``Z``, ``+05:30``, ``-0800``) in seconds."""
    if tz.upper() == "Z":
        return 0.0
    sign = -1.0 if tz[0] == "-" else 1.0
    digits = tz[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
