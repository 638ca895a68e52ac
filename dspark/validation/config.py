"""The ``dspark validate`` configuration: one frozen dataclass tree from a TOML file.

Sections: ``[models]`` (shipped checkpoints or tiny random models), ``[engine]``
(``real.engine.EngineConfig``), ``[profile]`` (``real.profile.ProfileConfig``),
``[workloads.<name>]`` (``real.tracing.PromptSetConfig``), ``[calibration]``, ``[heldout]``,
``[controller.<name>]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control.configio import from_mapping, param, read_toml
from control.errors import ConfigError
from control.registry import ENGINE_CONTROLLERS, make_config
from real.engine import EngineConfig
from real.profile import ProfileConfig
from real.tiny import TinyModelsConfig
from real.tracing import PromptSetConfig


@dataclass(frozen=True)
class ModelsConfig:
    # the shipped, trained checkpoints are what the lab validates against.
    source: str = param("shipped", choices=("shipped", "tiny"), doc="shipped checkpoints or tiny")
    # empty = real/checkpoints.
    checkpoints: str = param("", doc="checkpoint folder (empty = the shipped one)")
    tiny: TinyModelsConfig = param(default_factory=TinyModelsConfig)


@dataclass(frozen=True)
class CalibrationConfig:
    # fixed k = 3 is used only for calibration; no held-out controller is configured like it.
    controller: str = param("fixed", choices=ENGINE_CONTROLLERS, doc="controller X of the traces")
    controller_config: dict = param(default_factory=lambda: {"k": 3},
                                    doc="its config table (inline)")
    # the validation split of code: never a held-out prompt.
    workload: str = param("code-val", doc="workload A (a [workloads.<name>] table)")


@dataclass(frozen=True)
class HeldoutConfig:
    # the three: a fixed k, HF's heuristic, the seed's scheduler.
    controllers: tuple[str, ...] = param(("fixed", "hf-heuristic", "dspark"),
                                         doc="controllers Y (engine controllers)")
    # code completion and prose.
    workloads: tuple[str, ...] = param(("code", "prose"), doc="workloads B ([workloads.<name>])")
    # prose: a domain the fitted acceptance model never saw.
    fitted_workloads: tuple[str, ...] = param(("code", "prose"),
                                              doc="also predicted with the fitted acceptance model")


@dataclass(frozen=True)
class ValidateConfig:
    name: str = param("validate", doc="name for reports")
    # >= 3 real repeats: the issue asks for the run-to-run spread beside every error.
    repeats: int = param(3, lo=1, hi=100, doc="real runs per controller x workload")
    # 1 thread: the machine is shared; one thread is the least sensitive to other loads.
    threads: int = param(1, lo=1, hi=256, doc="torch CPU threads")
    # best_config.toml files exported by `dspark tune`; the first that exists is used.
    dspark_tuned: tuple[str, ...] = param(
        ("configs/dspark_tuned.toml", "runs/tune-standard/best_config.toml"),
        doc="candidate tuned [controller.dspark] tables (project-relative); first existing wins")
    # the expected run time is a sum of MEAN forward times (the 20%-trimmed mean of the repeats,
    # `seconds_mean`: robust to single preemption spikes); latency.csv keeps the median.
    latency_statistic: str = param("mean", choices=("mean", "median"),
                                   doc="profile statistic for the simulator (trimmed mean, median)")
    # spread the profile's cells between the real runs, so that a change of the machine's
    # background load reaches the calibration and the measurement alike.
    interleave_profile: bool = param(True, doc="profile cells interleaved with the real runs")
    models: ModelsConfig = param(default_factory=ModelsConfig)
    engine: EngineConfig = param(default_factory=lambda: EngineConfig(stop_at_eot=False))
    profile: ProfileConfig = param(default_factory=ProfileConfig)
    workloads: dict = param(default_factory=dict, doc="prompt sets by name")
    calibration: CalibrationConfig = param(default_factory=CalibrationConfig)
    heldout: HeldoutConfig = param(default_factory=HeldoutConfig)
    controller: dict = param(default_factory=dict, doc="controller configs by name")
    base_dir: str = param("", doc="folder of the config file (relative paths)")

    def prompt_set(self, name: str) -> PromptSetConfig:
        return self.workloads[name]


def _finish(cfg: ValidateConfig, source: str) -> ValidateConfig:
    wl = {}
    for name, table in cfg.workloads.items():
        if isinstance(table, PromptSetConfig):
            wl[name] = table
        elif isinstance(table, dict):
            wl[name] = from_mapping(PromptSetConfig, table, source=source,
                                    prefix=f"workloads.{name}")
        else:
            raise ConfigError(f"{source}: workloads.{name} must be a table")
    need = set(cfg.heldout.workloads) | set(cfg.heldout.fitted_workloads) | {
        cfg.calibration.workload}
    missing = sorted(need - set(wl))
    if missing:
        raise ConfigError(f"{source}: workload '{missing[0]}' is used but has no "
                          f"[workloads.{missing[0]}] table")
    extra = sorted(set(cfg.heldout.fitted_workloads) - set(cfg.heldout.workloads))
    if extra:
        raise ConfigError(f"{source}: heldout.fitted_workloads has '{extra[0]}', which is not "
                          f"in heldout.workloads")
    if cfg.calibration.workload in cfg.heldout.workloads:
        raise ConfigError(f"{source}: calibration.workload '{cfg.calibration.workload}' is also "
                          f"held out; calibrate on other prompts")
    for name in cfg.heldout.controllers:
        if name not in ENGINE_CONTROLLERS:
            raise ConfigError(f"{source}: heldout.controllers has '{name}'; allowed: "
                              f"{', '.join(ENGINE_CONTROLLERS)}")
    for name, table in cfg.controller.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: controller.{name} must be a table")
        make_config(name, table, source=source)
    make_config(cfg.calibration.controller, cfg.calibration.controller_config, source=source)
    if cfg.engine.stop_at_eot:
        raise ConfigError(f"{source}: engine.stop_at_eot must be false for validation (every "
                          f"request generates exactly max_new_tokens)")
    if cfg.engine.temperature != 0.0:
        raise ConfigError(f"{source}: engine.temperature must be 0 (greedy): acceptance is "
                          f"replayed from greedy position traces")
    for name, w in wl.items():
        if w.prompt_tokens_max + w.max_new_tokens + cfg.engine.k_max + 2 > cfg.engine.max_len:
            raise ConfigError(f"{source}: workloads.{name}: prompt_tokens_max + max_new_tokens + "
                              f"k_max + 2 exceeds engine.max_len {cfg.engine.max_len}")
    return dataclasses.replace(cfg, workloads=wl)


def load_validate(path: str | Path | None, overrides: dict[str, Any] | None = None
                  ) -> ValidateConfig:
    """Load a validate TOML (None: ``configs/validate.toml`` of the project)."""
    p = Path(path) if path else Path(__file__).resolve().parents[2] / "configs" / "validate.toml"
    data = read_toml(p)
    for key, value in (overrides or {}).items():
        d = data
        parts = key.split(".")
        for part in parts[:-1]:
            d = d.setdefault(part, {})
        d[parts[-1]] = value
    data.setdefault("engine", {}).setdefault("stop_at_eot", False)
    data["base_dir"] = str(p.resolve().parent)
    cfg = from_mapping(ValidateConfig, data, source=str(p))
    return _finish(cfg, str(p))


def controller_config(cfg: ValidateConfig, name: str) -> tuple[Any, str]:
    """(checked config, where it came from) of held-out controller ``name``."""
    root = Path(__file__).resolve().parents[2]
    for cand in (cfg.dspark_tuned if name == "dspark" else ()):
        p = Path(cand) if Path(cand).is_absolute() else root / cand
        if p.is_file():
            table = read_toml(p).get("controller", {}).get("dspark")
            if table is None:
                raise ConfigError(f"{p}: no [controller.dspark] table")
            return make_config("dspark", table, source=str(p)), f"tuned ({p})"
    table = cfg.controller.get(name)
    where = f"[controller.{name}] of the config" if table is not None else "defaults"
    return make_config(name, table, source="validate config"), where
