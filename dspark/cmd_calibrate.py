"""``dspark calibrate vllm-metrics BEFORE AFTER`` / ``dspark calibrate sglang-server-info FILE``:
a scenario's ``[acceptance]`` table from a real server's metrics.

``vllm-metrics``: two scrapes of vLLM's ``/metrics`` (Prometheus text, taken before and after
the traffic of interest) give the per-position conditional acceptance and the mean acceptance
length (``model = "curve"``); ``--requests FILE.jsonl`` (vLLM's per-request
``metrics.speculative_decoding`` summaries, one a line) adds the per-request spread.
``sglang-server-info``: SGLang's ``/server_info`` JSON gives ``avg_spec_accept_length`` and the
i.i.d. rate that explains it (``model = "iid"``). The table is printed, or written with
``--out``; paste it into a scenario (or use the file's ``[acceptance]`` table as is).
"""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = command_parser(
        subparsers, "calibrate", "a scenario's acceptance from vLLM or SGLang metrics", __doc__
    )
    sub = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    v = sub.add_parser(
        "vllm-metrics",
        help="two Prometheus scrapes of vLLM's /metrics",
        description="Per-position acceptance from the spec-decode counters between two scrapes.",
    )
    v.add_argument("before", metavar="BEFORE", help="scrape taken before the traffic")
    v.add_argument("after", metavar="AFTER", help="scrape taken after it")
    v.add_argument(
        "--requests",
        default=None,
        metavar="FILE.jsonl",
        help="per-request metrics.speculative_decoding summaries (the per-request spread)",
    )
    v.add_argument("--model", default=None, help="model_name label to read (several served)")
    v.add_argument("--out", default=None, metavar="FILE.toml", help="write the table here")
    s = sub.add_parser(
        "sglang-server-info",
        help="SGLang's /server_info JSON",
        description="The i.i.d. acceptance rate behind avg_spec_accept_length.",
    )
    s.add_argument("file", metavar="FILE.json", help="/server_info response")
    s.add_argument(
        "--num-steps",
        type=int,
        default=None,
        metavar="K",
        help="speculative_num_steps behind the average (default: the file's)",
    )
    s.add_argument("--out", default=None, metavar="FILE.toml", help="write the table here")
    return p


def _emit(table: dict, lines: list[str], out: str | None) -> None:
    from pathlib import Path

    from control.configio import to_toml

    text = "".join(f"# {line}\n" for line in lines) + to_toml(table)
    if out is None:
        print(text, end="")
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print("\n".join(lines))
    print(f"wrote {out}")


def run(args: argparse.Namespace) -> int:
    from control.errors import DSparkError

    if args.source == "vllm-metrics":
        from sim.metrics_import import calibrate_vllm

        cal = calibrate_vllm(args.before, args.after, args.requests, args.model)
        c = cal.counts
        assert c is not None
        lines = [
            (
                f"vLLM {args.before} -> {args.after}: {c.drafts:g} drafts, {c.draft_tokens:g} "
                f"drafted, {c.accepted:g} accepted; mean acceptance length "
                f"{cal.mean_acceptance_length:.4f}"
            ),
            "conditional acceptance by position: "
            + ", ".join(f"{r:.4f}" for r in cal.position_rates),
            *cal.notes,
        ]
        _emit(cal.table(), lines, args.out)
        return 0
    from sim.metrics_import import calibrate_sglang

    if args.num_steps is not None and args.num_steps < 1:
        raise DSparkError(f"--num-steps {args.num_steps}: must be >= 1")
    rate, length, k = calibrate_sglang(args.file, args.num_steps)
    lines = [
        (
            f"SGLang {args.file}: avg_spec_accept_length {length:.4f} at speculative_num_steps {k} "
            f"-> i.i.d. acceptance rate {rate:.4f}"
        ),
        "an average over the server's life: with adaptive tiers it mixes several num_steps",
    ]
    _emit({"acceptance": {"model": "iid", "rate": rate}}, lines, args.out)
    return 0
