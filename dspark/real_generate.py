"""``dspark real generate``: speculative decoding of one prompt with a chosen controller."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args

    p = subparsers.add_parser("generate", help="generate text for one prompt", description=__doc__)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--controller", default="fixed", help="controller name (default: fixed)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stream", action="store_true", help="print text as each round commits it")
    p.add_argument("--trace", default=None, help="write the round trace to this CSV")
    add_engine_args(p)
    return p


def run(args: argparse.Namespace) -> int:
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
    if args.stream:
        records: list = []
        sys.stdout.write(args.prompt)
        for piece in engine.stream_text(ids, args.max_new_tokens, ctrl):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        gen = engine.generate(ids, args.max_new_tokens, ctrl) if args.trace else None
        records = gen.records if gen else records
    else:
        gen = engine.generate(ids, args.max_new_tokens, ctrl)
        records = gen.records
        print(args.prompt + gen.text)
        n = len(gen.tokens)
        acc = sum(r.accepted for r in records)
        print(
            f"# {n} tokens in {len(records)} rounds, {n / gen.seconds:.1f} tokens/s, "
            f"mean accepted length {n / max(1, len(records)):.2f}, drafted accepted "
            f"{acc}/{sum(r.drafted for r in records)}",
            file=sys.stderr,
        )
    if args.trace:
        pd.DataFrame(records_to_columns(records)).to_csv(args.trace, index=False)
    return 0
