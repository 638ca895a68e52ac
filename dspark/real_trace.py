"""``dspark real trace``: run the engine on a prompt set with a chosen controller and record every
round (``rounds.csv``), every request's timing (``requests.csv``) and the greedy position trace
of every prompt (``positions.csv``: run length and the drafter's confidences from each output
position, sentence ends) — a ``kind = "real"`` run folder (docs/results-format.md)."""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import add_out_args, run_folder


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args

    p = subparsers.add_parser(
        "trace", help="record round and position traces of a prompt set", description=__doc__
    )
    add_out_args(p, "trace")
    p.add_argument("--controller", default="fixed", help="controller name (default: fixed)")
    p.add_argument("--workload", choices=("code", "prose", "random", "file"), default=None)
    p.add_argument(
        "--prompt-file",
        default=None,
        metavar="PATH",
        help="your own prompts (workload file): a file (one per line), a .jsonl (one per "
        "record) or a folder of documents (windowed)",
    )
    p.add_argument("--split", choices=("train", "val", "test"), default=None)
    p.add_argument("--n-prompts", type=int, default=None)
    p.add_argument("--prompt-tokens-min", type=int, default=None)
    p.add_argument("--prompt-tokens-max", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--prompt-seed", type=int, default=None, help="seed of the prompt choice")
    p.add_argument("--no-positions", action="store_true", help="skip the position trace")
    p.add_argument("--tiny", action="store_true", help="tiny random models (no checkpoint)")
    p.add_argument("--k-max", type=int, default=None, help="engine k_max")
    add_engine_args(p)
    return p


def _prompt_config(args: argparse.Namespace) -> Any:
    """The prompt set: ``[prompts]`` of the config, overridden by the command line."""
    from pathlib import Path

    from control.configio import from_mapping, read_toml
    from real.tracing import PromptSetConfig

    data = dict(read_toml(args.config).get("prompts", {})) if args.config else {}
    if data.get("path") and not Path(data["path"]).is_absolute():  # relative to the config
        data["path"] = str(Path(args.config).resolve().parent / data["path"])
    for key in (
        "workload",
        "split",
        "n_prompts",
        "prompt_tokens_min",
        "prompt_tokens_max",
        "max_new_tokens",
    ):
        v = getattr(args, key)
        if v is not None:
            data[key] = v
    if args.prompt_seed is not None:
        data["seed"] = args.prompt_seed
    if args.prompt_file is not None:
        data["workload"], data["path"] = "file", args.prompt_file
    if args.tiny:
        data.setdefault("workload", "random")
    return from_mapping(
        PromptSetConfig, data, source=args.config or "<command line>", prefix="prompts"
    )


def _write_traces(args, out, engine, prompts, pcfg, recs, reqs) -> None:
    """Write ``rounds.csv``, ``requests.csv`` and (unless ``--no-positions``) ``positions.csv``."""
    import pandas as pd

    from control.types import PositionRecord, records_to_columns
    from real.tracing import record_positions_full, request_rows

    pd.DataFrame(records_to_columns(recs)).to_csv(out / "rounds.csv", index=False)
    pd.DataFrame(request_rows(reqs, controller=args.controller)).to_csv(
        out / "requests.csv", index=False
    )
    if not args.no_positions:
        pos = []
        for i, p in enumerate(prompts):
            pos.extend(record_positions_full(engine, p, pcfg.max_new_tokens, request_id=i)[0])
        pd.DataFrame(records_to_columns(pos, PositionRecord)).to_csv(
            out / "positions.csv", index=False
        )


def _write_summary(args, out, pcfg, ecfg, ctrl_cfg, recs, reqs) -> dict:
    """Write ``summary.json`` and ``config.toml``; return the summary row."""
    import json

    from control.configio import to_dict, write_toml
    from validate.metrics import real_metrics

    m = real_metrics(recs, reqs)
    row = {
        "controller": args.controller,
        "tokens_per_s": m["throughput_tokens_per_s"],
        "mean_accepted_length": m["mean_accepted_length"],
        "acceptance_rate": m["acceptance_rate"],
        "tpot_p50_s": m["tpot_p50_s"],
        "tpot_p99_s": m["tpot_p99_s"],
        "requests": len(reqs),
        "rounds": len(recs),
        "workload": pcfg.workload,
    }
    (out / "summary.json").write_text(json.dumps({"kind": "real", "rows": [row]}, indent=1))
    write_toml(
        {
            "engine": ecfg.record(),
            "prompts": to_dict(pcfg),
            "controller": {args.controller: to_dict(ctrl_cfg)},
        },
        out / "config.toml",
    )
    return row


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from dspark.cmd_real import controller_from_args
    from dspark.real_profile import build
    from real.tracing import make_prompts, run_requests

    torch.set_num_threads(args.threads or 1)
    pcfg = _prompt_config(args)
    engine, ecfg = build(args, stop_at_eot=False)
    ctrl = controller_from_args(args.controller, args.config)
    ctrl_cfg = ctrl.config
    vocab = engine.target.embed_tokens.num_embeddings
    prompts = make_prompts(pcfg, engine.tokenizer, vocab)
    from control.registry import make_controller

    recs, reqs = run_requests(
        engine,
        prompts,
        pcfg.max_new_tokens,
        lambda: make_controller(args.controller, ctrl_cfg),
        args.controller,
    )
    out = Path(run_folder(args.out, args.overwrite, "trace"))
    out.mkdir(parents=True, exist_ok=True)
    _write_traces(args, out, engine, prompts, pcfg, recs, reqs)
    row = _write_summary(args, out, pcfg, ecfg, ctrl_cfg, recs, reqs)
    print(
        f"{len(reqs)} requests, {len(recs)} rounds: {row['tokens_per_s']:.1f} tokens/s, mean "
        f"accepted length {row['mean_accepted_length']:.3f}, â {row['acceptance_rate']:.3f}"
    )
    print(f"wrote {out}")
    return 0
