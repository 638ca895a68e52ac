"""``dspark real serve``: the batched engine serving real arrivals in wall-clock time (Poisson at
--rate, or an Azure-format trace, time-scaled), one run per --controller on the same arrivals;
writes requests.csv (the simulator's format), rounds.csv, batches.csv, summary.json, config.toml."""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import add_out_args, run_folder


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args, add_tp_args

    p = subparsers.add_parser(
        "serve", help="serve arrivals with continuous batching", description=__doc__
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second")
    src.add_argument(
        "--trace",
        default=None,
        help="Azure-format trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="multiplies the trace's inter-arrival times (< 1: more load)",
    )
    p.add_argument("--duration", type=float, default=None, help="arrival window in seconds")
    p.add_argument(
        "--drain",
        type=float,
        default=None,
        help="serve at most this many seconds after the window (default: until done)",
    )
    p.add_argument(
        "--controller",
        action="append",
        default=None,
        metavar="SPEC",
        help="repeatable: NAME, NAME:key=value,... or NAME@FILE.toml (default: dspark)",
    )
    p.add_argument("--slots", type=int, default=None, help="sequences in flight (default 8)")
    p.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO told the controllers, s")
    p.add_argument("--slo-tpot", type=float, default=None, help="TPOT SLO told the controllers, s")
    p.add_argument("--workload", choices=("code", "prose", "random"), default=None)
    p.add_argument("--prompt-tokens-min", type=int, default=None)
    p.add_argument("--prompt-tokens-max", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    add_out_args(p, "real-serve")
    p.add_argument("--tiny", action="store_true", help="tiny random models (no checkpoint)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_engine_args(p)
    add_tp_args(p)
    return p


def _serve_config(args: argparse.Namespace) -> Any:
    """The serving config: ``[serve]`` of the config, overridden by the command line."""
    from control.configio import from_mapping, read_toml
    from real.serve import ServeConfig

    data = dict(read_toml(args.config).get("serve", {})) if args.config else {}
    for key, v in (
        ("rate_rps", args.rate),
        ("trace", args.trace),
        ("time_scale", args.time_scale),
        ("duration_s", args.duration),
        ("drain_s", args.drain),
        ("workload", args.workload),
        ("prompt_tokens_min", args.prompt_tokens_min),
        ("prompt_tokens_max", args.prompt_tokens_max),
        ("max_new_tokens", args.max_new_tokens),
        ("slo_ttft_s", args.slo_ttft),
        ("slo_tpot_s", args.slo_tpot),
    ):
        if v is not None:
            data[key] = v
    if args.tiny:
        data.setdefault("workload", "random")
    return from_mapping(ServeConfig, data, source=args.config or "<command line>", prefix="serve")


def _serve_all(engine, stream, specs, scfg, log) -> tuple:
    """Replay the stream under each controller spec; return (requests, records, batches,
    summaries, controller tables)."""
    import sys

    from control.configio import to_dict
    from control.registry import make_config, make_controller, make_planner
    from real.serve import serve
    from real.tp import clock

    reqs, recs, bts, sums, tables = [], [], [], [], {}
    for spec in specs:
        name, table, label = (spec, None, spec) if isinstance(spec, str) else spec
        cfg = make_config(name, table)
        tables[label] = to_dict(cfg)
        res = serve(
            engine,
            stream,
            lambda n=name, c=cfg: make_controller(n, c),
            make_planner(name, cfg),
            label,
            scfg.duration_s,
            scfg.drain_s,
            log,
            scfg.progress_s,
            clock=clock(),  # under --tp, rank 0's clock on every rank (arrivals, admission)
            slo=scfg.slo(),
        )
        for m in res.rejected:
            print(m, file=sys.stderr)
        reqs.append(res.requests)
        recs.extend(res.records)
        bts.append(res.batches)
        sums.append(res.summary)
        s = res.summary
        print(
            f"{label}: {s['requests_finished']}/{s['requests']} finished "
            f"({s['requests_rejected']} rejected), {s['throughput_tokens_per_s']:.1f} tokens/s, "
            f"TTFT p50 {s['ttft_p50_s'] * 1e3:.0f} ms, TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms, "
            f"mean batch {s['mean_batch_size']:.2f}"
        )
    return reqs, recs, bts, sums, tables


def _write_results(args, out, scfg, ecfg, reqs, recs, bts, sums, tables) -> None:
    """Write ``requests.csv``, ``rounds.csv``, ``batches.csv``, ``summary.json``, ``config.toml``."""
    import json

    import pandas as pd

    from control.configio import to_dict, write_toml
    from control.types import records_to_columns

    pd.concat(reqs).to_csv(out / "requests.csv", index=False)
    pd.DataFrame(records_to_columns(recs)).to_csv(out / "rounds.csv", index=False)
    pd.concat(bts).to_csv(out / "batches.csv", index=False)
    (out / "summary.json").write_text(
        json.dumps({"kind": "real-serve", "runs": sums}, indent=1, default=str)
    )
    write_toml(
        {
            "engine": ecfg.record(),
            "serve": to_dict(scfg),
            "controller": tables,
            "models": {"source": "tiny" if args.tiny else "shipped"},
        },
        out / "config.toml",
    )


def run(args: argparse.Namespace) -> int:
    """``_run`` on one process, or on ``--tp N`` ranks (``real.tp``: rank 0 prints and writes)."""
    from real.tp import run_sharded

    return run_sharded(args, _run, ("out",))


def _run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    import torch

    from control.configio import read_toml
    from dspark.cmd_simulate import parse_controller_spec
    from dspark.real_profile import build
    from real.serve import arrivals

    torch.set_num_threads(args.threads or 1)
    scfg = _serve_config(args)
    over = {"stop_at_eot": False}
    if args.slots is not None or "slots" not in (
        read_toml(args.config).get("engine", {}) if args.config else {}
    ):
        over["slots"] = args.slots or 8
    engine, ecfg = build(args, **over)
    vocab = engine.target.embed_tokens.num_embeddings
    stream = arrivals(scfg, engine.tokenizer, vocab)
    specs = [parse_controller_spec(c) for c in (args.controller or ["dspark"])]
    out = Path(run_folder(args.out, args.overwrite, "real-serve"))
    out.mkdir(parents=True, exist_ok=True)
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    src = f"Poisson {scfg.rate_rps:g}/s" if scfg.trace is None else scfg.trace
    print(
        f"{len(stream)} requests over {scfg.duration_s:g} s ({src}), "
        f"{ecfg.slots} slots, {len(specs)} controller(s)",
        file=sys.stderr,
    )
    reqs, recs, bts, sums, tables = _serve_all(engine, stream, specs, scfg, log)
    _write_results(args, out, scfg, ecfg, reqs, recs, bts, sums, tables)
    print(f"wrote {out}/requests.csv, rounds.csv, batches.csv, summary.json")
    return 0
