"""Typed configs: TOML into frozen dataclasses, checked, and back to TOML.

Every component of the lab has one frozen config dataclass. Fields declare their allowed range
or choices with :func:`param`; :func:`from_mapping` checks every key, type and value and raises a
:class:`~control.errors.ConfigError` whose single line names the file, the dotted key and what is
allowed. :func:`to_toml` writes a resolved config back so it can be saved next to every result.

Only the standard library is used here (``tomllib``), so ``control`` stays pure; writing TOML
uses ``tomli_w`` when it is present and a small fallback writer otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from control.errors import ConfigError

T = TypeVar("T")

_MISSING = dataclasses.MISSING


def param(
    default: Any = _MISSING,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple | None = None,
    doc: str = "",
    default_factory: Any = _MISSING,
    tune: bool | tuple[float, float] = False,
    log: bool = False,
    switch: bool = False,
    when: dict[str, tuple] | None = None,
    lo_from: tuple[str, float] | None = None,
    hi_from: tuple[str, float] | None = None,
    choices_from: str | None = None,
) -> Any:
    """A dataclass field with an allowed range (``lo <= v <= hi``) or a set of choices.

    The tuning search space (:mod:`tuning.space`) reads the other keys, and nothing else:

    - ``tune``: ``(lo, hi)`` for a number, searched in that range (inside the allowed one);
      ``True`` for a field with ``choices`` (or ``choices_from``) or a ``bool``, searched over
      those values; ``False`` (default): not searched, it keeps its value;
    - ``log``: search the range on a log scale;
    - ``switch``: also an on/off switch ``<name>:on``; off = exactly 0, the range only when on;
    - ``when``: ``{field: allowed values}``: searched only while those fields have those values;
    - ``lo_from`` / ``hi_from``: ``(field, offset)``: the range starts (ends) at that field's
      drawn value + offset, so ordered pairs stay ordered;
    - ``choices_from``: a tuple field whose default lists the choices.
    """
    if isinstance(tune, tuple):
        if (
            len(tune) != 2
            or not tune[0] <= tune[1]
            or (lo is not None and tune[0] < lo)
            or (hi is not None and tune[1] > hi)
        ):
            raise ValueError(f"param: tuned range {tune} outside the allowed [{lo}, {hi}]")
    meta = {
        "lo": lo,
        "hi": hi,
        "choices": choices,
        "doc": doc,
        "tune": tune,
        "log": log,
        "switch": switch,
        "when": when or {},
        "lo_from": lo_from,
        "hi_from": hi_from,
        "choices_from": choices_from,
    }
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def allowed_text(f: dataclasses.Field) -> str:
    """Human text of what a field allows, e.g. ``[0.3, 1.5]`` or ``one of 'a', 'b'``."""
    m = f.metadata
    if m.get("choices"):
        return "one of " + ", ".join(repr(c) for c in m["choices"])
    lo, hi = m.get("lo"), m.get("hi")
    if lo is not None and hi is not None:
        return f"[{lo}, {hi}]"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return "any value of its type"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against annotation ``tp``; return the value converted (int->float etc.)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(
                f"{where} = {value!r}: allowed one of "
                + ", ".join(repr(a) for a in typing.get_args(tp))
            )
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {value!r}: expected a list")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} = {value!r}: expected a table")
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table [{where}], got {value!r}")
        return _build(tp, value, where)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where} = {value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} = {value!r}: expected a number")
        v = float(value)
        if math.isnan(v):
            raise ConfigError(f"{where} = nan: expected a number")
        return v
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} = {value!r}: expected a string")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where} = {value!r}: expected {_type_name(tp)}")
    return value


def _check_field(f: dataclasses.Field, value: Any, where: str) -> None:
    m = f.metadata
    if value is None:
        return
    if m.get("choices") and value not in m["choices"]:
        raise ConfigError(f"{where} = {value!r} is not allowed; allowed {allowed_text(f)}")
    vals = value if isinstance(value, tuple) else (value,)
    for v in vals:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            lo, hi = m.get("lo"), m.get("hi")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise ConfigError(f"{where} = {value!r} is out of range; allowed {allowed_text(f)}")


def _build(cls: type[T], data: dict, prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    # T is unbounded, so mypy cannot see that cls is a dataclass type; every caller passes one
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown key '{key}'; allowed keys: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        where = f"{prefix}.{name}" if prefix else name
        f = fields[name]
        v = _coerce(value, hints[name], where)
        _check_field(f, v, where)
        kwargs[name] = v
    try:
        obj = cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}: {e}" if prefix else str(e)) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None
    return obj


def from_mapping(cls: type[T], data: dict | None, source: str = "<config>", prefix: str = "") -> T:
    """Build ``cls`` from a plain mapping; errors name ``source`` and the dotted key."""
    try:
        return _build(cls, dict(data or {}), prefix)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def parse_sets(items: list[str], flag: str = "--set") -> dict:
    """``["a.b=3"]`` -> ``{"a.b": 3}``: each value parsed as TOML, else kept as text."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        key, val = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {val}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = val
    return out


def read_toml(path: str | Path) -> dict:
    """Parse a TOML file; a missing file or a syntax error is a one-line ConfigError."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: malformed TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None


def load(cls: type[T], path: str | Path, section: str | None = None) -> T:
    """Load a TOML file (or one ``[section]`` of it) into ``cls``."""
    data = read_toml(path)
    if section is not None:
        data = data.get(section, {})
    return from_mapping(cls, data, source=str(path), prefix=section or "")


def to_dict(obj: Any) -> dict:
    """A plain, TOML-ready dict of a (nested) config dataclass; ``None`` fields are omitted."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        out[f.name] = v
    return out


def to_toml(obj: Any) -> str:
    """TOML text of a config dataclass (or a dict of them / plain values)."""
    data = (
        to_dict(obj)
        if dataclasses.is_dataclass(obj)
        else {k: (to_dict(v) if dataclasses.is_dataclass(v) else v) for k, v in obj.items()}
    )
    try:
        import tomli_w

        return tomli_w.dumps(data)
    except ImportError:  # pragma: no cover - tomli_w is a declared dependency
        return _dumps(data)


def _dumps(data: dict, prefix: str = "") -> str:  # pragma: no cover - fallback writer
    import json

    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = f"{prefix}.{k}" if prefix else k
        text += f"\n[{name}]\n" + _dumps(v, name)
    return text


def write_toml(obj: Any, path: str | Path) -> Path:
    """Write a resolved config next to a result."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(to_toml(obj))
    return p


def describe(cls: type) -> list[tuple[str, Any, str, str]]:
    """(name, default, allowed, doc) for every field: used by docs and ``dspark config``."""
    rows = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not _MISSING
            else (f.default_factory() if f.default_factory is not _MISSING else None)
        )
        rows.append((f.name, default, allowed_text(f), f.metadata.get("doc", "")))
    return rows
