"""Tensor-parallel engine speed: TP = 1 and TP = 2, plain and speculative, interleaved.

Two gloo ranks are spawned on this machine (``real.tp``). Each repeat runs, in this order,
TP = 1 plain (target-only greedy decoding), TP = 1 speculative (the engine, ``--controller``,
``--drafter``), TP = 2 plain, TP = 2 speculative, then TP = 2 again with the ranks unpinned
(``tp2u``: every rank allowed on every core, as before ``real.tp.init`` pinned each rank to its
own), on the same held-out code prompts; the TP = 1 runs use an unsharded copy of the target on
rank 0 while rank 1 waits at a barrier. Greedy outputs are checked equal across TP = 1 and
TP = 2.

Collective share of a forward (``tp_collective_share``): the 1-token TP = 2 target forward
timed alone, and what tensor parallelism adds to each layer measured in context
(``real.tp_profile``: a layer's sharded projections with their two all-reduces and DTensor's
dispatch, chained back to back as a forward runs them, less the same projections on local
tensors); share = layers · that cost / forward. Printed beside it, the older estimate from an
all-reduce of the message (``d_model`` values) timed alone after a barrier, 2 · layers ·
all-reduce / forward: that timing holds the ranks' skew on leaving the barrier, and its
"share" reached 1.02 (more than the whole forward) on one machine, so it is not the headline.

Last line: ``real_tp2_vs_tp1=<TP2 / TP1 speculative tokens/s> tp_collective_share=<x>
tp2_pinned_vs_unpinned=<TP2 speculative tokens/s, pinned / unpinned>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_ALL_CORES = os.sched_getaffinity(0)  # before real.tp.init pins the rank


def _forward_s(engine, n: int = 60) -> float:
    """Median seconds of a 1-token target forward (the engine's packed step, cache slot 0)."""
    from real.models import Segments

    ids = torch.zeros(1, dtype=torch.long)
    xs = []
    with torch.inference_mode():
        for i in range(n + 5):
            segs = Segments([0], [i], [1])
            t0 = time.perf_counter()
            engine.target.step_packed(ids, segs, engine.state)
            xs.append(time.perf_counter() - t0)
    return float(np.median(xs[5:]))


def _runs(engines, prompts, a) -> dict:
    """Interleaved repeats: tokens/s per (tp, mode) and the outputs of the first repeat."""
    import torch.distributed as dist

    from control import make_controller
    from real.tp import current

    rank = current().rank
    res: dict = {}
    pinned = os.sched_getaffinity(0)
    for _r in range(a.repeats):
        for tp_n, eng in engines:
            # "2u": the sharded engine with this rank free to run on any core
            os.sched_setaffinity(0, _ALL_CORES if tp_n == "2u" else pinned)
            for mode in ("plain", "spec"):
                if tp_n == 1 and rank != 0:
                    dist.barrier()
                    continue
                toks, t0 = [], time.perf_counter()
                for i, p in enumerate(prompts):
                    if mode == "plain":
                        toks.append(eng.greedy_reference(p, a.new_tokens))
                    else:
                        ctrl = make_controller(a.controller)
                        toks.append(eng.generate(p, a.new_tokens, ctrl, request_id=i).tokens)
                s = time.perf_counter() - t0
                res.setdefault(f"tp{tp_n}/{mode}", []).append(sum(map(len, toks)) / s)
                res.setdefault(f"out/tp{tp_n}/{mode}", toks)
                if tp_n == 1:
                    dist.barrier()
    os.sched_setaffinity(0, pinned)
    return res


def _rank(rank: int, size: int, port: int, a_dict: dict, path: str) -> None:
    from real import tp
    from real.engine import EngineConfig
    from real.runtime import build_engine
    from real.serve import _windows
    from real.tp_profile import collective_rows, time_collectives

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    torch.set_num_threads(1)
    a = argparse.Namespace(**a_dict)
    tp.init(size, "cpu", 600.0)
    try:
        cfg = EngineConfig(stop_at_eot=False, drafter=a.drafter, max_len=a.prompt_tokens + 200)
        ctx = tp._CTX
        tp._CTX = None  # build the TP = 1 engine unsharded
        one = build_engine(cfg)
        tp._CTX = ctx
        two = build_engine(cfg)  # sharded (real.runtime calls real.tp.shard_engine)
        rng = np.random.default_rng(0)
        prompts = _windows([a.prompt_tokens] * a.prompts, "code", "test", one.tokenizer, None, rng)
        res = _runs([(1, one), (2, two), ("2u", two)], prompts, a)
        layers = two.target.cfg.n_layers
        times = time_collectives(two, [1], 40, 5, chain=layers)  # a forward's chain of layers
        coll = collective_rows(two, [1], times).set_index("kind")["seconds"]
        fwd = _forward_s(two)
        res["collectives"] = {
            "forward_s": fwd,
            "all_reduce_s": float(coll["all_reduce"]),
            "layer_s": float(coll["layer"]),
            "collective_share": 2 * layers * float(coll["all_reduce"]) / fwd,
            "layer_share": layers * float(coll["layer"]) / fwd,
        }
        tp.shutdown(synced=True)
    finally:
        tp.shutdown()
    if rank == 0:
        Path(path).write_text(json.dumps(res))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--drafter", default="conv")
    p.add_argument("--controller", default="fixed")
    a = p.parse_args()
    import torch.multiprocessing as mp

    from real.tp import free_port

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "res.json")
        mp.start_processes(
            _rank, args=(2, free_port(), vars(a), path), nprocs=2, start_method="spawn"
        )
        res = json.loads(Path(path).read_text())
    for mode in ("plain", "spec"):
        for two in ("tp2", "tp2u"):
            assert res[f"out/tp1/{mode}"] == res[f"out/{two}/{mode}"], f"TP outputs differ ({mode})"
    print(f"# {a.prompts} prompts x {a.new_tokens} tokens, {a.repeats} interleaved repeats")
    print(f"{'run':12s} {'tokens/s (median)':>18s} {'min':>8s} {'max':>8s}")
    for k in ("tp1/plain", "tp1/spec", "tp2/plain", "tp2/spec", "tp2u/plain", "tp2u/spec"):
        x = res[k]
        print(f"{k:12s} {np.median(x):18.1f} {min(x):8.1f} {max(x):8.1f}")
    c = res["collectives"]
    print(
        f"TP=2 1-token forward {c['forward_s'] * 1e3:.2f} ms; all-reduce alone "
        f"{c['all_reduce_s'] * 1e6:.0f} us; TP cost per layer (DTensor + 2 all-reduces) "
        f"{c['layer_s'] * 1e6:.0f} us; all-reduce-alone estimate {c['collective_share']:.3f}"
    )
    ratio = np.median(res["tp2/spec"]) / np.median(res["tp1/spec"])
    pin = np.median(res["tp2/spec"]) / np.median(res["tp2u/spec"])
    print(
        f"real_tp2_vs_tp1={ratio:.3f} tp_collective_share={c['layer_share']:.3f} "
        f"tp2_pinned_vs_unpinned={pin:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
