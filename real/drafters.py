"""Drafters: a model drafter with its own incremental cache, n-gram prompt lookup, and the
hybrid of the two (prompt lookup when the context repeats itself, the model otherwise).

A drafter serves a batch: ``propose_batch(seq, slots, Ls, ks, taus, sp, gens)`` proposes, for
each running sequence b (living in row ``slots[b]`` of the engine's token buffer ``seq`` and of
the drafter's own slotted cache), up to ``ks[b]`` tokens that continue ``seq[slot, :L]`` and writes
them into ``seq[slot, L:L+k']``. A model drafter runs ONE packed forward per draft step for all
rows still drafting (the first step also catches each row's cache up, ragged); lookup drafters
work per row. Per slot it keeps ``valid``: how many leading positions of its cache are known to
match the committed sequence; the engine calls ``accept_batch(slots, Ls, drafted, ns)`` after
verification, so rollback is just a smaller ``valid``. ``propose`` / ``accept`` / ``reset`` /
``valid`` are the one-sequence special case on slot 0 (``seq[0]``).

The τ stop (one rule for every drafter). Before drafting position i the drafter computes its
distribution q_i; the position's *confidence* is ``max q_i`` — the drafter's probability of its
most likely token, read BEFORE any token is drawn. Drafting stops before position i when that
confidence is below τ; otherwise the token is drawn (argmax under greedy, x ~ q_i under
sampling) and always kept. So the stop at position i depends only on the committed sequence and
the tokens already drafted at positions < i, never on the token drawn at i: a draft is a
stopping-time prefix of tokens each drawn from exactly the q row that verification divides by,
and speculative sampling stays exactly target-distributed for every τ (docs/design.md, "Two
kinds of threshold"). The rejected alternative, "draw x ~ q, drop x if q(x) < τ", proposes
from q conditioned on q(x) >= τ while verification divides by q: biased. HF's rule (keep the drawn
token, stop after it) is exact too; this one is chosen because under greedy decoding the drawn
token IS the argmax, so ``max q = q(x)`` and the rule is exactly the historical one ("stop before
the first drafted token whose confidence is below τ", as ``control.types.Decision``, the
simulator and the position-trace replay model it), and because it spends no verification slot
on a token the drafter itself rates below τ. Under sampling the reported confidences are these
``max q_i`` values too (not q_i(x) of the drawn token), so every reported confidence is >= τ.
N-gram lookup has no probabilities: confidence 1.0 and a one-hot q, so τ <= 1 never stops it.
"""

from __future__ import annotations

import torch

from real.drafter_protocol import Proposal
from real.models import Segments
from real.sampling import SamplingParams, probs

_NONE: Proposal = (0, [], None)


def _gens(gens, n: int) -> list:
    return list(gens) if isinstance(gens, (list, tuple)) else [gens] * n


class _OneRow:
    """``propose`` for one sequence (slot 0) through the drafter's ``propose_batch``."""

    def propose(
        self,
        seq: torch.Tensor,
        L: int,
        k: int,
        tau: float,
        sp: SamplingParams,
        gen: torch.Generator | None,
    ):
        """Draft up to ``k`` tokens after ``seq[0, :L]`` (slot 0); returns (count, confidences,
        q rows). Drafting stops before position i when its confidence ``max q_i`` (computed
        before drawing; see the module docstring) is below ``tau``; a drawn token is always
        kept. ``q`` is None in greedy mode."""
        return self.propose_batch(seq, [0], [L], [k], [tau], sp, [gen])[0]

    def propose_batch(
        self, seq: torch.Tensor, slots, Ls, ks, taus, sp: SamplingParams, gens
    ) -> list[Proposal]:
        raise NotImplementedError


class ModelDrafter(_OneRow):
    """Wraps a ``real.models`` model (conv or transformer) for incremental, batched drafting."""

    def __init__(
        self, model: torch.nn.Module, length: int, dtype: torch.dtype, device, slots: int = 1
    ) -> None:
        self.model = model
        self.name = f"drafter-{model.kind}"
        self.dtype, self.device, self.length = dtype, device, length
        self.allocate(slots)

    def allocate(self, slots: int) -> None:
        """(Re)build the slotted cache for ``slots`` sequences (forgets every slot)."""
        self.slots = slots
        self.state = self.model.new_state(self.length, self.dtype, self.device, slots)
        self._valid = [0] * slots
        self._fed: list = [None] * slots

    def reset_slot(self, slot: int) -> None:
        """A new sequence starts in ``slot``."""
        self._valid[slot] = 0
        self._fed[slot] = None

    def set_valid(self, slot: int, n: int) -> None:
        """Declare the first ``n`` positions of ``slot``'s cache valid (profiling)."""
        self._valid[slot] = n
        self._fed[slot] = None

    def valid_of(self, slot: int) -> int:
        return self._valid[slot]

    def reset(self) -> None:
        self.reset_slot(0)

    @property
    def valid(self) -> int:
        return self._valid[0]

    @valid.setter
    def valid(self, n: int) -> None:
        self.set_valid(0, n)

    def propose_batch(
        self, seq: torch.Tensor, slots, Ls, ks, taus, sp: SamplingParams, gens
    ) -> list[Proposal]:
        """``propose`` for every row b at once: one packed forward per draft step."""
        B = len(slots)
        gens = _gens(gens, B)
        out: list[Proposal] = [_NONE] * B
        for s in slots:
            self._fed[s] = None
        rows = [b for b in range(B) if ks[b] > 0]
        if not rows:
            return out
        dev = seq.device
        step = self.model.step_packed
        starts = [min(self._valid[slots[b]], Ls[b] - 1) for b in rows]
        segs = Segments(
            [slots[b] for b in rows], starts, [Ls[b] - st for b, st in zip(rows, starts)], dev
        )
        # the first step feeds each row's unseen tokens; only each row's last one is drafted from
        logits = step(seq[segs.slot_idx, segs.pos_idx], segs, self.state, logits=segs.last)
        confs: dict[int, list[float]] = {b: [] for b in rows}
        qs: dict[int, list] = {b: [] for b in rows}
        fed = dict.fromkeys(rows, 0)
        cur = rows
        for i in range(max(ks[b] for b in rows)):
            # the stop reads max q before drawing: never a function of the drawn token
            if sp.greedy:
                c, tok = torch.softmax(logits.float(), -1).max(-1)
                cf = c.tolist()
                keep = [j for j, b in enumerate(cur) if cf[j] >= taus[b]]
                if not keep:
                    break
                toks = tok[keep] if len(keep) < len(cur) else tok
            else:
                q = probs(logits, sp)
                cf = q.max(-1).values.tolist()
                keep = [j for j, b in enumerate(cur) if cf[j] >= taus[b]]
                if not keep:
                    break
                toks = torch.cat([torch.multinomial(q[j], 1, generator=gens[cur[j]]) for j in keep])
            kept = [cur[j] for j in keep]
            kslots = torch.tensor([slots[b] for b in kept], dtype=torch.long, device=dev)
            kpos = torch.tensor([Ls[b] + i for b in kept], dtype=torch.long, device=dev)
            seq[kslots, kpos] = toks
            for j, b in zip(keep, kept):
                confs[b].append(cf[j])
                if not sp.greedy:
                    qs[b].append(q[j])
            nxt = [(j, b) for j, b in enumerate(kept) if i + 1 < ks[b]]
            if not nxt:
                break
            if len(nxt) < len(kept):
                sel = torch.tensor([j for j, _ in nxt], dtype=torch.long, device=dev)
                kslots, kpos = kslots[sel], kpos[sel]
            cur = [b for _, b in nxt]
            segs = Segments([slots[b] for b in cur], [Ls[b] + i for b in cur], [1] * len(cur), dev)
            logits = step(seq[kslots, kpos], segs, self.state)
            for b in cur:
                fed[b] += 1
        for b in rows:
            n = len(confs[b])
            self._fed[slots[b]] = (Ls[b], fed[b])
            out[b] = (n, confs[b], torch.stack(qs[b]) if qs[b] else None)
        return out

    def accept(self, L: int, drafted: int, n: int) -> None:
        """``n`` of the ``drafted`` tokens written after position L were accepted (slot 0)."""
        self.accept_batch([0], [L], [drafted], [n])

    def accept_batch(self, slots, Ls, drafted, ns) -> None:
        for s, L, n in zip(slots, Ls, ns):
            f = self._fed[s]
            if f is not None and f[0] == L:
                self._valid[s] = L + min(n, f[1])
            self._fed[s] = None


class NgramDrafter(_OneRow):
    """Prompt lookup: copy what followed the latest earlier occurrence of the last n tokens.

    Confidence of a proposal is 1.0 (it has no probabilities); in sampling mode q is one-hot.
    The τ stop is the module's rule with ``max q = 1``: τ <= 1 never stops, τ > 1 drafts nothing.
    Stateless: every row is looked up in its own committed tokens.
    """

    name = "drafter-ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int = 4096) -> None:
        self.max_ngram, self.min_ngram, self.vocab_size = max_ngram, min_ngram, vocab_size

    def allocate(self, slots: int) -> None:
        pass

    def reset_slot(self, slot: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        return self.lookup_n(tokens, k)[0]

    def lookup_n(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """(the k tokens that followed the latest earlier occurrence of the longest matching
        suffix of ``tokens``, that suffix's length n); ([], 0) when nothing matches."""
        L = len(tokens)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = tokens[L - n :]
            for s in range(L - n - 1, -1, -1):
                if tokens[s : s + n] == tail:
                    got = tokens[s + n : s + n + k]
                    # a match inside a repeating stretch: the copy runs into the present, so
                    # continue the period (token s + n + j for j past the end is got[j - P])
                    period = L - (s + n)
                    while len(got) < k:
                        got.append(got[len(got) - period])
                    return got, n
        return [], 0

    def propose_batch(
        self, seq: torch.Tensor, slots, Ls, ks, taus, sp: SamplingParams, gens
    ) -> list[Proposal]:
        out: list[Proposal] = []
        for s, L, k, tau in zip(slots, Ls, ks, taus):
            if k <= 0 or tau > 1.0:
                out.append(_NONE)
                continue
            toks = self.lookup(seq[s, :L].tolist(), k)
            out.append(self.write(seq, L, toks, sp, s) if toks else _NONE)
        return out

    def write(
        self, seq: torch.Tensor, L: int, toks: list[int], sp: SamplingParams, slot: int = 0
    ) -> Proposal:
        """Put ``toks`` after position L of ``slot``; (count, confidences of 1.0, one-hot q or
        None)."""
        seq[slot, L : L + len(toks)] = torch.tensor(toks, dtype=seq.dtype, device=seq.device)
        q = None
        if not sp.greedy:
            q = torch.zeros(len(toks), self.vocab_size, device=seq.device)
            q[torch.arange(len(toks), device=seq.device), torch.tensor(toks, device=seq.device)] = (
                1.0
            )
        return len(toks), [1.0] * len(toks), q

    def accept(self, L: int, drafted: int, n: int) -> None:
        pass

    def accept_batch(self, slots, Ls, drafted, ns) -> None:
        pass


class HybridDrafter(_OneRow):
    """Prompt lookup first, the model drafter otherwise.

    When the last ``min_match`` or more tokens occurred earlier in the sequence (code repeats
    names, calls and whole lines), the tokens that followed are proposed at no model cost;
    otherwise the model drafter drafts. The model's cache simply falls behind during lookup
    rounds and catches up in one multi-token step the next time it drafts (its ``valid``
    prefix never covers tokens it did not see). The τ stop is the module's one rule: lookup
    rounds have confidence 1.0, model rounds stop where the model drafter's ``max q`` < τ.
    In a batch, the rows that look up are served per row and the others by ONE batched call
    of the model drafter.
    """

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, min_match: int) -> None:
        self.model, self.ngram, self.min_match = model, ngram, min_match
        self.name = f"drafter-hybrid-{model.model.kind}"
        self.lookups = self.model_rounds = 0

    @property
    def state(self) -> dict:
        return self.model.state

    @property
    def wants_hidden(self) -> bool:
        return bool(getattr(self.model, "wants_hidden", False))

    def observe_hidden(self, segs, hidden: torch.Tensor) -> None:
        """Lookup rounds too: the model drafter's features must cover every committed token."""
        self.model.observe_hidden(segs, hidden)  # type: ignore[attr-defined]

    @property
    def length(self) -> int:
        return self.model.length

    def allocate(self, slots: int) -> None:
        self.model.allocate(slots)

    def valid_of(self, slot: int) -> int:
        return self.model.valid_of(slot)

    def reset_slot(self, slot: int) -> None:
        self.model.reset_slot(slot)

    def reset(self) -> None:
        self.model.reset()
        self.lookups = self.model_rounds = 0

    def propose_batch(
        self, seq: torch.Tensor, slots, Ls, ks, taus, sp: SamplingParams, gens
    ) -> list[Proposal]:
        B = len(slots)  # gens pass through to the model drafter, which spreads them per row
        out: list[Proposal] = [_NONE] * B
        model_ks = [0] * B
        for b in range(B):
            if ks[b] <= 0:
                continue
            toks, n = self.ngram.lookup_n(seq[slots[b], : Ls[b]].tolist(), ks[b])
            if n >= self.min_match and taus[b] <= 1.0:
                self.lookups += 1
                out[b] = self.ngram.write(seq, Ls[b], toks, sp, slots[b])
            else:
                self.model_rounds += 1
                model_ks[b] = ks[b]
        got = self.model.propose_batch(seq, slots, Ls, model_ks, taus, sp, gens)
        return [g if model_ks[b] else out[b] for b, g in enumerate(got)]

    def accept(self, L: int, drafted: int, n: int) -> None:
        self.model.accept(L, drafted, n)

    def accept_batch(self, slots, Ls, drafted, ns) -> None:
        self.model.accept_batch(slots, Ls, drafted, ns)
