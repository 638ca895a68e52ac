"""``real.train.val_windows``: each workload's fixed evaluation windows, from its validation split."""

import dataclasses

import numpy as np
import torch

from real.train import TrainConfig, eval_windows, val_windows


def test_val_windows_cuts_each_workloads_validation_split():
    arrays = {
        "code_val": np.arange(200, dtype=np.int64),
        "prose_val": np.arange(1000, 1300, dtype=np.int64),
        "code_train": np.zeros(5, dtype=np.int64),  # a training split is never read
    }
    c = dataclasses.replace(TrainConfig(), eval_windows=3)
    out = val_windows(arrays, c, 15)
    assert list(out) == ["code", "prose"]
    for wl, w in out.items():
        assert w.shape == (3, 16)
        assert torch.equal(w, eval_windows(arrays[f"{wl}_val"], 3, 15))
