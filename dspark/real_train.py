"""``dspark real train``: rebuild tokenizer, target and drafters deterministically (resumable)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train", help="train tokenizer, target and distilled drafters", description=__doc__
    )
    p.add_argument(
        "--work-dir",
        default="runs/real-train",
        help="resumable training state (default: runs/real-train)",
    )
    p.add_argument("--out", default=None, help="checkpoint folder (default: real/checkpoints)")
    p.add_argument("--config", default=None, help="TOML file with a [train] table")
    p.add_argument("--target-steps", type=int, default=None)
    p.add_argument("--drafter-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--feature-drafter",
        action="store_true",
        help="only distil the feature conv drafter from the target in --out (default: the "
        "shipped one) and add it to that folder's manifest",
    )
    p.add_argument("--feat-steps", type=int, default=None)
    p.add_argument(
        "--block-drafter",
        action="store_true",
        help="only distil the block drafter (one forward, a block of tokens, a confidence head) "
        "from the target in --out (default: the shipped one) and add it to that folder's "
        "manifest; settings from the config's [block_train] table",
    )
    p.add_argument("--block-steps", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from control.configio import from_mapping, read_toml
    from real.store import CHECKPOINT_DIR
    from real.train import TrainConfig, run_training

    if args.block_drafter:
        return run_block(args)
    data = dict(read_toml(args.config).get("train", {})) if args.config else {}
    for key in ("target_steps", "drafter_steps", "seed", "threads", "feat_steps"):
        v = getattr(args, key)
        if v is not None:
            data[key] = v
    cfg = from_mapping(TrainConfig, data, source=args.config or "<command line>", prefix="train")
    command = "dspark real train " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    if args.feature_drafter:
        from real.train import train_feature_drafter

        out = Path(args.out) if args.out else CHECKPOINT_DIR
        e = train_feature_drafter(Path(args.work_dir), out, cfg, command.strip())
        e = e["models"]["drafter_feat"]
        print(f"drafter_feat: {e['params']} parameters, validation {e['validation']}")
        return 0
    m = run_training(
        Path(args.work_dir), Path(args.out) if args.out else CHECKPOINT_DIR, cfg, command.strip()
    )
    for name, e in m["models"].items():
        print(f"{name}: {e['params']} parameters, {e['steps']} steps, validation {e['validation']}")
    return 0


def run_block(args: argparse.Namespace) -> int:
    """``--block-drafter``: the block drafter alone, from the [block_train] table and flags."""
    from pathlib import Path

    from control.configio import from_mapping, read_toml
    from real.block_train import BlockTrainConfig, train_block_drafter
    from real.store import CHECKPOINT_DIR

    data = dict(read_toml(args.config).get("block_train", {})) if args.config else {}
    flags = {"steps": args.block_steps, "block_size": args.block_size}
    flags.update(seed=args.seed, threads=args.threads)
    data.update({k: v for k, v in flags.items() if v is not None})
    source = args.config or "<command line>"
    cfg = from_mapping(BlockTrainConfig, data, source=source, prefix="block_train")
    command = "dspark real train " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    out = Path(args.out) if args.out else CHECKPOINT_DIR
    e = train_block_drafter(Path(args.work_dir), out, cfg, command.strip())
    e = e["models"]["drafter_block"]
    print(f"drafter_block: {e['params']} parameters, validation {e['validation']}")
    return 0
