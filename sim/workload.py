"""Request streams: Poisson / gamma arrivals or Azure-trace replay; prompt and output lengths.

All draws come from Generators the caller derives from the run's seed, one per stream, so every
controller sees exactly the same arrivals and lengths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from control import tracefile
from control.configio import param
from control.errors import ConfigError, DSparkError
from sim.tables import read_table

AZURE_COLUMNS = tracefile.AZURE_COLUMNS
#: the largest token count a trace row may hold (LengthConfig's max_tokens bound).
MAX_TRACE_TOKENS = tracefile.MAX_TRACE_TOKENS
DEFAULT_TRACE = "../../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class LengthConfig:
    # heavy-tailed lengths like the Azure conversation trace.
    dist: str = param(
        "lognormal", choices=("lognormal", "empirical", "constant"), doc="length distribution"
    )
    # Azure conversation trace: ~1150 prompt / ~210 output tokens on average.
    mean_tokens: float = param(256.0, lo=1.0, hi=1e7, doc="mean (lognormal) or value (constant)")
    # lognormal shape; ~0.8 fits the Azure conversation outputs.
    sigma: float = param(0.8, lo=0.0, hi=5.0, doc="lognormal sigma")
    # a request has at least one token.
    min_tokens: int = param(1, lo=1, hi=10_000_000, doc="lower clip")
    # 32k context covers the Azure traces.
    max_tokens: int = param(32768, lo=1, hi=10_000_000, doc="upper clip")
    # empty unless dist = 'empirical' without a file.
    values: tuple[int, ...] = param(default_factory=tuple, lo=1, doc="empirical values")
    # empirical lengths may come from a CSV column instead (relative to the scenario file).
    path: str | None = param(None, doc="CSV file with empirical lengths")
    # the column of `path`.
    column: str = param("GeneratedTokens", doc="column of `path`")

    def __post_init__(self) -> None:
        if self.min_tokens > self.max_tokens:
            raise ConfigError(
                f"min_tokens = {self.min_tokens} is above max_tokens = "
                f"{self.max_tokens}; allowed min_tokens <= max_tokens"
            )


@dataclass(frozen=True)
class WorkloadConfig:
    # the Azure conversation trace is the standard arrival process.
    arrival: str = param(
        "poisson",
        choices=("poisson", "gamma", "sinusoid", "capacity", "trace"),
        doc="arrival process (capacity: every request at t = 0)",
    )
    # a moderately loaded single replica.
    rate_rps: float = param(2.0, lo=1e-6, hi=1e6, doc="mean arrival rate, requests/s")
    # cv > 1 = burstier than Poisson.
    gamma_cv: float = param(2.0, lo=0.01, hi=100.0, doc="coefficient of variation (gamma)")
    # ±90%: the rate swings from a tenth of its mean to nearly twice it.
    swing_amplitude: float = param(0.9, lo=0.0, hi=1.0, doc="relative rate swing (sinusoid)")
    # one minute: long enough for batches to fill and drain within a period.
    swing_period_s: float = param(60.0, lo=1e-3, hi=1e7, doc="period of the rate (sinusoid)")
    # enough requests for stable percentiles in a short run.
    num_requests: int | None = param(200, lo=1, hi=100_000_000, doc="requests to generate")
    # None = stop at num_requests.
    horizon_s: float | None = param(None, lo=0.0, doc="stop generating arrivals after this time")
    # the Azure conversation trace (CC-BY 4.0, Patel et al., Splitwise, ISCA 2024).
    trace_path: str = param(
        DEFAULT_TRACE,
        doc="Azure-format CSV trace, or a .jsonl trace of {timestamp, input_length, "
        "output_length, optional hash_ids} records (relative to scenario file)",
    )
    # ISO dates (the Azure traces) need no unit; auto reads numbers as seconds (JSONL: ms), warned.
    trace_timestamp_unit: str = param(
        "auto",
        choices=tracefile.UNIT_CHOICES,
        doc="unit of numeric trace timestamps (auto: ISO dates as dates, numbers as seconds, "
        "JSONL numbers as ms, with a warning naming the span)",
    )
    # a trace out of time order is more likely a misread than a plan: refused unless asked.
    trace_sort: bool = param(
        False, doc="sort trace rows by time (negative or out-of-order times are else an error)"
    )
    # Mooncake's public traces hash prompts in blocks of 512 tokens.
    trace_hash_block_tokens: int = param(
        512, lo=1, hi=1 << 20, doc="prompt tokens per hash_ids entry of a JSONL trace"
    )
    # 1 = real time; 0.1 = ten times faster.
    time_scale: float = param(1.0, lo=1e-6, hi=1e6, doc="multiplies trace inter-arrival times")
    # None = the whole trace (or num_requests, whichever is smaller).
    max_requests: int | None = param(None, lo=1, doc="trace request limit")
    # 0 = from the trace's first request; a later window is other traffic of the same trace
    # (held-out tuning windows), its first request at t = 0.
    trace_start: int = param(0, lo=0, doc="trace requests skipped before the first replayed")
    # trace replay takes its lengths from the trace by default.
    trace_lengths: bool = param(True, doc="use ContextTokens/GeneratedTokens of the trace")
    # Azure conversation-like prompts.
    prompt: LengthConfig = param(
        default_factory=lambda: LengthConfig(mean_tokens=1024.0, sigma=0.9)
    )
    # Azure conversation-like outputs.
    output: LengthConfig = param(default_factory=lambda: LengthConfig(mean_tokens=210.0, sigma=0.8))


@dataclass
class Requests:
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)


#: a trace: arrival seconds from the first request, context tokens, generated tokens (sorted
#: by time) and, for a JSONL trace with ``hash_ids``, each request's hash ids (else None)
Trace = tracefile.Trace


def read_trace_with_hashes(path: str, unit: str = "auto", sort: bool = False) -> Trace:
    """:func:`read_trace` and each request's ``hash_ids`` (None unless a JSONL trace has
    them): :func:`control.tracefile.read_trace_file`, the reader the real serving loop uses."""
    return tracefile.read_trace_file(path, unit, sort, prefix="workload.")


def read_trace(
    path: str, unit: str = "auto", sort: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first request, context tokens, generated tokens); ``unit``:
    that of numeric timestamps (``auto``: ISO dates as dates, numbers as seconds, or
    milliseconds in a .jsonl trace, with a warning); ``sort``: sort rows out of time order
    (else they are an error)."""
    t, ctx, gen, _ = read_trace_with_hashes(path, unit, sort)
    return t, ctx, gen


@functools.lru_cache(maxsize=8)
def _read_column(path: str, column: str) -> np.ndarray:
    df = read_table(path, "length table", (column,), numeric=(column,), minimum=1)
    return df[column].to_numpy(dtype=np.int64)


def draw_lengths(cfg: LengthConfig, n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    if cfg.dist == "constant":
        x = np.full(n, round(cfg.mean_tokens), dtype=np.int64)
    elif cfg.dist == "lognormal":
        mu = np.log(cfg.mean_tokens) - cfg.sigma**2 / 2  # so the mean is mean_tokens
        x = np.rint(rng.lognormal(mu, cfg.sigma, n)).astype(np.int64)
    else:
        vals = (
            np.asarray(cfg.values, dtype=np.int64)
            if cfg.values
            else (_read_column(cfg.path, cfg.column) if cfg.path else None)
        )
        if vals is None or len(vals) == 0:
            raise DSparkError(f"{what}: dist = 'empirical' needs values or path")
        x = vals[rng.integers(0, len(vals), n)]
    return np.clip(x, cfg.min_tokens, cfg.max_tokens)


def _window(cfg: WorkloadConfig, t, ctx, gen, hashes) -> Trace:
    """The trace from request ``trace_start`` on, its times from that request's."""
    i = cfg.trace_start
    if i >= len(t):
        raise DSparkError(
            f"workload.trace_start = {i}: the trace {cfg.trace_path} has only {len(t)} requests"
        )
    return Trace(t[i:] - t[i], ctx[i:], gen[i:], None if hashes is None else hashes[i:])


def generate(
    cfg: WorkloadConfig, streams: dict[str, np.random.Generator], load_scale: float = 1.0
) -> Requests:
    """Arrivals and lengths; ``load_scale`` multiplies the arrival rate (trace: compresses time)."""
    ra, rl = streams["arrivals"], streams["lengths"]
    if cfg.arrival == "trace":
        t, ctx, gen, hashes = read_trace_with_hashes(
            cfg.trace_path, cfg.trace_timestamp_unit, cfg.trace_sort
        )
        if cfg.trace_start:
            t, ctx, gen, hashes = _window(cfg, t, ctx, gen, hashes)
        n = len(t)
        for lim in (cfg.max_requests, cfg.num_requests):
            if lim is not None:
                n = min(n, lim)
        arr = t[:n] * cfg.time_scale / load_scale
        if cfg.horizon_s is not None:
            n = int(np.searchsorted(arr, cfg.horizon_s, side="right"))
            arr = arr[:n]
        extra: dict = {}
        if cfg.trace_lengths:
            prompt = np.maximum(ctx[:n], 1)
            out = np.maximum(gen[:n], 1)
            if hashes is not None:  # the prompts' block hashes (prefix caching)
                extra["hash_ids"] = hashes[:n]
        else:
            prompt = draw_lengths(cfg.prompt, n, rl, "workload.prompt")
            out = draw_lengths(cfg.output, n, rl, "workload.output")
        return Requests(arr.astype(float), prompt.astype(np.int64), out.astype(np.int64), extra)
    rate = cfg.rate_rps * load_scale
    h = cfg.horizon_s
    if cfg.num_requests is not None:
        n = cfg.num_requests
    elif h is None:
        raise DSparkError("workload: set num_requests or horizon_s")
    else:
        n = max(16, int(h * rate * 1.5 + 10 * np.sqrt(h * rate + 1)))
    if cfg.arrival == "capacity":
        arr = np.zeros(n)
        return Requests(
            arr,
            draw_lengths(cfg.prompt, n, rl, "workload.prompt"),
            draw_lengths(cfg.output, n, rl, "workload.output"),
        )
    if cfg.arrival == "sinusoid":
        gaps = _sinusoid_gaps(rate, cfg.swing_amplitude, cfg.swing_period_s, n, ra)
    elif cfg.arrival == "poisson":
        gaps = ra.exponential(1.0 / rate, n)
    else:
        shape = 1.0 / cfg.gamma_cv**2
        gaps = ra.gamma(shape, 1.0 / (rate * shape), n)
    arr = np.cumsum(gaps) - gaps[0]  # first request at t = 0
    if cfg.horizon_s is not None:
        arr = arr[arr <= cfg.horizon_s]
    n = len(arr)
    prompt = draw_lengths(cfg.prompt, n, rl, "workload.prompt")
    out = draw_lengths(cfg.output, n, rl, "workload.output")
    return Requests(arr, prompt, out)


def _sinusoid_gaps(
    rate: float, amplitude: float, period_s: float, n: int, rng: np.random.Generator
) -> np.ndarray:
    """Gaps of ``n`` arrivals of a Poisson process with rate ``rate·(1 + A·sin(2πt/P))``, by
    thinning (Lewis & Shedler) a process of rate ``rate·(1 + A)``; starts at t = 0."""
    peak = rate * (1.0 + amplitude)
    times: list[float] = [0.0]
    t = 0.0
    while len(times) < n:
        cand = t + np.cumsum(rng.exponential(1.0 / peak, 4 * n))
        keep = rng.random(len(cand)) * peak <= rate * (
            1.0 + amplitude * np.sin(2.0 * np.pi * cand / period_s)
        )
        times.extend(cand[keep].tolist())
        t = float(cand[-1])
    arr = np.asarray(times[:n])
    return np.diff(arr, prepend=0.0)
