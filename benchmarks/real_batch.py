"""Batched real-engine benchmark: plain batched decoding vs speculative decoding at batch 1..16.

The shipped models (target precision ``--target-dtype``, default the engine's ``auto``:
float32 for this batched engine on a CPU without native bf16, else bf16; the chosen drafter),
held-out code prompts, each decoded to ``--new-tokens`` tokens (the end-of-text token does not
stop it). Methods: ``plain`` (target only, no drafter: one packed forward per round serves every
row), fixed k (``--ks``),
and the controllers of ``--controllers`` (default ``hf-heuristic`` and ``dspark``, default
configs; ``NAME:key=value,...`` sets fields), each with its round planner when it has one (the
planner lives for the whole run, as in a serving engine, and is warmed by one untimed run per
batch size). Every (batch, method) cell runs once per repeat, cells interleaved (method order
rotated per repeat) so background load hits all alike; tokens/s are the median over repeats,
speedups the median of the per-repeat ratios (below).

**At batch B** means B sequences in flight: each cell serves ``--waves`` × B requests (prompts
reused in turn past 32) with continuous batching capped at B running
(``Engine.run_batch(max_running=B)``), so a finished row is replaced at the next round boundary,
as in a serving engine. Tokens/s at batch B count the tokens emitted by the rounds that ran B
rows, over the wall time from the first round to the first round with fewer rows (the final
drain), less the prefills inside that window. Without refills a speculative batch drains
unevenly (rows finish at different rounds, plain rows all together), so a fixed batch compares
speculation at a smaller mean batch than plain (about 12 against 16 at B = 16); the whole-run
figure, drain included, is printed beside it. Outputs are checked against ``plain`` (greedy:
identical in float32, equal up to near-ties in bf16).

Last line: ``real_batch8_plain_vs_batch1=<plain tok/s at 8 / at 1>
real_batch8_spec_vs_plain=<dspark's speedup over plain at 8>
real_spec_never_slower=<1 if dspark's speedup >= 1 at every batch>`` (steady-state tokens/s at
batch B; a speedup is the median over repeats of the ratio to plain in the same repeat, so the
machine's drift between repeats cancels).

    .venv/bin/python benchmarks/real_batch.py [--repeats 3] [--new-tokens 64] [--threads 2]
        [--batches 1,2,4,8,16] [--waves 3] [--ks 2,4] [--drafter conv]
        [--block-recalibration on|off]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable without an install


def paired_speedups(tps: dict, batches, methods) -> dict:
    """Per (batch, method): the median over repeats of its tokens/s over plain's at the same
    batch in the same repeat. A cell and its plain run seconds apart, so a ratio per repeat
    cancels the machine's slow drift (10-20% over minutes here), which a ratio of medians
    taken over different repeats does not."""
    return {
        (B, m): float(np.median(np.array(tps[(B, m)]) / np.array(tps[(B, "plain")])))
        for B in batches
        for m in methods
    }


def steady_and_whole(rounds, prefills, B: int, wall: float) -> tuple[float, float]:
    """(tokens/s at batch B, tokens/s of the whole run): the first over the rounds from the
    first to the first one with fewer than B rows, as wall time less the prefills inside that
    window; the second over the whole run less every prefill (module docstring)."""
    short = next((i for i, r in enumerate(rounds) if r.batch_size < B), len(rounds))
    lo = rounds[0].start_s
    hi = rounds[short].start_s if short < len(rounds) else rounds[-1].end_s
    pre = sum(p["end_s"] - p["start_s"] for p in prefills if lo <= p["start_s"] < hi)
    steady = sum(r.emitted for r in rounds[:short]) / max(hi - lo - pre, 1e-9)
    pre_all = sum(p["end_s"] - p["start_s"] for p in prefills)
    return steady, sum(r.emitted for r in rounds) / max(wall - pre_all, 1e-9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="real_batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--waves", type=int, default=3, help="requests per cell = waves x batch")
    p.add_argument("--ks", default="2,4", help="fixed draft lengths to run")
    p.add_argument(
        "--controllers",
        default="hf-heuristic dspark",
        help="adaptive controllers, space separated: NAME or NAME:key=value,...",
    )
    p.add_argument("--drafter", default="conv")
    p.add_argument("--workload", default="code", choices=("code", "prose"))
    p.add_argument("--prompt-tokens", default="64,128", help="min,max prompt tokens")
    p.add_argument("--checkpoints", default=None)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--target-dtype", default="auto", help="target precision (auto, float32, bfloat16, ...)"
    )
    p.add_argument(
        "--block-recalibration",
        choices=("on", "off"),
        default="on",
        help="the block drafter's online recalibration (engine.block_recalibration)",
    )
    args = p.parse_args(argv)

    import torch

    from control.errors import DSparkError
    from control.registry import controller_spec, make_config, make_controller, make_planner
    from real.engine import EngineConfig, Request
    from real.runtime import build_engine
    from real.tracing import PromptSetConfig, make_prompts

    torch.set_num_threads(args.threads)
    specs = {}
    for name, conf, label in map(controller_spec, args.controllers.split()):
        try:  # a bad spec is one line, before anything runs
            specs[label] = (name, make_config(name, conf, source=f"--controllers {label!r}"))
        except DSparkError as e:
            print(f"real_batch: error: {e}", file=sys.stderr)
            return 2
    batches = [int(x) for x in args.batches.split(",")]
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    lo, hi = (int(x) for x in args.prompt_tokens.split(","))
    B_max, N = max(batches), args.new_tokens
    cfg = EngineConfig(
        slots=B_max,
        stop_at_eot=False,
        drafter=args.drafter,
        max_len=hi + N + 8,
        device=args.device,
        target_dtype=args.target_dtype,
        block_recalibration=args.block_recalibration == "on",
    )
    engine = build_engine(cfg, args.checkpoints)
    drafter = engine.drafter
    prompts = make_prompts(
        PromptSetConfig(
            workload=args.workload,
            split="test",
            n_prompts=min(args.waves * B_max, 32),  # the code test split has 36 long enough
            prompt_tokens_min=lo,
            prompt_tokens_max=hi,
            seed=1,
        ),
        engine.tokenizer,
    )
    specs.update({f"fixed:k={k}": ("fixed", {"k": k}) for k in ks})
    methods = (
        ["plain"]
        + [f"fixed:k={k}" for k in ks]
        + [m for m in specs if m in args.controllers.split()]
    )

    def run(method: str, B: int) -> tuple[tuple[float, float], list[list[int]]]:
        if method == "plain":
            engine.drafter, name, conf = None, "fixed", {"k": 0}
        else:
            engine.drafter = drafter
            name, conf = specs[method]
        c = make_config(name, conf)
        # one planner per (method, batch) for the whole run, as a serving engine keeps it: its
        # cost model carries over between repeats (warmed once, untimed, before them)
        if (method, B) not in planners:
            planners[(method, B)] = make_planner(name, c)
        planner = planners[(method, B)]
        reqs = [
            Request(i, prompts[i % len(prompts)], N, make_controller(name, c))
            for i in range(args.waves * B)
        ]
        engine.prefills, engine.round_log = [], []
        t0 = time.perf_counter()
        seqs = engine.run_batch(reqs, planner=planner, max_running=B)
        wall = time.perf_counter() - t0
        return steady_and_whole(engine.round_log, engine.prefills, B, wall), [
            s.tokens for s in seqs
        ]

    print(
        f"real_batch: {args.drafter} drafter, {N} new tokens/sequence, batches {batches}, "
        f"{args.repeats} repeats, {args.threads} threads, {args.device}, "
        f"{engine.cfg.precision} target, methods {methods}",
        file=sys.stderr,
    )
    planners: dict = {}
    for B in batches[:2]:  # warm-up (allocations, first-touch)
        run("plain", B)
    for B in batches:  # each planner learns its costs once before the timed repeats
        for m in methods[1 + len(ks) :]:
            if planners.setdefault((m, B), make_planner(*specs[m])) is not None:
                run(m, B)  # (run uses the planner made here)
    tps: dict = {(B, m): [] for B in batches for m in methods}
    whole: dict = {(B, m): [] for B in batches for m in methods}
    same: dict = {(B, m): [] for B in batches for m in methods}
    t_start = time.perf_counter()
    for r in range(args.repeats):
        for B in batches:
            order = methods[r % len(methods) :] + methods[: r % len(methods)]
            outs = {}
            for m in order:
                (x, y), outs[m] = run(m, B)
                tps[(B, m)].append(x)
                whole[(B, m)].append(y)
            for m in methods:
                same[(B, m)].append(np.mean([a == b for a, b in zip(outs[m], outs["plain"])]))
        print(
            f"repeat {r + 1}/{args.repeats} done ({time.perf_counter() - t_start:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    med = {key: float(np.median(v)) for key, v in tps.items()}
    w = max(max(len(m) for m in methods), 14)
    speed = paired_speedups(tps, batches, methods)
    for title, table, sps in (
        (
            f"tokens/s at batch B ({args.waves} x B requests, at most B running; drain excluded)",
            med,
            speed,
        ),
        (
            "whole run, drain included (the last rows finish at a smaller batch)",
            {key: float(np.median(v)) for key, v in whole.items()},
            paired_speedups(whole, batches, methods),
        ),
    ):
        print(title)
        print(f"{'batch':>5}  " + "  ".join(f"{m:>{w}}" for m in methods))
        for B in batches:
            cells = [f"{table[(B, m)]:7.1f} ({sps[(B, m)]:4.2f}x)".rjust(w) for m in methods]
            print(f"{B:>5}  " + "  ".join(cells))
    print(
        "median tokens/s (median over repeats of the speedup over plain at the same batch in the "
        "same repeat); outputs equal to plain: "
        + ", ".join(
            f"{m} {np.mean([np.mean(same[(B, m)]) for B in batches]):.2f}" for m in methods[1:]
        )
    )
    if "dspark" not in methods:
        return 0  # the last line reports the default dspark
    b8 = 8 if 8 in batches else batches[-1]
    b1 = batches[0]
    never = int(all(speed[(B, "dspark")] >= 1.0 for B in batches))
    print(
        f"real_batch{b8}_plain_vs_batch{b1}={med[(b8, 'plain')] / med[(b1, 'plain')]:.3f} "
        f"real_batch{b8}_spec_vs_plain={speed[(b8, 'dspark')]:.3f} "
        f"real_spec_never_slower={never}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
