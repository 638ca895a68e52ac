"""Where the TP model misses: the TP = N engine's own forward passes against the model's table.

``dspark validate --part tp`` predicts TP = N generation from the TP = 1 profile plus what the
ranks measure of the sharded projections and collectives (``validate.tp.tp_table``).
This check takes generation out: one spawned group times, alternating in ``--repeats`` chunks,

- rank 0 alone (the other ranks at a barrier): the TP = 1 profile grid (verify passes of
  1..k_max + 1 tokens at context 0 and one middle context, the drafter's rows) and the
  full-width projections (``real.tp_profile.time_projections``);
- all ranks: the collectives profile (``real.tp_profile.time_collectives``) and the same grid
  on the sharded engine (``real.profile.GridProfiler`` on it, as ``dspark real profile --tp N``).

It prints, per grid row, the TP = 1 pass, the measured TP = N pass, the model's TP = N pass
and their ratio (means of the repeats). A ratio that stays above 1 at every token count is a
bias of the forward-pass model itself, not of the generation loop or of a controller.

    .venv/bin/python benchmarks/tp_grid_check.py [--tp 2] [--repeats 3]

Last line: ``tp_grid_real_vs_model_median=<median ratio over the target rows>
tp_grid_real_vs_model_max=<largest>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable without an install

KEYS = ["model", "batch", "new_tokens", "context_tokens"]


def _job(rank: int, size: int, port: int, repeats: int, path: str) -> None:
    import torch
    import torch.distributed as dist

    from real import tp
    from real.profile import GridProfiler
    from real.tp_profile import collective_rows, message_tokens, time_collectives, time_projections
    from validate.tp_runs import TP1Side, chunk_passes
    from validate.tp_setup import TPValidateConfig, engine_for

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    torch.set_num_threads(1)
    cfg = TPValidateConfig(tp=size, repeats=repeats, correct_profile=False)
    one = TP1Side(cfg) if rank == 0 else None  # built before the group: not sharded
    tp.init(size, "cpu", cfg.timeout_s)
    try:
        engine = engine_for(cfg)
        grid = GridProfiler(engine, TP1Side.profile_config(cfg))
        grid.passes(1, record=False)
        toks = message_tokens((1,), engine.cfg.k_max) + [cfg.prompt_tokens - 1]
        layers, n = engine.target.cfg.n_layers, chunk_passes(cfg)
        cells = np.arange(cfg.profile_repeats * len(grid.cells))
        slices = [len(x) for x in np.array_split(cells, cfg.repeats)]
        times: dict = {}
        for r in range(cfg.repeats):
            if one is not None:
                one.gp.run_cells(one.slices[r])
                warm = 1 if r == 0 else 0
                time_projections(one.engine, one.toks, n, warm, one.proj_times, layers)
            dist.barrier()
            time_collectives(engine, toks, n, 1 if r == 0 else 0, times, layers)
            dist.barrier()
            grid.run_cells(slices[r])
        coll = collective_rows(engine, toks, times)
        rows_n, _ = grid.rows()
        tp.shutdown(synced=True)
    finally:
        tp.shutdown()
    if one is not None:
        rows_1, _ = one.gp.rows()
        out = {
            "tp1": rows_1,
            "tpn": rows_n,
            "collectives": coll.to_dict("list"),
            "projections": {int(t): float(np.mean(v)) for t, v in one.proj_times.items()},
            "layers": layers,
        }
        Path(path).write_text(json.dumps(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="alternating chunks")
    args = ap.parse_args(argv)
    import pandas as pd
    import torch.multiprocessing as mp

    from real.tp import free_port
    from validate.tp import tp_table

    path = Path(tempfile.mkdtemp()) / "tp_grid.json"
    mp.start_processes(
        _job,
        args=(args.tp, free_port(), args.repeats, str(path)),
        nprocs=args.tp,
        join=True,
        start_method="spawn",
    )
    d = json.loads(path.read_text())
    one, tpn = pd.DataFrame(d["tp1"]), pd.DataFrame(d["tpn"])
    for t in (one, tpn):
        t["seconds"] = t["seconds_mean"]  # the validation's statistic (a run pays the mean)
    proj = {int(k): v for k, v in d["projections"].items()}
    model = tp_table(one, proj, pd.DataFrame(d["collectives"]), int(d["layers"]))
    m = one[KEYS + ["seconds"]].rename(columns={"seconds": "tp1_s"})
    m = m.merge(tpn[KEYS + ["seconds"]].rename(columns={"seconds": "measured_s"}), on=KEYS)
    m = m.merge(model[KEYS + ["seconds"]].rename(columns={"seconds": "model_s"}), on=KEYS)
    m["measured_vs_model"] = m["measured_s"] / m["model_s"]
    print(m.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    r = m.loc[m["model"] == "target", "measured_vs_model"]
    print(f"tp_grid_real_vs_model_median={r.median():.3f} tp_grid_real_vs_model_max={r.max():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
