"""The engine's default target precision, ``auto``: bf16 where it is native, float32 elsewhere."""

import dataclasses

import pytest
import torch

from control.configio import from_mapping
from control.errors import ConfigError
from real import checkpoint as ck
from real.engine import EngineConfig


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "device", "want"),
    [
        (False, False, "cpu", "float32"),  # AVX2 only: bf16 is emulated
        (True, False, "cpu", "bfloat16"),
        (False, True, "cpu", "bfloat16"),
        (False, False, "cuda", "bfloat16"),
    ],
)
def test_auto_resolves_by_device_and_cpu_features(monkeypatch, avx512_bf16, amx, device, want):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert ck.resolve_dtype("auto", device) == want
    cfg = EngineConfig(device=device)  # the default is auto, resolved when the config is made
    assert cfg.target_dtype == want
    loaded = from_mapping(EngineConfig, {"device": device}, source="x.toml", prefix="engine")
    assert loaded.target_dtype == want
    assert dataclasses.asdict(cfg)["target_dtype"] == want  # what a run folder records


def test_auto_without_the_cpu_probes_is_float32(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert ck.resolve_dtype("auto", "cpu") == "float32"


@pytest.mark.parametrize("name", sorted(ck.DTYPES))
def test_an_explicit_precision_is_kept(name):
    assert ck.resolve_dtype(name, "cpu") == name == EngineConfig(target_dtype=name).target_dtype


def test_an_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="target_dtype"):
        from_mapping(EngineConfig, {"target_dtype": "int8"}, source="x.toml", prefix="engine")
