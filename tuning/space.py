"""The search space: one function maps an Optuna trial to a controller config.

The space is read from each controller's config dataclass, and from nothing else: every
:func:`control.configio.param` declares whether and how its field is searched (``tune``: the
range, or ``True`` for choices and booleans; ``log``; ``switch``: an on/off switch ``<name>:on``
whose off is exactly 0; ``when``: the fields and values under which it is searched;
``lo_from`` / ``hi_from``: a bound taken from another field's drawn value, so ordered pairs stay
ordered; ``choices_from``: a tuple field listing the choices). A field without ``tune`` keeps its
value (the study's config may pin it).

Parameter names are the config's field names (dotted for nested dataclasses), so trial params
map back to a config with :func:`params_to_config`.

Scenario fields join the search the same way (:func:`scenario_space`, ``[tune]
scenario_params``): a scenario dataclass field whose ``param`` declares ``tune`` (e.g.
``draft.block_size``, a block drafter's B) is the trial parameter ``scenario.<dotted key>``, and
its drawn value is a dotted override of every tuning workload's scenario for that trial.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from control import controller_config_class, make_config
from control.configio import to_dict
from control.errors import ConfigError

ON = ":on"  # suffix of an on/off switch parameter
SCENARIO = "scenario."  # prefix of a tuned scenario field's trial parameter

#: The seed document's starting point (α = 0.8, β = 0.85 with threshold verification).
SEED_POINT: dict[str, dict[str, Any]] = {
    "dspark": {"policy": "seed", "mode": "threshold", "alpha0": 0.8, "beta0": 0.85},
}


@dataclass(frozen=True)
class Dim:
    """One tuned parameter."""

    name: str
    kind: str  # "float" | "int" | "categorical"
    lo: float | None = None
    hi: float | None = None
    log: bool = False
    choices: tuple = ()
    zero_switch: bool = False  # also a "<name>:on" categorical; off -> 0
    when: tuple[tuple[str, tuple], ...] = ()  # suggested only when these fields have these values
    lo_from: tuple[str, float] | None = None
    hi_from: tuple[str, float] | None = None
    doc: str = ""

    def refs(self) -> set[str]:
        r = {k for k, _ in self.when}
        r |= {x[0] for x in (self.lo_from, self.hi_from) if x}
        return r


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted name, field, resolved type) of every leaf field, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        d = _default(f)
        if dataclasses.is_dataclass(d) or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            out += _fields(type(d) if d is not None else tp, prefix + f.name + ".")
        else:
            out.append((prefix + f.name, f, tp))
    return out


def defaults(controller: str) -> dict[str, Any]:
    """Flat ``{dotted name: default}`` of a controller's config."""
    return flatten(to_dict(make_config(controller)))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        cur = out
        parts = k.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    return out


def _dim(name: str, f: dataclasses.Field, tp: Any, pre: str, dflt: dict[str, Any]) -> Dim | None:
    """The dimension a field's ``param`` metadata declares (``pre``: its dotted prefix)."""
    m = f.metadata
    tune = m.get("tune")
    if not tune:
        return None
    common = {
        "name": name,
        "doc": m.get("doc", ""),
        "when": tuple(sorted((pre + k, tuple(v)) for k, v in (m.get("when") or {}).items())),
    }
    if m.get("choices_from"):
        return Dim(kind="categorical", choices=tuple(dflt[pre + m["choices_from"]]), **common)
    if m.get("choices") or tp is bool:
        return Dim(kind="categorical", choices=tuple(m.get("choices") or (False, True)), **common)
    lo, hi = tune
    lo_from, hi_from = m.get("lo_from"), m.get("hi_from")
    return Dim(
        kind="int" if tp is int else "float",
        lo=lo,
        hi=hi,
        log=m.get("log", False),
        zero_switch=m.get("switch", False),
        lo_from=(pre + lo_from[0], lo_from[1]) if lo_from else None,
        hi_from=(pre + hi_from[0], hi_from[1]) if hi_from else None,
        **common,
    )


def space(controller: str) -> list[Dim]:
    """The tuned dimensions of ``controller``, ordered so every reference comes first."""
    leaves = _fields(controller_config_class(controller))
    dflt = {n: _default(f) for n, f, _ in leaves}
    dims = []
    for name, f, tp in leaves:
        d = _dim(name, f, tp, name[: len(name) - len(f.name)], dflt)
        if d is not None:
            dims.append(d)
    unknown = sorted(r for d in dims for r in d.refs() if r not in dflt)
    if unknown:  # a stale reference is a bug in the config's declaration, not a user error
        raise KeyError(f"tuning metadata of '{controller}' names unknown fields {unknown}")
    return _ordered(dims)


def _ordered(dims: list[Dim]) -> list[Dim]:
    placed: list[Dim] = []
    done: set[str] = set()
    tuned = {d.name for d in dims}
    pending = list(dims)
    while pending:
        for d in pending:
            if all(r in done or r not in tuned for r in d.refs()):
                placed.append(d)
                done.add(d.name)
                pending.remove(d)
                break
        else:  # pragma: no cover - a cycle in TABLE
            raise KeyError(f"cyclic references among {[d.name for d in pending]}")
    return placed


def _bounds(d: Dim, values: dict[str, Any]) -> tuple[float, float]:
    lo, hi = d.lo, d.hi
    if d.lo_from:
        lo = max(lo, values[d.lo_from[0]] + d.lo_from[1])
    if d.hi_from:
        hi = min(hi, values[d.hi_from[0]] + d.hi_from[1])
    if d.kind == "int":
        lo, hi = math.ceil(lo), math.floor(hi)
    return lo, max(lo, hi)


def _active(d: Dim, values: dict[str, Any]) -> bool:
    return all(values.get(k) in allowed for k, allowed in d.when)


def _suggest(trial: Any, d: Dim, values: dict[str, Any]) -> Any:
    """One dimension's value on ``trial`` (``values``: the fields its bounds may refer to)."""
    if d.kind == "categorical":
        return trial.suggest_categorical(d.name, list(d.choices))
    lo, hi = _bounds(d, values)
    if d.zero_switch and not trial.suggest_categorical(d.name + ON, [False, True]):
        return 0.0 if d.kind == "float" else 0
    if d.kind == "int":
        return trial.suggest_int(d.name, int(lo), int(hi), log=d.log and lo > 0)
    return trial.suggest_float(d.name, float(lo), float(hi), log=d.log and lo > 0)


def suggest_params(trial: Any, controller: str, fixed: dict[str, Any] | None = None) -> dict:
    """Suggest every active dimension on ``trial``; returns the flat config values set
    (tuned and ``fixed`` ones; everything else keeps its default)."""
    fixed = dict(fixed or {})
    values = {**defaults(controller), **fixed}
    chosen = dict(fixed)
    for d in space(controller):
        if d.name in fixed or not _active(d, values):
            continue
        v = _suggest(trial, d, values)
        values[d.name] = v
        chosen[d.name] = v
    return chosen


def _plain(tp: Any) -> Any:
    """``int`` for ``int | None`` (an optional field's value type); other types as they are."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def scenario_space(keys: tuple[str, ...] | list[str]) -> list[Dim]:
    """The tuned scenario dimensions ``[tune] scenario_params`` names, read from the scenario
    config dataclasses' ``param(..., tune=...)`` as :func:`space` reads a controller's; each
    trial param is ``scenario.<dotted key>``. An unknown key, a field without ``tune`` or one
    whose range depends on other fields is a :class:`ConfigError` naming the key."""
    from sim.config import SimConfig

    leaves = {n: (f, tp) for n, f, tp in _fields(SimConfig)}
    dims = []
    for key in keys:
        if key not in leaves:
            raise ConfigError(f"'{key}' is not a field of the scenario (e.g. 'draft.block_size')")
        f, tp = leaves[key]
        d = _dim(SCENARIO + key, f, _plain(tp), key[: len(key) - len(f.name)], {})
        if d is None:
            raise ConfigError(f"'{key}' declares no tuning range (its param has no tune=...)")
        if d.refs():
            raise ConfigError(f"'{key}' is searched only beside other fields; not tunable alone")
        dims.append(d)
    return dims


def suggest_scenario(trial: Any, dims: list[Dim]) -> dict[str, Any]:
    """The scenario overrides a trial draws: ``{dotted key: value}`` for each of ``dims``."""
    return {d.name[len(SCENARIO) :]: _suggest(trial, d, {}) for d in dims}


def scenario_values(params: dict[str, Any]) -> dict[str, Any]:
    """The scenario overrides among a trial's ``params`` (``scenario.<key>`` -> ``<key>``)."""
    return {k[len(SCENARIO) :]: v for k, v in params.items() if k.startswith(SCENARIO)}


def suggest_config(trial: Any, controller: str, fixed: dict[str, Any] | None = None) -> Any:
    """Map an Optuna trial (or ``FixedTrial``) to a checked config of ``controller``.

    ``fixed`` pins dotted fields (e.g. ``{"mode": "threshold"}``): they are not suggested,
    and fields conditional on them follow the pinned value.
    """
    return make_config(
        controller,
        unflatten(suggest_params(trial, controller, fixed)),
        source=f"tuning space of '{controller}'",
    )


def params_to_config(
    controller: str, params: dict[str, Any], fixed: dict[str, Any] | None = None
) -> Any:
    """The config a trial with ``params`` ran (``params``: ``trial.params``)."""
    import optuna

    return suggest_config(optuna.trial.FixedTrial(dict(params)), controller, fixed)


class _Recorder:
    """A stand-in trial that answers each suggestion with a config's own value."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: list) -> Any:
        if name.endswith(ON):
            v = self.values[name[: -len(ON)]] != 0
        else:
            v = self.values[name]
        if v not in choices:
            raise ValueError(f"'{name}' = {v!r} is not among the tuned choices {choices}")
        self.params[name] = v
        return v

    def _num(self, name: str, lo: float, hi: float) -> Any:
        v = self.values[name]
        if not lo <= v <= hi:
            raise ValueError(f"'{name}' = {v!r} is outside the tuned range [{lo}, {hi}]")
        self.params[name] = v
        return v

    def suggest_int(self, name: str, lo: int, hi: int, log: bool = False) -> int:
        return self._num(name, lo, hi)

    def suggest_float(self, name: str, lo: float, hi: float, log: bool = False) -> float:
        return self._num(name, lo, hi)


def config_to_params(
    controller: str, config: Any = None, fixed: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Trial params that reproduce ``config`` (instance, mapping of overrides, or None for
    defaults): what :func:`optuna.Study.enqueue_trial` needs. A value outside the tuned
    range is a ``ValueError`` (the space must contain it)."""
    if config is None or isinstance(config, dict):
        values = {**defaults(controller), **flatten(unflatten(dict(config or {})))}
        make_config(controller, unflatten(values))  # the point itself must be valid
    else:
        values = flatten(to_dict(config))
    rec = _Recorder({**values, **(fixed or {})})
    suggest_params(rec, controller, fixed)
    return rec.params


def start_points(controller: str, fixed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Params to enqueue first: the seed's starting point (where the controller has one and
    it fits ``fixed``), then the untuned defaults; duplicates dropped."""
    points = []
    seed = SEED_POINT.get(controller)
    fixed = dict(fixed or {})
    if seed is not None:
        # a seed value of an unsearched field (e.g. dspark's policy) must be what trials run
        tuned = {d.name for d in space(controller)}
        dflt = {**defaults(controller), **fixed}
        if any(k not in tuned and dflt.get(k) != v for k, v in seed.items()):
            seed = None
    if seed is not None and all(seed.get(k, v) == v for k, v in fixed.items()):
        points.append(config_to_params(controller, seed, fixed))
    try:
        points.append(config_to_params(controller, None, fixed))
    except (ValueError, ConfigError):  # a pinned field clashes with a default: skip it
        pass
    out: list[dict[str, Any]] = []
    for p in points:
        if p not in out:
            out.append(p)
    return out


def describe_space(controller: str) -> list[dict[str, Any]]:
    """Rows describing the space (for docs and the CLI)."""
    return [
        {
            "param": d.name,
            "kind": d.kind,
            "lo": d.lo,
            "hi": d.hi,
            "log": d.log,
            "choices": d.choices or None,
            "zero_switch": d.zero_switch,
            "when": dict(d.when) or None,
        }
        for d in space(controller)
    ]


__all__ = [
    "SEED_POINT",
    "Dim",
    "config_to_params",
    "defaults",
    "describe_space",
    "params_to_config",
    "scenario_space",
    "scenario_values",
    "space",
    "start_points",
    "suggest_config",
    "suggest_params",
    "suggest_scenario",
]
