"""Tensor-parallel verification (real.tp): 2 gloo ranks on localhost, float64, tiny models.

Each test spawns the ranks once; they write what they computed to JSON files, and the test
compares it with the same computation on one process."""

import argparse
import dataclasses
import json
import os
import signal
import time

import pytest
import torch

from control import ENGINE_CONTROLLERS, make_controller
from control.errors import DSparkError
from control.registry import make_planner
from real import tp
from real.engine import Request
from real.models import Segments
from tests.built_once import built_once
from tests.real.conftest import CFG, V, make_engine, prompt, tiny_target

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

DRAFTERS = ["tf", "conv", "ngram", "ngram+conv", "ngram+tf"]
BATCH_CONTROLLERS = ["fixed", "dspark"]
N_NEW = 16


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of 2 ranks computed (one spawn per test run: ~5 s of start-up)."""
    return built_once(tmp_path_factory, "tp_ranks", lambda out: _spawn("all", out))[1]


def _spawn(job: str, tmp_path, size: int = 2) -> list[dict]:
    import torch.multiprocessing as mp

    for attempt in range(2):
        try:
            mp.start_processes(
                _rank_job,
                args=(size, tp.free_port(), str(tmp_path), job),
                nprocs=size,
                join=True,
                start_method="spawn",
            )
            break
        except mp.ProcessExitedException as e:
            # once in ~5 loaded CI runs a gloo rank died by SIGABRT (never reproduced alone;
            # tp.shutdown(synced=True) is the fix tried); a second start on a fresh port is a
            # fresh group, and a real fault fails it again
            if attempt or e.exit_code >= 0:
                raise
            for r in range(size):
                (tmp_path / f"rank{r}.json").unlink(missing_ok=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(size)]


def _rank_job(rank: int, size: int, port: int, tmp: str, job: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    torch.set_num_threads(1)
    ctx = tp.init(size, "cpu", 30.0)
    try:
        out = JOBS[job](ctx)
        tp.shutdown(synced=True)
    finally:
        tp.shutdown()
    with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


# --------------------------------------------------------------------------- logits
def _logit_gaps(ctx) -> dict:
    """Max |sharded - unsharded| over packed prefill + verify steps on random inputs."""
    ref, m = tiny_target(), tp.shard_target(tiny_target(), ctx)
    g = torch.Generator().manual_seed(5)
    s_ref = ref.new_state(64, torch.float64, "cpu", 3)
    s_tp = m.new_state(64, torch.float64, "cpu", 3)
    gaps, scale = [], 0.0
    with torch.inference_mode():
        for segs in (
            Segments([0, 1, 2], [0, 0, 0], [9, 5, 12]),  # prefill
            Segments([2, 0, 1], [12, 9, 5], [4, 1, 6]),  # ragged verify
            Segments([1], [11], [1]),  # one plain step
        ):
            ids = torch.randint(0, V, (segs.n,), generator=g)
            a, b = m.step_packed(ids, segs, s_tp), ref.step_packed(ids, segs, s_ref)
            gaps.append(float((a - b).abs().max()))
            scale = max(scale, float(b.abs().max()))
        ids = torch.randint(0, V, (2, 20), generator=g)
        gaps.append(float((m(ids) - ref(ids)).abs().max()))
    heads = [int(k.shape[1]) for k, _ in s_tp["kv"]]
    return {"gaps": gaps, "scale": scale, "heads": heads}


def test_sharded_logits_equal_unsharded(ranks):
    for r in (r["logits"] for r in ranks):
        assert max(r["gaps"]) <= 1e-12, r
        assert r["scale"] > 1.0  # logits of a real size, so 1e-12 is a real bound
        assert r["heads"] == [1, 1]  # each rank's KV cache holds its own head of the two


# --------------------------------------------------------------------------- greedy equality
def _generations(ctx) -> dict:
    """Batch 1: every drafter with fixed k, every engine controller with the tf drafter
    (plus target-only greedy decoding on one process); batched: 4 requests over 3 slots."""
    out: dict = {}
    for d in DRAFTERS:
        eng = make_engine(d)
        if ctx is not None:
            tp.shard_engine(eng)
        for name in ENGINE_CONTROLLERS if d == "tf" else ["fixed"]:
            out[f"{d}/{name}"] = eng.generate(prompt(3), N_NEW, make_controller(name)).tokens
        if ctx is None:
            out[f"{d}/reference"] = eng.greedy_reference(prompt(3), N_NEW)
    eng = make_engine("tf", cfg=dataclasses.replace(CFG, slots=3))
    if ctx is not None:
        tp.shard_engine(eng)
    for name in BATCH_CONTROLLERS:
        reqs = [Request(i, prompt(20 + i), 10 + i, make_controller(name)) for i in range(4)]
        done = eng.run_batch(reqs, make_planner(name))
        out[f"batch/{name}"] = [s.tokens for s in done]
    return out


def test_tp2_greedy_equals_tp1_for_every_drafter_and_controller(ranks):
    one = _generations(None)
    gens = [r["generate"] for r in ranks]
    assert gens[0] == gens[1]  # every rank decided and committed the same
    keys = [k for k in one if not k.endswith("/reference")]
    assert sorted(gens[0]) == sorted(keys)
    for key in keys:
        assert gens[0][key] == one[key], key
        if not key.startswith("batch/"):  # and target-only greedy decoding
            assert one[key] == one[key.split("/")[0] + "/reference"], key


# --------------------------------------------------------------------------- a dead rank
def _dies(args) -> int:
    """Rank 1 kills itself after a first all-reduce; rank 0 waits in the next one."""
    ctx = tp.current()
    t = torch.ones(4)
    dist.all_reduce(t)
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    time.sleep(600)
    return 0


def _dies_run(args) -> int:
    return tp.run_sharded(args, _dies)


def test_killed_rank_ends_the_run_with_one_line(tmp_path):
    args = argparse.Namespace(tp=2, tp_timeout=10.0, device="cpu", _real_run=_dies_run)
    t0 = time.perf_counter()
    with pytest.raises(DSparkError) as e:
        tp.launch(args, 2, 10.0)
    assert time.perf_counter() - t0 < 10.0 + 15.0
    msg = str(e.value)
    assert "\n" not in msg and "rank" in msg, msg


def test_bad_tp_flags_are_one_line_errors():
    with pytest.raises(DSparkError, match="--tp must be >= 1"):
        tp.run_sharded(argparse.Namespace(tp=0, tp_timeout=1.0), lambda a: 0)
    assert tp.run_sharded(argparse.Namespace(tp=1, tp_timeout=1.0), lambda a: 7) == 7


JOBS = {"all": lambda ctx: {"logits": _logit_gaps(ctx), "generate": _generations(ctx)}}
