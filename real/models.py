"""The project's models: a Llama-style target / tiny transformer drafter and the seed's conv drafter.

Both expose ``forward(ids)`` for teacher-forced training (``[B, T] -> [B, T, V]`` logits) and an
incremental, batched ``step_packed(ids, segs, state)`` for decoding. The static cache is slotted:
``new_state(length, dtype, device, slots)`` holds ``slots`` sequences of ``length`` positions each.
A call serves several sequences at once, *packed*: ``segs`` (:class:`Segments`) says which slot each
sequence lives in, where its new tokens start and how many it brings (ragged: 1 for a plain step,
k + 1 for a verify pass, a whole prompt for a prefill); ``ids`` holds all their tokens back to back.
Every matmul runs on the packed tokens (no padding FLOPs); attention runs per sequence on a view of
its own slot, reading only positions ``< start + count`` of that slot, so nothing beyond a
sequence's written prefix — stale drafts, other slots, free slots — is ever read, not even under a
mask. Rolling back is not advancing the start: positions beyond the accepted prefix are
overwritten by the next step and never read. ``step(ids, pos, state, slot=0)`` is the one-sequence
special case (``ids`` of shape ``[1, T]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from control.configio import param

#: Which tokens' logits a packed step computes: all (True), none (False), or those a list or
#: tensor of packed row indices picks (a drafter's first step wants each segment's last token).
Wanted = bool | list[int] | torch.Tensor


def head_rows(x: torch.Tensor, logits: Wanted) -> torch.Tensor:
    """The rows of ``x`` whose logits are wanted (``logits`` True or row indices)."""
    return x if isinstance(logits, bool) else x[logits]


class Segments:
    """The sequences of one packed step: sequence b lives in cache slot ``slots[b]``, its
    ``lens[b]`` new tokens sit at positions ``starts[b] ..`` and occupy rows
    ``offsets[b] .. offsets[b] + lens[b]`` of the packed ``ids``. ``slot_idx`` / ``pos_idx``:
    per packed token, its slot and position (long tensors on ``device``)."""

    __slots__ = ("slots", "starts", "lens", "offsets", "n", "slot_idx", "pos_idx", "last")

    def __init__(self, slots, starts, lens, device="cpu") -> None:
        self.slots = [int(s) for s in slots]
        self.starts = [int(p) for p in starts]
        self.lens = [int(t) for t in lens]
        if not (len(self.slots) == len(self.starts) == len(self.lens)):
            raise ValueError("Segments: slots, starts and lens differ in length")
        if any(t < 1 for t in self.lens):
            raise ValueError(f"Segments: every sequence needs >= 1 new token, got {self.lens}")
        off, offs = 0, []
        for t in self.lens:
            offs.append(off)
            off += t
        self.offsets, self.n = offs, off
        if all(t == 1 for t in self.lens):
            si, pi = self.slots, self.starts
        else:
            si = [s for s, t in zip(self.slots, self.lens) for _ in range(t)]
            pi = [p + j for p, t in zip(self.starts, self.lens) for j in range(t)]
        self.slot_idx = torch.tensor(si, dtype=torch.long, device=device)
        self.pos_idx = torch.tensor(pi, dtype=torch.long, device=device)
        #: packed row of each sequence's last new token
        self.last = [o + t - 1 for o, t in zip(offs, self.lens)]

    @classmethod
    def one(cls, slot: int, start: int, count: int, device="cpu") -> Segments:
        return cls([slot], [start], [count], device)

    def check(self, state: dict) -> None:
        length, n_slots = state["length"], state["slots"]
        for s, p, t in zip(self.slots, self.starts, self.lens):
            if p + t > length:
                raise ValueError(f"cache overflow: {p + t} > {length}")
            if not 0 <= s < n_slots or p < 0:
                raise ValueError(f"bad slot/position: slot {s} of {n_slots}, position {p}")


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
        return self.dilation_base**i


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float32, torch.float64) and x.dtype == self.weight.dtype:
            # one fused op, bit-equal to the formula (tests/real/test_models.py): a drafter
            # step runs five norms of one token, where the op count is the cost.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return self.formula(x)

    def formula(self, x: torch.Tensor) -> torch.Tensor:
        """Llama's formula op by op: statistics in float32 (or float64), then cast back."""
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
        B, T, _ = x.shape
        qkv = (
            self.qkv(self.input_layernorm(x)).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        )
        qk = _rope(qkv[:2], cos, sin)  # q and k together: [2, B, H, T, hd]
        q, k, v = qk[0], qk[1], qkv[2]
        if cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            kc, vc = cache
            kc[:, :, pos : pos + T] = k
            vc[:, :, pos : pos + T] = v
            a = F.scaled_dot_product_attention(
                q, kc[:, :, : pos + T], vc[:, :, : pos + T], attn_mask=mask
            )
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.h * self.hd))
        g, u = self.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)

    def forward_packed(self, x, cos, sin, cache, segs: Segments, causal):
        """``x``: ``[N, D]`` packed new tokens of several sequences (see :class:`Segments`)."""
        N, _ = x.shape
        qkv = self.qkv(self.input_layernorm(x)).view(N, 3, self.h, self.hd)
        qk = _rope(qkv[:, :2], cos, sin)  # [N, 2, H, hd]; cos/sin: [N, 1, 1, hd]
        kc, vc = cache  # the cache may hold another dtype than x (``kv_dtype``)
        kc[segs.slot_idx, :, segs.pos_idx] = qk[:, 1].to(kc.dtype)
        vc[segs.slot_idx, :, segs.pos_idx] = qkv[:, 2].to(vc.dtype)
        q = qk[:, 0].transpose(0, 1).to(kc.dtype)  # [H, N, hd]
        outs = []
        for s, p, t, o in zip(segs.slots, segs.starts, segs.lens, segs.offsets):
            end = p + t
            a = F.scaled_dot_product_attention(
                q[None, :, o : o + t],
                kc[s : s + 1, :, :end],
                vc[s : s + 1, :, :end],
                attn_mask=None if t == 1 else causal[p:end, :end],
            )
            outs.append(a[0])
        a = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [H, N, hd]
        x = x + self.o(a.transpose(0, 1).reshape(N, self.h * self.hd).to(x.dtype))
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
                s = (
                    std / math.sqrt(2 * self.cfg.n_layers)
                    if n.endswith(("o.weight", "down.weight"))
                    else std
                )
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
        return self.logits(self.hidden(ids))

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The last layer's output before the final norm, ``[B, T, D]`` (what a feature
        drafter is conditioned on; ``logits(hidden(ids)) == forward(ids)``)."""
        T = ids.shape[1]
        x = self.embed_tokens(ids)
        cos, sin = self.tables(x.dtype if x.dtype != torch.float32 else torch.float32, x.device)
        cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x

    # --- incremental decoding: slotted static cache, packed sequences ---
    def new_state(self, length: int, dtype, device, slots: int = 1, kv_dtype=None) -> dict:
        """``kv_dtype`` (default ``dtype``): the KV cache's dtype; attention runs in it."""
        c = self.cfg
        hd = c.d_model // c.n_heads
        kvd = dtype if kv_dtype is None else kv_dtype
        if length > c.max_seq_len:
            raise ValueError(
                f"cache of {length} positions exceeds the RoPE table ({c.max_seq_len})"
            )
        h = self.layers[0].h  # the heads this process holds (a shard of them under real.tp)
        kv = [
            (
                torch.zeros(slots, h, length, hd, dtype=kvd, device=device),
                torch.zeros(slots, h, length, hd, dtype=kvd, device=device),
            )
            for _ in range(c.n_layers)
        ]
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        cos, sin = self.tables(dtype, device)
        return {
            "kv": kv,
            "causal": causal,
            "cos": cos,
            "sin": sin,
            "length": length,
            "slots": slots,
        }

    def step_packed(
        self, ids: torch.Tensor, segs: Segments, state: dict, logits: Wanted = True
    ) -> torch.Tensor | None:
        """Logits ``[N, V]`` of the packed new tokens ``ids`` (shape ``[N]``) of ``segs``
        (None with ``logits=False``: a prefill only fills the cache; an index tensor: those
        tokens' only, :func:`head_rows`). The last layer's output of these tokens (before the
        final norm, ``[N, D]``) is left in ``state["hidden"]`` for a feature drafter, every
        layer's in ``state["hidden_layers"]`` (references, no copies)."""
        segs.check(state)
        x = self.embed_tokens(ids)
        cos = state["cos"][segs.pos_idx][:, None, None, :]
        sin = state["sin"][segs.pos_idx][:, None, None, :]
        outs = []  # every layer's output, for a drafter that reads several (real.block_drafter)
        for layer, cache in zip(self.layers, state["kv"]):
            x = layer.forward_packed(x, cos, sin, cache, segs, state["causal"])
            outs.append(x)
        state["hidden"], state["hidden_layers"] = x, outs
        return None if logits is False else self.logits(head_rows(x, logits))

    def step(self, ids: torch.Tensor, pos: int, state: dict, slot: int = 0) -> torch.Tensor:
        """Logits ``[T, V]`` of ``ids`` (shape ``[1, T]``) placed at ``pos..pos+T-1`` of
        ``slot``: one sequence through :meth:`step_packed`."""
        return self.step_packed(ids[0], Segments.one(slot, pos, ids.shape[1], ids.device), state)


class ConvBlock(nn.Module):
    def __init__(self, cfg: ConvConfig, dilation: int = 1) -> None:
        super().__init__()
        self.dil = dilation
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.conv = nn.Conv1d(
            cfg.d_model, cfg.d_model, cfg.kernel, groups=cfg.d_model, bias=True, dilation=dilation
        )
        self.proj_in = nn.Linear(cfg.d_model, 2 * cfg.d_hidden, bias=False)
        self.proj_out = nn.Linear(cfg.d_hidden, cfg.d_model, bias=False)


#: Up to this many new tokens of one sequence, a conv block gathers each token's window and
#: sums it (as the packed path does) instead of launching ``F.conv1d``: on a CPU the gather is
#: the faster of the two up to this size and its cost grows with T (``benchmarks/drafter_step.py``
#: times both at 2, 8 and 32 tokens: a drafter catching up on the tokens of a fully accepted or
#: draft-free round).
GATHER_MAX_TOKENS = 32


def _taps(r: int, dil: int, device) -> torch.Tensor:
    """Offsets ``0, dil, .., r`` of a conv window's taps from its first buffer position."""
    return torch.arange(0, r + 1, dil, device=device)


def _span(T: int, r: int, dil: int, device) -> torch.Tensor:
    """``[T, r // dil + 1]`` buffer offsets of each of T consecutive tokens' conv windows."""
    return torch.arange(T, device=device)[:, None] + _taps(r, dil, device)


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

    def inputs(self, ids: torch.Tensor, segs: Segments, state: dict) -> torch.Tensor:
        """The first block's input for packed tokens (a feature drafter adds the target's
        hidden states here)."""
        return self.embed_tokens(ids)

    def _mix(self, blk: ConvBlock, x: torch.Tensor, u_conv: torch.Tensor) -> torch.Tensor:
        # GLU: first half times the sigmoid of the second; the weights are called directly
        # (no module dispatch: the step of one token is bound by per-op overhead)
        h = F.glu(F.linear(u_conv, blk.proj_in.weight), dim=-1)
        return x + F.linear(h, blk.proj_out.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_blocks(self.embed_tokens(ids)))

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks over whole sequences ``[B, T, d]`` (teacher-forced, causal)."""
        K = self.cfg.kernel
        for blk in self.blocks:
            u = blk.norm(x).transpose(1, 2)
            c = blk.conv(F.pad(u, ((K - 1) * blk.dil, 0))).transpose(1, 2)
            x = self._mix(blk, x, c)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def new_state(self, length: int, dtype, device, slots: int = 1) -> dict:
        K, c = self.cfg.kernel, self.cfg
        # conv inputs by slot and position (position-major), with (K-1)·dilation leading zero
        # rows: position p lives at row p + (K-1)·dil, so the window of position p is rows
        # p, p + dil, ..., p + (K-1)·dil of its slot.
        return {
            "buf": [
                torch.zeros(
                    slots, length + (K - 1) * blk.dil, c.d_model, dtype=dtype, device=device
                )
                for blk in self.blocks
            ],
            "length": length,
            "slots": slots,
        }

    def step_packed(
        self, ids: torch.Tensor, segs: Segments, state: dict, logits: Wanted = True
    ) -> torch.Tensor | None:
        """Logits ``[N, V]`` of the packed new tokens ``ids`` (shape ``[N]``) of ``segs``
        (None with ``logits=False``; an index tensor: those tokens' only)."""
        segs.check(state)
        K, d = self.cfg.kernel, self.cfg.d_model
        x = self.inputs(ids, segs, state)  # [N, d]
        si, pi = segs.slot_idx, segs.pos_idx
        one = len(segs.slots) == 1
        for blk, buf in zip(self.blocks, state["buf"]):
            r = (K - 1) * blk.dil  # receptive span of the block, minus one
            w = blk.conv.weight.view(d, K)
            if one:  # one sequence: contiguous rows of its slot, as a view
                s, p, T = segs.slots[0], segs.starts[0], segs.lens[0]
                b = buf[s]
                b[p + r : p + r + T] = blk.norm(x)
                if T == 1:  # a weighted sum over the window, no conv kernel launch
                    c = (b[p : p + r + 1 : blk.dil] * w.t()).sum(0, keepdim=True) + blk.conv.bias
                elif T <= GATHER_MAX_TOKENS:  # a few tokens (a drafter's catch-up): gathered
                    win = p + _span(T, r, blk.dil, b.device)
                    c = (b[win] * w.t()).sum(1) + blk.conv.bias
                else:
                    c = F.conv1d(
                        b[p : p + r + T].t().unsqueeze(0),
                        blk.conv.weight,
                        blk.conv.bias,
                        groups=d,
                        dilation=blk.dil,
                    )[0].t()
            else:  # packed: write every new input, then gather each token's window
                buf[si, pi + r] = blk.norm(x)
                win = pi[:, None] + _taps(r, blk.dil, pi.device)
                c = (buf[si[:, None], win] * w.t()).sum(1) + blk.conv.bias
            x = self._mix(blk, x, c)
        if logits is False:
            return None
        return F.linear(self.norm(head_rows(x, logits)), self.embed_tokens.weight)

    def step(self, ids: torch.Tensor, pos: int, state: dict, slot: int = 0) -> torch.Tensor:
        """Logits ``[T, V]`` of ``ids`` (shape ``[1, T]``) placed at ``pos..pos+T-1`` of
        ``slot``: one sequence through :meth:`step_packed`."""
        return self.step_packed(ids[0], Segments.one(slot, pos, ids.shape[1], ids.device), state)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
