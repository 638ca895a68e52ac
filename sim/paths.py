"""Resolving data paths of a scenario: relative to the scenario file, else under a ``shared/data``
folder found by searching upward (CI clones the repo with ``shared/`` as its sibling)."""

from __future__ import annotations

from pathlib import Path

from control.errors import ConfigError


def resolve_path(p: str, base: Path, what: str) -> str:
    path = Path(p).expanduser()
    if path.is_absolute():
        if not path.exists():
            raise ConfigError(f"{what}: file not found: {path}")
        return str(path)
    cands = [base / path]
    rel = Path(*[q for q in path.parts if q not in ("..", ".")])
    tail = rel.parts[2:] if rel.parts[:2] == ("shared", "data") else rel.parts
    for anc in [base, *base.resolve().parents, Path.cwd(), *Path.cwd().resolve().parents]:
        cands.append(anc / "shared" / "data" / Path(*tail))
    for c in cands:
        if c.exists():
            return str(c.resolve())
    raise ConfigError(
        f"{what}: file not found: {cands[0]} (also looked for shared/data/"
        f"{Path(*tail)} in the folders above)"
    )
