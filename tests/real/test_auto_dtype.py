"""The engine's default target precision, ``auto``: bf16 where it is native or at batch 1,
float32 for a batched engine on a CPU that emulates bf16."""

import dataclasses

import pytest
import torch

from control.configio import from_mapping
from control.errors import ConfigError
from real import checkpoint as ck
from real.engine import EngineConfig


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "device", "slots", "want"),
    [
        (False, False, "cpu", 8, "float32"),  # AVX2 only, batched: bf16 is emulated
        (False, False, "cpu", 1, "bfloat16"),  # AVX2 only, batch 1: bf16 decodes faster
        (True, False, "cpu", 8, "bfloat16"),
        (False, True, "cpu", 8, "bfloat16"),
        (False, False, "cuda", 8, "bfloat16"),
    ],
)
def test_auto_resolves_by_device_cpu_features_and_slots(
    monkeypatch, avx512_bf16, amx, device, slots, want
):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert ck.resolve_dtype("auto", device, slots) == want
    cfg = EngineConfig(device=device, slots=slots)  # the default: auto, kept as requested
    assert cfg.target_dtype == "auto" and cfg.precision == want
    loaded = from_mapping(
        EngineConfig, {"device": device, "slots": slots}, source="x.toml", prefix="engine"
    )
    assert loaded.precision == want
    assert cfg.record()["target_dtype"] == want  # what a run folder records
    assert cfg.record() == {**dataclasses.asdict(cfg), "target_dtype": want}


def test_a_replaced_config_resolves_auto_again(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False)
    batch1 = EngineConfig()
    assert batch1.precision == "bfloat16"
    # the batched validation part makes its engine config this way
    assert dataclasses.replace(batch1, slots=8).precision == "float32"
    assert dataclasses.replace(batch1, slots=8, device="cuda").precision == "bfloat16"
    pinned = EngineConfig(target_dtype="float32")
    assert dataclasses.replace(pinned, slots=1).precision == "float32"


def test_auto_without_the_cpu_probes_is_float32(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert ck.resolve_dtype("auto", "cpu", slots=2) == "float32"


@pytest.mark.parametrize("name", sorted(ck.DTYPES))
def test_an_explicit_precision_is_kept(name):
    assert ck.resolve_dtype(name, "cpu", 8) == name
    assert EngineConfig(target_dtype=name, slots=8).precision == name


def test_an_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="target_dtype"):
        from_mapping(EngineConfig, {"target_dtype": "int8"}, source="x.toml", prefix="engine")
