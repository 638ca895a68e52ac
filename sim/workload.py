"""Request streams: Poisson / gamma arrivals or Azure-trace replay; prompt and output lengths.

All draws come from Generators the caller derives from the run's seed, one per stream, so every
controller sees exactly the same arrivals and lengths.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np

from control.configio import param
from control.errors import ConfigError, DSparkError
from sim.tables import read_table

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: the largest token count a trace row may hold (LengthConfig's max_tokens bound).
MAX_TRACE_TOKENS = 10_000_000
_TZ_SUFFIX = r"(?:Z|[+-]\d\d:?\d\d)\s*$"
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
    # datetime strings (the Azure traces) need no unit; numbers need one (JSONL traces: ms).
    trace_timestamp_unit: str = param(
        "auto",
        choices=("auto", "s", "ms", "us", "ns"),
        doc="unit of numeric trace timestamps (auto: datetimes as text, JSONL numbers in ms)",
    )
    # Mooncake's public traces hash prompts in blocks of 512 tokens.
    trace_hash_block_tokens: int = param(
        512, lo=1, hi=1 << 20, doc="prompt tokens per hash_ids entry of a JSONL trace"
    )
    # 1 = real time; 0.1 = ten times faster.
    time_scale: float = param(1.0, lo=1e-6, hi=1e6, doc="multiplies trace inter-arrival times")
    # None = the whole trace (or num_requests, whichever is smaller).
    max_requests: int | None = param(None, lo=1, doc="trace request limit")
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


def _hash_ids(rec: dict, path: str, line_no: int) -> tuple[int, ...]:
    """A record's ``hash_ids`` (one id per block of prompt tokens; () when it has none)."""
    h = rec.get("hash_ids", [])
    if not isinstance(h, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in h
    ):
        raise DSparkError(f"{path}: line {line_no}: hash_ids must be a list of integers")
    return tuple(h)


def _read_jsonl(path: str):
    """A JSONL trace (one record a line: ``timestamp``, ``input_length``, ``output_length``,
    optional ``hash_ids``, the form public long-context traces use) as the Azure columns, and
    the records' hash ids (None when no record has any)."""
    import json

    import pandas as pd

    rows, hashes = [], []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rows.append((rec["timestamp"], rec["input_length"], rec["output_length"]))
            except (ValueError, TypeError) as e:
                raise DSparkError(f"{path}: line {line_no} is not a JSON record: {e}") from None
            except KeyError as e:
                raise DSparkError(
                    f"{path}: line {line_no} has no {e}; a record needs timestamp, input_length "
                    "and output_length"
                ) from None
            hashes.append(_hash_ids(rec, path, line_no))
    df = pd.DataFrame(rows, columns=list(AZURE_COLUMNS)).astype(str)
    return df, (hashes if any(hashes) else None)


def _numeric_times(df, path: str, unit: str):
    """Numeric ``TIMESTAMP`` values in ``unit`` as timedeltas (None when they are not numbers)."""
    import pandas as pd

    v = pd.to_numeric(df["TIMESTAMP"], errors="coerce")
    if v.isna().any():
        if unit != "auto":
            row = int(np.flatnonzero(v.isna().to_numpy())[0])
            raise DSparkError(
                f"{path}: column 'TIMESTAMP' = {df['TIMESTAMP'].iloc[row]!r} at row {row + 2} is "
                f"not a number; trace_timestamp_unit = '{unit}' needs numbers"
            )
        return None
    return pd.to_timedelta(v, unit=unit)


#: a trace: arrival seconds from the first request, context tokens, generated tokens (sorted
#: by time) and, for a JSONL trace with ``hash_ids``, each request's hash ids (else None)
Trace = tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, ...]] | None]


@functools.lru_cache(maxsize=8)
def _read_trace(path: str, mtime: float, unit: str = "auto") -> Trace:
    jsonl = path.endswith(".jsonl")
    hashes = None
    if jsonl:
        df, hashes = _read_jsonl(path)
    else:
        df = read_table(path, "trace", AZURE_COLUMNS)
    if df.empty:
        raise DSparkError(f"{path}: trace has no requests (only a header); need at least one row")
    numeric = (
        _numeric_times(df, path, "ms" if unit == "auto" and jsonl else unit)
        if unit != "auto" or jsonl
        else None
    )
    t, ctx, gen, order = _trace_arrays(
        df, path, numeric if numeric is not None else _times(df, path)
    )
    return t, ctx, gen, ([hashes[j] for j in order] if hashes is not None else None)


def _times(df, path: str):
    """Datetime-text ``TIMESTAMP`` values as timestamps (one-line errors for bad ones)."""
    import pandas as pd

    text = df["TIMESTAMP"].astype(str).str.strip()
    aware = text.str.contains(_TZ_SUFFIX, regex=True)
    if aware.any() and not aware.all():
        row = int(np.flatnonzero((aware != aware.iloc[0]).to_numpy())[0])
        raise DSparkError(
            f"{path}: column 'TIMESTAMP' mixes timezone-aware and naive times "
            f"(row 2: {text.iloc[0]!r}, row {row + 2}: {text.iloc[row]!r}); "
            "give every time a UTC offset or none"
        )
    try:
        ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed", utc=bool(aware.all()))
    except (ValueError, TypeError, OverflowError) as e:
        raise DSparkError(
            f"{path}: column 'TIMESTAMP' cannot be read as times: {str(e).splitlines()[0]}"
        ) from None
    if ts.isna().any():
        row = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise DSparkError(
            f"{path}: column 'TIMESTAMP' has a garbled value at row {row + 2}: "
            f"{df['TIMESTAMP'].iloc[row]!r}"
        )
    return ts


def _trace_arrays(df, path: str, ts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(seconds from the first request, context tokens, generated tokens), sorted by time, and
    the sorting order."""
    import pandas as pd

    out = []
    for c in AZURE_COLUMNS[1:]:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna() | (v < 0) | (v != v.round())
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise DSparkError(
                f"{path}: column '{c}' has a garbled value at row {row + 2}: {df[c].iloc[row]!r}"
            )
        big = v > MAX_TRACE_TOKENS
        if big.any():
            row = int(np.flatnonzero(big.to_numpy())[0])
            raise DSparkError(
                f"{path}: column '{c}' = {df[c].iloc[row]} at row {row + 2} is out "
                f"of range; allowed 0 to {MAX_TRACE_TOKENS} tokens"
            )
        out.append(v.to_numpy(dtype=np.int64))
    t = (ts - ts.min()).dt.total_seconds().to_numpy()
    order = np.argsort(t, kind="stable")
    return t[order], out[0][order], out[1][order], order


def read_trace_with_hashes(path: str, unit: str = "auto") -> Trace:
    """:func:`read_trace` and each request's ``hash_ids`` (None unless a JSONL trace has
    them)."""
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        raise DSparkError(f"{path}: trace file not found") from None
    return _read_trace(path, mtime, unit)


def read_trace(path: str, unit: str = "auto") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first request, context tokens, generated tokens); ``unit``:
    that of numeric timestamps (``auto``: datetime text, or milliseconds in a .jsonl trace)."""
    t, ctx, gen, _ = read_trace_with_hashes(path, unit)
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


def generate(
    cfg: WorkloadConfig, streams: dict[str, np.random.Generator], load_scale: float = 1.0
) -> Requests:
    """Arrivals and lengths; ``load_scale`` multiplies the arrival rate (trace: compresses time)."""
    ra, rl = streams["arrivals"], streams["lengths"]
    if cfg.arrival == "trace":
        t, ctx, gen, hashes = read_trace_with_hashes(cfg.trace_path, cfg.trace_timestamp_unit)
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
