"""Batched real-engine benchmark: plain batched decoding vs speculative decoding at batch 1..16.

The shipped models (the engine's ``auto`` target precision: float32 for this batched engine on a
CPU without native bf16, else bf16; the chosen drafter), held-out code prompts, every sequence of a
batch admitted at once (one packed prefill) and decoded to ``--new-tokens`` tokens (the
end-of-text token does not stop it). Methods: ``plain`` (target only, no drafter: one packed
forward per round serves every row), fixed k (``--ks``), ``hf-heuristic`` and ``dspark``
(default config, with its round planner when it has one; the planner lives for the whole run, as
in a serving engine, and is warmed by one untimed run per batch size). Every (batch, method) cell
runs once per repeat, cells interleaved (method order rotated per repeat) so background load hits all
alike; the median over repeats is reported. Tokens/s count decoded tokens over the decode time
(wall time of the batch minus its prefill); speedup is over ``plain`` at the same batch size.
Outputs are checked against ``plain`` (greedy: identical in float32, equal up to near-ties in bf16).

Last line: ``real_batch8_plain_vs_batch1=<plain tok/s at 8 / at 1> real_batch8_spec_vs_plain=
<dspark tok/s / plain tok/s at 8> real_spec_never_slower=<1 if dspark >= plain at every batch>``.

    .venv/bin/python benchmarks/real_batch.py [--repeats 3] [--new-tokens 64] [--threads 2]
        [--batches 1,2,4,8,16] [--ks 2,4] [--drafter conv]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable without an install


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="real_batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--ks", default="2,4", help="fixed draft lengths to run")
    p.add_argument("--drafter", default="conv")
    p.add_argument("--workload", default="code", choices=("code", "prose"))
    p.add_argument("--prompt-tokens", default="64,128", help="min,max prompt tokens")
    p.add_argument("--checkpoints", default=None)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from control.registry import make_config, make_controller, make_planner
    from real.engine import EngineConfig, Request
    from real.runtime import build_engine
    from real.tracing import PromptSetConfig, make_prompts

    torch.set_num_threads(args.threads)
    batches = [int(x) for x in args.batches.split(",")]
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    lo, hi = (int(x) for x in args.prompt_tokens.split(","))
    B_max, N = max(batches), args.new_tokens
    cfg = EngineConfig(
        slots=B_max, stop_at_eot=False, drafter=args.drafter, max_len=hi + N + 8, device=args.device
    )
    engine = build_engine(cfg, args.checkpoints)
    drafter = engine.drafter
    prompts = make_prompts(
        PromptSetConfig(
            workload=args.workload,
            split="test",
            n_prompts=B_max,
            prompt_tokens_min=lo,
            prompt_tokens_max=hi,
            seed=1,
        ),
        engine.tokenizer,
    )
    methods = ["plain"] + [f"fixed:k={k}" for k in ks] + ["hf-heuristic", "dspark"]

    def run(method: str, B: int) -> tuple[float, list[list[int]]]:
        if method == "plain":
            engine.drafter, name, conf = None, "fixed", {"k": 0}
        else:
            engine.drafter = drafter
            name, conf = (
                ("fixed", {"k": int(method.split("=")[1])})
                if method.startswith("fixed")
                else (method, None)
            )
        c = make_config(name, conf)
        # one planner per (method, batch) for the whole run, as a serving engine keeps it: its
        # cost model carries over between repeats (warmed once, untimed, before them)
        if (method, B) not in planners:
            planners[(method, B)] = make_planner(name, c)
        planner = planners[(method, B)]
        reqs = [Request(i, prompts[i], N, make_controller(name, c)) for i in range(B)]
        engine.prefills = []
        t0 = time.perf_counter()
        seqs = engine.run_batch(reqs, planner=planner)
        wall = time.perf_counter() - t0
        pre = sum(x["end_s"] - x["start_s"] for x in engine.prefills)
        toks = sum(len(s.tokens) for s in seqs)
        return toks / max(wall - pre, 1e-9), [s.tokens for s in seqs]

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
        run("dspark", B)
    tps: dict = {(B, m): [] for B in batches for m in methods}
    same: dict = {(B, m): [] for B in batches for m in methods}
    t_start = time.perf_counter()
    for r in range(args.repeats):
        for B in batches:
            order = methods[r % len(methods) :] + methods[: r % len(methods)]
            outs = {}
            for m in order:
                x, outs[m] = run(m, B)
                tps[(B, m)].append(x)
            for m in methods:
                same[(B, m)].append(np.mean([a == b for a, b in zip(outs[m], outs["plain"])]))
        print(
            f"repeat {r + 1}/{args.repeats} done ({time.perf_counter() - t_start:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    med = {key: float(np.median(v)) for key, v in tps.items()}
    w = max(len(m) for m in methods)
    print(f"{'batch':>5}  " + "  ".join(f"{m:>{max(w, 14)}}" for m in methods))
    for B in batches:
        cells = []
        for m in methods:
            sp = med[(B, m)] / med[(B, "plain")]
            cells.append(f"{med[(B, m)]:7.1f} ({sp:4.2f}x)".rjust(max(w, 14)))
        print(f"{B:>5}  " + "  ".join(cells))
    print(
        "tokens/s (speedup over plain at the same batch); outputs equal to plain: "
        + ", ".join(
            f"{m} {np.mean([np.mean(same[(B, m)]) for B in batches]):.2f}" for m in methods[1:]
        )
    )
    b8 = 8 if 8 in batches else batches[-1]
    b1 = batches[0]
    never = int(all(med[(B, "dspark")] >= med[(B, "plain")] for B in batches))
    print(
        f"real_batch{b8}_plain_vs_batch{b1}={med[(b8, 'plain')] / med[(b1, 'plain')]:.3f} "
        f"real_batch{b8}_spec_vs_plain={med[(b8, 'dspark')] / med[(b8, 'plain')]:.3f} "
        f"real_spec_never_slower={never}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
