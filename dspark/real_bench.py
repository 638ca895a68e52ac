"""``dspark real bench``: tokens/s of target-only decoding vs the engine with every controller
(and Hugging Face assisted generation when the ``bench`` extra is installed); writes a run
folder of kind "real" (rounds.csv, results.csv, summary.json, config.toml)."""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import add_out_args, run_folder


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args, add_tp_args

    p = subparsers.add_parser(
        "bench", help="benchmark the engine's controllers (batch 1)", description=__doc__
    )
    add_out_args(p, "real-bench")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--workload", choices=("code", "prose", "mixed"), default=None)
    p.add_argument(
        "--prompt-file",
        default=None,
        metavar="PATH",
        help="your own prompts: a file (one per line), a .jsonl (one per record) or a folder "
        "of documents (windowed); instead of --workload",
    )
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face assisted generation")
    p.add_argument(
        "--quality-betas",
        default=None,
        metavar="'B1 B2 ...'",
        help="also measure threshold verification's quality change at these β",
    )
    p.add_argument(
        "--drafters",
        default=None,
        metavar="'D1 D2 ...'",
        help="bench these drafters side by side in one run (conv tf ngram "
        "ngram+conv ngram+tf); methods are named drafter/controller",
    )
    add_engine_args(p)
    add_tp_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """``_run`` on one process, or on ``--tp N`` ranks (``real.tp``: rank 0 prints and writes)."""
    from real.tp import run_sharded

    return run_sharded(args, _run, ("out",))


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dspark.cmd_real import engine_flags
    from real.bench import bench_main, summary_lines

    overrides = {
        k: v
        for k, v in {
            "prompts": args.prompts,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "workload": args.workload,
            "prompt_file": args.prompt_file,
            "threads": args.threads,
            "quality_betas": args.quality_betas,
            "drafters": args.drafters,
        }.items()
        if v is not None
    }
    if args.no_hf or args.tp > 1:  # HF's model is not sharded: no assisted generation under TP
        overrides["hf"] = False
    out = Path(run_folder(args.out, args.overwrite, "real-bench"))
    summary = bench_main(args.config, args.checkpoints, out, engine_flags(args), overrides)
    print("\n".join(summary_lines(summary, out)))
    return 0 if summary else 1
