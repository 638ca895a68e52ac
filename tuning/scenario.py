"""Scenario fields the study searches beside the controller (``[tune] scenario_params``).

::

    [tune]
    scenario_params = ["draft.block_size"]   # dotted scenario keys

Each key names a scenario field whose ``param`` declares ``tune`` (its range, log scale or
choices, read by :func:`tuning.space.scenario_space` exactly as a controller's fields are). A
trial draws it as ``scenario.<key>`` and runs every tuning workload with the drawn value written
over the workload's own scenario (and over the workload's override of the same key). The best
trial's values go to ``best_config.toml`` as a ``[scenario]`` table of dotted keys
(:func:`tuning.export.load_best_scenario` reads it back); the held-out evaluation runs the tuned
controller with them and every other entry on its workload's scenario as written.

:func:`check_scenario_params` refuses, before any trial, a key that is unknown, has no ``tune``
range, or that a workload's scenario cannot take at the ends of its range (e.g.
``draft.block_size`` where ``draft.kind`` is not ``"block"``): one line naming the key, the
workload and the files.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from control.errors import ConfigError
from tuning.space import Dim, scenario_space


def _probes(d: Dim) -> list[Any]:
    """Values a workload's scenario must accept: every choice, else both ends of the range."""
    if d.kind == "categorical":
        return list(d.choices)
    if d.kind == "int":
        return [int(d.lo), int(d.hi)] if d.lo is not None and d.hi is not None else []
    return [float(d.lo), float(d.hi)] if d.lo is not None and d.hi is not None else []


def check_scenario_params(
    keys: tuple[str, ...], workloads: tuple[Any, ...], source: str
) -> list[Dim]:
    """The scenario dimensions of ``keys``; a :class:`ConfigError` naming the key and ``source``
    (and the workload's scenario file) when one cannot be searched on every workload."""
    from sim import load_scenario

    if len(set(keys)) != len(keys):
        raise ConfigError(f"{source}: tune.scenario_params {list(keys)} names a key twice")
    dims = []
    for key in keys:
        try:
            (d,) = scenario_space((key,))
        except ConfigError as e:
            raise ConfigError(f"{source}: tune.scenario_params: {e}") from None
        dims.append(d)
        for w in workloads:
            for v in _probes(d):
                try:
                    load_scenario(w.scenario, {**w.overrides, key: v})
                except ConfigError as e:
                    raise ConfigError(
                        f"{source}: tune.scenario_params '{key}' = {v!r} does not fit "
                        f"workload '{w.name}': {e}"
                    ) from None
    return dims


def with_scenario(spec: Any, values: dict[str, Any]) -> Any:
    """``spec`` (a :class:`tuning.config.WorkloadSpec`) with the tuned scenario ``values``
    written over its overrides."""
    return replace(spec, overrides={**spec.overrides, **values}) if values else spec


def scenario_line(values: dict[str, Any]) -> str:
    """``draft.block_size=9, ...`` (what ``dspark tune`` prints)."""
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
