"""The feature-conditioned conv drafter (EAGLE-style): the seed's depthwise-separable blocks,
fed the target's own last hidden states as well as token embeddings.

The input of position t is ``embed(x_t) + proj(norm(h_{t-1}))``, where ``h_{t-1}`` is the target's
last-layer output (before its final norm) at position t - 1 — the state from which the target
predicted x_t. The target computes ``h`` for every committed position as a by-product of its
passes (prefill and verify), so when a round starts with L committed tokens the features of
positions ``0 .. L-2`` are known: the drafter's first draft step (input x_{L-1}, feature
h_{L-2}) sees the target's full state; draft steps after it feed tokens the target has not seen
yet and use a learned *missing* vector instead of a feature. Training (``real.train``) mimics
exactly that: per window, features up to a cut c, missing after it, loss at depths 1..D past c.

Because positions drafted with a missing feature are recomputed once their features exist, the
drafter's cache is valid only up to the committed length L of the round that fed it (not
L + accepted, as for the token-only drafters); the next round's catch-up step refeeds them.
The engine hands the hidden states over with ``observe_hidden(segs, hidden)`` after every target
pass (``real.drafter_protocol``: drafters with ``wants_hidden``). The token-only conv drafter
(``real.models.ConvDrafter``) stays an option; this one is ``kind = "featconv"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from control.configio import param
from real.drafters import ModelDrafter
from real.models import ConvConfig, ConvDrafter, RMSNorm, Segments


@dataclass(frozen=True)
class FeatureConvConfig(ConvConfig):
    # 384: the shipped target's residual width (its last hidden state is the feature).
    d_feature: int = param(384, lo=8, hi=16384, doc="width of the target's hidden state")


class FeatureConvDrafter(ConvDrafter):
    """``ConvDrafter`` whose first block's input adds the projected target hidden state."""

    kind = "featconv"

    def __init__(self, cfg: FeatureConvConfig) -> None:
        super().__init__(cfg)
        self.feat_norm = RMSNorm(cfg.d_feature, cfg.norm_eps)
        self.feat_proj = nn.Linear(cfg.d_feature, cfg.d_model, bias=False)
        # zero: an untrained feature path leaves the token-only drafter unchanged (warm start).
        nn.init.zeros_(self.feat_proj.weight)
        self.missing = nn.Parameter(torch.zeros(cfg.d_model))

    def receptive_field(self) -> int:
        """Positions one output depends on (itself included)."""
        return 1 + sum((self.cfg.kernel - 1) * b.dil for b in self.blocks)

    def feature_term(self, feats: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """``proj(norm(feats))`` where ``present``, the missing vector elsewhere."""
        f = self.feat_proj(self.feat_norm(feats.to(self.missing.dtype)))
        return torch.where(present[..., None], f, self.missing)

    def forward(
        self,
        ids: torch.Tensor,
        feats: torch.Tensor | None = None,
        present: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits ``[B, T, V]``; ``feats[:, t]`` is the target's hidden state at
        position t - 1 of ``ids`` (``[B, T, d_feature]``), used where ``present`` (``[B, T]``)."""
        x = self.embed_tokens(ids)
        if feats is None or present is None:
            x = x + self.missing
        else:
            x = x + self.feature_term(feats, present)
        return self.head(self.run_blocks(x))

    def new_state(self, length: int, dtype, device, slots: int = 1) -> dict:
        st = super().new_state(length, dtype, device, slots)
        #: the target's hidden state by slot and position, and per slot how many leading
        #: positions of it are known (set by the drafter before each draft phase)
        st["feat"] = torch.zeros(slots, length, self.cfg.d_feature, dtype=dtype, device=device)
        st["known"] = torch.zeros(slots, dtype=torch.long, device=device)
        return st

    def inputs(self, ids: torch.Tensor, segs: Segments, state: dict) -> torch.Tensor:
        si, pi = segs.slot_idx, segs.pos_idx
        prev = (pi - 1).clamp_min(0)
        present = (pi >= 1) & (prev < state["known"][si])
        x = self.embed_tokens(ids)
        if not bool(present.any()):  # draft steps past the committed prefix
            return x + self.missing
        return x + self.feature_term(state["feat"][si, prev], present)


class FeatureDrafter(ModelDrafter):
    """``ModelDrafter`` for a :class:`FeatureConvDrafter`: takes the target's hidden states from
    the engine and keeps its cache valid only where it was computed with known features."""

    wants_hidden = True

    def observe_hidden(self, segs: Segments, hidden: torch.Tensor) -> None:
        """The target's hidden states ``[N, D]`` of the packed tokens of ``segs`` (one pass)."""
        self.state["feat"][segs.slot_idx, segs.pos_idx] = hidden.to(self.dtype)

    def propose_batch(self, seq: torch.Tensor, slots, Ls, ks, taus, sp, gens):
        # positions < L - 1 of a row were fed to the target with committed tokens
        known = self.state["known"]
        known[torch.tensor(list(slots), dtype=torch.long, device=known.device)] = torch.tensor(
            [L - 1 for L in Ls], dtype=torch.long, device=known.device
        )
        return super().propose_batch(seq, slots, Ls, ks, taus, sp, gens)

    def accept_batch(self, slots, Ls, drafted, ns) -> None:
        # drafted positions were computed without features: refeed them next round
        for s, L in zip(slots, Ls):
            f = self._fed[s]
            if f is not None and f[0] == L:
                self._valid[s] = L
            self._fed[s] = None
