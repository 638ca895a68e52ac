"""Offline text corpora: the running interpreter's standard library (code) and its prose.

The *code* workload is the stdlib's ``.py`` source without its tests; the *prose* workload is the
docstrings and comments extracted from the same files (``ast`` + ``tokenize``). Both are split into
train / val / test by a hash of the file's path relative to the stdlib root, so a file and its prose
land in the same split. The corpus depends on the Python version; :func:`corpus_hash` names it.
"""

from __future__ import annotations

import ast
import hashlib
import io
import sysconfig
import tokenize
from functools import lru_cache
from pathlib import Path

from control.errors import DSparkError

SPLITS = ("train", "val", "test")
WORKLOADS = ("code", "prose")
#: path components never read: tests, installed packages, caches.
SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "ensurepip"}
)
#: percent of files per split (hash buckets 0..99): train < 90 <= val < 95 <= test.
TRAIN_PCT, VAL_PCT = 90, 95


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """Deterministic split of a file from its path relative to the stdlib root."""
    bucket = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:4], "big") % 100
    return "train" if bucket < TRAIN_PCT else "val" if bucket < VAL_PCT else "test"


@lru_cache(maxsize=2)
def stdlib_files(root: str | None = None) -> tuple[tuple[str, str], ...]:
    """Sorted ``(relpath, source)`` of the stdlib's non-test ``.py`` files."""
    base = Path(root) if root else stdlib_root()
    if not base.is_dir():
        raise DSparkError(f"standard library not found at {base}")
    out = []
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base).as_posix()
        parts = rel.split("/")
        if any(part in SKIP_DIRS or part.startswith("test_") for part in parts):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            out.append((rel, text))
    if not out:
        raise DSparkError(f"no Python source found under {base}")
    return tuple(out)


def prose_of(source: str) -> str:
    """Docstrings and comments of one source file, as plain text paragraphs."""
    pieces: list[str] = []
    try:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 20:
                    pieces.append(doc.strip())
    except (SyntaxError, ValueError):
        pass
    comment: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                text = tok.string.lstrip("#").strip()
                if text and not text.startswith("!") and "coding" not in text[:12]:
                    comment.append(text)
                    continue
            if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and comment:
                if sum(len(c) for c in comment) > 40:
                    pieces.append(" ".join(comment))
                comment = []
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return "\n\n".join(pieces)


def documents(workload: str, split: str, root: str | None = None) -> list[str]:
    """Texts of one workload and split (one per source file, empty ones dropped)."""
    if workload not in WORKLOADS:
        raise DSparkError(f"unknown workload '{workload}'; allowed: {', '.join(WORKLOADS)}")
    if split not in SPLITS:
        raise DSparkError(f"unknown split '{split}'; allowed: {', '.join(SPLITS)}")
    docs = []
    for rel, text in stdlib_files(root):
        if split_of(rel) != split:
            continue
        t = text if workload == "code" else prose_of(text)
        if t.strip():
            docs.append(t)
    return docs


def corpus_hash(root: str | None = None) -> str:
    """sha256 over every (relpath, source) of the corpus: names the stdlib version trained on."""
    h = hashlib.sha256()
    for rel, text in stdlib_files(root):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()
