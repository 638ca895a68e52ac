"""Generators of the fuzz cases of issue 39's input surfaces (tests/dspark/test_fuzz_inputs.py):
trace timestamps, [slo] tables, horizons, capacity searches, peer controller tables, export,
Prometheus scrapes and SGLang server info, and sweep specs (``--workers`` / ``--storage``).

Each generator takes a seeded ``random.Random`` and the case's folder, writes its files there and
returns ``(argv, expect, needle)``: ``expect`` is ``"bad"`` (one ``dspark: error:`` line, exit
2), ``"ok"`` (exit 0), ``"warn"`` (exit 0 and a ``dspark: warning:`` line holding ``needle``) or
``"any"`` (either, but never a traceback or a hang); ``needle``, when given for a bad case, must
be in the error line.
"""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[2]
TRACE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
Case = tuple[list[str], str, str]


def tiny(requests: int = 6) -> dict:
    data = tomllib.loads((ROOT / "configs" / "tiny.toml").read_text())
    data["workload"]["num_requests"] = requests
    return data


def _write(d: Path, data: dict, name: str = "s.toml") -> str:
    (d / name).write_text(tomli_w.dumps(data))
    return name


def _simulate(name: str = "s.toml", *extra: str) -> list[str]:
    return ["simulate", name, "--no-out", "--quiet", "--controller", "fixed", *extra]


# ---- trace timestamps ----------------------------------------------------------------------


def _rows(times: list[str], rng: random.Random) -> list[str]:
    return [f"{t},{rng.randint(10, 400)},{rng.randint(2, 40)}" for t in times]


def _iso(seconds: list[float], base: str = "2023-11-16 18:15:") -> list[str]:
    return [f"{base}{10 + s:09.6f}" for s in seconds]


def trace_case(rng: random.Random, d: Path) -> Case:
    """A trace whose timestamps are numbers in some unit, dates, or broken; the unit and sort
    options set or not."""
    secs = sorted(round(rng.uniform(0, 20), 3) for _ in range(rng.randint(3, 8)))
    secs[0] = 0.0
    kind = rng.choice(
        [
            "seconds",
            "seconds-unit",
            "ms-unit",
            "ns-unit",
            "ns-as-seconds",
            "epoch-seconds",
            "negative",
            "negative-sorted",
            "unsorted",
            "unsorted-sorted",
            "sub-ms",
            "burst",
            "iso",
            "iso-unsorted",
            "iso-tz-mixed",
            "iso-decades",
            "garbage",
            "unit-with-dates",
            "jsonl",
            "jsonl-unsorted",
            "jsonl-bool",
            "bad-unit",
            "bad-sort",
        ]
    )
    workload: dict = {"arrival": "trace", "trace_path": "t.csv"}
    expect, needle = "ok", ""
    times = [f"{s:g}" for s in secs]
    if kind == "seconds":
        expect, needle = "warn", "read as seconds"
    elif kind == "seconds-unit":
        workload["trace_timestamp_unit"] = "s"
    elif kind == "ms-unit":
        times = [f"{s * 1000:.0f}" for s in secs]
        workload["trace_timestamp_unit"] = "ms"
    elif kind == "ns-unit":
        times = [str(1_700_000_000_000_000_000 + round(s * 1e9)) for s in secs]
        workload["trace_timestamp_unit"] = "ns"
    elif kind == "ns-as-seconds":
        times = [str(1_700_000_000_000_000_000 + round(s * 1e9)) for s in secs]
        expect, needle = "bad", "more than 10 years"
    elif kind == "epoch-seconds":
        times = [f"{1_700_000_000 + s:.3f}" for s in secs]
        expect, needle = "warn", "read as seconds"
    elif kind in ("negative", "negative-sorted"):
        times = [f"{s - 5:g}" for s in secs]
        if kind == "negative":
            expect, needle = "bad", "is negative"
        else:
            workload["trace_sort"] = True
            expect, needle = "warn", "read as seconds"
    elif kind in ("unsorted", "unsorted-sorted"):
        times = times[1:] + times[:1] if len(set(times)) > 1 else ["5", *times]
        workload["trace_timestamp_unit"] = "s"
        if kind == "unsorted":
            expect, needle = "bad", "goes back in time"
        else:
            workload["trace_sort"] = True
    elif kind == "sub-ms":
        times = ["0", "0.0001", "0.0002", *(f"0.000{3 + i}" for i in range(rng.randint(0, 3)))]
        workload["trace_timestamp_unit"] = rng.choice(["s", "auto"])
        expect, needle = "bad", "under 1 ms"
    elif kind == "burst":
        times = ["2024-01-01 00:00:00"] * len(secs)
    elif kind == "iso":
        times = _iso(secs)
    elif kind == "iso-unsorted":
        times = list(reversed(_iso(secs)))
        sort = rng.random() < 0.5
        workload["trace_sort"] = sort
        expect, needle = ("ok", "") if sort else ("bad", "goes back in time")
    elif kind == "iso-tz-mixed":
        times = _iso(secs)
        times[0] += "+00:00"
        expect, needle = "bad", "mixes timezone-aware and naive"
    elif kind == "iso-decades":
        times = ["1990-01-01 00:00:00", *(_iso(secs[1:]))]
        expect, needle = "bad", "more than 10 years"
    elif kind == "garbage":
        times[rng.randrange(len(times))] = rng.choice(
            ["yesterday", "", "1e", "0x10", "NaN", "inf", "11/16/2023 18:15", "2023-02-30"]
        )
        expect, needle = "bad", "column 'TIMESTAMP'"
    elif kind == "unit-with-dates":
        times = _iso(secs)
        workload["trace_timestamp_unit"] = rng.choice(["s", "ms", "ns"])
        expect, needle = "bad", "needs numbers"
    elif kind.startswith("jsonl"):
        stamps: list = [round(s * 1000) for s in secs]
        if kind == "jsonl-unsorted":
            stamps = stamps[::-1]
            expect, needle = "bad", "goes back in time"
        elif kind == "jsonl-bool":
            stamps[-1] = True
            expect, needle = "bad", "column 'timestamp' has a garbled value"
        else:
            expect, needle = "warn", "read as milliseconds"
        lines = [
            json.dumps({"timestamp": t, "input_length": 50, "output_length": 8}) for t in stamps
        ]
        (d / "t.jsonl").write_text("\n".join(lines) + "\n")
        workload["trace_path"] = "t.jsonl"
    elif kind == "bad-unit":
        workload["trace_timestamp_unit"] = rng.choice(["min", "seconds", "", 1])
        expect, needle = "bad", "trace_timestamp_unit"
    else:  # bad-sort
        workload["trace_sort"] = rng.choice(["yes", 1, [True]])
        expect, needle = "bad", "trace_sort"
    if not kind.startswith("jsonl"):
        (d / "t.csv").write_text("\n".join([TRACE_HEAD, *_rows(times, rng)]) + "\n")
    data = tiny()
    data["workload"].update(workload)
    return _simulate(_write(d, data)), expect, needle


# ---- [slo] tables and horizons ---------------------------------------------------------------

SLO_VALUES = [0, -1, -0.5, 0.0, 1e-9, float("nan"), float("inf"), "x", [], True, 0.5, 2.0, 1e-3]


def _slo_value_ok(v: object) -> bool | None:
    """True: a valid SLO; False: refused; None: either (inf)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if v != v or v < 1e-6:
        return False
    return None if v == float("inf") else True


def slo_case(rng: random.Random, d: Path) -> Case:
    data = tiny()
    slo = data["slo"]
    ok: bool | None = True
    for key in rng.sample(["ttft_s", "tpot_s"], rng.randint(1, 2)):
        v = rng.choice(SLO_VALUES)
        slo[key] = v
        good = _slo_value_ok(v)
        ok = False if good is False or ok is False else (None if good is None else ok)
    if rng.random() < 0.15:
        slo["ttft"] = 1.0  # a misspelled key
        ok = False
    if rng.random() < 0.1:
        data["slo"] = rng.choice([3, "x", [1]])
        ok = False
    try:
        name = _write(d, data)
    except (TypeError, ValueError):  # tomli_w cannot write it: an empty [slo] value instead
        (d / "s.toml").write_text((ROOT / "configs" / "tiny.toml").read_text() + "\n[slo]\n")
        name, ok = "s.toml", False
    expect = {True: "ok", False: "bad", None: "any"}[ok]
    return _simulate(name), expect, "slo" if expect == "bad" else ""


HORIZONS = [float("inf"), float("-inf"), 0, -1, 0.0, 1e-9, 0.5, 3.0, 1e9, "x", float("nan")]


def horizon_case(rng: random.Random, d: Path) -> Case:
    data = tiny()
    h = rng.choice(HORIZONS)
    data["sim"]["horizon_s"] = h
    if rng.random() < 0.3:
        data["sim"]["warmup_s"] = rng.choice([0.0, 1.0, 5.0, 1e6, -1.0])
    if rng.random() < 0.3:
        data["workload"]["horizon_s"] = rng.choice([float("inf"), 0.0, 2.0, -1.0, float("nan")])
    refused = isinstance(h, str) or h != h or not 0 < h < float("inf") or h == 1e-9
    return (
        _simulate(_write(d, data)),
        ("bad" if refused else "any"),
        ("horizon_s" if refused else ""),
    )


# ---- capacity at SLO ---------------------------------------------------------------------------


def capacity_case(rng: random.Random, d: Path) -> Case:
    data = tiny()
    data["slo"] = {"ttft_s": 0.03, "tpot_s": 0.01}  # crossed near load 5.7 (seed 0)
    bad, needle = False, ""
    r = rng.random()
    if r < 0.3:
        data["slo"][rng.choice(["ttft_s", "tpot_s"])] = rng.choice([0, -1.0, 1e-9])
        bad = True
    elif r < 0.5:  # an SLO nothing meets at any load: the search never crosses the target
        data["slo"]["ttft_s"] = 1e-5
        bad, needle = True, "never crosses"
    name = _write(d, data)
    argv = ["capacity", name, "--no-out", "--controller", "fixed", "--rel-tol", "0.3"]
    if rng.random() < 0.4:
        a = rng.choice(["0.9", "0", "-1", "1.5", "nan", "1", "0.5", "x"])
        argv += ["--attainment", a]
        bad |= a in ("0", "-1", "1.5", "nan")
    if rng.random() < 0.4:
        r = rng.choice(["0.05,20", "1,1", "2,1", "x", "0,5", "-1,2", "nan,2", "0.5", "0.5,50"])
        argv += ["--range", r]
        bad |= r in ("1,1", "2,1", "x", "0,5", "-1,2", "nan,2", "0.5")
    if rng.random() < 0.3:
        s = rng.choice(["0", "0,1", "-1", "x", "", "1.5"])
        argv += ["--seeds", s]
        bad |= s in ("-1", "x", "", "1.5")
    if rng.random() < 0.2:
        w = rng.choice(["0", "-2", "1"])
        argv += ["--workers", w]
        bad |= w != "1"
    if needle and len(argv) > 7:  # another flag may be refused first
        needle = ""
    return argv, ("bad" if bad else "any"), needle


# ---- peer controllers: their tables in a scenario, and export ---------------------------------

DSD = ("vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification")


def _peer_table(rng: random.Random) -> tuple[str, dict, str]:
    """A peer controller's table, maybe broken; its name and the needle of its error ('' when
    it is valid)."""
    name = rng.choice([*DSD, "sglang-adaptive"])
    if name == "sglang-adaptive":
        steps = rng.choice([[1, 3, 7], [3, 1, 7], [], [1, 1, 3], [0, 2], [2, 4], [1, 100]])
        ok = steps in ([1, 3, 7], [2, 4])
        return name, {"candidate_steps": steps}, "" if ok else "candidate_steps"
    t: dict = {"rows": 3, "num_speculative_tokens": 4, "k_1": 4, "k_2": 2, "k_3": 1}
    t.update(end_bs_1=8, end_bs_2=32, max_bs=512)
    kind = rng.choice(["ok", "overlap", "unsorted", "k-above", "rows-high", "end-zero", "max"])
    if kind == "overlap":
        t["end_bs_2"] = t["end_bs_1"]
    elif kind == "unsorted":
        t["end_bs_1"], t["end_bs_2"] = 32, 8
    elif kind == "k-above":
        t[f"k_{rng.randint(1, 3)}"] = 9
    elif kind == "rows-high":
        t["rows"] = 7
    elif kind == "end-zero":
        t["end_bs_1"] = 0
    elif kind == "max":
        t["max_bs"] = 16
    needle = {
        "ok": "",
        "overlap": "must be above the previous row's end",
        "unsorted": "must be above the previous row's end",
        "k-above": "exceeds num_speculative_tokens",
        "rows-high": "rows = 7 is out of range",
        "end-zero": "end_bs_1 = 0 is out of range",
        "max": "max_bs = 16 must be above",
    }[kind]
    return name, t, needle


def peer_case(rng: random.Random, d: Path) -> Case:
    name, table, needle = _peer_table(rng)
    data = tiny()
    data["controller"] = {name: table}
    argv = ["simulate", _write(d, data), "--no-out", "--quiet", "--controller", name]
    return argv, ("bad" if needle else "ok"), needle


EXPORT_REFUSED = {
    ("dspark", "vllm"),
    ("dspark", "sglang"),
    ("sglang-adaptive", "vllm"),
    ("vllm-dsd", "sglang"),
    ("vllm-adaptive-k", "sglang"),
    ("vllm-adaptive-verification", "sglang"),
    ("ema-hysteresis", "sglang"),
}


def export_case(rng: random.Random, d: Path) -> Case:
    to = rng.choice(["vllm", "sglang"])
    kind = rng.random()
    argv = ["export", "best_config.toml", "--to", to]
    if rng.random() < 0.3:
        argv.append("--json")
    if kind < 0.5:
        name, table, needle = _peer_table(rng)
        expect = "bad" if needle or (name, to) in EXPORT_REFUSED else "any"
        (d / "best_config.toml").write_text(tomli_w.dumps({"controller": {name: table}}))
        return argv, expect, needle
    if kind < 0.75:
        name = rng.choice(["dspark", "fixed", "ema-hysteresis", "analytic"])
        table = {"mode": "threshold"} if name == "fixed" and rng.random() < 0.5 else {}
        (d / "best_config.toml").write_text(tomli_w.dumps({"controller": {name: table}}))
        refused = (name, to) in EXPORT_REFUSED or table.get("mode") == "threshold"
        return argv, ("bad" if refused else "any"), ""
    body = rng.choice(
        [
            "not toml [",
            "",
            "controller = 3\n",
            "[controller]\n",
            "[controller.nope]\nk = 1\n",
            "[controller.fixed]\nk = -1\n",
            '[controller.fixed]\nk = 2\n[controller."vllm-dsd"]\nrows = 1\n',
        ]
    )
    if rng.random() < 0.1:
        return ["export", "missing.toml", "--to", to], "bad", "file not found"
    (d / "best_config.toml").write_text(body)
    return argv, "bad", ""


# ---- Prometheus scrapes and SGLang's server info --------------------------------------------


def _scrapes(rng: random.Random) -> tuple[str, str, list[str], str, str]:
    """(BEFORE, AFTER, extra flags, expect, needle) of a vLLM scrape pair, maybe broken."""
    from sim.metrics_import import ACCEPTED, DRAFTS, PER_POS, SpecCounts, vllm_scrape

    k = rng.randint(1, 5)
    drafts = float(rng.randint(20, 500))
    per, prev = [], drafts
    for _ in range(k):
        prev = float(rng.randint(0, int(prev)))
        per.append(prev)
    base = SpecCounts(5.0 * k, 5.0 * k * k, 0.0, tuple(0.0 for _ in range(k)))
    more = SpecCounts(base.drafts + drafts, base.draft_tokens + drafts * k, sum(per), tuple(per))
    before, after = vllm_scrape(base), vllm_scrape(more)
    kind = rng.choice(
        [
            "ok",
            "ok-order",
            "ok-extra",
            "swapped",
            "missing-pos",
            "missing-counter",
            "garbage",
            "engine",
            "model-flag",
            "two-models",
            "nan",
            "negative",
            "duplicate",
            "no-traffic",
            "empty",
            "skew",
            "accepted-above-drafted",
        ]
    )
    flags: list[str] = []
    expect, needle = "bad", ""
    if kind == "ok":
        expect = "ok"
    elif kind == "ok-order":
        after = after.replace('engine="0",model_name="model"', 'model_name="model",engine="0"')
        expect = "ok"
    elif kind == "ok-extra":
        after += '# HELP x y\nvllm:num_requests_running{engine="0",model_name="model"} 3\n'
        expect = "ok"
    elif kind == "swapped":
        before, after, needle = after, before, "went down"
    elif kind == "missing-pos":
        drop = f'position="{rng.randrange(k)}"'
        after = "".join(x + "\n" for x in after.splitlines() if drop not in x)
    elif kind == "missing-counter":
        gone = rng.choice([DRAFTS, ACCEPTED, PER_POS])
        after = "".join(x + "\n" for x in after.splitlines() if not x.startswith(gone))
        needle = "is missing"
    elif kind == "garbage":
        after = rng.choice(["hello world\n", "\x00\x01{{\n", after.replace("} ", "} x")])
    elif kind == "engine":
        after, needle = vllm_scrape(more, engine="1"), "label sets differ"
    elif kind == "model-flag":
        flags, needle = ["--model", "other"], "no samples of model 'other'"
    elif kind == "two-models":
        after += vllm_scrape(more, model="other").replace("# TYPE", "#")
        needle = "several models"
    elif kind == "nan":
        after = after.replace(f"{DRAFTS}{{", f"{DRAFTS}{{", 1).replace(
            f" {more.drafts!r}", " NaN", 1
        )
        needle = "is not a counter value"
    elif kind == "negative":
        after = after.replace(f" {more.drafts!r}", f" -{more.drafts!r}", 1)
        needle = "is not a counter value"
    elif kind == "duplicate":
        line = next(x for x in after.splitlines() if x.startswith(DRAFTS))
        after += line + "\n"
        needle = "twice"
    elif kind == "no-traffic":
        after, needle = before, "did not move"
    elif kind == "empty":
        after = ""
    elif kind == "skew":
        after = vllm_scrape(
            SpecCounts(more.drafts, more.draft_tokens, more.accepted + 3, more.per_pos)
        )
    else:  # accepted-above-drafted: more tokens accepted than were drafted
        after = vllm_scrape(
            SpecCounts(
                more.drafts, base.draft_tokens + sum(per) / 2 - 1, more.accepted, more.per_pos
            )
        )
        expect = "bad" if sum(per) > 2 else "any"
    return before, after, flags, expect, needle


def calibrate_case(rng: random.Random, d: Path) -> Case:
    if rng.random() < 0.75:
        before, after, flags, expect, needle = _scrapes(rng)
        (d / "b.prom").write_text(before)
        (d / "a.prom").write_text(after)
        return ["calibrate", "vllm-metrics", "b.prom", "a.prom", *flags], expect, needle
    length = rng.choice([1.875, 1.0, 4.0, 4.5, 0.5, float("nan"), "x", None, True])
    steps = rng.choice([3, 0, -1, "3", None])
    info: dict = {"internal_states": [{"avg_spec_accept_length": length}]}
    if steps is not None:
        info["internal_states"][0]["speculative_num_steps"] = steps
    body = json.dumps(info) if rng.random() > 0.1 else rng.choice(["{", "[]", "3", ""])
    (d / "info.json").write_text(body)
    argv = ["calibrate", "sglang-server-info", "info.json"]
    flag = None
    if rng.random() < 0.3:
        flag = rng.choice(["3", "0", "-2", "x"])
        argv += ["--num-steps", flag]
    k = int(flag) if flag not in (None, "x") else (steps if flag is None else None)
    real = isinstance(length, float) and not isinstance(length, bool)
    ok = body == json.dumps(info) and real and k == 3 and 1.0 <= length <= 4.0  # type: ignore[operator]
    return argv, ("ok" if ok else "bad"), ""


# ---- sweep specs: --loads with --workers / --storage -------------------------------------------


def sweep_case(rng: random.Random, d: Path) -> Case:
    _write(d, tiny(4))
    argv = ["simulate", "s.toml", "--no-out", "--quiet", "--controller", "fixed"]
    bad = False
    if rng.random() < 0.6:
        loads = rng.choice(["1", "0.5,2", "0", "-1", "nan", "1,,2", "x", "1,1"])
        argv += ["--loads", loads]
        bad |= loads in ("0", "-1", "nan", "x")
    w = rng.choice(["1", "2", "0", "-1", "x", "1.5"])
    argv += [f"--workers={w}"]
    bad |= w in ("0", "-1")
    if rng.random() < 0.5:
        s = rng.choice(
            ["memory", "bogus://x", "journal:", "sqlite:///s.db", "s.journal", "nope", "journal"]
        )
        argv += ["--storage", s]
        bad |= s in ("bogus://x", "journal:", "nope", "journal")  # journal: needs a run folder
    return argv, ("bad" if bad else "any"), ""
