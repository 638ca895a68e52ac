"""``dspark real profile``: time the engine's verify pass, draft step and per-round overhead over
a grid (batch sizes, new tokens 1..k_max+1 or --draft-lengths k+1, prefill chunks, context
lengths) and write the ``latency.csv`` the simulator's table backend reads
(docs/results-format.md). ``--batches 1,2,4,8,16`` profiles continuous batching."""

from __future__ import annotations

import argparse
from typing import Any

from dspark.args import add_out_args, run_folder


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from dspark.cmd_real import add_engine_args, add_tp_args

    p = subparsers.add_parser(
        "profile", help="measure the latency table for the simulator", description=__doc__
    )
    add_out_args(p, "profile")
    p.add_argument("--tiny", action="store_true", help="tiny random models (no checkpoint)")
    p.add_argument("--repeats", type=int, default=None, help="timed passes over the grid")
    p.add_argument("--warmup", type=int, default=None, help="discarded passes over the grid")
    p.add_argument("--contexts", default=None, help="comma-separated context lengths")
    p.add_argument("--prefill-tokens", default=None, help="comma-separated prefill chunk sizes")
    p.add_argument("--k-max", type=int, default=None, help="engine k_max (new tokens 1..k_max+1)")
    p.add_argument(
        "--batches", default=None, help="comma-separated batch sizes (default 1; e.g. 1,2,4,8,16)"
    )
    p.add_argument(
        "--draft-lengths",
        default=None,
        help="comma-separated k whose verify pass (k+1 tokens) is timed "
        "(default 0..k_max; e.g. 0,1,2,4,8,16 for a batched grid)",
    )
    add_engine_args(p)
    add_tp_args(p)
    return p


def _ints(text: str | None):
    return None if text is None else tuple(int(x) for x in text.split(",") if x.strip())


def build(args: argparse.Namespace, **overrides: Any):
    """The engine of ``dspark real profile|trace`` (shipped checkpoints or ``--tiny``)."""
    from dspark.cmd_real import engine_config

    if getattr(args, "k_max", None) is not None:
        overrides["k_max"] = args.k_max
    cfg = engine_config(args, **overrides)
    if args.tiny:
        from real.tiny import TinyModelsConfig, tiny_engine

        return tiny_engine(TinyModelsConfig(), cfg), cfg
    from real.runtime import build_engine

    return build_engine(cfg, args.checkpoints), cfg


def run(args: argparse.Namespace) -> int:
    """``_run`` on one process, or on ``--tp N`` ranks (``real.tp``: rank 0 prints and writes)."""
    from real.tp import run_sharded

    return run_sharded(args, _run, ("out",))


def _run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    import torch

    from control.configio import from_mapping, read_toml, to_dict, write_toml
    from real.profile import ProfileConfig, profile

    torch.set_num_threads(args.threads or 1)
    data = dict(read_toml(args.config).get("profile", {})) if args.config else {}
    for key, v in (
        ("repeats", args.repeats),
        ("warmup", args.warmup),
        ("contexts", _ints(args.contexts)),
        ("prefill_tokens", _ints(args.prefill_tokens)),
        ("batches", _ints(getattr(args, "batches", None))),
        ("draft_lengths", _ints(getattr(args, "draft_lengths", None))),
    ):
        if v is not None:
            data[key] = v
    pcfg = from_mapping(
        ProfileConfig, data, source=args.config or "<command line>", prefix="profile"
    )
    engine, ecfg = build(args, stop_at_eot=False, slots=max(pcfg.batches))
    df, details = profile(engine, pcfg, lambda i, n: print(f"pass {i}/{n}", file=sys.stderr))
    out = Path(run_folder(args.out, args.overwrite, "profile"))
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "latency.csv", index=False)
    write_toml(
        {
            "engine": ecfg.record(),
            "profile": to_dict(pcfg),
            "models": {"source": "tiny" if args.tiny else "shipped"},
        },
        out / "config.toml",
    )
    (out / "summary.json").write_text(json.dumps({"kind": "profile", **details}, indent=1))
    _collectives(engine, pcfg, ecfg, out)
    b1 = df["batch"] == min(pcfg.batches)
    t = df[(df["model"] == "target") & (df["new_tokens"] == 1) & b1]
    d = df[(df["model"] == "drafter") & (df["new_tokens"] == 1) & b1]
    print(f"wrote {out / 'latency.csv'} ({len(df)} rows)")
    c = d["seconds"].median() / t["seconds"].median()
    print(
        f"target 1-token verify: {t['seconds'].median() * 1e3:.3f} ms, drafter step: "
        f"{d['seconds'].median() * 1e3:.3f} ms (c = {c:.3f}), "
        f"round overhead: {details['round_overhead_s'] * 1e3:.3f} ms"
    )
    if len(pcfg.batches) > 1:
        for b in sorted(set(pcfg.batches)):
            tb = df[(df["model"] == "target") & (df["new_tokens"] == 1) & (df["batch"] == b)]
            print(
                f"batch {b:3d}: 1-token verify {tb['seconds'].median() * 1e3:8.3f} ms "
                f"({b / tb['seconds'].median():8.1f} plain tokens/s)"
            )
    return 0


def _collectives(engine, pcfg, ecfg, out) -> None:
    """Under ``--tp N``: the target's all-reduces timed alone, ``collectives.csv``."""
    from real.tp import current

    if current() is None:
        return
    from real.tp_profile import message_tokens, profile_collectives

    df = profile_collectives(
        engine, message_tokens(pcfg.batches, ecfg.k_max), pcfg.repeats, pcfg.warmup
    )
    df.to_csv(out / "collectives.csv", index=False)
    one = df[df["tokens"] == df["tokens"].min()].set_index("kind")["seconds"]
    print(
        f"wrote {out / 'collectives.csv'}: all-reduce of {int(df['tokens'].min())} token(s) "
        f"{one['all_reduce'] * 1e6:.0f} us, TP cost per layer {one['layer'] * 1e6:.0f} us"
    )
