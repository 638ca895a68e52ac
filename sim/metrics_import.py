"""Calibrate a scenario's ``[acceptance]`` table from a real server's own metrics.

**vLLM.** Two Prometheus text scrapes of ``/metrics`` (parsed with ``prometheus_client``), taken
before and after the traffic of interest. Of the documented speculative-decoding counters

    vllm:spec_decode_num_drafts_total              verification steps that drafted
    vllm:spec_decode_num_draft_tokens_total        drafted tokens
    vllm:spec_decode_num_accepted_tokens_total     accepted drafted tokens
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}   accepted at position j

the deltas give the per-position *conditional* acceptance ``c_j = A_j / A_{j-1}`` (``A_{-1}`` =
drafts; position j accepted given the earlier ones were) and the mean acceptance length
``1 + accepted / drafts``. They are written as ``model = "curve"`` with ``position_rates``
(:mod:`sim.acceptance`). The ratio is exact when every step drafted the same number of tokens
(``draft_tokens = drafts × positions``); with varying drafts a step that never reached position
j counts against it, and the output says so.

Per-request summaries (vLLM's ``metrics.speculative_decoding``, one JSON object a line) give
the per-request spread: request i's first-position rate ``r_i = 1 − hist_i[0] / steps_i``, and
a Beta's concentration by the method of moments, the binomial noise of each ``r_i``
(``r_i(1 − r_i)/(steps_i − 1)``, unbiased) taken out of the variance across requests:
``κ = m(1 − m) / v_between − 1``; 0 when no spread shows beyond that noise.

**SGLang.** ``/server_info``'s ``avg_spec_accept_length`` (tokens per verify step, the bonus
token included) at ``speculative_num_steps`` k: the i.i.d. rate ``a`` with
``(1 − a^(k+1)) / (1 − a)`` equal to it (``model = "iid"``).

Every malformed or missing counter, a counter that went down (AFTER not later than BEFORE, or a
server restart), label sets that differ between the scrapes, and a scrape of another model is
a one-line :class:`DSparkError` naming the metric.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control.errors import DSparkError

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS)


@dataclass(frozen=True)
class SpecCounts:
    """Speculative-decoding counts (totals, or deltas between two scrapes)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]  # accepted at position 0, 1, ...


@dataclass
class Calibration:
    """What a calibration found: the conditional rates and the lines to report."""

    position_rates: list[float]
    mean_acceptance_length: float
    counts: SpecCounts | None = None
    concentration: float | None = None
    notes: list[str] = field(default_factory=list)

    def table(self) -> dict[str, Any]:
        acc: dict[str, Any] = {"model": "curve", "position_rates": self.position_rates}
        if self.concentration is not None:
            acc["position_concentration"] = self.concentration
        return {"acceptance": acc}


# ------------------------------------------------------------------------------ reading
def _labels(labels: dict, where: str, model: str | None) -> tuple | None:
    """The sample's labels without ``position`` (its series key), or None when it belongs to
    another model than ``model``."""
    if model is not None and labels.get("model_name", model) != model:
        return None
    return tuple(sorted((k, v) for k, v in labels.items() if k != "position"))


def read_scrape(text: str, where: str, model: str | None = None) -> dict[str, dict]:
    """``{counter: {series key: value}}`` of a Prometheus text scrape; the per-position
    counter keyed by ``(series key, position)``. Only samples of ``model`` (its ``model_name``
    label) when given; several model names without one is an error."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict] = {c: {} for c in COUNTERS}
    names: set[str] = set()
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name not in out:
                    continue
                if "model_name" in s.labels:
                    names.add(s.labels["model_name"])
                key = _labels(s.labels, where, model)
                if key is None:
                    continue
                v = float(s.value)
                if not math.isfinite(v) or v < 0:
                    raise DSparkError(f"{where}: {s.name} = {s.value!r} is not a counter value")
                if s.name == PER_POS:
                    if "position" not in s.labels or not s.labels["position"].isdigit():
                        raise DSparkError(
                            f"{where}: {PER_POS} has a sample without an integer 'position' "
                            f"label: {dict(s.labels)}"
                        )
                    key = (key, int(s.labels["position"]))
                if key in out[s.name]:  # Prometheus exposes a series once: not a sum
                    raise DSparkError(f"{where}: {s.name}{_series(key)} appears twice")
                out[s.name][key] = v
    except ValueError as e:
        raise DSparkError(f"{where}: {_malformed(text, e)}") from None
    if model is None and len(names) > 1:
        raise DSparkError(
            f"{where}: {DRAFTS} and the other counters come from several models "
            f"({', '.join(sorted(names))}); pass --model NAME"
        )
    if model is not None and names and model not in names:
        raise DSparkError(
            f"{where}: {DRAFTS}: no samples of model '{model}' (the scrape has "
            f"{', '.join(sorted(names))})"
        )
    for c in COUNTERS:
        if not out[c]:
            raise DSparkError(f"{where}: counter {c} is missing")
    return out


def _malformed(text: str, error: ValueError) -> str:
    """The parser's complaint, naming the metric of the first line it rejects."""
    from prometheus_client.parser import text_string_to_metric_families

    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError as e:
            name = line.split("{", 1)[0].split()[0]
            return f"malformed sample of {name}: {e}"
    return f"malformed Prometheus text: {error}"


def _series(key: Any) -> str:
    """A series key as Prometheus writes its labels: ``{engine="0",position="1"}``."""
    labels, pos = (key[0], key[1]) if len(key) == 2 and isinstance(key[1], int) else (key, None)
    items = [f'{k}="{v}"' for k, v in labels] + ([f'position="{pos}"'] if pos is not None else [])
    return "{" + ",".join(items) + "}"


def _delta(before: dict, after: dict, name: str, where: str) -> dict:
    if set(before) != set(after):
        odd = sorted(set(before) ^ set(after), key=repr)[0]
        side = "BEFORE" if odd in before else "AFTER"
        raise DSparkError(
            f"{where}: {name}{_series(odd)} is only in {side}: the scrapes' label sets differ "
            "(another server, or a restart between them)"
        )
    out = {}
    for key, v in after.items():
        d = v - before[key]
        if d < 0:
            raise DSparkError(
                f"{where}: {name}{_series(key)} went down from {before[key]:g} to {v:g}: AFTER "
                "is not later than BEFORE (or the server restarted between them)"
            )
        out[key] = d
    return out


def counter_deltas(before: dict, after: dict, where: str) -> SpecCounts:
    """The counts between two :func:`read_scrape` results (summed over series, e.g. engines)."""
    d = {c: _delta(before[c], after[c], c, where) for c in COUNTERS}
    positions = sorted({pos for _, pos in d[PER_POS]})
    if positions != list(range(len(positions))):
        raise DSparkError(f"{where}: {PER_POS} positions {positions} are not 0, 1, 2, ...")
    per_pos = tuple(
        sum(v for (_, pos), v in d[PER_POS].items() if pos == j) for j in range(len(positions))
    )
    return SpecCounts(
        sum(d[DRAFTS].values()), sum(d[DRAFT_TOKENS].values()), sum(d[ACCEPTED].values()), per_pos
    )


def calibrate_counts(c: SpecCounts, where: str) -> Calibration:
    """Conditional per-position acceptance and mean acceptance length of counts."""
    if c.drafts <= 0:
        raise DSparkError(
            f"{where}: {DRAFTS} did not move between the scrapes: no drafts to learn from"
        )
    if c.accepted > c.draft_tokens * (1 + 1e-9):
        raise DSparkError(
            f"{where}: {ACCEPTED} moved by {c.accepted:g}, more than {DRAFT_TOKENS} "
            f"({c.draft_tokens:g}): more tokens accepted than drafted"
        )
    total = sum(c.per_pos)
    if abs(total - c.accepted) > 1e-6 * max(c.accepted, 1.0):
        raise DSparkError(
            f"{where}: {PER_POS} sums to {total:g} over its positions but {ACCEPTED} moved by "
            f"{c.accepted:g}"
        )
    prev, rates = c.drafts, []
    for j, a in enumerate(c.per_pos):
        if a > prev:
            raise DSparkError(
                f"{where}: {PER_POS} position {j} moved by {a:g}, more than "
                f"{'the drafts' if j == 0 else f'position {j - 1}'} ({prev:g})"
            )
        if prev == 0:
            break  # no step reached this position
        rates.append(a / prev)
        prev = a
    cal = Calibration(rates or [0.0], 1.0 + c.accepted / c.drafts, c)
    n = len(c.per_pos)
    if abs(c.draft_tokens - c.drafts * n) > 1e-6 * max(c.draft_tokens, 1.0):
        cal.notes.append(
            f"drafts had varying lengths ({c.draft_tokens / c.drafts:.3g} tokens a step on "
            f"average, {n} positions): a step that never reached position j counts against "
            "it, so the rates past the shortest draft are low"
        )
    return cal


def calibrate_vllm(
    before: str, after: str, requests: str | None = None, model: str | None = None
) -> Calibration:
    """The calibration of two scrape files (and a JSON-lines file of per-request summaries)."""
    b = read_scrape(_read(before), before, model)
    a = read_scrape(_read(after), after, model)
    cal = calibrate_counts(counter_deltas(b, a, f"{before} -> {after}"), f"{before} -> {after}")
    if requests is not None:
        rows = read_request_summaries(requests)
        kappa, mean, used = beta_concentration(rows, requests)
        cal.concentration = kappa
        cal.notes.append(
            f"{used} requests: first-position rate {mean:.4g} on average, Beta concentration "
            + (f"{kappa:.4g}" if kappa > 0 else "0 (no spread beyond sampling noise)")
        )
    return cal


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise DSparkError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DSparkError(f"{path}: cannot read: {e}") from None


# ------------------------------------------------------------------------- per request
def _summary(obj: Any) -> Any:
    """The ``speculative_decoding`` object of a response, its ``metrics``, or itself."""
    if isinstance(obj, dict) and "metrics" in obj:
        obj = obj["metrics"]
    if isinstance(obj, dict) and "speculative_decoding" in obj:
        obj = obj["speculative_decoding"]
    return obj


def _steps_and_zero(s: dict, where: str) -> tuple[int, int]:
    """(steps that drafted, of them the steps that accepted nothing) of one summary."""
    by_len = s.get("acceptance_histogram_by_draft_length")
    if isinstance(by_len, dict):
        hists = [(int(k), h) for k, h in by_len.items() if str(k).isdigit() and int(k) > 0]
    elif "acceptance_histogram" in s:
        hists = [(len(s["acceptance_histogram"]) - 1, s["acceptance_histogram"])]
    else:
        raise DSparkError(f"{where}: speculative_decoding has no acceptance_histogram")
    steps = zero = 0
    for k, h in hists:
        if (
            not isinstance(h, list)
            or len(h) != k + 1
            or not all(isinstance(x, int) and x >= 0 for x in h)
        ):
            raise DSparkError(f"{where}: acceptance histogram {h!r} is not {k + 1} counts")
        steps += sum(h)
        zero += h[0]
    return steps, zero


def read_request_summaries(path: str) -> list[tuple[int, int]]:
    """``(steps, steps that accepted no draft)`` per request of a JSON-lines file of vLLM's
    per-request summaries; requests whose summary is null (``n > 1``) are skipped."""
    rows = []
    for i, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            s = _summary(json.loads(line))
        except json.JSONDecodeError as e:
            raise DSparkError(f"{where}: not JSON: {e.msg}") from None
        if s is None:
            continue
        if not isinstance(s, dict):
            raise DSparkError(f"{where}: expected a speculative_decoding object")
        rows.append(_steps_and_zero(s, where))
    if not rows:
        raise DSparkError(f"{path}: no per-request speculative_decoding summary")
    return rows


def beta_concentration(rows: list[tuple[int, int]], where: str) -> tuple[float, float, int]:
    """(κ, mean first-position rate, requests used) by the method of moments (module
    docstring); requests with fewer than 2 steps are left out."""
    r, noise = [], []
    for steps, zero in rows:
        if steps >= 2:
            x = 1.0 - zero / steps
            r.append(x)
            noise.append(x * (1.0 - x) / (steps - 1))
    if len(r) < 2:
        raise DSparkError(f"{where}: fewer than 2 requests with 2 or more steps; no spread to fit")
    n = len(r)
    mean = sum(r) / n
    var = sum((x - mean) ** 2 for x in r) / (n - 1)
    between = var - sum(noise) / n
    if between <= 0 or mean <= 0 or mean >= 1:
        return 0.0, mean, n
    return max(mean * (1.0 - mean) / between - 1.0, 0.0), mean, n


# ------------------------------------------------------------------------------- SGLang
def calibrate_sglang(path: str, num_steps: int | None = None) -> tuple[float, float, int]:
    """(i.i.d. rate, avg_spec_accept_length, k) of an SGLang ``/server_info`` JSON file."""
    try:
        info = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise DSparkError(f"{path}: not JSON: {e.msg}") from None
    states = info.get("internal_states") if isinstance(info, dict) else None
    src = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    if not isinstance(info, dict):
        raise DSparkError(f"{path}: expected a JSON object")
    length = src.get("avg_spec_accept_length", info.get("avg_spec_accept_length"))
    if not isinstance(length, (int, float)) or isinstance(length, bool):
        raise DSparkError(f"{path}: no avg_spec_accept_length (in internal_states[0] or on top)")
    if num_steps is not None and num_steps < 1:
        raise DSparkError(f"--num-steps {num_steps}: allowed an integer >= 1")
    k = num_steps or src.get("speculative_num_steps", info.get("speculative_num_steps"))
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise DSparkError(f"{path}: no speculative_num_steps; pass --num-steps K")
    return iid_rate(float(length), k, path), float(length), k


def iid_rate(length: float, k: int, where: str) -> float:
    """The rate ``a`` with ``(1 − a^(k+1)) / (1 − a) = length`` (tokens per step at k)."""
    if not 1.0 <= length <= k + 1:
        raise DSparkError(
            f"{where}: avg_spec_accept_length = {length:g} is outside [1, {k + 1}] at "
            f"speculative_num_steps = {k}"
        )
    if length == 1.0:
        return 0.0
    if length == k + 1:
        return 1.0
    from scipy.optimize import brentq

    return float(brentq(lambda a: sum(a**j for j in range(k + 1)) - length, 0.0, 1.0, xtol=1e-14))


# ------------------------------------------------------------------ scrapes we make ourselves
def counts_of_rounds(drafted: Any, accepted: Any) -> SpecCounts:
    """The counter deltas a vLLM server would report for rounds ``(drafted, accepted)``."""
    pairs = [(int(d), int(n)) for d, n in zip(drafted, accepted) if int(d) > 0]
    top = max((d for d, _ in pairs), default=0)
    return SpecCounts(
        float(len(pairs)),
        float(sum(d for d, _ in pairs)),
        float(sum(n for _, n in pairs)),
        tuple(float(sum(1 for _, n in pairs if n > j)) for j in range(top)),
    )


def vllm_scrape(c: SpecCounts, model: str = "model", engine: str = "0") -> str:
    """Prometheus text of counts, with vLLM's counter names and labels."""
    lab = f'engine="{engine}",model_name="{model}"'
    lines = []
    for name, v in ((DRAFTS, c.drafts), (DRAFT_TOKENS, c.draft_tokens), (ACCEPTED, c.accepted)):
        base = name.removesuffix("_total")
        lines += [f"# TYPE {base} counter", f"{name}{{{lab}}} {v!r}"]
    lines.append(f"# TYPE {PER_POS.removesuffix('_total')} counter")
    lines += [f'{PER_POS}{{{lab},position="{j}"}} {v!r}' for j, v in enumerate(c.per_pos)]
    return "\n".join(lines) + "\n"
