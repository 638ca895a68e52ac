"""Target-only decoding, the baseline speculative decoding must reproduce: greedy (token for
token) and sampled with the engine's own sampling parameters and generator. A base of
:class:`real.engine.Engine`, on its buffers (slot 0 of its cache, its target and generator);
the engine must be idle.
"""

from __future__ import annotations

import torch

from control.errors import DSparkError
from real.models import Segments


class TargetReference:
    """The engine's target-only references (:class:`real.engine.Engine` derives from it): the
    target, the token buffer ``seq``, the cache ``state``, the generator ``gen``, ``cfg`` and
    the end-of-text id are the engine's."""

    def _prefill(self, ids: list[int]) -> int:
        """Slot 0 holds ``ids`` with all but the last token in the target's cache (references
        and traces; the engine must be idle)."""
        if self.running:
            raise DSparkError("the engine is busy (sequences are running)")
        L = len(ids)
        self.seq[0, :L] = torch.tensor(ids, dtype=torch.long, device=self.device)
        if L > 1:
            self.target.step(self.seq[:1, : L - 1], 0, self.state)
            self._hand_hidden(Segments.one(0, 0, L - 1, self.device))
        if self._drafter is not None:
            self._drafter.reset()
        return L

    @torch.inference_mode()
    def greedy_reference(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """Target-only greedy decoding (the baseline): one token per forward, no drafter."""
        ids = self.check_request(prompt_ids, max_new_tokens)
        L = self._prefill(ids)
        seq, step, st = self.seq, self.target.step, self.state
        out = []
        for _ in range(max_new_tokens):
            nxt = step(seq[:1, L - 1 : L], L - 1, st)[-1].argmax()
            seq[0, L] = nxt
            L += 1
            if self.cfg.stop_at_eot and self.eot_id is not None:
                t = int(nxt)
                out.append(t)
                if t == self.eot_id:
                    break
        if not (self.cfg.stop_at_eot and self.eot_id is not None):
            out = seq[0, len(ids) : L].tolist()
        return out

    @torch.inference_mode()
    def sample_reference(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """Target-only sampling with the engine's sampling parameters and generator."""
        from real.sampling import probs

        ids = self.check_request(prompt_ids, max_new_tokens)
        self.gen.manual_seed(self.cfg.seed)
        L = self._prefill(ids)
        out = []
        for _ in range(max_new_tokens):
            p = probs(
                self.target.step(self.seq[:1, L - 1 : L], L - 1, self.state), self.cfg.sampling
            )
            t = int(torch.multinomial(p[-1], 1, generator=self.gen))
            self.seq[0, L] = t
            L += 1
            out.append(t)
            if self.cfg.stop_at_eot and t == self.eot_id:
                break
        return out
