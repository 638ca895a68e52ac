"""The process table, read from /proc: what the fault tests look for after a kill."""

from __future__ import annotations

from pathlib import Path


def parents() -> dict[int, int]:
    """pid -> parent pid of every process in /proc."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    return {c for c, p in parents().items() if p == pid}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    table, found, todo = parents(), set(), [pid]
    while todo:
        p = todo.pop()
        for c, parent in table.items():
            if parent == p and c not in found:
                found.add(c)
                todo.append(c)
    return found
