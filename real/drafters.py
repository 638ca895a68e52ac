"""Drafters: a model drafter with its own incremental cache, n-gram prompt lookup, and the
hybrid of the two (prompt lookup when the context repeats itself, the model otherwise).

A drafter proposes tokens that continue the committed sequence ``seq[0, :L]`` and writes them
into ``seq[0, L:L+k']`` (the engine's preallocated token buffer). It keeps ``valid``: how many
leading positions of its own cache are known to match the committed sequence; the engine calls
``accept(L, drafted, n)`` after verification, so rollback is just a smaller ``valid``.

The τ stop (one rule for every drafter). Before drafting position i the drafter computes its
distribution q_i; the position's *confidence* is ``max q_i`` — the drafter's probability of its
most likely token, read BEFORE any token is drawn. Drafting stops before position i when that
confidence is below τ; otherwise the token is drawn (argmax under greedy, x ~ q_i under
sampling) and always kept. So the stop at position i depends only on the committed sequence and
the tokens already drafted at positions < i, never on the token drawn at i: a draft is a
stopping-time prefix of tokens each drawn from exactly the q row that verification divides by,
and speculative sampling stays exactly target-distributed for every τ (DESIGN.md, "Drafting stop
vs verification threshold"). The rejected alternative, "draw x ~ q, drop x if q(x) < τ", proposes
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

from real.sampling import SamplingParams, probs


class ModelDrafter:
    """Wraps a ``real.models`` model (conv or transformer) for incremental drafting."""

    def __init__(self, model: torch.nn.Module, length: int, dtype: torch.dtype, device) -> None:
        self.model = model
        self.name = f"drafter-{model.kind}"
        self.dtype, self.device = dtype, device
        self.state = model.new_state(length, dtype, device)
        self.valid = 0
        self._fed = None

    def reset(self) -> None:
        self.valid = 0
        self._fed = None

    def propose(self, seq: torch.Tensor, L: int, k: int, tau: float, sp: SamplingParams,
                gen: torch.Generator | None):
        """Draft up to ``k`` tokens after ``seq[0, :L]``; returns (count, confidences, q rows).

        Drafting stops before position i when its confidence ``max q_i`` (computed before
        drawing; see the module docstring) is below ``tau``; a drawn token is always kept.
        ``q`` is None in greedy mode.
        """
        self._fed = None
        if k <= 0:
            return 0, [], None
        start = min(self.valid, L - 1)
        step = self.model.step
        logits = step(seq[:, start:L], start, self.state)[-1]
        confs: list[float] = []
        qs = []
        count = fed = 0
        for i in range(k):
            # the stop reads max q before drawing: never a function of the drawn token
            if sp.greedy:
                c, tok = torch.softmax(logits.float(), -1).max(-1)
                cf = float(c)
                if cf < tau:
                    break
            else:
                q = probs(logits, sp)
                cf = float(q.max())
                if cf < tau:
                    break
                tok = torch.multinomial(q, 1, generator=gen)[0]
            seq[0, L + i] = tok
            confs.append(cf)
            if not sp.greedy:
                qs.append(q)
            count += 1
            if i + 1 < k:
                logits = step(seq[:, L + i:L + i + 1], L + i, self.state)[-1]
                fed += 1
        self._fed = (L, fed)
        return count, confs, (torch.stack(qs) if qs else None)

    def accept(self, L: int, drafted: int, n: int) -> None:
        """``n`` of the ``drafted`` tokens written after position L were accepted."""
        if self._fed is not None and self._fed[0] == L:
            self.valid = L + min(n, self._fed[1])
        self._fed = None


class NgramDrafter:
    """Prompt lookup: copy what followed the latest earlier occurrence of the last n tokens.

    Confidence of a proposal is 1.0 (it has no probabilities); in sampling mode q is one-hot.
    The τ stop is the module's rule with ``max q = 1``: τ <= 1 never stops, τ > 1 drafts nothing.
    """

    name = "drafter-ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int = 4096) -> None:
        self.max_ngram, self.min_ngram, self.vocab_size = max_ngram, min_ngram, vocab_size

    def reset(self) -> None:
        pass

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        return self.lookup_n(tokens, k)[0]

    def lookup_n(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """(the k tokens that followed the latest earlier occurrence of the longest matching
        suffix of ``tokens``, that suffix's length n); ([], 0) when nothing matches."""
        L = len(tokens)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = tokens[L - n:]
            for s in range(L - n - 1, -1, -1):
                if tokens[s:s + n] == tail:
                    got = tokens[s + n:s + n + k]
                    # a match inside a repeating stretch: the copy runs into the present, so
                    # continue the period (token s + n + j for j past the end is got[j - P])
                    period = L - (s + n)
                    while len(got) < k:
                        got.append(got[len(got) - period])
                    return got, n
        return [], 0

    def propose(self, seq: torch.Tensor, L: int, k: int, tau: float, sp: SamplingParams,
                gen: torch.Generator | None):
        if k <= 0:
            return 0, [], None
        toks = self.lookup(seq[0, :L].tolist(), k)
        if not toks or tau > 1.0:
            return 0, [], None
        return self.write(seq, L, toks, sp)

    def write(self, seq: torch.Tensor, L: int, toks: list[int], sp: SamplingParams):
        """Put ``toks`` after position L; (count, confidences of 1.0, one-hot q or None)."""
        seq[0, L:L + len(toks)] = torch.tensor(toks, dtype=seq.dtype, device=seq.device)
        q = None
        if not sp.greedy:
            q = torch.zeros(len(toks), self.vocab_size, device=seq.device)
            q[torch.arange(len(toks), device=seq.device),
              torch.tensor(toks, device=seq.device)] = 1.0
        return len(toks), [1.0] * len(toks), q

    def accept(self, L: int, drafted: int, n: int) -> None:
        pass


class HybridDrafter:
    """Prompt lookup first, the model drafter otherwise.

    When the last ``min_match`` or more tokens occurred earlier in the sequence (code repeats
    names, calls and whole lines), the tokens that followed are proposed at no model cost;
    otherwise the model drafter drafts. The model's cache simply falls behind during lookup
    rounds and catches up in one multi-token step the next time it drafts (its ``valid``
    prefix never covers tokens it did not see). The τ stop is the module's one rule: lookup
    rounds have confidence 1.0, model rounds stop where the model drafter's ``max q`` < τ.
    """

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, min_match: int) -> None:
        self.model, self.ngram, self.min_match = model, ngram, min_match
        self.state = model.state
        self.name = f"drafter-hybrid-{model.model.kind}"
        self.lookups = self.model_rounds = 0

    def reset(self) -> None:
        self.model.reset()
        self.lookups = self.model_rounds = 0

    def propose(self, seq: torch.Tensor, L: int, k: int, tau: float, sp: SamplingParams,
                gen: torch.Generator | None):
        if k <= 0:
            return 0, [], None
        toks, n = self.ngram.lookup_n(seq[0, :L].tolist(), k)
        if n >= self.min_match and tau <= 1.0:
            self.lookups += 1
            return self.ngram.write(seq, L, toks, sp)
        self.model_rounds += 1
        return self.model.propose(seq, L, k, tau, sp, gen)

    def accept(self, L: int, drafted: int, n: int) -> None:
        self.model.accept(L, drafted, n)
