"""``dspark export BEST_CONFIG.toml --to vllm|sglang``: the server settings that run a config.

Reads the ``[controller.<name>]`` table of a config file (``best_config.toml`` of ``dspark
tune``, or any scenario) and prints what to paste: for vLLM a ``--speculative-config`` JSON
(``num_speculative_tokens``, ``num_speculative_tokens_per_batch_size``, ``enable_adaptive_k``
with its knobs, or ``enable_adaptive_verification``); for SGLang the launch flags and the
``--speculative-adaptive-config`` JSON. A setting the server cannot express is one ``# not
expressible`` line; a controller it cannot run at all (``dspark``'s per-sequence planning) is
one error line, never an approximate JSON.
"""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(
        subparsers, "export", "print a tuned config as vLLM or SGLang settings", __doc__
    )
    p.add_argument("config", metavar="BEST_CONFIG.toml", help="file with a [controller.NAME] table")
    p.add_argument("--to", required=True, choices=("vllm", "sglang"), help="the serving engine")
    p.add_argument(
        "--controller",
        default=None,
        metavar="NAME",
        help="the table to export when the file has several",
    )
    p.add_argument("--json", action="store_true", help="print the JSON object alone")
    return p


def run(args: argparse.Namespace) -> int:
    from tuning.export import load_best_config
    from tuning.peer_export import export_config

    name, cfg = load_best_config(args.config, args.controller)
    out = export_config(name, cfg, args.to)
    print(out.json if args.json else out.text())
    return 0
