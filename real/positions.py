"""Greedy position trace: from every output position, how far the drafter agrees with the target.

Under greedy decoding the output is the target's own greedy continuation G, and what the drafter
proposes from output position t depends only on ``prompt + G[:t]``. ``record_positions`` stores,
for each t, the run length L(t) of drafter proposals equal to ``G[t:]`` (up to ``horizon``), the
drafter's confidences of all its proposals from there (up to ``horizon``), and whether G[t] ends
a sentence. A round of any fixed k (and τ) starting at t then accepts ``min(k_eff, L(t))``.
"""

from __future__ import annotations

import torch

from control.errors import DSparkError
from control.types import PositionRecord, draft_stop
from real.block_recalibration import shipped_calibration
from real.sampling import SamplingParams

_GREEDY = SamplingParams()


def record_positions(
    engine, prompt_ids, max_new_tokens: int, horizon: int | None = None, request_id: int = 0
) -> list[PositionRecord]:
    """The greedy position trace of one prompt (see the module docstring)."""
    return record_positions_full(engine, prompt_ids, max_new_tokens, request_id, horizon)[0]


def record_positions_full(
    engine, prompt_ids, max_new_tokens: int, request_id: int = 0, horizon: int | None = None
) -> tuple[list[PositionRecord], list[int]]:
    """:func:`_record_positions_full` with the drafter's head as shipped, no online
    recalibration (a position trace is a property of the drafter)."""
    with shipped_calibration(engine.drafter):
        return _record_positions_full(engine, prompt_ids, max_new_tokens, request_id, horizon)


@torch.inference_mode()
def _record_positions_full(
    engine, prompt_ids, max_new_tokens: int, request_id: int = 0, horizon: int | None = None
) -> tuple[list[PositionRecord], list[int]]:
    """Position trace plus the greedy continuation. Confidences are the drafter's whole chain
    of ``horizon`` proposals, not only the run and its first miss: a τ stop beyond the first
    miss still decides how many tokens a round drafts (and so its draft time)."""
    h = engine.cfg.k_max + 1 if horizon is None else horizon
    if engine.drafter is None:
        raise DSparkError("a position trace needs a drafter")
    if h > engine.cfg.k_max + 1:
        raise DSparkError(f"horizon {h} exceeds k_max + 1 = {engine.cfg.k_max + 1}")
    prompt = [int(t) for t in prompt_ids]
    # the continuation is extended by the horizon so that runs near the end are not cut short.
    cont = engine.greedy_reference(prompt, max_new_tokens + h)
    full = prompt + cont
    P, seq, drafter = len(prompt), engine.seq, engine.drafter
    if len(full) > engine.length:
        raise DSparkError(f"prompt + {max_new_tokens} + horizon {h} exceeds the engine's cache")
    if getattr(drafter, "wants_hidden", False):
        # a drafter that reads the target's hidden states (block, feature) gets them for every
        # committed position, as the engine's passes hand them over: target-only decoding
        # hands over none, so one teacher-forced target pass over the whole sequence does
        engine._prefill(full)
    seq[0, : len(full)] = torch.tensor(full, dtype=seq.dtype, device=seq.device)
    drafter.reset()
    out = []
    for t in range(min(max_new_tokens, len(cont))):
        L = P + t
        count, confs, _ = drafter.propose(seq, L, h, 0.0, _GREEDY, None)
        proposed = seq[0, L : L + count].tolist()
        run = 0
        while run < count and t + run < len(cont) and proposed[run] == cont[t + run]:
            run += 1
        drafter.accept(L, count, run)
        seq[0, L : L + count] = torch.tensor(
            full[L : L + count], dtype=seq.dtype, device=seq.device
        )
        out.append(
            PositionRecord(
                request_id=request_id,
                position=t,
                run_length=run,
                confidences=tuple(float(c) for c in confs),
                sentence_end=cont[t] in engine.sentence_end_ids,
            )
        )
    return out, cont[:max_new_tokens]


def replay_fixed_k(records: list[PositionRecord], k: int, tau: float = 0.0) -> list[int]:
    """Accepted count of each round of a fixed-k greedy run, predicted from a position trace."""
    N = len(records)
    pos, accepted = 0, []
    while pos < N:
        r = records[pos]
        kk = draft_stop(r.confidences, min(k, N - pos - 1), tau)
        n = min(kk, r.run_length)
        accepted.append(n)
        pos += n + 1
    return accepted
