"""Quality of lossy (threshold) verification, measured against strict greedy output."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from control.metrics import record_metrics
from control.types import Decision


@torch.inference_mode()
def target_nll(target: torch.nn.Module, prompt: list[int], output: list[int]) -> float:
    """The target's own negative log-likelihood per output token (nats), teacher-forced."""
    if not output:
        return float("nan")
    ids = torch.tensor([prompt + output], dtype=torch.long, device=next(target.parameters()).device)
    logits = target(ids[:, :-1])[0, len(prompt) - 1 :]
    return float(F.cross_entropy(logits.double(), ids[0, len(prompt) :], reduction="mean"))


class FixedDecision:
    """A controller that makes the same decision every round (β may be any value in [0, 1])."""

    name = "fixed-decision"

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def decide(self, now_s: float) -> Decision:
        return self.decision

    def observe(self, obs) -> None:
        pass

    def reset(self) -> None:
        pass

    def state(self) -> dict:
        return {"k": self.decision.k}


def threshold_quality(
    engine, prompts: list[list[int]], max_new_tokens: int, beta: float, k: int = 4
) -> dict[str, float]:
    """Run strict greedy and threshold(β) on the same prompts; compare.

    Returns token agreement with the strict output (position-wise, over the strict length),
    the target's NLL per token of both outputs, its relative change in %, the fraction of
    tokens accepted lossily, and mean accepted length (1 + Σn / rounds over all prompts,
    :mod:`control.metrics`) under each mode.
    """
    agree = total = lossy = emitted = 0
    nll_s, nll_t, recs_s, recs_t = [], [], [], []
    for p in prompts:
        s = engine.generate(p, max_new_tokens, FixedDecision(Decision(k=k)))
        t = engine.generate(
            p, max_new_tokens, FixedDecision(Decision(k=k, mode="threshold", beta=beta))
        )
        agree += sum(a == b for a, b in zip(s.tokens, t.tokens))
        total += len(s.tokens)
        lossy += sum(r.lossy_accepts for r in t.records)
        emitted += len(t.tokens)
        nll_s.append(target_nll(engine.target, p, s.tokens))
        nll_t.append(target_nll(engine.target, p, t.tokens))
        recs_s += s.records
        recs_t += t.records
    ns, nt = sum(nll_s) / len(nll_s), sum(nll_t) / len(nll_t)
    return {
        "beta": beta,
        "agreement": agree / max(1, total),
        "nll_strict": ns,
        "nll_threshold": nt,
        "nll_change_pct": 100.0 * (nt - ns) / ns if ns else math.nan,
        "lossy_fraction": lossy / max(1, emitted),
        "mean_accepted_length_strict": record_metrics(recs_s)["mean_accepted_length"],
        "mean_accepted_length_threshold": record_metrics(recs_t)["mean_accepted_length"],
    }
