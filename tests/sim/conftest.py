import sys
from pathlib import Path

import pytest

from control.configio import from_mapping
from sim.config import SimConfig, _finish

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def scenario(data: dict, base: Path | None = None) -> SimConfig:
    """A SimConfig from a plain nested mapping (like a TOML file)."""
    d = dict(data)
    if base is not None:
        d["base_dir"] = str(base)
    return _finish(from_mapping(SimConfig, d, source="<test>"))


def constant_scenario(
    a: float = 0.8, c: float = 0.05, out_tokens: int = 1000, n: int = 1, **extra
) -> SimConfig:
    data = {
        "deployment": {"max_batch": 1},
        "latency": {
            "backend": "constant",
            "constant_target_s": 0.01,
            "constant_drafter_s": 0.01 * c,
            "constant_prefill_s": 0.0,
        },
        "workload": {
            "arrival": "poisson",
            "rate_rps": 1000.0,
            "num_requests": n,
            "prompt": {"dist": "constant", "mean_tokens": 16.0},
            "output": {
                "dist": "constant",
                "mean_tokens": float(out_tokens),
                "max_tokens": 10_000_000,
            },
        },
        "acceptance": {"model": "iid", "rate": a},
    }
    for k, v in extra.items():
        data.setdefault(k, {}).update(v)
    return scenario(data)


def h100_8b_scenario(base: Path, trace_file: str, **sections) -> SimConfig:
    """One H100 serving Llama-3.1-8B (Llama-3.2-1B drafter, i.i.d. acceptance 0.8) on the trace
    ``trace_file`` in ``base``; ``sections`` update the scenario's tables."""
    data: dict = {
        "target": {"preset": "Llama-3.1-8B"},
        "drafter": {"preset": "Llama-3.2-1B"},
        "workload": {"arrival": "trace", "trace_path": trace_file},
        "acceptance": {"model": "iid", "rate": 0.8},
    }
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return scenario(data, base=base)


def prefill_pass(cl, n: int, prefix: int) -> float:
    """A pass of one prompt chunk alone: target, then the colocated drafter."""
    from sim.latency import causal_pairs

    pairs = causal_pairs(n, prefix)
    return cl.lat_t.pass_seconds(0, 0, 0.0, 1, n, pairs, prefix) + cl.lat_d.pass_seconds(
        0, 0, 0.0, 1, n, pairs, prefix
    )


@pytest.fixture
def tiny():
    from sim import load_scenario

    return load_scenario(CONFIGS / "tiny.toml")


sys.path.insert(0, str(Path(__file__).parent))
