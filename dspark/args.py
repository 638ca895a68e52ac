"""Small argument helpers shared by several subcommands."""

from __future__ import annotations

import tomllib

from control.errors import DSparkError


def parse_sets(items: list[str], flag: str = "--set") -> dict:
    """``["a.b=3"]`` -> ``{"a.b": 3}``: each value parsed as TOML, else kept as text."""
    out = {}
    for item in items:
        if "=" not in item:
            raise DSparkError(f"{flag} {item!r}: expected KEY=VALUE")
        key, val = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {val}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = val
    return out
