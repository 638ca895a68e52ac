"""``dspark real trace``: prompt sets, timed engine runs and greedy position traces.

- :func:`make_prompts`: a deterministic prompt set of a workload (``code`` / ``prose`` windows of
  the corpus' documents of one split, ``random`` token ids for tiny models, or ``file``: the
  user's own prompts, :mod:`real.promptfiles`).
- :func:`run_requests`: the engine serves the prompts one at a time (batch 1) with a fresh
  controller per request; every round becomes a ``RoundRecord`` and every request a row of
  timing (``seconds`` from before prefill to after the last round, ``decode_s`` = the last
  round's ``now_s``, i.e. from the end of prefill).
- :func:`record_positions_full`: the greedy position trace of one prompt (``PositionRecord``):
  run length L(t) of drafter proposals equal to the target's greedy continuation, and the
  drafter's confidences of ALL its proposals up to the horizon (``k_max + 1``). Under greedy
  decoding the drafter's proposals from t depend only on the prefix, so the whole chain —
  including the tokens after its first disagreement — is fixed; keeping all of it lets a replay
  reproduce a confidence stop (τ) exactly even when it fires after the first rejected token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from control.configio import param
from control.errors import DSparkError
from control.types import PositionRecord, RoundRecord, draft_stop
from real.positions import record_positions_full  # noqa: F401  (re-exported: part of the trace API)


@dataclass(frozen=True)
class PromptSetConfig:
    # code completion is the first validation workload.
    workload: str = param(
        "code",
        choices=("code", "prose", "mixed", "random", "file"),
        doc="prompt source (mixed: code and prose prompts alternating; file: the prompts of path)",
    )
    # a .jsonl file (a prompt per record), another file (a prompt per line) or a folder of
    # documents windowed by real.promptfiles' rule; relative paths: the config file's folder.
    path: str = param("", doc="workload = 'file': prompt file or folder")
    # held-out text: the models never trained on the test split.
    split: str = param("test", choices=("train", "val", "test"), doc="corpus split")
    # 8 prompts: ~1000 generated tokens per run, stable totals in a short run.
    n_prompts: int = param(8, lo=1, hi=100_000, doc="prompts in the set")
    # prompts of 48-192 tokens: a few lines of context to a page.
    prompt_tokens_min: int = param(48, lo=2, hi=1 << 16, doc="shortest prompt")
    prompt_tokens_max: int = param(192, lo=2, hi=1 << 16, doc="longest prompt")
    # 128 new tokens: a function body or a paragraph.
    max_new_tokens: int = param(128, lo=1, hi=1 << 16, doc="tokens generated per prompt")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of the prompt choice")


def make_prompts(
    cfg: PromptSetConfig, tokenizer=None, vocab_size: int | None = None
) -> list[list[int]]:
    if cfg.prompt_tokens_min > cfg.prompt_tokens_max:
        raise DSparkError(
            f"prompt_tokens_min {cfg.prompt_tokens_min} > prompt_tokens_max {cfg.prompt_tokens_max}"
        )
    if cfg.workload == "file":
        from real.promptfiles import file_prompts

        if not cfg.path:
            raise DSparkError("a 'file' prompt set needs path (a prompt file or folder)")
        return file_prompts(
            cfg.path,
            tokenizer,
            cfg.n_prompts,
            cfg.prompt_tokens_min,
            cfg.prompt_tokens_max,
            cfg.seed,
        )
    rng = np.random.default_rng(cfg.seed)
    lens = rng.integers(cfg.prompt_tokens_min, cfg.prompt_tokens_max + 1, cfg.n_prompts)
    if cfg.workload == "random":
        if not vocab_size:
            raise DSparkError("a 'random' prompt set needs the vocabulary size")
        return [rng.integers(0, vocab_size, int(n)).tolist() for n in lens]
    if tokenizer is None:
        raise DSparkError(f"a '{cfg.workload}' prompt set needs the tokenizer")
    if cfg.workload == "mixed":  # code, prose, code, ... (the code half first when n is odd)
        import dataclasses

        n_code = (cfg.n_prompts + 1) // 2
        code = make_prompts(dataclasses.replace(cfg, workload="code", n_prompts=n_code), tokenizer)
        prose = (
            make_prompts(
                dataclasses.replace(cfg, workload="prose", n_prompts=cfg.n_prompts - n_code),
                tokenizer,
            )
            if cfg.n_prompts > n_code
            else []
        )
        return [p for pair in zip(code, prose + [None]) for p in pair if p is not None]
    from real.corpus import documents

    docs = documents(cfg.workload, cfg.split)
    order = rng.permutation(len(docs))
    out: list[list[int]] = []
    for i in order.tolist():
        if len(out) == cfg.n_prompts:
            break
        ids = tokenizer.encode(docs[i]).ids
        P = int(lens[len(out)])
        if len(ids) < P:
            continue
        start = int(rng.integers(0, len(ids) - P + 1))
        out.append(ids[start : start + P])
    if len(out) < cfg.n_prompts:
        raise DSparkError(
            f"workload '{cfg.workload}' ({cfg.split}) has only {len(out)} documents "
            f"of >= {cfg.prompt_tokens_min} tokens; {cfg.n_prompts} prompts asked"
        )
    return out


@dataclass
class RequestRun:
    request_id: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    decode_s: float
    rounds: int
    tokens: list


def request_rows(reqs: list[RequestRun], **extra) -> list[dict]:
    """``requests.csv`` rows of served requests (``extra`` columns first, e.g. the controller)."""
    return [
        {
            **extra,
            "request_id": q.request_id,
            "prompt_tokens": q.prompt_tokens,
            "output_tokens": q.output_tokens,
            "seconds": q.seconds,
            "decode_s": q.decode_s,
            "rounds": q.rounds,
        }
        for q in reqs
    ]


def run_requests(
    engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    make_ctrl: Callable[[], object],
    label: str = "",
    first_id: int = 0,
) -> tuple[list[RoundRecord], list[RequestRun]]:
    """Serve ``prompts`` one at a time; a fresh controller per request (as the simulator)."""
    records: list[RoundRecord] = []
    reqs: list[RequestRun] = []
    for i, p in enumerate(prompts):
        ctrl = make_ctrl()
        g = engine.generate(p, max_new_tokens, ctrl, request_id=first_id + i)
        recs = [r if not label else _relabel(r, label) for r in g.records]
        records.extend(recs)
        reqs.append(
            RequestRun(
                first_id + i,
                len(p),
                len(g.tokens),
                g.seconds,
                recs[-1].now_s if recs else 0.0,
                len(recs),
                g.tokens,
            )
        )
    return records, reqs


def _relabel(r: RoundRecord, label: str) -> RoundRecord:
    import dataclasses

    return dataclasses.replace(r, controller=label)


def replay_accepted(
    positions: list[PositionRecord], ks: list[int], taus: list[float], k_cap: int, length: int
) -> list[tuple[int, int]]:
    """(drafted, accepted) of the rounds whose decisions were ``ks``/``taus``, predicted from a
    position trace the way the engine would run them (k cut at ``k_cap`` and at the length)."""
    pos, out = 0, []
    for k, tau in zip(ks, taus):
        if pos >= length:
            break
        r = positions[pos]
        kk = draft_stop(r.confidences, max(0, min(k, k_cap, length - pos - 1)), tau)
        n = min(kk, r.run_length)
        out.append((kk, n))
        pos += n + 1
    return out
