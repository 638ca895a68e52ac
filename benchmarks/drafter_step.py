"""The conv drafter's draft steps, each choice against the one it replaced, side by side in one run.

A draft phase's first step feeds every token the drafter has not seen: one normally, two after a
fully accepted round or a draft-free one, a whole prompt after admission; the steps after it feed
one token each. Three choices of ``real.models.ConvDrafter.step_packed`` are timed against the
alternative they replaced, on the shipped conv drafter (float32, 1 thread, medians of ``--calls``
calls of each, the two called in turn):

- the conv blocks of one sequence's 2..32 new tokens: gathering each token's window (what the
  step does) against ``F.conv1d`` over the span (what it did);
- the vocabulary head: each row's last token only (``logits=segs.last``, what the drafter asks
  for) against every fed token's logits, then indexed (what it did);
- a one-token step: the fused norm (``F.rms_norm``) and GLU (``F.glu``, the weights called
  without module dispatch) against the module-by-module ops they replaced, whose results are the
  same bits (``tests/real/test_models.py``).

Last line: ``drafter_gather_vs_conv1d_2tok=<time ratio> drafter_last_vs_all_logits_100tok=<time
ratio at 1 row> drafter_fused_vs_modules_step=<time ratio>`` (below 1: the step's way is faster).

    .venv/bin/python benchmarks/drafter_step.py [--calls 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _paired_ms(fa, fb, calls: int) -> tuple[float, float]:
    """Medians (ms) of ``fa`` and ``fb`` called in turn, ``calls`` each, after 10 warm-up calls
    of each: a change of machine speed hits both alike."""
    for _ in range(10):
        fa()
        fb()
    ta, tb = [], []
    for _ in range(calls):
        for fn, ts in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return float(np.median(ta)) * 1e3, float(np.median(tb)) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from real.engine import EngineConfig
    from real.models import Segments, _span
    from real.runtime import build_engine

    torch.set_num_threads(1)
    cfg = EngineConfig(
        target_dtype="float32", drafter="conv", drafter_dtype="float32", device="cpu", slots=8
    )
    eng = build_engine(cfg)
    m, st = eng.drafter.model, eng.drafter.state
    K, d, p = m.cfg.kernel, m.cfg.d_model, 300

    def blocks(T: int, gather: bool):
        x = torch.randn(T, d)

        def run():
            for blk, buf in zip(m.blocks, st["buf"]):
                r, w, b = (K - 1) * blk.dil, blk.conv.weight.view(d, K), buf[0]
                b[p + r : p + r + T] = blk.norm(x)
                if gather:
                    (b[p + _span(T, r, blk.dil, b.device)] * w.t()).sum(1) + blk.conv.bias
                else:
                    F.conv1d(
                        b[p : p + r + T].t().unsqueeze(0),
                        blk.conv.weight,
                        blk.conv.bias,
                        groups=d,
                        dilation=blk.dil,
                    )

        return run

    ids = torch.randint(0, m.cfg.vocab_size, (8 * 100,))

    def head(T: int, B: int, last: bool):
        def run():
            segs = Segments(list(range(B)), [p] * B, [T] * B, "cpu")
            x = ids[: T * B]
            if last:
                m.step_packed(x, segs, st, logits=segs.last)
            else:
                m.step_packed(x, segs, st)[segs.last]

        return run

    out = {}
    with torch.inference_mode():
        print("conv blocks of one sequence's new tokens (ms, median):")
        for T in (2, 8, 32):
            g, c = _paired_ms(blocks(T, True), blocks(T, False), a.calls)
            out[("gather", T)] = g / c
            print(f"  {T:3d} tokens: gather {g:.3f}, conv1d {c:.3f}, ratio {g / c:.3f}")
        print("first step with its logits (ms, median):")
        for T, B in ((2, 1), (100, 1), (2, 8), (100, 8)):
            n = max(10, a.calls // (10 if T * B > 100 else 1))
            lt, al = _paired_ms(head(T, B, True), head(T, B, False), n)
            out[("last", T, B)] = lt / al
            print(
                f"  {B} x {T:3d} tokens: last-token logits {lt:.3f}, all {al:.3f}, "
                f"ratio {lt / al:.3f}"
            )
        print("one-token step, fused norm and GLU against module-by-module (ms, median):")
        one, seg1 = ids[:1], Segments.one(0, p, 1)
        fused, mods = _paired_ms(
            _with(False, lambda: m.step_packed(one, seg1, st)),
            _with(True, lambda: m.step_packed(one, seg1, st)),
            a.calls,
        )
        out["fused"] = fused / mods
        print(f"  fused {fused:.3f}, modules {mods:.3f}, ratio {fused / mods:.3f}")
    print(
        f"drafter_gather_vs_conv1d_2tok={out[('gather', 2)]:.3f} "
        f"drafter_last_vs_all_logits_100tok={out[('last', 100, 1)]:.3f} "
        f"drafter_fused_vs_modules_step={out['fused']:.3f}"
    )
    return 0


def _modules_mix(self, blk, x, u_conv):
    """``ConvDrafter._mix`` before ``F.glu``: through the modules, chunk and sigmoid."""
    import torch

    a, g = blk.proj_in(u_conv).chunk(2, dim=-1)
    return x + blk.proj_out(a * torch.sigmoid(g))


def _with(modules: bool, fn):
    """``fn`` run with the module-by-module ops (``modules``) or the fused ones (the code's)."""
    from real.models import ConvDrafter, RMSNorm

    new = (RMSNorm.forward, ConvDrafter._mix)

    def run():
        if modules:
            RMSNorm.forward, ConvDrafter._mix = RMSNorm.formula, _modules_mix
        try:
            return fn()
        finally:
            RMSNorm.forward, ConvDrafter._mix = new

    return run


if __name__ == "__main__":
    raise SystemExit(main())
