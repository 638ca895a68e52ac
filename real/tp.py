"""Tensor-parallel verification: the target sharded over N ranks with PyTorch's DTensor API.

Sharding (:func:`shard_target`) is ``torch.distributed.tensor.parallel.parallelize_module`` on
each decoder layer of ``real.models.Transformer`` over a 1-D ``init_device_mesh``: attention by
heads (the fused Q/K/V projection ``ColwiseParallel``, the output projection ``RowwiseParallel``;
each rank's KV cache holds its own heads only, ``Transformer.new_state`` sizes it from the
layer's head count), the SwiGLU MLP with the fused gate/up projection ``ColwiseParallel`` and the
down projection ``RowwiseParallel``: two all-reduces per layer, none written here. The fused
projections' output rows are first reordered (a permutation, no arithmetic) so that the
contiguous block ``ColwiseParallel`` gives rank r is ``[q_r, k_r, v_r]`` (``[gate_r, up_r]``):
then each rank's local ``view``/``chunk`` in ``Block.forward_packed`` splits its own heads.

Embedding and LM head are replicated (not sharded). The API's vocabulary-parallel embedding
(``RowwiseParallel`` on ``nn.Embedding``) adds one all-reduce of ``tokens × d_model`` per forward,
and the tied LM head sharded by vocabulary rows would need its logits gathered (all-gather of
``tokens × vocab``) because every rank runs acceptance; at the shipped 4096 × 384 table that is
two extra collectives to save 1.5 M multiply-adds per token. Replicated, they cost no traffic
and the logits every rank holds are bitwise identical (the all-reduce hands every rank the same
sum), which the next paragraph relies on.

Drafter and controller run identically on every rank, not on rank 0 with a broadcast. Every
input of a round is already identical everywhere: the committed tokens, the replicated logits,
the drafter's weights and cache (a drafter is replicated: it is small and runs on each rank's
own core), the sampling generators (seeded from the request, identically) and the controller's
state. So every rank drafts the same tokens, accepts the same prefix and takes the same
decisions without shipping tokens or decisions around; a rank-0 design would broadcast the
draft (k tokens per row) and every decision each round and leave the other ranks idle while
rank 0 drafts. One thing differs per rank: measured time. Controllers and planners that read
``draft_s`` / ``verify_s`` / ``now_s`` (dspark, the cost-model planners) would diverge on
rank-local clocks, so the engine's ``agree`` hook (:func:`agree`) hands every rank rank 0's
readings: one broadcast of 1-3 float64 values at the round's start, after verify and (when a
planner or round log wants it) at its end. ``real.serve`` replays arrivals on the same agreed
clock (:func:`clock`).

Launch (:func:`run_sharded`): ``--tp N`` on the command line spawns N ranks on this machine
(``torch.multiprocessing``, gloo on CPU, NCCL on CUDA, ``MASTER_ADDR``/``MASTER_PORT`` on
localhost with a free port); under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) the same code
joins the group instead of spawning. The process group has a timeout; a rank that raises or dies
ends the run with one line naming it (the launcher stops the others; a rank blocked in a
collective with a dead peer errors out within the timeout). Rank 0 prints and writes; the
others' output and run folders go to a temporary directory.

The NCCL path (device ``cuda``) is written but was only tested on CPU/gloo here.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from control.errors import DSparkError
from real.tp_config import TPConfig as TPConfig  # torch-free, for the command line's defaults


@dataclass
class TPContext:
    """The process's place in the tensor-parallel group."""

    rank: int
    size: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    device: str


_CTX: TPContext | None = None


def current() -> TPContext | None:
    """The active tensor-parallel context (None: one process)."""
    return _CTX


def in_launcher() -> bool:
    """True under ``torchrun`` or a rank this module spawned (``RANK``/``WORLD_SIZE`` set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def pin_cores(local_rank: int, local_size: int) -> set[int] | None:
    """Bind this process to its own share of the cores it may run on: local rank r of n gets the
    r-th of n equal, disjoint blocks (none when there are fewer cores than local ranks, or the
    platform cannot pin), as launchers of CPU ranks usually do (``benchmarks/real_tp.py``'s
    unpinned arm measures what it changes). Returns the cores."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // max(local_size, 1)
    if per < 1:
        return None
    mine = set(cores[local_rank * per : (local_rank + 1) * per])
    os.sched_setaffinity(0, mine)
    return mine


def init(size: int, device: str = "cpu", timeout_s: float = 60.0) -> TPContext:
    """Join the process group (from the environment) and build the 1-D mesh of ``size`` ranks.
    On CPU each rank is bound to its own cores first (:func:`pin_cores`; local
    rank and size from ``torchrun``'s ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, else the rank and
    ``size``: all ranks on this machine)."""
    global _CTX
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available():
        raise DSparkError("--tp: torch.distributed is not available in this PyTorch build")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        pin_cores(rank, int(os.environ.get("LOCAL_WORLD_SIZE", size)))
    if not dist.is_initialized():
        dist.init_process_group(
            backend_for(device), timeout=datetime.timedelta(seconds=float(timeout_s))
        )
    world = dist.get_world_size()
    if world != size:
        raise DSparkError(f"--tp {size} but the process group has {world} ranks")
    mesh = init_device_mesh(device, (size,))
    _CTX = TPContext(dist.get_rank(), size, mesh, device)
    return _CTX


def shutdown(synced: bool = False) -> None:
    """Leave the group (a no-op when not in one). ``synced``: a barrier first, on the path where
    every rank finished its work, so that no rank tears down its gloo connections while another
    still uses them (a rank then died by SIGABRT, "terminate called without an active
    exception", about once in five loaded CI runs); error paths leave without it (a dead peer
    would make the barrier wait for the whole timeout)."""
    global _CTX
    import torch.distributed as dist

    _CTX = None
    if dist.is_available() and dist.is_initialized():
        if synced:
            dist.barrier()
        dist.destroy_process_group()


def _interleave(w: torch.Tensor, parts: int, n: int) -> torch.Tensor:
    """Rows ``[p_0 | p_1 | ...]`` (``parts`` blocks) reordered to ``[p_0^0, p_1^0, .., p_0^1,
    ..]``: rank r's contiguous block of ``ColwiseParallel`` then holds its share of every part."""
    rows, cols = w.shape
    return w.view(parts, n, rows // (parts * n), cols).transpose(0, 1).reshape(rows, cols)


def shard_target(model: torch.nn.Module, ctx: TPContext) -> torch.nn.Module:
    """Shard ``model`` (a ``real.models.Transformer``) in place over ``ctx.mesh``."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    n, c = ctx.size, getattr(model, "cfg", None)
    if getattr(model, "kind", None) != "transformer":
        raise DSparkError(f"--tp {n}: only a transformer target can be sharded")
    if c.n_heads % n or c.d_ff % n:
        raise DSparkError(
            f"--tp {n}: the target's {c.n_heads} heads and d_ff {c.d_ff} must both divide by {n}"
        )
    plan = {
        "qkv": ColwiseParallel(),
        "o": RowwiseParallel(),
        "gate_up": ColwiseParallel(),
        "down": RowwiseParallel(),
    }
    for layer in model.layers:
        with torch.no_grad():
            layer.qkv.weight.copy_(_interleave(layer.qkv.weight, 3, n))
            layer.gate_up.weight.copy_(_interleave(layer.gate_up.weight, 2, n))
        parallelize_module(layer, ctx.mesh, plan)
        layer.h = c.n_heads // n  # heads of this rank (the local view and the KV cache)
    return model


def shard_engine(engine) -> None:
    """Under an active context: shard the engine's target, rebuild its cache for the local
    heads and make rank 0's times every rank's (``Engine.agree``). No-op on one process."""
    ctx = current()
    if ctx is None or ctx.size == 1:
        return
    if engine.device != ctx.device:
        raise DSparkError(
            f"--tp: engine device {engine.device!r} but the group uses {ctx.device!r}"
        )
    shard_target(engine.target, ctx)
    engine.state = engine.target.new_state(engine.length, engine.dtype, engine.device, engine.slots)
    engine.agree = agree
    warm_shapes(engine, range(1, engine.cfg.k_max + 2))


def warm_shapes(engine, sizes) -> None:
    """One untimed pass of each verify size (tokens) in ``sizes``, on every rank. DTensor
    propagates the sharding of each op once per new input shape: on this project's CPU the
    first pass of a size cost 0.35-0.52 s at TP = 2, later ones 31-108 ms, so a controller that
    tries a new draft length mid-run paid ~10x a round (``dspark validate --part tp`` saw it as
    model error). The engine is idle: slot 0's cache is overwritten by the next admission."""
    from real.models import Segments

    with torch.inference_mode():
        for n in sizes:
            if n > engine.length:
                break
            segs = Segments([0], [0], [n], engine.device)
            ids = torch.zeros(n, dtype=torch.long, device=engine.device)
            engine.target.step_packed(ids, segs, engine.state, logits=True)


def agree(values: list[float]) -> list[float]:
    """Rank 0's ``values`` on every rank (one broadcast)."""
    import torch.distributed as dist

    ctx = current()
    if ctx is None or ctx.size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.broadcast(t, 0)
    return t.tolist()


def clock() -> Callable[[], float]:
    """``time.perf_counter`` on one process; under TP, rank 0's reading on every rank."""
    import time

    if current() is None:
        return time.perf_counter
    return lambda: agree([time.perf_counter()])[0]


# --------------------------------------------------------------------------- launch
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quiet_rank(args, outputs: tuple[str, ...]) -> None:
    """A rank other than 0: no stdout/stderr chatter, its run folders in a temporary dir."""
    tmp = tempfile.mkdtemp(prefix="dspark-tp-rank-")
    for name in outputs:
        if getattr(args, name, None) is not None or name == "out":
            setattr(args, name, os.path.join(tmp, name))
    if hasattr(args, "overwrite"):
        args.overwrite = True
    sys.stdout = open(os.devnull, "w")  # for the life of the rank


def run_sharded(args, body: Callable[[Any], int], outputs: tuple[str, ...] = ("out",)) -> int:
    """Run ``body(args)`` on ``args.tp`` ranks: directly when ``--tp 1``; inside the group when
    this process is a rank (torchrun, or spawned below); else spawn the ranks here."""
    size = int(1 if getattr(args, "tp", None) is None else args.tp)
    if size < 1:
        raise DSparkError(f"--tp must be >= 1, got {size}")
    if size == 1:
        return body(args)
    if not in_launcher():
        return launch(args, size, float(args.tp_timeout))
    device = getattr(args, "device", None) or "cpu"
    ctx = init(size, device, float(args.tp_timeout))
    if ctx.rank != 0:
        _quiet_rank(args, outputs)
    try:
        rc = int(body(args) or 0)
        shutdown(synced=True)
        return rc
    finally:
        shutdown()


def _rank_main(rank: int, size: int, port: int, data: dict, err_path: str) -> None:
    """One spawned rank: the environment torchrun would set, then the command itself."""
    import argparse

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(size),
    )
    args = argparse.Namespace(**data)
    if rank:  # its errors reach the launcher through err_path
        sys.stderr = open(os.devnull, "w")  # for the life of the rank
    try:
        rc = int(args._real_run(args) or 0)
    except DSparkError as e:
        _report(err_path, rank, " ".join(str(e).split()))
        sys.exit(2)
    except Exception as e:  # a collective with a dead peer, a timeout: one line, not a trace
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        _report(err_path, rank, f"{type(e).__name__}: {first}")
        sys.exit(1)
    if rc:
        sys.exit(rc)


def _report(err_path: str, rank: int, msg: str) -> None:
    with open(err_path, "a") as f:
        f.write(f"rank {rank}: {msg}\n")


def launch(args, size: int, timeout_s: float) -> int:
    """Spawn ``size`` ranks of this command on localhost; a failed or dead rank is one
    DSparkError line (the others are stopped)."""
    import logging

    import torch.multiprocessing as mp

    # the launcher's own "Terminating process ..." warning would be a second line
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    if getattr(args, "device", None) == "cuda" and torch.cuda.device_count() < size:
        raise DSparkError(
            f"--tp {size} on cuda needs {size} GPUs, found {torch.cuda.device_count()}"
        )
    data = {k: v for k, v in vars(args).items() if k != "_parser"}
    fd, err_path = tempfile.mkstemp(prefix="dspark-tp-", suffix=".err")
    os.close(fd)
    try:
        ctx = mp.start_processes(
            _rank_main,
            args=(size, free_port(), data, err_path),
            nprocs=size,
            join=False,
            start_method="spawn",
        )
        try:
            while not ctx.join():
                pass
        except mp.ProcessExitedException as e:
            raise DSparkError(_why(err_path, e.error_index, e.exit_code)) from None
        except mp.ProcessRaisedException as e:
            raise DSparkError(_why(err_path, e.error_index, None)) from None
        return 0
    finally:
        os.unlink(err_path)


def _why(err_path: str, rank: int, code: int | None) -> str:
    """The first rank's own one-line error, else how rank ``rank`` ended."""
    with open(err_path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    if lines:
        return f"--tp: {lines[0]}"
    if code is not None and code < 0:
        return f"--tp: rank {rank} died (signal {-code}); the other ranks were stopped"
    return f"--tp: rank {rank} exited with status {code}; the other ranks were stopped"
