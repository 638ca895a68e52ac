"""``Ledger``: what a run records per request (numpy arrays, one slot per request) and in total."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.workload import Requests


@dataclass
class Counters:
    rounds: int = 0
    accepted: int = 0
    drafted: int = 0
    rejected_rounds: int = 0
    accepted_emitted: int = 0
    lossy: int = 0
    round_tokens: int = 0
    prefill_tokens: int = 0
    gpu_busy_s: float = 0.0  # GPU-seconds
    bytes_moved: float = 0.0  # over all GPUs
    measured_tokens: int = 0  # tokens emitted after warm-up
    preemptions: int = 0  # requests preempted (KV freed, to be recomputed)
    recomputed_tokens: int = 0  # KV tokens discarded by preemptions (computed again later)
    prefill_computed: int = 0  # prompt (and recompute) tokens processed by prefill passes
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose KV the prefix cache held
    drafter_catchup_tokens: int = 0  # tokens drafters prefilled after rounds at k = 0
    prefix_cache_evictions: int = 0  # cached prompt blocks evicted for memory


class Ledger:
    """Per-request outcomes shared by all replicas of a run, the run's :class:`Counters`, and
    the per-request constants the loop indexes one by one (as Python lists: ``kv_need`` bytes
    reserved on admission under full reservation, ``prompt``, ``output`` and ``total`` =
    prompt + output tokens; ``hash_ids``: prompt block hashes or None). ``emitted`` is authoritative only for
    requests outside a live batch view (a view holds the running ones' positions)."""

    def __init__(
        self, reqs: Requests, kv_bytes_per_token: float, progress: Callable[[int], None] | None
    ) -> None:
        n = len(reqs)
        self.reqs = reqs
        self.first_token_s = np.full(n, np.nan)
        self.admitted_s = np.full(n, np.nan)  # first admitted to prefill (first chunk)
        self.finish_s = np.full(n, np.nan)
        self.emitted = np.zeros(n, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.rejected = np.zeros(n, dtype=bool)
        self.counters = Counters()
        self.kv_need = ((reqs.prompt_tokens + reqs.output_tokens) * kv_bytes_per_token).tolist()
        self.prompt = reqs.prompt_tokens.tolist()
        self.output = reqs.output_tokens.tolist()
        self.total = (reqs.prompt_tokens + reqs.output_tokens).tolist()
        # each request's prompt block hashes (JSONL traces with hash_ids), else None
        self.hash_ids: list[tuple[int, ...]] | None = reqs.extra.get("hash_ids")
        self.finished = 0
        self.last_finish_s = 0.0
        self.progress = progress

    def finish(self, i: int, t: float) -> None:
        self.finish_s[i] = t
        self.finished += 1
        self.last_finish_s = t

    def report_progress(self) -> None:
        if self.progress is not None:
            self.progress(self.finished)
