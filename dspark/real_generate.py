"""``dspark real generate``: speculative decoding of one prompt with a chosen controller."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args, add_tp_args

    p = subparsers.add_parser("generate", help="generate text for one prompt", description=__doc__)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--controller", default="fixed", help="controller name (default: fixed)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stream", action="store_true", help="print text as each round commits it")
    p.add_argument("--trace", default=None, help="write the round trace to this CSV")
    add_engine_args(p)
    add_tp_args(p)
    return p


def stats_line(n: int, records: list, seconds: float) -> str:
    """The one stats line of a generation (streamed or not)."""
    acc = sum(r.accepted for r in records)
    return (
        f"# {n} tokens in {len(records)} rounds, {n / max(seconds, 1e-12):.1f} tokens/s, "
        f"mean accepted length {n / max(1, len(records)):.2f}, drafted accepted "
        f"{acc}/{sum(r.drafted for r in records)}"
    )


def run(args: argparse.Namespace) -> int:
    """``_run`` on one process, or on ``--tp N`` ranks (``real.tp``: rank 0 prints and writes)."""
    from real.tp import run_sharded

    return run_sharded(args, _run, ("trace",))


def _run(args: argparse.Namespace) -> int:
    import pandas as pd
    import torch

    from control.types import records_to_columns
    from dspark.cmd_real import controller_from_args, engine_config
    from real.runtime import build_engine, encode

    torch.set_num_threads(args.threads or 1)
    cfg = engine_config(args)
    ctrl = controller_from_args(args.controller, args.config)
    engine = build_engine(cfg, args.checkpoints)
    ids = encode(engine, args.prompt)
    records: list = []
    t0 = time.perf_counter()
    toks: list[int] = []
    if args.stream:  # one generation: the text as each round commits it, then the same stats
        shown = ""
        sys.stdout.write(args.prompt)
        for piece in engine.stream(ids, args.max_new_tokens, ctrl, records=records):
            toks.extend(piece)
            text = engine.tokenizer.decode(toks)
            if text.endswith("\ufffd"):  # byte-level BPE split a character: wait for the rest
                continue
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
        text = engine.tokenizer.decode(toks)
        sys.stdout.write(text[len(shown) :] + "\n")
        seconds = time.perf_counter() - t0
    else:
        gen = engine.generate(ids, args.max_new_tokens, ctrl)
        records, toks, seconds = gen.records, gen.tokens, gen.seconds
        print(args.prompt + gen.text)
    sys.stdout.flush()
    print(stats_line(len(toks), records, seconds), file=sys.stderr)
    if args.trace:
        pd.DataFrame(records_to_columns(records)).to_csv(args.trace, index=False)
    return 0
