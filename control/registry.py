"""Name -> controller class and its config dataclass; ``make_controller`` builds one."""

from __future__ import annotations

import importlib
from typing import Any

from control.base import Controller
from control.configio import from_mapping, parse_sets
from control.errors import ConfigError

# name: (module, controller class, config class)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "fixed": ("control.fixed", "FixedController", "FixedConfig"),
    "hf-heuristic": ("control.hf_heuristic", "HFHeuristicController", "HFHeuristicConfig"),
    "confidence-stop": (
        "control.confidence_stop",
        "ConfidenceStopController",
        "ConfidenceStopConfig",
    ),
    "ema-hysteresis": ("control.ema_hysteresis", "EmaHysteresisController", "EmaHysteresisConfig"),
    "analytic": ("control.analytic", "AnalyticController", "AnalyticConfig"),
    "dspark": ("control.dspark", "DSparkController", "DSparkConfig"),
    "clairvoyant": ("control.references", "ClairvoyantController", "ClairvoyantConfig"),
    "rate-oracle": ("control.references", "RateOracleController", "DSparkConfig"),
    "vllm-dsd": ("control.peer_vllm_dsd", "VllmDsdController", "VllmDsdConfig"),
    "vllm-adaptive-k": (
        "control.peer_vllm_adaptive_k",
        "VllmAdaptiveKController",
        "VllmAdaptiveKConfig",
    ),
    "vllm-adaptive-verification": (
        "control.peer_vllm_verification",
        "VllmVerificationController",
        "VllmVerificationConfig",
    ),
    "sglang-adaptive": ("control.peer_sglang", "SglangAdaptiveController", "SglangAdaptiveConfig"),
}

#: References told what only the simulator knows (run lengths, true rates).
REFERENCES = ("clairvoyant", "rate-oracle")
#: Controllers the real engine can run.
ENGINE_CONTROLLERS = tuple(n for n in _REGISTRY if n not in REFERENCES)


def controller_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def _lookup(name: str) -> tuple[Any, type]:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown controller '{name}'; allowed: {', '.join(_REGISTRY)}")
    mod_name, ctrl_name, cfg_name = _REGISTRY[name]
    mod = importlib.import_module(mod_name)
    return getattr(mod, ctrl_name), getattr(mod, cfg_name)


def controller_config_class(name: str) -> type:
    """The config dataclass of controller ``name``."""
    return _lookup(name)[1]


def make_config(name: str, config: Any = None, source: str = "<config>") -> Any:
    """A checked config instance for ``name`` from None (defaults), a mapping, or an instance."""
    cls = controller_config_class(name)
    if config is None:
        return cls()
    if isinstance(config, cls):
        return config
    if isinstance(config, dict):
        return from_mapping(cls, config, source=source, prefix=f"controller.{name}")
    raise ConfigError(
        f"{source}: controller '{name}' needs a {cls.__name__}, got {type(config).__name__}"
    )


def make_controller(name: str, config: Any = None, source: str = "<config>") -> Controller:
    """Build controller ``name`` with ``config`` (None, a mapping, or its config dataclass)."""
    ctrl_cls, _ = _lookup(name)
    return ctrl_cls(make_config(name, config, source))


def make_planner(name: str, config: Any = None, source: str = "<config>") -> Any:
    """The round planner of controller ``name`` with ``config``, or None when it has none."""
    ctrl_cls, _ = _lookup(name)
    return ctrl_cls.make_planner(make_config(name, config, source))


def controller_spec(spec: str) -> tuple[str, dict | None, str]:
    """``NAME`` or ``NAME:key=value,...`` -> ``(name, mapping or None, label)``: a controller
    with some of its config's fields set (values parsed as TOML), labelled by the spec."""
    if ":" not in spec:
        return spec, None, spec
    name, body = spec.split(":", 1)
    return name, parse_sets([kv for kv in body.split(",") if kv.strip()], spec), spec
