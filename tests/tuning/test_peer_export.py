"""``dspark export``: a config as vLLM / SGLang settings, exactly, and back (the round trip
simulates the same run); what a server cannot express is an error or a named line."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from control import make_config
from control.errors import DSparkError
from dspark.cli import main
from sim.api import simulate
from sim.config import load_scenario
from tuning.export import write_best_config
from tuning.peer_export import export_config, parse_sglang, parse_vllm, same_config
from tuning.space import suggest_config

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"

# configs as a study would export them (inactive fields at their defaults)
CASES = [
    ("vllm", "fixed", {"k": 5}),
    ("vllm", "vllm-dsd", {}),
    (
        "vllm",
        "vllm-dsd",
        {"rows": 4, "end_bs_1": 2, "end_bs_2": 6, "end_bs_3": 12, "max_bs": 256, "k_1": 5}
        | {"k_2": 3, "k_3": 2, "k_4": 1, "num_speculative_tokens": 6},
    ),
    ("vllm", "vllm-adaptive-k", {"ema_alpha": 0.5, "c_draft": 0.2, "cooldown_steps": 1}),
    ("vllm", "vllm-adaptive-k", {"rows": 2, "end_bs_1": 4, "k_1": 6, "k_2": 2}),
    ("vllm", "vllm-adaptive-verification", {"num_speculative_tokens": 5}),
    ("vllm", "vllm-adaptive-verification", {"rows": 1, "k_1": 2, "max_bs": 64}),
    ("sglang", "fixed", {"k": 3}),
    ("sglang", "sglang-adaptive", {}),
    (
        "sglang",
        "sglang-adaptive",
        {"candidate_steps": [2, 4], "num_steps": 4, "ema_alpha": 0.4, "warmup_batches": 3}
        | {"update_interval": 2, "down_hysteresis": -0.5, "up_hysteresis": 0.25},
    ),
]


def parse(target: str, out) -> tuple[str, object]:
    """Read the export back as a user's server would get it: from the printed JSON."""
    if target == "vllm":
        return parse_vllm(json.loads(out.json))
    steps = int(next(f for f in out.flags if f.startswith("--speculative-num-steps")).split()[1])
    return parse_sglang(steps, json.loads(out.json) if out.config else None)


@pytest.fixture(scope="module")
def tiny():
    return load_scenario(TINY, {"workload.num_requests": 24})


@pytest.mark.parametrize("target, name, cfg", CASES)
def test_round_trip_is_exact(target, name, cfg, tiny):
    original = make_config(name, cfg)
    out = export_config(name, original, target)
    assert not out.notes
    back_name, back = parse(target, out)
    assert back_name == name and same_config(back, original)
    a = simulate(tiny, name, original, seed=2, baseline=False).summary
    b = simulate(tiny, back_name, back, seed=2, baseline=False).summary
    assert a == pytest.approx(b, nan_ok=True)


def test_vllm_json_by_hand():
    assert json.loads(export_config("vllm-dsd", None, "vllm").json) == {
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 128, 1], [129, 512, 0]],
    }
    assert json.loads(export_config("vllm-adaptive-k", None, "vllm").json) == {
        "num_speculative_tokens": 10,
        "enable_adaptive_k": True,
        "adaptive_k_ema_alpha": 0.3,
        "adaptive_k_c_draft": 0.1144,
        "adaptive_k_min_tokens": 0,
        "adaptive_k_cooldown_steps": 2,
        "adaptive_k_bs_penalty": 0.002,
        "adaptive_k_alpha_prior": 0.85,
    }
    assert json.loads(export_config("vllm-adaptive-verification", None, "vllm").json) == {
        "num_speculative_tokens": 7,
        "enable_adaptive_verification": True,
    }
    out = export_config("sglang-adaptive", None, "sglang")
    assert out.flags == (
        "--speculative-algorithm EAGLE",
        "--speculative-eagle-topk 1",
        "--speculative-num-steps 3",
        "--speculative-num-draft-tokens 4",
        "--speculative-adaptive",
        "--speculative-adaptive-config adaptive_spec.json",
    )
    assert out.config == {
        "candidate_steps": [1, 3, 7],
        "ema_alpha": 0.2,
        "warmup_batches": 10,
        "update_interval": 5,
        "down_hysteresis": -0.25,
        "up_hysteresis": 0.0,
    }


@pytest.mark.parametrize(
    "name, cfg, target, needle",
    [
        ("dspark", None, "vllm", "per-sequence goodput planning"),
        ("dspark", None, "sglang", "per-sequence goodput planning"),
        ("sglang-adaptive", None, "vllm", "vLLM has no such policy"),
        ("vllm-dsd", None, "sglang", "SGLang has no such policy"),
        ("fixed", {"mode": "threshold"}, "vllm", "threshold (lossy) verification"),
        ("fixed", {"k": 0}, "sglang", "k = 0 is plain serving"),
        ("ema-hysteresis", None, "sglang", "not SGLang's policy"),
    ],
)
def test_what_no_server_runs_is_one_error(name, cfg, target, needle):
    with pytest.raises(DSparkError, match=f"controller '{name}' cannot be expressed in {target}"):
        export_config(name, cfg, target)
    with pytest.raises(DSparkError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        export_config(name, cfg, target)


def test_not_expressible_lines():
    out = export_config(
        "vllm-adaptive-verification",
        {"rows": 1, "k_1": 3, "dsd_budget": "cap", "memory_rounds": 4.0},
        "vllm",
    )
    assert out.notes == (
        (
            "dsd_budget = 'cap' (vLLM's budget with a table is N x K of the table; the server runs "
            "that)"
        ),
        "memory_rounds = 4.0 (vLLM's per-request estimates are its own)",
    )
    lines = out.text().splitlines()
    assert lines[-2:] == [f"# not expressible in vllm: {n}" for n in out.notes]
    assert json.loads(lines[1]) == out.config


def test_export_command(tmp_path, capsys):
    path = write_best_config(tmp_path / "best_config.toml", "vllm-dsd", make_config("vllm-dsd"))
    assert main(["export", str(path), "--to", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == export_config("vllm-dsd", None, "vllm").config
    assert main(["export", str(path), "--to", "vllm"]) == 0
    assert capsys.readouterr().out.startswith("# vLLM (vllm-dsd): --speculative-config")
    assert main(["export", str(path), "--to", "sglang"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dspark: error: controller 'vllm-dsd' cannot be expressed in sglang")
    assert main(["export", str(tmp_path / "none.toml"), "--to", "vllm"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_parse_errors():
    with pytest.raises(DSparkError, match="no num_speculative_tokens"):
        parse_vllm({"method": "eagle"})
    with pytest.raises(DSparkError, match="rows must cover batch sizes from 1"):
        parse_vllm(
            {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 3]]}
        )
    with pytest.raises(DSparkError, match="unknown key 'ceiling_coeff'"):
        parse_sglang(3, {"ceiling_coeff": 0})


@pytest.mark.parametrize("name", ["vllm-dsd", "vllm-adaptive-k", "vllm-adaptive-verification"])
def test_every_tuned_table_is_valid_and_exportable(name):
    """The tuner's draws (boundaries and Ks of the table) are always a valid table."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(200):
        trial = study.ask()
        cfg = suggest_config(trial, name, {"rows": 4} if name != "vllm-dsd" else None)
        out = export_config(name, cfg, "vllm")
        back_name, back = parse_vllm(json.loads(out.json))
        assert back_name == name
        assert out.config == export_config(name, back, "vllm").config
        study.tell(trial, 0.0)
