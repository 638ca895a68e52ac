"""``dspark real serve``: the batched engine under real arrivals, replayed in wall-clock time.

Arrivals are Poisson at ``rate_rps`` or an Azure-format trace (``TIMESTAMP,ContextTokens,
GeneratedTokens``; Patel et al., "Splitwise", ISCA 2024, CC-BY 4.0) whose inter-arrival times are
multiplied by ``time_scale``, cut at ``duration_s``. Prompts are windows of held-out documents
(``split``) of the request's prompt length (the trace's ContextTokens clipped to
``[prompt_tokens_min, prompt_tokens_max]``; uniform in that range under Poisson); output lengths
are the trace's GeneratedTokens clipped to ``[output_tokens_min, max_new_tokens]`` (uniform in
that range under Poisson). The end-of-text token does not end a request early here
(``stop_at_eot`` is off), so every request emits its output length, as in the simulator.

The loop: at every round boundary, requests whose arrival time has passed join the FIFO queue;
as many as there are free slots are admitted (one packed prefill), then one round of the batched
engine runs for every running sequence. When nothing runs, the loop sleeps until the next
arrival. A request that cannot fit a slot (prompt + output > ``max_len``) is rejected with a
one-line message and reported unfinished, never dropped silently. After ``duration_s`` no new
request arrives; the queue drains for at most ``drain_s`` more seconds (then what is left is
reported unfinished).

Outputs (``ServeResult``): the per-request table in the simulator's ``requests.csv`` format
(``REQUEST_COLUMNS``; times in seconds from the start of the replay: TTFT = first token −
arrival, TPOT = (finish − first token) / (output tokens − 1), e2e = finish − arrival; the first
token is committed by the request's first round, after its prefill), every round of every
request (``RoundRecord``), and the batch trace: one row per round (``RoundStats``) or prefill.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from control.batch import told_slo
from control.configio import param
from control.errors import DSparkError
from control.tracefile import UNIT_CHOICES, read_trace_file
from control.types import RoundRecord

#: the simulator's ``requests.csv`` columns (sim.metrics.requests_table), in order
REQUEST_COLUMNS = (
    "controller",
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "finished",
    "replica",
    "emitted_tokens",
)
#: columns of the batch trace (one row per round or prefill pass)
BATCH_COLUMNS = (
    "controller",
    "kind",
    "start_s",
    "end_s",
    "batch_size",
    "drafting",
    "draft_steps",
    "verify_tokens",
    "context_tokens",
    "draft_s",
    "verify_s",
    "accepted",
    "emitted",
    "waiting",
    "prefill_tokens",
)


@dataclass(frozen=True)
class ServeConfig:
    # None: arrivals from `trace`; one of the two must be set.
    rate_rps: float | None = param(None, lo=1e-6, hi=1e6, doc="Poisson arrival rate")
    trace: str | None = param(None, doc="Azure-format trace CSV (arrivals and lengths)")
    # as the simulator's workload.trace_timestamp_unit: ISO dates, or numbers as seconds, warned.
    trace_timestamp_unit: str = param(
        "auto", choices=UNIT_CHOICES, doc="unit of numeric trace timestamps (auto: see sim)"
    )
    # as the simulator's workload.trace_sort: out-of-order times are an error unless sorted.
    trace_sort: bool = param(False, doc="sort trace rows by time")
    # 1: the trace's own pace; < 1 compresses it (more load).
    time_scale: float = param(1.0, lo=1e-6, hi=1e6, doc="multiplies trace inter-arrival times")
    # 30 s: a few hundred requests at a saturating rate on this CPU.
    duration_s: float = param(30.0, lo=1e-6, hi=1e6, doc="arrivals fall in [0, duration_s)")
    # None: drain everything that arrived.
    drain_s: float | None = param(
        None, lo=0.0, hi=1e6, doc="serve at most this long after duration_s"
    )
    workload: str = param("code", choices=("code", "prose", "random"), doc="prompt source")
    # held-out text: the models never trained on the test split.
    split: str = param("test", choices=("train", "val", "test"), doc="corpus split")
    prompt_tokens_min: int = param(32, lo=2, hi=1 << 16, doc="shortest prompt")
    # 256 + 128 output fits the engine's default max_len (1024) with room to spare.
    prompt_tokens_max: int = param(256, lo=2, hi=1 << 16, doc="longest prompt (trace: clipped)")
    output_tokens_min: int = param(8, lo=1, hi=1 << 16, doc="shortest output")
    max_new_tokens: int = param(128, lo=1, hi=1 << 16, doc="longest output (trace: clipped)")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of arrivals, lengths and prompts")
    progress_s: float = param(2.0, lo=0.0, hi=3600.0, doc="progress line every (0 = never)")
    # None: no SLO (the controllers plan as if none); set, the controllers and the round
    # planner are told it (control.batch.Slo), as the simulator tells them its scenario's [slo].
    slo_ttft_s: float | None = param(None, lo=1e-6, hi=1e6, doc="TTFT SLO handed to controllers, s")
    slo_tpot_s: float | None = param(None, lo=1e-6, hi=1e6, doc="TPOT SLO handed to controllers, s")

    def slo(self) -> Any:
        """The SLOs as the controller protocol takes them (``inf`` where unset)."""
        from control.batch import Slo

        inf = math.inf
        return Slo(
            inf if self.slo_ttft_s is None else self.slo_ttft_s,
            inf if self.slo_tpot_s is None else self.slo_tpot_s,
        )


@dataclass
class Arrival:
    request_id: int
    arrival_s: float
    prompt: list[int]
    output_tokens: int


@dataclass
class ServeResult:
    requests: Any  # pandas DataFrame, REQUEST_COLUMNS
    records: list[RoundRecord]
    batches: Any  # pandas DataFrame, BATCH_COLUMNS
    summary: dict
    rejected: list[str] = field(default_factory=list)


def read_azure_trace(
    path: str, unit: str = "auto", sort: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first request, context tokens, generated tokens), sorted by
    time: the simulator's reader (:func:`control.tracefile.read_trace_file`), keys named
    ``serve.trace_timestamp_unit`` / ``serve.trace_sort``."""
    t, ctx, gen, _ = read_trace_file(path, unit, sort, prefix="serve.")
    return t, ctx, gen


def _windows(
    lengths: list[int],
    workload: str,
    split: str,
    tokenizer,
    vocab_size: int | None,
    rng: np.random.Generator,
) -> list[list[int]]:
    """One prompt of each length: a window of a held-out document (or random ids)."""
    if workload == "random":
        if not vocab_size:
            raise DSparkError("a 'random' workload needs the vocabulary size")
        return [rng.integers(0, vocab_size, n).tolist() for n in lengths]
    if tokenizer is None:
        raise DSparkError(f"a '{workload}' workload needs the tokenizer")
    from real.corpus import documents

    docs = [tokenizer.encode(d).ids for d in documents(workload, split)]
    docs = [d for d in docs if len(d) >= min(lengths, default=1)]
    if not docs:
        raise DSparkError(
            f"workload '{workload}' ({split}) has no document of >= {min(lengths)} tokens"
        )
    out = []
    for n in lengths:
        fit = [d for d in docs if len(d) >= n]
        if not fit:
            raise DSparkError(
                f"workload '{workload}' ({split}) has no document of >= {n} "
                f"tokens; lower prompt_tokens_max"
            )
        d = fit[int(rng.integers(0, len(fit)))]
        s = int(rng.integers(0, len(d) - n + 1))
        out.append(d[s : s + n])
    return out


def arrivals(cfg: ServeConfig, tokenizer=None, vocab_size: int | None = None) -> list[Arrival]:
    """The request stream of a replay (deterministic given the config)."""
    if (cfg.rate_rps is None) == (cfg.trace is None):
        raise DSparkError("serve: set exactly one of rate_rps (Poisson) and trace")
    if cfg.prompt_tokens_min > cfg.prompt_tokens_max:
        raise DSparkError(
            f"serve: prompt_tokens_min {cfg.prompt_tokens_min} > "
            f"prompt_tokens_max {cfg.prompt_tokens_max}"
        )
    if cfg.output_tokens_min > cfg.max_new_tokens:
        raise DSparkError(
            f"serve: output_tokens_min {cfg.output_tokens_min} > "
            f"max_new_tokens {cfg.max_new_tokens}"
        )
    rng = np.random.default_rng(cfg.seed)
    if cfg.trace is not None:
        t, ctx, gen = read_azure_trace(cfg.trace, cfg.trace_timestamp_unit, cfg.trace_sort)
        arr = t * cfg.time_scale
        n = int(np.searchsorted(arr, cfg.duration_s, side="left"))
        arr = arr[:n]
        plen = np.clip(ctx[:n], cfg.prompt_tokens_min, cfg.prompt_tokens_max)
        olen = np.clip(gen[:n], cfg.output_tokens_min, cfg.max_new_tokens)
    else:
        times = [0.0]  # the first request arrives at t = 0
        while True:
            t_next = times[-1] + float(rng.exponential(1.0 / cfg.rate_rps))
            if t_next >= cfg.duration_s:
                break
            times.append(t_next)
        arr = np.asarray(times)
        n = len(arr)
        plen = rng.integers(cfg.prompt_tokens_min, cfg.prompt_tokens_max + 1, n)
        olen = rng.integers(cfg.output_tokens_min, cfg.max_new_tokens + 1, n)
    prompts = _windows([int(x) for x in plen], cfg.workload, cfg.split, tokenizer, vocab_size, rng)
    return [Arrival(i, float(arr[i]), prompts[i], int(olen[i])) for i in range(n)]


@dataclass
class _Replay:
    """The mutable bookkeeping of one replay: per-request results, logs, queue and counters."""

    stream: list[Arrival]
    first: np.ndarray
    finish: np.ndarray
    emitted: np.ndarray
    index: dict[int, int]
    records: list[RoundRecord] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    batches: list[dict] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    nxt: int = 0
    done: int = 0
    tokens: int = 0

    @classmethod
    def start(cls, stream: list[Arrival]) -> _Replay:
        """Empty bookkeeping for ``stream`` (sorted by arrival)."""
        n = len(stream)
        return cls(
            stream,
            np.full(n, np.nan),
            np.full(n, np.nan),
            np.zeros(n, dtype=np.int64),
            {a.request_id: i for i, a in enumerate(stream)},
        )

    def finish_seq(self, s) -> None:
        """Record a finished sequence's times, token count and round records."""
        i = self.index[s.req.request_id]
        self.first[i], self.finish[i] = s.first_token_s, s.finish_s
        self.emitted[i] = len(s.tokens)
        self.records.extend(s.records or [])
        self.done += 1

    def cut_off(self, running) -> None:
        """Record the sequences still running (cut off by the drain limit): unfinished,
        tokens counted."""
        for s in running:
            i = self.index[s.req.request_id]
            self.first[i], self.emitted[i] = s.first_token_s, len(s.tokens)
            self.records.extend(s.records or [])


def _take_waiting(engine, st: _Replay, make_ctrl, progress, Request) -> list:
    """Pop as many waiting arrivals as there are free slots into requests; one that cannot fit
    a slot is rejected (and counted done)."""
    take = []
    while st.waiting and len(take) < engine.free_slots:
        a = st.waiting.popleft()
        try:
            engine.check_request(a.prompt, a.output_tokens)
        except DSparkError as e:
            msg = f"request {a.request_id} rejected: {e}"
            st.rejected.append(msg)
            if progress is not None:
                progress(msg)
            st.done += 1
            continue
        take.append(
            Request(a.request_id, a.prompt, a.output_tokens, make_ctrl(), arrival_s=a.arrival_s)
        )
    return take


def _admit(engine, st: _Replay, take: list, origin: float) -> None:
    """Admit ``take`` (one packed prefill) and log the prefill in the batch trace."""
    for s in engine.admit(take, origin):
        if s.done:
            st.finish_seq(s)
    p = engine.prefills[-1]
    st.batches.append(
        {
            "kind": "prefill",
            "start_s": p["start_s"],
            "end_s": p["end_s"],
            "batch_size": p["requests"],
            "prefill_tokens": p["prefill_tokens"],
            "context_tokens": p["prompt_tokens"],
            "waiting": len(st.waiting),
        }
    )


def _run_round(engine, st: _Replay, planner, origin: float) -> None:
    """One engine round for every running sequence, logged in the batch trace."""
    for s, out in engine.round(origin, planner):
        st.tokens += len(out)
        if s.done:
            st.finish_seq(s)
    r = engine.round_log[-1]
    st.batches.append(
        {
            "kind": "round",
            "start_s": r.start_s,
            "end_s": r.end_s,
            "batch_size": r.batch_size,
            "drafting": r.drafting,
            "draft_steps": r.draft_steps,
            "verify_tokens": r.verify_tokens,
            "context_tokens": r.context_tokens,
            "draft_s": r.draft_s,
            "verify_s": r.verify_s,
            "accepted": r.accepted,
            "emitted": r.emitted,
            "waiting": len(st.waiting),
        }
    )


def _request_table(st: _Replay, label: str):
    """The per-request table (``REQUEST_COLUMNS``) of a finished replay."""
    import pandas as pd

    stream, first, finish, emitted = st.stream, st.first, st.finish, st.emitted
    arr = np.array([a.arrival_s for a in stream])
    out_l = np.array([a.output_tokens for a in stream], dtype=np.int64)
    fin = ~np.isnan(finish)
    # a request ended early by the end-of-text token (stop_at_eot) emitted fewer tokens
    n_out = np.where(fin, emitted, out_l)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out > 1, (finish - first) / (n_out - 1), np.nan)
    return pd.DataFrame(
        {
            "controller": label,
            "request_id": [a.request_id for a in stream],
            "arrival_s": arr,
            "prompt_tokens": [len(a.prompt) for a in stream],
            "output_tokens": out_l,
            "first_token_s": first,
            "finish_s": finish,
            "ttft_s": first - arr,
            "tpot_s": tpot,
            "e2e_s": finish - arr,
            "finished": fin,
            "replica": 0,
            "emitted_tokens": emitted,
        },
        columns=list(REQUEST_COLUMNS),
    )


def serve(
    engine,
    stream: list[Arrival],
    make_ctrl: Callable[[], Any],
    planner=None,
    label: str = "",
    duration_s: float | None = None,
    drain_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_s: float = 2.0,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    slo: Any = None,
) -> ServeResult:
    """Replay ``stream`` through ``engine`` in wall-clock time (see the module docstring).
    ``slo`` (a :class:`control.batch.Slo`): told to the planner and to every controller."""
    import pandas as pd

    from real.engine import Request

    if engine.running:
        raise DSparkError("serve needs an idle engine")
    stream = sorted(stream, key=lambda a: a.arrival_s)
    n = len(stream)
    st = _Replay.start(stream)
    waiting = st.waiting
    deadline = math.inf
    if duration_s is not None and drain_s is not None:
        deadline = duration_s + drain_s
    engine.round_log = []
    engine.prefills = []
    if planner is not None:
        planner.reset()
        engine.seed_planner(planner)
    if slo is not None:
        if planner is not None:
            planner.set_slo(slo)
        make_ctrl = told_slo(make_ctrl, slo)
    origin = clock()
    last_print = 0.0
    try:
        while True:
            now = clock() - origin
            if now >= deadline:
                break
            while st.nxt < n and stream[st.nxt].arrival_s <= now:
                waiting.append(stream[st.nxt])
                st.nxt += 1
            take = _take_waiting(engine, st, make_ctrl, progress, Request)
            if take:
                _admit(engine, st, take, origin)
            if engine.running:
                _run_round(engine, st, planner, origin)
            elif st.nxt < n:
                sleep(max(0.0, min(stream[st.nxt].arrival_s, deadline) - (clock() - origin)))
            elif not waiting:
                break
            if progress is not None and progress_s > 0:
                now = clock() - origin
                if now - last_print >= progress_s:
                    last_print = now
                    progress(
                        f"[{label or 'serve'}] t={now:7.1f}s arrived {st.nxt}/{n} "
                        f"waiting {len(waiting)} running {len(engine.running)} "
                        f"done {st.done} tokens {st.tokens} ({st.tokens / max(now, 1e-9):.1f}/s)"
                    )
    finally:
        st.cut_off(engine.running)
        engine.abort()
        engine.round_log = None
    end_s = clock() - origin
    req = _request_table(st, label)
    bt = pd.DataFrame(st.batches, columns=[c for c in BATCH_COLUMNS if c != "controller"])
    bt.insert(0, "controller", label)
    summary = summarize(req, bt, end_s, len(st.rejected), label)
    return ServeResult(req, st.records, bt, summary, st.rejected)


def _pct(x: np.ndarray, q: float) -> float:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


def summarize(req, batches, end_s: float, rejected: int, label: str) -> dict:
    fin = req["finished"].to_numpy(dtype=bool)
    rounds = batches[batches["kind"] == "round"]
    out = {
        "controller": label,
        "requests": len(req),
        "requests_finished": int(fin.sum()),
        "requests_unfinished": int((~fin).sum()),
        "requests_rejected": int(rejected),
        "output_tokens": int(req["emitted_tokens"].sum()),
        "wall_s": float(end_s),
        "throughput_tokens_per_s": float(req["emitted_tokens"].sum()) / max(end_s, 1e-12),
        "rounds": len(rounds),
        "mean_batch_size": float(rounds["batch_size"].mean()) if len(rounds) else float("nan"),
    }
    for m in ("ttft", "tpot", "e2e"):
        x = req[f"{m}_s"].to_numpy(dtype=float)[fin]
        for q in (50, 90, 99):
            out[f"{m}_p{q}_s"] = _pct(x, q)
    return out
