"""Trace formats: Azure CSV with datetimes (as before), numeric timestamps with a stated unit,
and the JSONL records of public long-context traces (timestamp in ms)."""

from __future__ import annotations

import numpy as np
import pytest

from control.errors import DSparkError
from sim.workload import read_trace


def test_jsonl_in_ms_equals_a_csv_in_seconds(tmp_path):
    j = tmp_path / "t.jsonl"
    j.write_text(
        '{"timestamp": 2500, "input_length": 7, "output_length": 3, "hash_ids": [1, 2]}\n'
        '\n{"timestamp": 1000, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 4000, "input_length": 9, "output_length": 1}\n'
    )
    c = tmp_path / "t.csv"
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2.5,7,3\n1,5,2\n4,9,1\n")
    tj, cj, gj = read_trace(str(j), sort=True)
    tc, cc, gc = read_trace(str(c), "s", sort=True)
    assert tj.tolist() == pytest.approx([0.0, 1.5, 3.0]) and cj.tolist() == [5, 7, 9]
    assert np.array_equal(tj, tc) and np.array_equal(cj, cc) and np.array_equal(gj, gc)
    tu, _, _ = read_trace(str(c), "ms", sort=True)  # the same numbers read as milliseconds
    assert tu.tolist() == pytest.approx([0.0, 0.0015, 0.003])


def test_datetime_text_still_reads_and_units_need_numbers(tmp_path):
    c = tmp_path / "d.csv"
    c.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    t, _, _ = read_trace(str(c))
    assert t.tolist() == pytest.approx([0.0, 4.314579])
    with pytest.raises(DSparkError, match="trace_timestamp_unit = 's' needs numbers"):
        read_trace(str(c), "s")


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"timestamp": 1, "input_length": 2}\n', "line 1 has no 'output_length'"),
        (
            '{"timestamp": 1, "input_length": 2, "output_length": 3}\nnot json\n',
            "line 2 is not a JSON record",
        ),
        (
            '{"timestamp": 1, "input_length": -2, "output_length": 3}\n',
            "column 'input_length' has a garbled value at line 1: '-2'",
        ),
    ],
)
def test_bad_jsonl_is_one_line(tmp_path, body, message):
    j = tmp_path / "bad.jsonl"
    j.write_text(body)
    with pytest.raises(DSparkError, match=message) as e:
        read_trace(str(j))
    assert "\n" not in str(e.value)


def test_trace_start_replays_a_later_window_from_t_0(tmp_path):
    from sim.workload import WorkloadConfig, generate

    c = tmp_path / "t.csv"
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1.5,7,3\n4,9,1\n4.5,6,8\n")
    streams = {k: np.random.default_rng(0) for k in ("arrivals", "lengths")}
    base = dict(arrival="trace", trace_path=str(c), trace_timestamp_unit="s", time_scale=2.0)
    r = generate(WorkloadConfig(**base, trace_start=1, num_requests=2), streams, load_scale=4.0)
    # requests 1 and 2 of the trace, their gap 2.5 s times 2 / 4
    assert r.arrival_s.tolist() == [0.0, 1.25]
    assert r.prompt_tokens.tolist() == [7, 9] and r.output_tokens.tolist() == [3, 1]
    with pytest.raises(DSparkError, match=r"workload.trace_start = 4: the trace .* only 4"):
        generate(WorkloadConfig(**base, trace_start=4), streams)
