"""Verification rules: strict greedy, strict speculative sampling, and the lossy β threshold.

All rules take the target's logits for ``[last token + k drafted tokens]`` (``k+1`` rows: row i is
the target's distribution for drafted position i; row k the bonus position) and return
``(n, next_token, lossy)``: drafted tokens accepted (a prefix), the token the target emits after
them (correction or bonus) and how many accepted tokens differ from the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy decoding; top-k / top-p then do nothing."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Rows of the processed sampling distribution (temperature, then top-k, then top-p).

    The same function is applied to the target's and the drafter's logits, so p and q are
    processed consistently. In greedy mode it is the plain softmax (temperature 1).
    """
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if sp.greedy:
        return torch.softmax(x, dim=-1)
    x = x / sp.temperature
    if 0 < sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sp_, idx = torch.sort(p, dim=-1, descending=True)
        cum = sp_.cumsum(-1)
        drop = (cum - sp_) >= sp.top_p  # keep the smallest prefix reaching top_p
        sp_ = sp_.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter_(-1, idx, sp_)
        p = p / p.sum(-1, keepdim=True)
    return p


def _first_false(mask: torch.Tensor) -> int:
    """Length of the leading run of True in a 1-D bool tensor (one host sync)."""
    return int(mask.to(torch.int64).cumprod(0).sum()) if mask.numel() else 0


def verify_greedy(draft: torch.Tensor, logits: torch.Tensor) -> tuple[int, int, int]:
    am = logits.argmax(-1)
    n = _first_false(am[:-1] == draft)
    return n, int(am[n]), 0


def verify_threshold(
    draft: torch.Tensor,
    logits: torch.Tensor,
    beta: float,
    sp: SamplingParams,
    gen: torch.Generator | None,
) -> tuple[int, int, int]:
    """Accept drafted x iff p(x) >= beta * max p; first rejection emits the target's choice."""
    p = probs(logits, sp)
    k = draft.numel()
    pmax, am = p.max(-1)
    px = p[torch.arange(k, device=p.device), draft] if k else p[:0, 0]
    n = _first_false(px >= beta * pmax[:k])
    lossy = int((draft[:n] != am[:n]).sum()) if n else 0
    nxt = int(am[n]) if sp.greedy else int(torch.multinomial(p[n], 1, generator=gen))
    return n, nxt, lossy


def verify_sampling(
    draft: torch.Tensor,
    q: torch.Tensor,
    logits: torch.Tensor,
    sp: SamplingParams,
    gen: torch.Generator | None,
) -> tuple[int, int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): identically distributed
    to sampling from the target. ``q`` rows are the drafter's processed distributions."""
    p = probs(logits, sp)
    return speculative_accept(draft, q, p, gen)


def speculative_accept(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator | None
) -> tuple[int, int, int]:
    k = draft.numel()
    if k:
        ar = torch.arange(k, device=p.device)
        px, qx = p[ar, draft], q[ar, draft]
        u = torch.rand(k, generator=gen, device=p.device, dtype=p.dtype)
        n = _first_false(u * qx <= px)  # u < min(1, p/q), without dividing by q
    else:
        n = 0
    if n < k:
        resid = (p[n] - q[n]).clamp_min(0.0)
        s = resid.sum()
        dist = resid / s if float(s) > 0 else p[n]
        nxt = int(torch.multinomial(dist, 1, generator=gen))
    else:
        nxt = int(torch.multinomial(p[k], 1, generator=gen))
    return n, nxt, 0  # strict: never lossy
