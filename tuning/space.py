"""The search space: one function maps an Optuna trial to a controller config.

The space is *derived* from each controller's config dataclass (``control.configio.param``
metadata: ``lo``/``hi``/``choices``), so it follows the controllers as they change, and then
narrowed by :data:`TABLE` where the declared range is a validity range rather than a sensible
search range. Rules applied to every field:

- ``choices`` -> categorical; ``bool`` -> categorical ``[False, True]``;
- numbers with both ``lo`` and ``hi`` -> a range; log scale when ``lo > 0`` and ``hi/lo >= 100``;
- controller gains (``*_kp``, ``*_ki``, ``*_kd``) -> log scale; a gain whose declared range
  starts at 0 gets a switch ``<name>:on`` (off = exactly 0, the seed's ``Kp = Kd = 0``), and its
  magnitude is suggested only when the switch is on;
- when the config has a ``mode`` with a ``threshold`` choice, fields that only act in threshold
  mode (named ``beta*`` or documented "threshold mode") are suggested only when
  ``mode = threshold``;
- ``X_min``/``X_max`` pairs stay ordered (and bracket ``X0`` when there is one): the later
  field's range starts (or ends) at the value already drawn;
- tuples, free strings and fields without a range are not tuned (they keep their default).

Parameter names are the config's field names (dotted for nested dataclasses), so trial params
map back to a config with :func:`params_to_config`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from control import controller_config_class, make_config
from control.configio import to_dict
from control.errors import ConfigError

ON = ":on"      # suffix of a gain's on/off switch parameter

# Per controller: field -> narrowing. Keys: lo, hi, log, skip, when {field: allowed values},
# lo_from / hi_from (field, offset): the bound is that field's value + offset,
# choices_from: a (tuple) field whose default lists the choices.
GAIN_RANGE = {"lo": 1e-3, "hi": 2.0, "log": True}   # error terms are O(1); α spans 1.2
TABLE: dict[str, dict[str, dict[str, Any]]] = {
    "fixed": {
        "k": {"lo": 0, "hi": 16},
    },
    "hf-heuristic": {
        "k0": {"lo": 1, "hi": 16},
        "k_max": {"lo": 1, "hi": 64, "lo_from": ("k0", 0)},
    },
    "confidence-stop": {
        "k_max": {"lo": 1, "hi": 32},
        "tau": {"lo": 0.0, "hi": 0.95},
        "target_accept": {"lo": 0.1, "hi": 0.95, "when": {"adapt": ("target",)}},
        "bins": {"lo": 4, "hi": 64, "when": {"adapt": ("target",)}},
        "window_pairs": {"lo": 64, "hi": 8192, "log": True, "when": {"adapt": ("target",)}},
        "min_bin_pairs": {"lo": 1, "hi": 128, "log": True, "when": {"adapt": ("target",)}},
        "update_rounds": {"lo": 1, "hi": 256, "log": True, "when": {"adapt": ("target",)}},
        "tau_min": {"lo": 0.0, "hi": 0.5, "when": {"adapt": ("target",)}},
        "tau_max": {"lo": 0.5, "hi": 1.0, "lo_from": ("tau_min", 0.0),
                    "when": {"adapt": ("target",)}},
    },
    "ema-hysteresis": {
        "k0": {"choices_from": "candidates"},
        "ema_coef": {"lo": 0.01, "hi": 1.0, "log": True},
        "up_ratio": {"lo": 0.3, "hi": 1.0},
        "down_ratio": {"lo": 0.0, "hi": 0.9, "hi_from": ("up_ratio", -0.05)},
        "warmup_rounds": {"lo": 0, "hi": 64},
        "update_rounds": {"lo": 1, "hi": 64, "log": True},
    },
    "analytic": {
        "window_rounds": {"lo": 4, "hi": 1024, "log": True},
        "k_min": {"lo": 0, "hi": 4},
        "k_max": {"lo": 1, "hi": 32},
        "a_prior": {"lo": 0.2, "hi": 0.95},
        "c_prior": {"lo": 0.005, "hi": 1.0, "log": True},
        "min_trials": {"lo": 1, "hi": 512, "log": True},
        "update_rounds": {"lo": 1, "hi": 64, "log": True},
    },
    "dspark": {
        # the policy is chosen by the study's config (seed point: seed), not searched; the
        # seed policy's α → k fields are searched only when it is the seed policy
        "policy": {"skip": True},
        "prior_trials": {"lo": 0.5, "hi": 64.0, "log": True, "when": {"policy": ("goodput",)}},
        "a_prior": {"lo": 0.3, "hi": 0.95, "when": {"policy": ("goodput",)}},
        "k_start": {"lo": 1, "hi": 8, "when": {"policy": ("goodput",)}},
        "explore_every": {"lo": 0, "hi": 256, "when": {"policy": ("goodput",)}},
        "cost_forget": {"lo": 0.9, "hi": 0.999, "when": {"policy": ("goodput",)}},
        "memory_rounds": {"lo": 4, "hi": 1024, "log": True, "when": {"policy": ("goodput",)}},
        "goodput_cooldown": {"when": {"policy": ("goodput",)}},
        "replan_rounds": {"lo": 1, "hi": 32, "log": True, "when": {"policy": ("goodput",)}},
        "alpha0": {"lo": 0.3, "hi": 1.5, "when": {"policy": ("seed",)}},
        "k_ref": {"lo": 2.0, "hi": 32.0, "log": True, "when": {"policy": ("seed",)}},
        "k_min": {"lo": 1, "hi": 8, "when": {"policy": ("seed",)}},
        "k_max": {"lo": 2, "hi": 32},
        "k_hysteresis": {"lo": 1, "hi": 4, "when": {"policy": ("seed",)}},
        "tau": {"lo": 0.0, "hi": 0.9},
        "a_target": {"lo": 0.3, "hi": 0.95, "when": {"policy": ("seed",)}},
        "slo_tpot_s": {"skip": True},       # a property of the service, not a knob
        "tpot_source": {"skip": True},      # how TPOT is measured, not a knob
        "span_tokens": {"skip": True},      # a property of the model
        "window_rounds": {"lo": 4, "hi": 512, "log": True},
        "block_tokens": {"lo": 16, "hi": 512, "log": True},
        "snap_tokens": {"lo": 0, "hi": 64, "hi_from": ("block_tokens", -1)},
        "warmup_rounds": {"lo": 0, "hi": 64},
        "min_update_rounds": {"lo": 1, "hi": 32, "log": True},
        "d_filter": {"lo": 0.05, "hi": 1.0, "log": True},
        "anomaly_z": {"lo": 1.0, "hi": 10.0, "log": True, "when": {"anomaly_detector": ("zscore",)}},
        "anomaly_sigma_floor": {"lo": 0.005, "hi": 0.2, "log": True,
                                "when": {"anomaly_detector": ("zscore",)}},
        "cusum_slack": {"lo": 0.0, "hi": 0.2, "when": {"anomaly_detector": ("cusum",)}},
        "cusum_limit": {"lo": 0.05, "hi": 2.0, "log": True,
                        "when": {"anomaly_detector": ("cusum",)}},
        "baseline_ema": {"lo": 0.02, "hi": 0.8, "log": True,
                         "when": {"anomaly_detector": ("zscore", "cusum")}},
        "baseline_min_blocks": {"lo": 1, "hi": 16, "when": {"anomaly_detector": ("zscore", "cusum")}},
        "anomaly_action": {"when": {"anomaly_detector": ("zscore", "cusum")}},
        "recovery_blocks": {"lo": 1, "hi": 16, "when": {"anomaly_detector": ("zscore", "cusum")}},
        "lossy_limit": {"lo": 0.005, "hi": 0.5, "log": True},
        "beta_raise": {"lo": 0.01, "hi": 0.29,
                       "when": {"anomaly_action": ("raise_beta",),
                                "anomaly_detector": ("zscore", "cusum")}},
        "cooldown_rounds": {"lo": 1, "hi": 64, "log": True},
    },
    "clairvoyant": {
        "k_max": {"lo": 1, "hi": 32},
        "k_start": {"lo": 1, "hi": 16},
        "cost_forget": {"lo": 0.9, "hi": 1.0},
    },
}

TABLE["rate-oracle"] = TABLE["dspark"]  # the same config, told the true rates

#: The seed document's starting point (α = 0.8, β = 0.85 with threshold verification).
SEED_POINT: dict[str, dict[str, Any]] = {
    "dspark": {"policy": "seed", "mode": "threshold", "alpha0": 0.8, "beta0": 0.85},
}


@dataclass(frozen=True)
class Dim:
    """One tuned parameter."""
    name: str
    kind: str                                  # "float" | "int" | "categorical"
    lo: float | None = None
    hi: float | None = None
    log: bool = False
    choices: tuple = ()
    zero_switch: bool = False                  # also a "<name>:on" categorical; off -> 0
    when: tuple[tuple[str, tuple], ...] = ()   # suggested only when these fields have these values
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


def _is_gain(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("kp", "ki", "kd", "gamma") or leaf.endswith(("_kp", "_ki", "_kd"))


def _threshold_only(name: str, doc: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    d = doc.lower()
    return leaf.startswith("beta") or "threshold mode" in d or "threshold-mode" in d


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


def space(controller: str) -> list[Dim]:
    """The tuned dimensions of ``controller``, ordered so every reference comes first."""
    cls = controller_config_class(controller)
    table = TABLE.get(controller, {})
    leaves = _fields(cls)
    names = {n for n, _, _ in leaves}
    unknown = sorted(set(table) - names)
    if unknown:  # a stale table entry is a bug in this file, not a user error
        raise KeyError(f"tuning table of '{controller}' names unknown fields {unknown}")
    dflt = {n: _default(f) for n, f, _ in leaves}
    mode_field = next((n for n, f, _ in leaves if n.rsplit(".", 1)[-1] == "mode"
                       and "threshold" in (f.metadata.get("choices") or ())), None)
    dims: list[Dim] = []
    for name, f, tp in leaves:
        spec = table.get(name, {})
        if spec.get("skip"):
            continue
        m = f.metadata
        doc = m.get("doc", "")
        when = dict(spec.get("when", {}))
        if mode_field and name != mode_field and _threshold_only(name, doc):
            when.setdefault(mode_field, ("threshold",))
        common = {"name": name, "doc": doc, "when": tuple(sorted(when.items()))}
        choices = spec.get("choices") or (tuple(dflt[spec["choices_from"]])
                                          if "choices_from" in spec else m.get("choices"))
        if choices:
            dims.append(Dim(kind="categorical", choices=tuple(choices), **common))
            continue
        if tp is bool:
            dims.append(Dim(kind="categorical", choices=(False, True), **common))
            continue
        if tp not in (int, float):
            continue
        lo = spec.get("lo", m.get("lo"))
        hi = spec.get("hi", m.get("hi"))
        if lo is None or hi is None:
            continue
        zero_switch = False
        log = spec.get("log")
        if _is_gain(name) and "lo" not in spec:
            zero_switch = lo <= 0
            lo, hi = max(lo, GAIN_RANGE["lo"]), min(hi, GAIN_RANGE["hi"])
            log = True if log is None else log
        if log is None:
            log = lo > 0 and hi / lo >= 100
        lo_from, hi_from = spec.get("lo_from"), spec.get("hi_from")
        leaf = name.rsplit(".", 1)[-1]
        pre = name[: len(name) - len(leaf)]
        if leaf.endswith(("_min", "_max")) and not (lo_from or hi_from):
            stem = leaf[:-4]
            anchor = pre + stem + "0"
            if anchor in names and not table.get(anchor, {}).get("skip"):
                if leaf.endswith("_min"):
                    hi_from = (anchor, 0)
                else:
                    lo_from = (anchor, 0)
            elif leaf.endswith("_max") and pre + stem + "_min" in names:
                lo_from = (pre + stem + "_min", 0)
        dims.append(Dim(kind="int" if tp is int else "float", lo=lo, hi=hi, log=bool(log),
                        zero_switch=zero_switch, lo_from=lo_from, hi_from=hi_from, **common))
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


def suggest_params(trial: Any, controller: str, fixed: dict[str, Any] | None = None) -> dict:
    """Suggest every active dimension on ``trial``; returns the flat config values set
    (tuned and ``fixed`` ones; everything else keeps its default)."""
    fixed = dict(fixed or {})
    values = {**defaults(controller), **fixed}
    chosen = dict(fixed)
    for d in space(controller):
        if d.name in fixed or not _active(d, values):
            continue
        if d.kind == "categorical":
            v = trial.suggest_categorical(d.name, list(d.choices))
        else:
            lo, hi = _bounds(d, values)
            if d.zero_switch and not trial.suggest_categorical(d.name + ON, [False, True]):
                v = 0.0 if d.kind == "float" else 0
            elif d.kind == "int":
                v = trial.suggest_int(d.name, int(lo), int(hi), log=d.log and lo > 0)
            else:
                v = trial.suggest_float(d.name, float(lo), float(hi), log=d.log and lo > 0)
        values[d.name] = v
        chosen[d.name] = v
    return chosen


def suggest_config(trial: Any, controller: str, fixed: dict[str, Any] | None = None) -> Any:
    """Map an Optuna trial (or ``FixedTrial``) to a checked config of ``controller``.

    ``fixed`` pins dotted fields (e.g. ``{"mode": "threshold"}``): they are not suggested,
    and fields conditional on them follow the pinned value.
    """
    return make_config(controller, unflatten(suggest_params(trial, controller, fixed)),
                       source=f"tuning space of '{controller}'")


def params_to_config(controller: str, params: dict[str, Any],
                     fixed: dict[str, Any] | None = None) -> Any:
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


def config_to_params(controller: str, config: Any = None,
                     fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Trial params that reproduce ``config`` (instance, mapping of overrides, or None for
    defaults): what :func:`optuna.Study.enqueue_trial` needs. A value outside the tuned
    range is a ``ValueError`` (the space must contain it)."""
    if config is None or isinstance(config, dict):
        values = {**defaults(controller), **flatten(unflatten(dict(config or {})))}
        make_config(controller, unflatten(values))      # the point itself must be valid
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
    return [{"param": d.name, "kind": d.kind, "lo": d.lo, "hi": d.hi, "log": d.log,
             "choices": d.choices or None, "zero_switch": d.zero_switch,
             "when": dict(d.when) or None} for d in space(controller)]


__all__ = [
    "SEED_POINT",
    "TABLE",
    "Dim",
    "config_to_params",
    "defaults",
    "describe_space",
    "params_to_config",
    "space",
    "start_points",
    "suggest_config",
    "suggest_params",
]
