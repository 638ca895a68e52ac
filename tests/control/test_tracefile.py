"""The one trace reader (control.tracefile): units decided from the values or stated, the one
warning of an assumed unit, and the one-line refusals (negative, out of order, implausible
spans) — exact values throughout."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from control.errors import DSparkError
from control.tracefile import MAX_SPAN_S, TraceWarning, read_trace_file

HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _csv(tmp_path, rows: list[str], name: str = "t.csv") -> str:
    p = tmp_path / name
    p.write_text(HEAD + "".join(r + "\n" for r in rows))
    return str(p)


def _read(path: str, unit: str = "auto", sort: bool = False):
    """The trace and the TraceWarnings its reading gave."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tr = read_trace_file(path, unit, sort)
    return tr, [str(w.message) for w in seen if issubclass(w.category, TraceWarning)]


def _refused(path: str, unit: str = "auto", sort: bool = False) -> str:
    with pytest.raises(DSparkError) as e:
        read_trace_file(path, unit, sort)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(path + ": ")
    return msg


def test_numbers_under_auto_are_seconds_with_one_warning(tmp_path):
    p = _csv(tmp_path, ["0.0,10,2", "0.5,11,3", "3537,12,4"])
    tr, warned = _read(p)
    assert tr.arrival_s.tolist() == [0.0, 0.5, 3537.0]
    assert tr.context_tokens.tolist() == [10, 11, 12] and tr.generated_tokens.tolist() == [2, 3, 4]
    assert warned == [
        (
            f"{p}: column 'TIMESTAMP' holds numbers, read as seconds: the trace spans 3537 s "
            "(59 min) over 3 requests; set workload.trace_timestamp_unit = 's', 'ms', 'us' or 'ns' "
            "to state the unit"
        )
    ]


def test_a_stated_unit_reads_without_a_warning(tmp_path):
    ms = _csv(tmp_path, ["0,1,1", "1500,1,1", "3537000,1,1"], "ms.csv")
    tr, warned = _read(ms, "ms")
    assert tr.arrival_s.tolist() == [0.0, 1.5, 3537.0] and warned == []
    ns = _csv(tmp_path, ["1700158546680590000,1,1", "1700158550995169000,1,1"], "ns.csv")
    tr, warned = _read(ns, "ns")
    # epoch nanoseconds: float64 keeps them to 256 ns
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 4.314579], abs=1e-6) and warned == []
    us = _csv(tmp_path, ["5,1,1", "250005,1,1"], "us.csv")
    assert _read(us, "us")[0].arrival_s.tolist() == [0.0, 0.25]


def test_iso_dates_are_dates_and_offsets_are_utc(tmp_path):
    p = _csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16T18:15:50.995169,396,9"])
    tr, warned = _read(p)
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 4.314579], abs=1e-9) and warned == []
    # 10:00+02:00 is 08:00 UTC, one hour before 09:00Z; a date alone is midnight
    q = _csv(
        tmp_path,
        ["2024-01-01 10:00:00+02:00,1,1", "2024-01-01T09:00:00Z,1,1", "2024-01-02+0000,1,1"],
        "tz.csv",
    )
    assert _read(q)[0].arrival_s.tolist() == [0.0, 3600.0, 16 * 3600.0]
    mixed = _csv(tmp_path, ["2024-01-01 10:00:00+02:00,1,1", "2024-01-01 11:00:00,1,1"], "m.csv")
    assert "mixes timezone-aware and naive times (row 2: " in _refused(mixed)


def test_all_at_once_is_a_burst_not_an_error(tmp_path):
    p = _csv(tmp_path, ["2024-01-01 00:00:00,1,1"] * 5)
    assert _read(p)[0].arrival_s.tolist() == [0.0] * 5


@pytest.mark.parametrize(
    "rows, unit, needle",
    [
        (["0,1,1", "-2.5,1,1"], "auto", "column 'TIMESTAMP' = -2.5 at row 3 is negative"),
        (
            ["0,1,1", "2,1,1", "1,1,1"],
            "s",
            (
                "column 'TIMESTAMP' goes back in time at row 4 ('1' after '2'); sort the trace by "
                "time or set workload.trace_sort = true"
            ),
        ),
        (
            ["2024-01-01 00:00:02,1,1", "2024-01-01 00:00:01,1,1"],
            "auto",
            "goes back in time at row 3",
        ),
        (
            # epoch nanoseconds read as seconds: 1.7e18 s
            ["0,1,1", "1700158546680590000,1,1"],
            "auto",
            (
                "column 'TIMESTAMP' spans 1.70016e+18 s (5.39e+10 years) (more than 10 years): not "
                "a plausible trace; read as seconds; set workload.trace_timestamp_unit to the unit "
                "of its numbers (s, ms, us or ns)"
            ),
        ),
        (
            # a 3.5 ms trace in microseconds read as nanoseconds
            ["0,1,1", "1000,1,1", "3500,1,1"],
            "ns",
            (
                "column 'TIMESTAMP' spans 0.0035 ms (under 1 ms for 3 requests): not a plausible "
                "trace; read as nanoseconds"
            ),
        ),
        (
            ["1900-01-01 00:00:00,1,1", "2023-11-16 18:15:46,1,1"],
            "auto",
            "(more than 10 years): not a plausible trace; check its dates",
        ),
        (["0,1,1", "x,1,1"], "ms", "column 'TIMESTAMP' = 'x' at row 3 is not a number"),
        (["0,1,1", "nan,1,1"], "auto", "column 'TIMESTAMP' has a garbled value at row 3: 'nan'"),
        (["11/16/2023 18:15,1,1"], "auto", "has a garbled value at row 2: '11/16/2023 18:15'"),
        (["2023-02-30 00:00:00,1,1"], "auto", "has a garbled value at row 2"),
        (["0,1.5,1"], "s", "column 'ContextTokens' has a garbled value at row 2: '1.5'"),
        (["0,1,inf"], "s", "column 'GeneratedTokens' = inf at row 2 is out of range"),
        (["0,1,1,7"], "s", "row 2 has 4 fields, the header 3"),
    ],
)
def test_misreads_are_one_line_errors(tmp_path, rows, unit, needle):
    assert needle in _refused(_csv(tmp_path, rows), unit)


def test_sort_takes_negative_and_unsorted_times(tmp_path):
    p = _csv(tmp_path, ["2,20,1", "-1,10,1", "0.5,15,1", "0.5,16,1"])
    tr, _ = _read(p, "s", sort=True)
    assert tr.arrival_s.tolist() == [0.0, 1.5, 1.5, 3.0]
    assert tr.context_tokens.tolist() == [10, 15, 16, 20]  # stable among equal times


def test_span_limits_are_exact(tmp_path):
    ok = _csv(tmp_path, ["0,1,1", "0.0005,1,1", "0.001,1,1"], "ok.csv")  # 1 ms: allowed
    assert _read(ok, "s")[0].arrival_s[-1] == 0.001
    two = _csv(tmp_path, ["0,1,1", "0.0001,1,1"], "two.csv")  # two requests: any span
    assert _read(two, "s")[0].arrival_s[-1] == 0.0001
    long = _csv(tmp_path, ["0,1,1", f"{MAX_SPAN_S},1,1"], "long.csv")  # exactly 10 years
    assert _read(long, "s")[0].arrival_s[-1] == MAX_SPAN_S
    over = _csv(tmp_path, ["0,1,1", f"{MAX_SPAN_S * 1.001},1,1"], "over.csv")
    assert "more than 10 years" in _refused(over, "s")


def test_jsonl_numbers_are_milliseconds_and_name_their_fields(tmp_path):
    j = tmp_path / "t.jsonl"
    j.write_text(
        '{"timestamp": 1000, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 2500, "input_length": 7, "output_length": 3, "hash_ids": [1, 2]}\n'
    )
    tr, warned = _read(str(j))
    assert tr.arrival_s.tolist() == [0.0, 1.5] and tr.hash_ids == [(), (1, 2)]
    assert warned and "column 'timestamp' holds numbers, read as milliseconds" in warned[0]
    assert _read(str(j), "s")[0].arrival_s.tolist() == [0.0, 1500.0]
    j.write_text('{"timestamp": true, "input_length": 5, "output_length": 2}\n')
    assert "column 'timestamp' has a garbled value at line 1: 'true'" in _refused(str(j))


def test_the_real_serving_loop_reads_the_same(tmp_path):
    """real.serve reads through the same function: same times, same refusals, its own keys."""
    from real.serve import read_azure_trace
    from sim.workload import read_trace

    p = _csv(tmp_path, ["0,10,2", "1.25,11,3", "4,12,4"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        real = read_azure_trace(p, "ms")
    assert not seen
    for a, b in zip(real, read_trace(p, "ms")):
        assert np.array_equal(a, b)
    assert real[0].tolist() == [0.0, 0.00125, 0.004]
    bad = _csv(tmp_path, ["1,1,1", "0,1,1"], "bad.csv")
    with pytest.raises(DSparkError, match=r"at row 3 \('0' after '1'\).* serve\.trace_sort = true"):
        read_azure_trace(bad, "s")
    assert read_azure_trace(bad, "s", sort=True)[0].tolist() == [0.0, 1.0]
