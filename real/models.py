"""The project's models: a Llama-style target / tiny transformer drafter and the seed's conv drafter.

Both expose ``forward(ids)`` for teacher-forced training (``[B, T] -> [B, T, V]`` logits) and an
incremental ``step(ids, pos, state)`` for batch-1 decoding that writes into a static cache at
positions ``pos .. pos+T-1`` and reads only positions ``< pos+T``. Rolling back is not advancing
``pos``: slots beyond the accepted prefix are overwritten by the next step and never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from control.configio import param


@dataclass(frozen=True)
class TransformerConfig:
    # 4096: the shared byte-level BPE vocabulary (issue 4).
    vocab_size: int = param(4096, lo=16, hi=65536, doc="vocabulary size")
    # 384 x 6 layers x 6 heads, SwiGLU 1024: ~12 M parameters, trainable on 2 CPU cores.
    d_model: int = param(384, lo=8, hi=8192, doc="residual width")
    n_layers: int = param(6, lo=1, hi=64, doc="decoder layers")
    n_heads: int = param(6, lo=1, hi=64, doc="attention heads")
    d_ff: int = param(1024, lo=8, hi=32768, doc="SwiGLU hidden width")
    # 2048 positions of RoPE tables: longer than any prompt + output used here.
    max_seq_len: int = param(2048, lo=8, hi=65536, doc="longest sequence (RoPE table size)")
    # Llama's defaults.
    rope_theta: float = param(10000.0, lo=1.0, hi=1e7, doc="RoPE base")
    norm_eps: float = param(1e-5, lo=1e-8, hi=1e-2, doc="RMSNorm epsilon")


@dataclass(frozen=True)
class ConvConfig:
    vocab_size: int = param(4096, lo=16, hi=65536, doc="vocabulary size (shared tokenizer)")
    # d 128, 4 blocks, kernel 8, GLU width 256: ~0.9 M parameters, the seed's drafter size.
    d_model: int = param(128, lo=8, hi=4096, doc="residual width")
    n_blocks: int = param(4, lo=1, hi=32, doc="conv blocks")
    kernel: int = param(8, lo=1, hi=64, doc="causal depthwise conv kernel size")
    d_hidden: int = param(256, lo=8, hi=8192, doc="GLU width of each block")
    norm_eps: float = param(1e-5, lo=1e-8, hi=1e-2, doc="RMSNorm epsilon")
    # 1 = the seed's plain convs (receptive field n_blocks·(K-1)+1 = 29 tokens); 2 dilates
    # block i by 2^i (1, 2, 4, 8: 106 tokens) at the same parameter count and step cost.
    dilation_base: int = param(1, lo=1, hi=4, doc="block i dilates its conv by base**i")

    def dilation(self, i: int) -> int:
        return self.dilation_base ** i


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computed in float32 (or float64), as Llama does, then cast back.
        dt = x.dtype
        xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rope_tables(cfg: TransformerConfig, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    hd = cfg.d_model // cfg.n_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    t = torch.arange(cfg.max_seq_len, dtype=torch.int64).float()
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)
    # Llama's rotate_half(x) = [-x2, x1] = roll(x, hd/2) * [-1.., +1..]: fold the sign into sin
    # (exact: a sign flip never rounds), so RoPE is mul + roll + mul + add.
    sign = torch.ones(hd, dtype=dtype, device=device)
    sign[: hd // 2] = -1
    return cos, sin * sign


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, self.h = cfg.d_model, cfg.n_heads
        self.hd = d // cfg.n_heads
        self.input_layernorm = RMSNorm(d, cfg.norm_eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, cfg.norm_eps)
        self.gate_up = nn.Linear(d, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, d, bias=False)

    def forward(self, x, cos, sin, cache=None, pos=0, mask=None):
        B, T, D = x.shape
        qkv = self.qkv(self.input_layernorm(x)).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        qk = _rope(qkv[:2], cos, sin)  # q and k together: [2, B, H, T, hd]
        q, k, v = qk[0], qk[1], qkv[2]
        if cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            kc, vc = cache
            kc[:, :, pos:pos + T] = k
            vc[:, :, pos:pos + T] = v
            a = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T],
                                               attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        g, u = self.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Transformer(nn.Module):
    """Llama-style decoder (RMSNorm, RoPE, SwiGLU, tied embeddings)."""

    kind = "transformer"

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self._tables: dict = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * self.cfg.n_layers) if n.endswith(("o.weight", "down.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def tables(self, dtype, device):
        key = (dtype, str(device))
        if key not in self._tables:
            with torch.inference_mode(False):  # normal tensors, usable inside and outside
                self._tables[key] = rope_tables(self.cfg, dtype, device)
        return self._tables[key]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.embed_tokens(ids)
        cos, sin = self.tables(x.dtype if x.dtype != torch.float32 else torch.float32, x.device)
        cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.logits(x)

    # --- incremental decoding (batch 1) ---
    def new_state(self, length: int, dtype, device) -> dict:
        c = self.cfg
        hd = c.d_model // c.n_heads
        kv = [(torch.zeros(1, c.n_heads, length, hd, dtype=dtype, device=device),
               torch.zeros(1, c.n_heads, length, hd, dtype=dtype, device=device))
              for _ in range(c.n_layers)]
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        cos, sin = self.tables(dtype, device)
        return {"kv": kv, "causal": causal, "cos": cos, "sin": sin, "length": length}

    def step(self, ids: torch.Tensor, pos: int, state: dict) -> torch.Tensor:
        """Logits ``[T, V]`` of ``ids`` (shape ``[1, T]``) placed at ``pos..pos+T-1``."""
        T = ids.shape[1]
        if pos + T > state["length"]:
            raise ValueError(f"cache overflow: {pos + T} > {state['length']}")
        x = self.embed_tokens(ids)
        cos, sin = state["cos"][pos:pos + T], state["sin"][pos:pos + T]
        mask = None if T == 1 else state["causal"][pos:pos + T, :pos + T]
        for layer, cache in zip(self.layers, state["kv"]):
            x = layer(x, cos, sin, cache, pos, mask)
        return self.logits(x)[0]


class ConvBlock(nn.Module):
    def __init__(self, cfg: ConvConfig, dilation: int = 1) -> None:
        super().__init__()
        self.dil = dilation
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, cfg.kernel, groups=cfg.d_model, bias=True,
                              dilation=dilation)
        self.proj_in = nn.Linear(cfg.d_model, 2 * cfg.d_hidden, bias=False)
        self.proj_out = nn.Linear(cfg.d_hidden, cfg.d_model, bias=False)


class ConvDrafter(nn.Module):
    """The seed's drafter: causal depthwise conv (kernel K) + pointwise GLU, residual blocks."""

    kind = "conv"

    def __init__(self, cfg: ConvConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed_tokens.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(ConvBlock(cfg, cfg.dilation(i)) for i in range(cfg.n_blocks))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    def _mix(self, blk: ConvBlock, x: torch.Tensor, u_conv: torch.Tensor) -> torch.Tensor:
        a, g = blk.proj_in(u_conv).chunk(2, dim=-1)
        return x + blk.proj_out(a * torch.sigmoid(g))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        K = self.cfg.kernel
        for blk in self.blocks:
            u = blk.norm(x).transpose(1, 2)
            c = blk.conv(F.pad(u, ((K - 1) * blk.dil, 0))).transpose(1, 2)
            x = self._mix(blk, x, c)
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def new_state(self, length: int, dtype, device) -> dict:
        K, c = self.cfg.kernel, self.cfg
        # conv inputs by position (position-major), with (K-1)·dilation leading zero rows:
        # position p lives at row p + (K-1)·dil, so the window of position p is rows
        # p, p + dil, ..., p + (K-1)·dil.
        return {"buf": [torch.zeros(length + (K - 1) * blk.dil, c.d_model, dtype=dtype,
                                    device=device) for blk in self.blocks], "length": length}

    def step(self, ids: torch.Tensor, pos: int, state: dict) -> torch.Tensor:
        T = ids.shape[1]
        if pos + T > state["length"]:
            raise ValueError(f"cache overflow: {pos + T} > {state['length']}")
        K, d = self.cfg.kernel, self.cfg.d_model
        x = self.embed_tokens(ids)[0]  # [T, d]
        for blk, buf in zip(self.blocks, state["buf"]):
            r = (K - 1) * blk.dil  # receptive span of the block, minus one
            buf[pos + r:pos + r + T] = blk.norm(x)
            w = blk.conv.weight.view(d, K)
            if T == 1:  # one position: a weighted sum over the window, no conv kernel launch
                c = (buf[pos:pos + r + 1:blk.dil] * w.t()).sum(0, keepdim=True) + blk.conv.bias
            else:
                c = F.conv1d(buf[pos:pos + r + T].t().unsqueeze(0), blk.conv.weight,
                             blk.conv.bias, groups=d, dilation=blk.dil)[0].t()
            x = self._mix(blk, x, c)
        return F.linear(self.norm(x), self.embed_tokens.weight)


def build_model(kind: str, cfg) -> nn.Module:
    if kind == "transformer":
        return Transformer(cfg)
    if kind == "conv":
        return ConvDrafter(cfg)
    raise ValueError(f"unknown model kind {kind!r}")


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
