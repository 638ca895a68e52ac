"""The batched engine on a CUDA device (issue 12), one short run (< 6 minutes on an H200):

A. correctness on the GPU: tiny float64 models, batched greedy equality per sequence (different k
   per row, rows joining and leaving; tf, conv and ngram+tf drafters) and batch invariance of
   sampling (a sequence's tokens alone == among other sequences);
B. attention of one layer for a batch of ragged rows, packed per-row views (the engine's choice)
   vs padded-and-gathered with a mask, bf16, batch 1..16, 1 and 5 new tokens per row;
C. ``benchmarks/real_batch.py`` on the GPU (shipped models, bf16).

    python3 benchmarks/gpu_batch_check.py [--repeats 2] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def part_a() -> None:
    import torch

    from control import make_controller
    from real.drafters import HybridDrafter, ModelDrafter, NgramDrafter
    from real.engine import Engine, EngineConfig, Request
    from real.models import ConvConfig, ConvDrafter, Transformer, TransformerConfig

    dev, V = "cuda", 48
    torch.manual_seed(0)
    tgt = Transformer(
        TransformerConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=256)
    )
    with torch.no_grad():
        for name, p in tgt.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name else 3.0 / p.shape[1] ** 0.5)
    tgt = tgt.double().eval().to(dev)
    noisy = copy.deepcopy(tgt)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(
                torch.randn(p.shape, generator=g, dtype=p.dtype).to(dev)
                * 0.05
                * p.std().clamp_min(1e-3)
            )
    torch.manual_seed(2)
    conv = (
        ConvDrafter(ConvConfig(vocab_size=V, d_model=16, n_blocks=2, kernel=4, d_hidden=32))
        .double()
        .eval()
        .to(dev)
    )
    cfg = EngineConfig(
        max_len=200,
        k_max=8,
        target_dtype="float64",
        drafter_dtype="float64",
        stop_at_eot=False,
        slots=3,
        device=dev,
    )
    L = cfg.max_len + cfg.k_max + 1

    def prompt(seed, n):
        return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()

    for kind in ("tf", "conv", "ngram+tf"):
        if kind == "tf":
            d = ModelDrafter(noisy, L, torch.float64, dev)
        elif kind == "conv":
            d = ModelDrafter(conv, L, torch.float64, dev)
        else:
            d = HybridDrafter(
                ModelDrafter(noisy, L, torch.float64, dev), NgramDrafter(vocab_size=V), 1
            )
        eng = Engine(tgt, d, cfg)
        reqs = [
            Request(
                i,
                prompt(100 + i, 3 + 2 * i),
                15 + 4 * i,
                make_controller("fixed", {"k": (0, 1, 3, 5, 8, 2, 4)[i]}),
            )
            for i in range(7)
        ]
        refs = [eng.greedy_reference(r.prompt, r.max_new_tokens) for r in reqs]
        seqs = eng.run_batch(reqs)
        ok = all(s.tokens == r for s, r in zip(seqs, refs))
        acc = sum(r.accepted for s in seqs for r in s.records)
        print(
            f"A. cuda float64 batched greedy equality, drafter {kind}: "
            f"{'OK' if ok else 'MISMATCH'} (7 requests, 3 slots, {acc} accepted)",
            flush=True,
        )
    eng = Engine(
        tgt,
        ModelDrafter(noisy, L, torch.float64, dev),
        dataclasses.replace(cfg, temperature=1.0, top_k=20, seed=3),
    )

    def sreqs(ids):
        return [
            Request(i, prompt(200 + i, 6 + i), 20, make_controller("fixed", {"k": 3})) for i in ids
        ]

    alone = eng.run_batch(sreqs([0]))[0].tokens
    mates = {s.req.request_id: s.tokens for s in eng.run_batch(sreqs([2, 0, 1]))}
    print(
        f"A. cuda sampling batch invariance: {'OK' if alone == mates[0] else 'MISMATCH'}",
        flush=True,
    )


def part_b() -> None:
    import torch
    import torch.nn.functional as F

    dev, dt, H, hd, S, Lc = "cuda", torch.bfloat16, 6, 64, 16, 1100
    kc = torch.randn(S, H, Lc, hd, dtype=dt, device=dev)
    vc = torch.randn(S, H, Lc, hd, dtype=dt, device=dev)
    causal = torch.ones(Lc, Lc, dtype=torch.bool, device=dev).tril()

    def per_row(q, segs):
        outs, off = [], 0
        for s, p0, T in segs:
            m = None if T == 1 else causal[p0 : p0 + T, : p0 + T]
            outs.append(
                F.scaled_dot_product_attention(
                    q[None, :, off : off + T],
                    kc[s : s + 1, :, : p0 + T],
                    vc[s : s + 1, :, : p0 + T],
                    attn_mask=m,
                )[0]
            )
            off += T
        return torch.cat(outs, dim=1)

    def padded(q, segs):
        B, Tm = len(segs), max(t for _, _, t in segs)
        Lm = max(p + t for _, p, t in segs)
        slots = torch.tensor([s for s, _, _ in segs], device=dev)
        p0 = torch.tensor([p for _, p, _ in segs], device=dev)
        qp = q.new_zeros(B, H, Tm, hd)
        qp[:, :, : q.shape[1] // B] = q.view(H, B, -1, hd).transpose(0, 1)
        qpos = p0[:, None] + torch.arange(Tm, device=dev)[None]
        m = (torch.arange(Lm, device=dev)[None, None, :] <= qpos[:, :, None])[:, None]
        return F.scaled_dot_product_attention(qp, kc[slots, :, :Lm], vc[slots, :, :Lm], attn_mask=m)

    for B in (1, 4, 8, 16):
        for T in (1, 5):
            segs = [(b, 300 + 7 * b, T) for b in range(B)]
            q = torch.randn(H, B * T, hd, dtype=dt, device=dev)
            res = []
            for f in (per_row, padded):
                for _ in range(5):
                    f(q, segs)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(100):
                    f(q, segs)
                torch.cuda.synchronize()
                res.append(f"{f.__name__} {(time.perf_counter() - t) / 100 * 1e6:7.1f} us")
            print(
                f"B. attention one layer, batch {B:2d}, {T} new/row: " + ", ".join(res), flush=True
            )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--parts", default="abc")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_batch_check: no CUDA device")
    print(
        f"gpu_batch_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True
    )
    t0 = time.perf_counter()
    for part, fn in (("a", part_a), ("b", part_b)):
        if part in a.parts:
            try:
                fn()
            except Exception as e:
                print(f"part {part} failed: {type(e).__name__}: {e}", flush=True)
            print(f"({time.perf_counter() - t0:.0f} s)", flush=True)
    if "c" in a.parts:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from real_batch import main as rb

        rb(
            [
                "--device",
                "cuda",
                "--repeats",
                str(a.repeats),
                "--new-tokens",
                str(a.new_tokens),
                "--threads",
                "2",
            ]
        )
    print(f"gpu_batch_check: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
