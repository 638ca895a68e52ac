"""The block (semi-autoregressive) drafter: ONE forward proposes up to B tokens, with a
confidence head (docs/design.md, "Block (semi-autoregressive) drafting").

When a round starts with L committed tokens, the target has computed its hidden states for
positions ``0 .. L-2`` (its passes feed every committed token but the last). The drafter reads
the last ``context`` committed positions p = L-C .. L-1: entry p is ``embed(x_p)`` plus a
projection of the target's hidden states at p - 1 from several of its layers
(``feature_layers``; a learned *missing* vector at p = 0). B mask slots follow, one per block
position j = 1..B, each a learned vector. A small encoder runs over the C + B entries with
bidirectional attention (every slot sees the context and every other slot), and the tied head
turns slot j into the distribution q_j of token x_{L+j-1}. The entry for p = L-1 carries the
last verified token, the one the target has not yet seen.

With the adjacent-token chain (``adjacent`` > 0), slot j also reads the token the block drafted
at slot j - 1 (the last verified token for slot 1) and a running state over the slots before
it: ``r_j = silu(X x_j + E emb(t_{j-1}) + R r_{j-1})``, and slot j's state becomes ``x_j + O
r_j``. The encoder runs once; the chain adds three small products, a norm and the head's product
per slot. Training feeds it the labels' own previous tokens (teacher forcing: the tokens the
block drafted whenever it was accepted so far).

The confidence head predicts, per slot j, the probability that draft token j is accepted given
the ones before it were: a small MLP over the slot's final state and q_j's top probability,
then a per-position affine calibration (``calib``, fitted on held-out text after training).
Those predictions are the round's confidences (``Observation.confidences``), the acceptance
estimate the controllers plan with.

Exactness. Slot j's distribution q_j depends on the committed context and, with the chain, on
the tokens drawn at slots before j; under sampling token j is drawn from that q_j and
verification divides by that same q_j: lossless. The τ stop reads the head's prediction of
slot j, computed before token j is drawn: drafting stops before the first slot whose
confidence is below τ (the rule of ``real.drafters``), and only the tokens kept are drawn.
Under greedy decoding the target's argmax decides as for every drafter. The drafter keeps no
cache (only the target's hidden states by slot and position), so a rejected draft needs no
rollback and a row never falls behind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from control.configio import param
from control.errors import DSparkError
from control.types import draft_stop
from real.block_recalibration import OnlineCalibration, verified_slots
from real.drafter_protocol import Proposal
from real.drafters import _NONE, _gens, _OneRow
from real.models import RMSNorm, Segments
from real.sampling import SamplingParams, probs


@dataclass(frozen=True)
class BlockConfig:
    # the shared byte-level BPE vocabulary (real.tokenizer).
    vocab_size: int = param(4096, lo=16, hi=65536, doc="vocabulary size")
    # 128 wide, SwiGLU 384, tied head: ~1 M parameters, the conv drafter's width. Two layers by
    # default so the slots exchange what the first one found (one layer shows each slot only the
    # others' constant inputs); with the adjacent-token chain one layer is enough: the shipped
    # drafter has one, accepting as much on unseen prompts as two at a ~20% cheaper propose call
    # (benchmarks/real_speed.py; configs/train_block.toml). At batch 1 on the 2-core CPU 192 x 2
    # layers over 8 context positions cost ~1.2x the conv drafter's four steps.
    d_model: int = param(128, lo=8, hi=4096, doc="residual width")
    n_layers: int = param(2, lo=1, hi=16, doc="encoder layers over context + mask slots")
    n_heads: int = param(4, lo=1, hi=64, doc="attention heads")
    d_ff: int = param(384, lo=8, hi=16384, doc="SwiGLU hidden width")
    # DSpark's block; the engine's k cuts it per sequence.
    block_size: int = param(7, lo=1, hi=64, doc="draft block B: tokens one forward proposes")
    # 4 committed positions: the recent tokens and the target's states there (the states
    # carry the longer past).
    context: int = param(4, lo=1, hi=256, doc="committed positions the block attends to")
    # the shipped target's residual width.
    d_feature: int = param(384, lo=8, hi=16384, doc="width of the target's hidden states")
    # target layers 2, 4 and 6 (1-based outputs; 6 = the last of the shipped 6-layer target).
    feature_layers: tuple[int, ...] = param(
        (2, 4, 6), lo=1, hi=256, doc="target layers whose outputs condition the block"
    )
    # the adjacent-token chain's width (0: none, every slot guesses from the context alone).
    # Each slot j then also reads the token drafted at j - 1 (the last committed token for
    # j = 1) and a running state over the slots before it: a block's later tokens follow the
    # ones it drafted, as an autoregressive drafter's do, for one small product a slot.
    adjacent: int = param(0, lo=0, hi=4096, doc="adjacent-token chain width (0: none)")
    # the confidence head's hidden width.
    d_conf: int = param(32, lo=4, hi=4096, doc="confidence head hidden width")
    norm_eps: float = param(1e-5, lo=1e-8, hi=1e-2, doc="RMSNorm epsilon")


class EncoderLayer(nn.Module):
    """Pre-norm attention (no mask: bidirectional, padded entries masked out) + SwiGLU."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        d, self.h = cfg.d_model, cfg.n_heads
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.gate_up = nn.Linear(d, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, d, bias=False)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, rows: slice | None = None
    ) -> torch.Tensor:
        """``[N, T, d]`` -> the outputs of entries ``rows`` (None: all): every entry is a key
        and a value, only those rows query and go through the MLP (the last layer's other
        outputs are never read)."""
        N, T, d = x.shape
        hd = d // self.h
        y = self.attn_norm(x)
        if rows is None:
            q, k, v = self.qkv(y).view(N, T, 3, self.h, hd).unbind(2)
        else:
            w = self.qkv.weight
            k, v = F.linear(y, w[d:]).view(N, T, 2, self.h, hd).unbind(2)
            x = x[:, rows]
            q = F.linear(y[:, rows], w[:d]).view(N, x.shape[1], self.h, hd)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
        )
        x = x + self.o(a.transpose(1, 2).reshape(N, x.shape[1], d))
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class BlockDrafterModel(nn.Module):
    """The block drafter's network: context entries + B mask slots -> B distributions and B
    confidence logits."""

    kind = "block"

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise DSparkError(
                f"block drafter: d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}"
            )
        self.cfg = cfg
        d, nf = cfg.d_model, len(cfg.feature_layers)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.feat_norm = nn.Parameter(torch.ones(nf, cfg.d_feature))
        self.feat_proj = nn.Linear(nf * cfg.d_feature, d, bias=False)
        self.missing = nn.Parameter(torch.zeros(d))
        self.ctx_pos = nn.Parameter(torch.zeros(cfg.context, d))
        self.slots = nn.Parameter(torch.zeros(cfg.block_size, d))
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d, cfg.norm_eps)
        if cfg.adjacent:  # r_j = silu(X x_j + E emb(t_{j-1}) + R r_{j-1}); x_j += O r_j
            a = cfg.adjacent
            self.adj_x = nn.Linear(d, a)
            self.adj_e = nn.Linear(d, a, bias=False)
            self.adj_r = nn.Linear(a, a, bias=False)
            self.adj_o = nn.Linear(a, d, bias=False)
        self.conf_in = nn.Linear(d + 2, cfg.d_conf)
        self.conf_out = nn.Linear(cfg.d_conf, 1)
        # per block position: confidence = sigmoid(scale_j · logit + shift_j) (identity until
        # fitted on held-out text, real.block_train.calibrate)
        self.calib = nn.Parameter(
            torch.stack([torch.ones(cfg.block_size), torch.zeros(cfg.block_size)])
        )
        for p in (self.embed_tokens.weight, self.ctx_pos, self.slots):
            nn.init.normal_(p, 0.0, 0.02)
        for layer in self.layers:
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                nn.init.normal_(lin.weight, 0.0, 0.02)
        if cfg.adjacent:  # starts as the chain-free drafter
            nn.init.zeros_(self.adj_o.weight)

    def features(self, feats: torch.Tensor) -> torch.Tensor:
        """``[..., nf · d_feature]`` target states -> ``[..., d]``: each layer's state
        RMS-normalised with its own gain, then one projection."""
        nf, df = self.feat_norm.shape
        f = feats.to(self.feat_norm.dtype).unflatten(-1, (nf, df))
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * self.feat_norm
        return self.feat_proj(f.flatten(-2))

    def encode(
        self,
        tokens: torch.Tensor,
        feats: torch.Tensor,
        present: torch.Tensor,
        valid: torch.Tensor | None,
        heads: int | None = None,
        projected: bool = False,
    ) -> torch.Tensor:
        """The encoder's outputs ``[N, H, d]`` (before the final norm) of N blocks' first H =
        ``heads`` slots (None: all B; every slot takes part in the attention either way).

        ``tokens`` ``[N, C]``: context tokens x_p; ``feats`` ``[N, C, nf · d_feature]``: the
        target's states at p - 1 (``projected``: already through :meth:`features`, ``[N, C,
        d]``), used where ``present``; ``valid`` ``[N, C]``: entries that exist (p >= 0; a
        prompt shorter than C leaves the first ones out; None: all)."""
        N, C = tokens.shape
        x = self.embed_tokens(tokens) + self.ctx_pos[-C:]
        f = feats if projected else self.features(feats)
        x = x + torch.where(present[..., None], f, self.missing)
        x = torch.cat([x, self.slots.expand(N, -1, -1)], dim=1)
        mask = None
        if valid is not None and not bool(valid.all()):
            keep = torch.cat([valid, valid.new_ones(N, self.cfg.block_size)], dim=1)
            mask = keep[:, None, None, :]
        H = self.cfg.block_size if heads is None else heads
        *first, last = self.layers
        for layer in first:
            x = layer(x, mask)
        return last(x, mask, slice(C, C + H))  # only the read slots' outputs

    def forward(
        self,
        tokens: torch.Tensor,
        feats: torch.Tensor,
        present: torch.Tensor,
        valid: torch.Tensor | None,
        heads: int | None = None,
        projected: bool = False,
        prev: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[N, H, V]`` and confidence logits ``[N, H]`` (calibrated) of the first H
        slots (arguments as :meth:`encode`). With the adjacent-token chain, slot j reads
        ``prev[:, j - 1]`` as the token before it (``prev`` ``[N, H]``: the last context
        token, then the block's own tokens; teacher forcing); None: the greedy chain, each slot
        reading the argmax of the one before."""
        x = self.encode(tokens, feats, present, valid, heads, projected)
        if not self.cfg.adjacent:
            h = self.norm(x)
            logits = F.linear(h, self.embed_tokens.weight)
        elif prev is None:
            logits, h = self.chain(x, tokens[:, -1], lambda lg, h, j: lg.argmax(-1))
        else:
            logits, h = self.chain(x, prev[:, 0], lambda lg, h, j: prev[:, j + 1])
        return logits, self.confidence_logits(h, logits)

    def chain(self, x: torch.Tensor, first: torch.Tensor, pick):
        """The adjacent-token chain over the slots of ``x`` ``[N, H, d]`` (:meth:`encode`):
        slot j reads the token before it (``first`` ``[N]`` for slot 1, then ``pick(logits_j,
        h_j, j)``, the token slot j + 1 reads: not called after the last slot) and the chain's
        state. Returns the logits ``[N, H, V]`` and the normed states ``[N, H, d]``."""
        H = x.shape[1]
        px = self.adj_x(x)
        we, wr, wo = self.adj_e.weight.t(), self.adj_r.weight.t(), self.adj_o.weight.t()
        prev, r = first, None
        ls, hs = [], []
        for j in range(H):  # fused products: the op count is a slot's cost on a CPU
            a = torch.addmm(px[:, j], self.embed_tokens(prev), we)
            r = F.silu(a if r is None else torch.addmm(a, r, wr))
            h = self.norm(torch.addmm(x[:, j], r, wo))
            lg = F.linear(h, self.embed_tokens.weight)
            ls.append(lg)
            hs.append(h)
            if j + 1 < H:
                prev = pick(lg, h, j)
        return torch.stack(ls, 1), torch.stack(hs, 1)

    def confidence_logits(
        self, h: torch.Tensor, logits: torch.Tensor, start: int = 0
    ) -> torch.Tensor:
        """The head's calibrated logit of P(slot j accepted | slots < j accepted), ``[N, H]``
        for slots ``start`` .. ``start`` + H - 1 (0-based): from the slot's state and the top
        probability of its distribution (no gradient into the drafter through the head)."""
        top = torch.log_softmax(logits.detach().float(), -1).max(-1).values
        z = torch.cat(
            [h.detach(), top[..., None].to(h.dtype), top.exp()[..., None].to(h.dtype)], -1
        )
        cal = self.calib[:, start : start + h.shape[-2]]
        raw = self.conf_out(F.silu(self.conf_in(z)))[..., 0]
        return raw * cal[0] + cal[1]


class BlockDrafter(_OneRow):
    """The engine's block drafter (``Drafter`` protocol): the target's hidden states of
    ``feature_layers`` by slot and position (handed over after every target pass), one
    forward per round for every drafting row."""

    wants_hidden = True

    def __init__(
        self,
        model: BlockDrafterModel,
        length: int,
        dtype: torch.dtype,
        device,
        slots: int = 1,
        recalibration: OnlineCalibration | None = None,
    ) -> None:
        """``recalibration``: the head's predictions refitted on the rounds the engine tells
        (:meth:`learn`); None keeps the shipped calibration."""
        self.model, self.dtype, self.device, self.length = model, dtype, device, length
        self.name = "drafter-block"
        cfg = model.cfg
        self.block_size, self.hidden_layers = cfg.block_size, cfg.feature_layers
        self.recalibration = recalibration
        self._logits: dict[int, list[float]] = {}  # per slot: the kept slots' head logits
        self.allocate(slots)

    def allocate(self, slots: int) -> None:
        """Per slot and position the target's states, already projected (:meth:`features`:
        each position's projection is the same whichever round reads it, so it is computed
        once, when the target hands the states over)."""
        d = self.model.cfg.d_model
        self.state = {
            "feat": torch.zeros(slots, self.length, d, dtype=self.dtype, device=self.device),
            "length": self.length,
            "slots": slots,
        }

    def reset_slot(self, slot: int) -> None:
        """A new request in ``slot``: positions are overwritten by its passes; the
        recalibration forgets the last request's offset."""
        if self.recalibration is not None:
            self.recalibration.forget_request(slot)

    def reset(self) -> None:
        self.reset_slot(0)

    def valid_of(self, slot: int) -> int:
        """No cache of its own: a row is never behind (the engine counts no catch-up)."""
        return self.length

    def observe_hidden(self, segs: Segments, hidden: torch.Tensor) -> None:
        """The target's states ``[N, nf · d_feature]`` of the packed tokens of ``segs``."""
        cfg = self.model.cfg
        want = len(cfg.feature_layers) * cfg.d_feature
        if hidden.shape[-1] != want:
            raise DSparkError(
                f"block drafter: the target hands {hidden.shape[-1]} features a token, the "
                f"drafter reads {want} (layers {self.hidden_layers} of width {cfg.d_feature})"
            )
        with torch.no_grad():
            f = self.model.features(hidden.to(self.dtype))
            self.state["feat"][segs.slot_idx, segs.pos_idx] = f

    def block(self, seq: torch.Tensor, slots: list[int], Ls: list[int], heads: int | None = None):
        """Logits ``[R, H, V]`` and the head's confidences ``[R, H]`` of the first H =
        ``heads`` slots (None: B) of rows ``slots`` at lengths ``Ls``."""
        logits, z = self.block_logits(seq, slots, Ls, heads)
        return logits, torch.sigmoid(z)

    def block_logits(self, seq: torch.Tensor, slots: list[int], Ls: list[int], heads=None):
        """:meth:`block` with the head's (calibrated) confidence logits, float32 (with the
        adjacent-token chain: along the greedy chain)."""
        logits, conf = self.model(*self._inputs(seq, slots, Ls), heads, projected=True)
        return logits, conf.float()

    def _inputs(self, seq: torch.Tensor, slots: list[int], Ls: list[int]):
        """The model's context tokens, projected states, presence and validity for rows
        ``slots`` at lengths ``Ls``."""
        C, dev = self.model.cfg.context, seq.device
        s = torch.tensor(slots, dtype=torch.long, device=dev)[:, None]
        pos = (
            torch.tensor(Ls, dtype=torch.long, device=dev)[:, None]
            - C
            + torch.arange(C, device=dev)
        )
        tokens = seq[s, pos.clamp_min(0)]
        feats = self.state["feat"][s, (pos - 1).clamp_min(0)]
        valid = None if min(Ls) >= C else pos >= 0  # known on the host: no device sync
        return tokens, feats, pos >= 1, valid

    def _mapped(self, z: torch.Tensor, slots: list[int]):
        """Confidences (nested lists) of the head's logits ``z`` (a row per slot of
        ``slots``: the request whose offset applies) and those logits as lists (None without
        recalibration)."""
        if self.recalibration is None:
            return torch.sigmoid(z).tolist(), None
        zs = z.detach().double().cpu().numpy()
        return self.recalibration.apply(zs, slots).tolist(), zs.tolist()

    def _confidences(self, seq, slots, Ls, heads):
        """Logits, confidences (lists per row) and the head's logits (None: no
        recalibration) of rows ``slots``: the head's predictions, or their recalibration."""
        logits, z = self.block_logits(seq, slots, Ls, heads)
        return (logits, *self._mapped(z, slots))

    def propose_batch(
        self, seq: torch.Tensor, slots, Ls, ks, taus, sp: SamplingParams, gens
    ) -> list[Proposal]:
        """One forward for every row with k > 0; row b keeps the first ``min(k_b, B)`` slots,
        cut before the first whose confidence is below ``tau_b``."""
        B = len(slots)
        gens = _gens(gens, B)
        out: list[Proposal] = [_NONE] * B
        rows = [b for b in range(B) if ks[b] > 0]
        if not rows:
            return out
        heads = min(max(ks[b] for b in rows), self.block_size)  # no head for a slot nobody keeps
        if self.model.cfg.adjacent and not sp.greedy:
            return self._sampled_chain(seq, slots, Ls, ks, taus, sp, gens, rows, heads, out)
        logits, cf, zs = self._confidences(
            seq, [slots[b] for b in rows], [Ls[b] for b in rows], heads
        )
        q = None if sp.greedy else probs(logits, sp)
        am = logits.argmax(-1) if sp.greedy else None
        for i, b in enumerate(rows):
            n = draft_stop(cf[i], min(ks[b], self.block_size), taus[b])
            if not n:
                continue
            if q is None:
                assert am is not None
                toks = am[i, :n]
            else:  # drawn from exactly the rows verification divides by
                toks = torch.multinomial(q[i, :n], 1, generator=gens[b])[:, 0]
            seq[slots[b], Ls[b] : Ls[b] + n] = toks
            out[b] = (n, cf[i][:n], None if q is None else q[i, :n])
            if zs is not None:
                self._logits[slots[b]] = zs[i][:n]
        return out

    def _sampled_chain(self, seq, slots, Ls, ks, taus, sp, gens, rows, heads, out):
        """:meth:`propose_batch` under sampling with the adjacent-token chain: slot j's
        distribution q_j follows the token drawn at j - 1, so a row draws slot by slot, from
        exactly the q_j verification divides by, and stops before the first slot past its k or
        below its τ (read from that slot's confidence, known before its token is drawn). Rows
        that stopped follow their argmax (no draw) while the others go on."""
        m = self.model
        tokens, feats, present, valid = self._inputs(
            seq, [slots[b] for b in rows], [Ls[b] for b in rows]
        )
        x = m.encode(tokens, feats, present, valid, heads, projected=True)
        live = [min(ks[b], self.block_size) for b in rows]  # slots a row may still draw
        kept: list[tuple[list, list, list, list]] = [([], [], [], []) for _ in rows]

        keys = [slots[b] for b in rows]

        def pick(lg: torch.Tensor, h: torch.Tensor, j: int) -> torch.Tensor:
            z = m.confidence_logits(h[:, None], lg[:, None], j)[:, 0].float()
            cf, zs = self._mapped(z, keys)
            q, nxt = probs(lg, sp), lg.argmax(-1)
            for i, b in enumerate(rows):
                if j >= live[i] or cf[i] < taus[b]:
                    live[i] = 0
                    continue
                t = torch.multinomial(q[i], 1, generator=gens[b])[0]
                nxt[i] = t
                for acc, v in zip(kept[i], (t, cf[i], q[i], None if zs is None else zs[i])):
                    acc.append(v)
            return nxt

        logits, h = m.chain(x, tokens[:, -1], pick)
        pick(logits[:, -1], h[:, -1], heads - 1)  # the last slot's draw (the chain ends there)
        for i, b in enumerate(rows):
            toks, cfs, qs, zs = kept[i]
            if not toks:
                continue
            n = len(toks)
            seq[slots[b], Ls[b] : Ls[b] + n] = torch.stack(toks)
            out[b] = (n, cfs, torch.stack(qs))
            if self.recalibration is not None:
                self._logits[slots[b]] = zs
        return out

    def accept(self, L: int, drafted: int, n: int) -> None:
        pass

    def accept_batch(self, slots, Ls, drafted, ns) -> None:
        pass

    def learn(self, slots, drafted, ns) -> None:
        """What verification decided about the slots the last proposal drafted (called by the
        engine after each round, never by tools that replay or profile a drafter): the
        recalibration refits on them."""
        rc = self.recalibration
        if rc is None:
            return
        z: list[float] = []
        y: list[float] = []
        keys: list[int] = []
        for slot, d, n in zip(slots, drafted, ns):
            row = self._logits.pop(slot, None)
            if row is not None and d:
                zi, yi = verified_slots(row, d, n)
                z += zi
                y += yi
                keys += [slot] * len(zi)
            else:  # a round without a draft: the request's offset is forgotten a little
                rc.idle(slot)
        rc.learn(np.array(z), np.array(y), keys)


def target_layer_states(target, ids: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """Teacher-forced outputs of the target's ``layers`` (1-based), concatenated:
    ``[B, T, len(layers) · d]`` (what the engine hands a block drafter, whole sequences)."""
    T = ids.shape[1]
    x = target.embed_tokens(ids)
    cos, sin = target.tables(torch.float32, x.device)
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    outs = []
    for i, layer in enumerate(target.layers, start=1):
        x = layer(x, cos, sin)
        if i in layers:
            outs.append(x)
    return torch.cat(outs, dim=-1)


def file_metadata(path) -> dict:
    """The safetensors header metadata of ``path`` (empty when it has none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises SafetensorError / OSError on bad bytes
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DSparkError(f"checkpoint {path} is unreadable: {msg}") from None


def check_bundle(bundle, name: str = "drafter_block") -> None:
    """One line naming the file and the mismatch when the block checkpoint ``name`` of a
    loaded bundle does not belong to the bundle's target (the target sha256 its manifest entry
    and its file record; the target's layers and width) or its file records another block size
    than its config."""
    entry = bundle.manifest["models"][name]
    path = bundle.directory / entry["file"]
    cfg = bundle.models[name].cfg
    target = bundle.models["target"]
    want = bundle.manifest["models"]["target"].get("sha256", "")
    meta = file_metadata(path)
    for where, got in (
        ("manifest entry", entry.get("target_sha256")),
        ("file", meta.get("target_sha256")),
    ):
        if got is not None and got != want:
            raise DSparkError(
                f"block drafter checkpoint {path} was distilled from another target ({where} "
                f"names target sha256 {str(got)[:12]}..., this target is {want[:12]}...)"
            )
    if "block_size" in meta and int(meta["block_size"]) != cfg.block_size:
        raise DSparkError(
            f"block drafter checkpoint {path} holds block size {meta['block_size']}, "
            f"its manifest config says {cfg.block_size}"
        )
    n_layers, d = len(target.layers), target.cfg.d_model
    if max(cfg.feature_layers) > n_layers or cfg.d_feature != d:
        raise DSparkError(
            f"block drafter checkpoint {path} reads target layers {cfg.feature_layers} of width "
            f"{cfg.d_feature}; the target has {n_layers} layers of width {d}"
        )
