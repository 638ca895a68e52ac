"""Simulated results are bit-identical to a saved run: the summary rows and a hash of
requests.csv and rounds.csv of fixed runs (tests/sim/saved_summary.json). A change to the
simulator or to a controller that moves any number fails here; a refactor must not.

Regenerate the fixture (only for an intended change of results) with
``.venv/bin/python tests/sim/test_saved_summary.py --write``."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURE = HERE / "saved_summary.json"
SEED = 11
LOADS = (1.0, 2.5)
CONTROLLERS = [("fixed", {"k": 2}), "dspark", "vllm-dsd"]


def _pressure_trace(path: Path) -> None:
    """A seeded JSONL trace with shared prompt prefixes (hash_ids), so the run under tight
    KV memory exercises the prefix cache, eviction and preemption."""
    rng = np.random.default_rng(5)
    t, lines = 0.0, []
    for _ in range(40):
        t += float(rng.exponential(120.0))
        head = [1, 2] if rng.random() < 0.6 else [3]
        tail = [int(x) for x in rng.integers(10, 400, size=int(rng.integers(0, 3)))]
        p = 512 * len(head + tail) - int(rng.integers(0, 300))
        o = int(rng.integers(20, 500))
        rec = {"timestamp": int(t), "input_length": p, "output_length": o, "hash_ids": head + tail}
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")


def _scenarios(tmp: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from conftest import h100_8b_scenario

    from sim import load_scenario

    _pressure_trace(tmp / "trace.jsonl")
    tight = {"max_batch": 24, "kv_memory_fraction": 0.255}
    ms = {"trace_timestamp_unit": "ms"}
    return {
        "tiny": load_scenario(ROOT / "configs" / "tiny.toml"),
        "pressure-chunked": h100_8b_scenario(
            tmp, "trace.jsonl", deployment=dict(tight), workload=ms
        ),
        "pressure-prefill-first": h100_8b_scenario(
            tmp,
            "trace.jsonl",
            deployment={**tight, "scheduler": "prefill-first", "prefill_order": "shortest-first"},
            workload=ms,
        ),
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def current(tmp: Path) -> dict:
    """Every scenario's summary rows and table hashes, as the fixture stores them."""
    from sim.compare import compare_runs

    out = {}
    for name, scn in _scenarios(tmp).items():
        folder = tmp / name
        compare_runs(scn, CONTROLLERS, seed=SEED, out_dir=folder, load_scales=LOADS, trace=True)
        out[name] = {
            "rows": json.loads((folder / "summary.json").read_text())["rows"],
            "requests_sha256": _digest(folder / "requests.csv"),
            "rounds_sha256": _digest(folder / "rounds.csv"),
        }
    return out


def test_simulated_results_match_the_saved_run(tmp_path):
    saved = json.loads(FIXTURE.read_text())
    now = current(tmp_path)
    assert list(now) == list(saved)
    for name in saved:
        for a, b in zip(now[name]["rows"], saved[name]["rows"], strict=True):
            assert a == b, f"{name}: {a['controller']} at load {a['load_scale']}"
        assert now[name]["requests_sha256"] == saved[name]["requests_sha256"], name
        assert now[name]["rounds_sha256"] == saved[name]["rounds_sha256"], name


def test_the_saved_run_exercises_memory_pressure():
    saved = json.loads(FIXTURE.read_text())
    rows = [r for n in ("pressure-chunked", "pressure-prefill-first") for r in saved[n]["rows"]]
    assert any(r["preemptions"] > 0 for r in rows)
    assert any(r["prefix_cache_hit_tokens"] > 0 for r in rows)


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        pytest.exit("usage: test_saved_summary.py --write")
    with tempfile.TemporaryDirectory() as d:
        FIXTURE.write_text(json.dumps(current(Path(d)), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
