"""``dspark real ...``: the real PyTorch engine on the project's own trained models.

Sub-subcommands live in their own modules (``REAL_SUBCOMMANDS``: name -> module), each with
``add_parser(subparsers) -> parser`` and ``run(args) -> int``; one that cannot be imported is an
error (``dspark.cli.add_subcommands``).
"""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import command_parser

REAL_SUBCOMMANDS = {
    "train": "dspark.real_train",
    "generate": "dspark.real_generate",
    "bench": "dspark.real_bench",
    "profile": "dspark.real_profile",
    "trace": "dspark.real_trace",
    "serve": "dspark.real_serve",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(subparsers, "real", "run the real speculative-decoding engine", __doc__)
    from dspark.cli import add_subcommands

    add_subcommands(
        p.add_subparsers(dest="real_command", metavar="REAL_COMMAND"), REAL_SUBCOMMANDS, "_real_run"
    )
    p.set_defaults(_parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_real_run", None)
    if fn is None:
        args._parser.print_help()
        return 2
    return int(fn(args) or 0)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine options shared by generate / bench (and later profile / trace)."""
    p.add_argument(
        "--config", default=None, help="TOML file with [engine] and [controller.<name>] tables"
    )
    p.add_argument("--checkpoints", default=None, help="checkpoint folder (default: shipped)")
    from real import DRAFTERS

    p.add_argument("--drafter", choices=DRAFTERS, default=None)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument(
        "--target-dtype",
        default=None,
        choices=("auto", "float32", "float64", "bfloat16", "float16"),
        help="target precision (default auto: bfloat16 on CUDA, on a CPU with native bf16 and "
        "at --slots 1; float32 for a batched engine on another CPU)",
    )
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")


def add_tp_args(p: argparse.ArgumentParser) -> None:
    """``--tp N``: the target sharded over N ranks (``real.tp``; spawned here, or torchrun's)."""
    from real.tp_config import TPConfig  # torch-free: building the parser loads no torch

    p.add_argument(
        "--tp",
        type=int,
        default=TPConfig.size,
        metavar="N",
        help="tensor-parallel ranks: spawns N processes on this machine (gloo on cpu, nccl on "
        "cuda), or joins torchrun's group (default 1)",
    )
    p.add_argument(
        "--tp-timeout",
        type=float,
        default=TPConfig.timeout_s,
        metavar="S",
        help=f"process-group timeout in seconds: a dead rank ends the run (default "
        f"{TPConfig.timeout_s:g})",
    )


def engine_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options given on the command line (None: not given)."""
    return {
        "drafter": args.drafter,
        "device": args.device,
        "target_dtype": args.target_dtype,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
    }


def engine_config(args: argparse.Namespace, **overrides: Any):
    """EngineConfig from ``--config``'s [engine] table, then command-line flags."""
    from real.runtime import load_engine_config

    return load_engine_config(args.config, engine_flags(args), **overrides)


def controller_from_args(name: str, config_path: str | None):
    from control.configio import read_toml
    from control.registry import make_controller

    table = None
    if config_path:
        table = read_toml(config_path).get("controller", {}).get(name)
    return make_controller(name, table, source=config_path or "<defaults>")
