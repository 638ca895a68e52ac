"""Prompt sets from the user's own files (``PromptSetConfig(workload="file", path=...)``).

Three sources, by what ``path`` is:

- a ``.jsonl`` file: one prompt per record: a JSON string, or an object with a ``"prompt"`` (else
  ``"text"``) string field; blank lines are skipped;
- any other file: one prompt per non-blank line (the line without its newline; write a literal
  ``\\n`` for a newline inside a prompt: it is decoded, as ``\\t`` and ``\\\\`` are);
- a folder: every file under it (recursively, sorted by relative path; hidden files and folders,
  and files that are not UTF-8 text, are skipped) is a document, and prompts are windows of
  them (the rule below).

Records and lines: the first ``n_prompts`` prompts of at least ``prompt_tokens_min`` tokens, in
file order, each cut to its LAST ``prompt_tokens_max`` tokens (the text nearest to what is
generated next); a file with fewer such prompts is a one-line error that says how many were too
short.

Folder windowing rule (deterministic given ``seed``): the documents of at least
``prompt_tokens_min`` tokens are visited in a seeded random order, cycling when more prompts than
documents are asked; each visit takes one window of a seeded length, uniform in
``[prompt_tokens_min, min(prompt_tokens_max, document length)]``, at a seeded uniform start.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from control.errors import DSparkError

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _unescape(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line) and line[i + 1] in _ESCAPES:
            out.append(_ESCAPES[line[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DSparkError(f"{p}: prompt file not found") from None
    except UnicodeDecodeError:
        raise DSparkError(f"{p}: prompt file is not UTF-8 text") from None
    except OSError as e:
        raise DSparkError(f"{p}: cannot read prompt file: {e}") from None


def read_prompt_texts(path: str | Path) -> tuple[str, list[str]]:
    """``("prompts", texts)`` of a lines or JSONL file, ``("documents", texts)`` of a folder."""
    p = Path(path)
    if p.is_dir():
        docs = []
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p).parts
            if not f.is_file() or any(part.startswith(".") for part in rel):
                continue
            try:
                docs.append(f.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
        if not docs:
            raise DSparkError(f"{p}: prompt folder holds no UTF-8 text file")
        return "documents", docs
    if not p.exists():
        raise DSparkError(f"{p}: prompt file not found")
    text = _read_text(p)
    out: list[str] = []
    if p.suffix.lower() == ".jsonl":
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DSparkError(f"{p}: line {i} is not JSON: {e.msg}") from None
            if isinstance(rec, dict):
                rec = rec.get("prompt", rec.get("text"))
            if not isinstance(rec, str):
                raise DSparkError(
                    f"{p}: line {i}: expected a JSON string or an object with a "
                    f"'prompt' (or 'text') string"
                )
            out.append(rec)
    else:
        out = [_unescape(line) for line in text.splitlines() if line.strip()]
    if not out:
        raise DSparkError(f"{p}: prompt file holds no prompt")
    return "prompts", out


def file_prompts(
    path: str | Path, tokenizer, n: int, lo: int, hi: int, seed: int
) -> list[list[int]]:
    """``n`` prompts (token ids) from ``path`` by the module's rules."""
    if tokenizer is None:
        raise DSparkError("a 'file' prompt set needs the tokenizer (not the tiny models)")
    kind, texts = read_prompt_texts(path)
    ids = [tokenizer.encode(t).ids for t in texts]
    if kind == "prompts":
        ok = [x[-hi:] for x in ids if len(x) >= lo]
        if len(ok) < n:
            raise DSparkError(
                f"{path}: {len(ok)} prompts of >= {lo} tokens ({len(ids) - len(ok)} "
                f"shorter), {n} asked; lower n_prompts or prompt_tokens_min"
            )
        return ok[:n]
    docs = [x for x in ids if len(x) >= lo]
    if not docs:
        raise DSparkError(f"{path}: no document of >= {lo} tokens; lower prompt_tokens_min")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs)).tolist()
    out = []
    for i in range(n):
        d = docs[order[i % len(docs)]]
        length = int(rng.integers(lo, min(hi, len(d)) + 1))
        start = int(rng.integers(0, len(d) - length + 1))
        out.append(d[start : start + length])
    return out
