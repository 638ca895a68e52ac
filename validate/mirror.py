"""Configure the simulator to mirror the engine, and read its prediction back.

The mirror: one replica, batch 1 (``max_batch = 1``), every request arriving at t = 0 (a trace
in the Azure format with one timestamp), the prompts' own lengths, the table latency backend on
the measured ``latency.csv`` with its measured per-round overhead, the engine's caps on k
(``k_max``; never drafting past ``max_new_tokens``), and acceptance either replayed from the
greedy position traces (exact for any controller under greedy decoding) or a statistical model
fitted on the calibration traces.

One structural difference is mapped, not modelled away: the engine's prefill runs the target on
the prompt's first P - 1 tokens and emits nothing (its first round verifies from the last prompt
token), while the simulator's prefill emits the first token. So the simulator's request is the
prompt's first P - 1 tokens, and its "first token" is the engine's last prompt token: the sim's
rounds then start at context P exactly as the engine's, its output is one longer, and its
position trace is the engine's shifted by one (position 0 is that prompt token, never drafted
from). Metrics are computed from the rounds and request times by the same function on both
sides (:mod:`validate.metrics`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from control.configio import write_toml
from control.types import PositionRecord, records_to_columns
from sim.latency import table_block_size
from validate.metrics import compute

TIMESTAMP = "2023-11-16 00:00:00.000000"


def write_positions_sim(path: Path, positions: list[list[PositionRecord]]) -> None:
    """The engine's position traces shifted by one (see the module doc)."""
    import pandas as pd

    rows = []
    for rid, recs in enumerate(positions):
        rows.append(PositionRecord(request_id=rid, position=0, run_length=0))
        for r in recs:
            rows.append(
                PositionRecord(
                    request_id=rid,
                    position=r.position + 1,
                    run_length=r.run_length,
                    confidences=r.confidences,
                    sentence_end=r.sentence_end,
                )
            )
    pd.DataFrame(records_to_columns(rows, PositionRecord)).to_csv(path, index=False)


def write_requests_trace(
    path: Path,
    prompt_tokens: list[int],
    new_tokens: list[int],
    arrival_s: list[float] | None = None,
) -> None:
    """The mirrored requests as an Azure-format trace (all at t = 0 unless ``arrival_s``; the
    first arrival must be at 0: the simulator counts time from the trace's first request)."""
    import pandas as pd

    if arrival_s is None:
        stamps = [TIMESTAMP] * len(prompt_tokens)
    else:
        base = pd.Timestamp(TIMESTAMP)
        stamps = [
            (base + pd.Timedelta(microseconds=round(t * 1e6))).strftime("%Y-%m-%d %H:%M:%S.%f")
            for t in arrival_s
        ]
    pd.DataFrame(
        {
            "TIMESTAMP": stamps,
            "ContextTokens": [p - 1 for p in prompt_tokens],
            "GeneratedTokens": [n + 1 for n in new_tokens],
        }
    ).to_csv(path, index=False)


def position_rates(records, block: int) -> tuple[float, ...]:
    """Conditional acceptance of draft position j = 1..``block`` given 1..j-1 were accepted,
    from rounds (``RoundRecord``s): rounds that drafted position j after accepting every earlier
    one, and the share of them that accepted it (a position nobody reached repeats the last
    rate; none reached at all: the overall rate Σn / Σ(drafted positions tried))."""
    reached = np.zeros(block)
    passed = np.zeros(block)
    for r in records:
        tried = min(r.drafted, r.accepted + 1, block)  # positions 1..tried were decided
        reached[:tried] += 1
        passed[: min(r.accepted, block)] += 1
    if not reached.any():
        return ()
    out: list[float] = []
    for j in range(block):
        if reached[j]:
            out.append(float(passed[j] / reached[j]))
        else:
            out.append(out[-1] if out else float(passed.sum() / reached.sum()))
    return tuple(out)


def fit_acceptance(records, block: int = 0) -> dict:
    """A statistical acceptance model from calibration rounds (``RoundRecord``s).

    i.i.d. rate = â = Σn / (Σn + rejected rounds) (the MLE of a geometric run length censored at
    k); drafter-confidence logits: mean and pooled std of logit(confidence) of accepted drafted
    tokens and of the rest of rejected rounds; sentence ends per emitted token. For a block
    drafter (``block`` = B > 0) the model is its per-position curve (:func:`position_rates`):
    a block position's acceptance is not the one before it.
    """
    acc, rej = [], []
    s = r_ = 0
    ends = emitted = 0
    for r in records:
        s += r.accepted
        r_ += int(r.accepted < r.drafted)
        c = np.clip(np.asarray(r.confidences, dtype=float), 1e-6, 1 - 1e-6)
        z = np.log(c / (1 - c))
        acc.extend(z[: r.accepted].tolist())
        rej.extend(z[r.accepted :].tolist())
        ends += len(r.sentence_ends)
        emitted += r.emitted
    rate = s / (s + r_) if s + r_ else 0.0
    za, zr = np.asarray(acc), np.asarray(rej)
    resid = np.concatenate([za - za.mean() if len(za) else za, zr - zr.mean() if len(zr) else zr])
    clip = lambda v: float(np.clip(v, -20.0, 20.0))  # noqa: E731
    curve = position_rates(records, block) if block else ()
    return {
        "model": "curve" if curve else "iid",
        **({"position_rates": list(curve)} if curve else {}),
        "rate": float(rate),
        "conf_accept_logit": clip(za.mean()) if len(za) else 2.0,
        "conf_reject_logit": clip(zr.mean()) if len(zr) else -0.5,
        "conf_logit_sd": float(min(resid.std(), 20.0)) if len(resid) else 1.0,
        "sentence_end_rate": float(ends / emitted) if emitted else 0.0,
    }


def engine_deployment() -> dict:
    """Deployment keys that make the simulator schedule like the engine, where this simulator
    has them: one prefill pass for every admitted prompt while the running rows wait
    (``scheduler = "prefill-first"``), and a slot's KV held from admission
    (``kv_allocation = "reserve"``), and a round planner seeded with a start-up cost profile
    (``seed_planner_costs``, as the engine seeds its own)."""
    import dataclasses

    from sim.config import DeploymentConfig

    have = {f.name for f in dataclasses.fields(DeploymentConfig)}
    want = {"scheduler": "prefill-first", "kv_allocation": "reserve", "seed_planner_costs": True}
    return {k: v for k, v in want.items() if k in have}


def write_scenario(
    folder: Path,
    name: str,
    latency_csv: Path,
    round_overhead_s: float,
    k_max: int,
    prompt_tokens: list[int],
    new_tokens: list[int],
    positions: list[list[PositionRecord]] | None,
    fitted: dict | None,
    controllers: dict,
    block: int = 0,
) -> Path:
    """Write the mirror scenario (and its data files) into ``folder``; return its path. A
    block drafter's engine (``block`` = its B > 0) is mirrored by ``draft.kind = "block"``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_requests_trace(folder / "requests_trace.csv", prompt_tokens, new_tokens)
    acc: dict = {"max_run_tokens": k_max + 1}
    if positions is not None:
        write_positions_sim(folder / "positions_sim.csv", positions)
        acc.update(model="replay", replay_path="positions_sim.csv", replay_lengths=True)
    else:
        acc.update(fitted or {})
    data = {
        "name": name,
        "deployment": {
            "replicas": 1,
            "tp": 1,
            "max_batch": 1,
            "max_draft_tokens": k_max,
            "draft_within_length": True,
            **engine_deployment(),
        },
        "workload": {"arrival": "trace", "trace_path": "requests_trace.csv", "trace_lengths": True},
        "acceptance": acc,
        "latency": {
            "backend": "table",
            "table_path": str(Path(latency_csv).resolve()),
            "target_name": "target",
            "drafter_name": "drafter",
            "round_overhead_s": float(round_overhead_s),
        },
        "sim": {"controllers": list(controllers)},
        "controller": controllers,
        **draft_section(block),
    }
    path = folder / "scenario.toml"
    write_toml(data, path)
    return path


def draft_section(block: int) -> dict:
    """The scenario's ``[draft]`` section mirroring the engine's drafter: a block drafter of
    block size ``block``, or none (autoregressive) for 0."""
    return {"draft": {"kind": "block", "block_size": int(block)}} if block else {}


def write_serving_scenario(
    folder: Path,
    name: str,
    latency_csv: Path,
    k_max: int,
    slots: int,
    arrival_s: list[float],
    prompt_tokens: list[int],
    new_tokens: list[int],
    positions: list[list[PositionRecord]],
    controllers: dict,
) -> Path:
    """The mirror of a ``real.serve`` replay: one replica of ``max_batch = slots``, the replay's
    own arrivals and lengths (a trace), acceptance replayed from each request's greedy position
    trace, the table backend with the per-batch round overhead already in its target verify
    rows (``round_overhead_s = 0``). Same prompt / first-token mapping as :func:`write_scenario`
    (the simulator's prefill of P - 1 tokens emits the engine's last prompt token; its first
    round is the engine's first round)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_requests_trace(folder / "requests_trace.csv", prompt_tokens, new_tokens, arrival_s)
    write_positions_sim(folder / "positions_sim.csv", positions)
    data = {
        "name": name,
        "deployment": {
            "replicas": 1,
            "tp": 1,
            "max_batch": int(slots),
            "max_draft_tokens": int(k_max),
            "draft_within_length": True,
            **engine_deployment(),
        },
        "workload": {
            "arrival": "trace",
            "trace_path": "requests_trace.csv",
            "trace_lengths": True,
            "num_requests": len(arrival_s),
        },
        "acceptance": {
            "max_run_tokens": k_max + 1,
            "model": "replay",
            "replay_path": "positions_sim.csv",
            "replay_lengths": True,
        },
        "latency": {
            "backend": "table",
            "table_path": str(Path(latency_csv).resolve()),
            "target_name": "target",
            "drafter_name": "drafter",
            "round_overhead_s": 0.0,
        },
        "sim": {"controllers": list(controllers)},
        "controller": controllers,
        **draft_section(table_block_size(latency_csv)),
    }
    path = folder / "scenario.toml"
    write_toml(data, path)
    return path


def sim_serving_metrics(res) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The batched part's metrics of a mirrored serving run (``trace=True``) and its
    per-request times. Mapped back to the engine: the simulator's first token (end of its
    prefill) is the engine's admission, the end of the request's first round its first token,
    its output one token longer."""
    from validate.metrics import serving

    req = res.requests.sort_values("request_id")
    rd = res.rounds
    first_round = rd.groupby("request_id")["now_s"].min()
    ids = req["request_id"].to_numpy()
    first = first_round.reindex(ids).to_numpy(dtype=float)
    times = {
        "request_id": ids,
        "arrival_s": req["arrival_s"].to_numpy(dtype=float),
        "admitted_s": req["first_token_s"].to_numpy(dtype=float),
        "first_token_s": first,
        "finish_s": req["finish_s"].to_numpy(dtype=float),
        "tokens": req["output_tokens"].to_numpy(dtype=float) - 1,
    }
    m = serving(
        times["arrival_s"],
        times["admitted_s"],
        first,
        times["finish_s"],
        times["tokens"],
        int(rd["accepted"].sum()),
        len(rd),
    )
    return m, times


def sim_metrics(res) -> dict[str, float]:
    """The compared metrics of a ``SimResult`` of a mirror scenario (needs ``trace=True``)."""
    req = res.requests.sort_values("finish_s")
    finish = req["finish_s"].to_numpy(dtype=float)
    start = np.concatenate([[0.0], finish[:-1]])
    tokens = req["output_tokens"].to_numpy(dtype=float) - 1  # minus the mapped prompt token
    decode = finish - req["first_token_s"].to_numpy(dtype=float)
    rd = res.rounds
    return compute(
        rd["accepted"].to_numpy(), rd["drafted"].to_numpy(), tokens, finish - start, decode
    )


def decision_cpu_s(name: str, config, records, k_max: int) -> float:
    """Seconds of CPU one batch-1 round of controller ``name`` (with ``config``) costs on this
    machine: its round planner's ``plan`` and ``observe_round`` and its own ``observe``, replayed
    over ``records`` (``RoundRecord``s of a calibration run, in the order they ran; a fresh
    controller per request, one planner for all, as the engine keeps them). The engine runs them between
    its forward passes; a profile's round overhead, measured with fixed k, holds only fixed k's."""
    spent = _replay_cpu(name, config, [[r] for r in records], k_max)
    n = sum(len(v) for v in spent.values())
    return sum(sum(v) for v in spent.values()) / max(n, 1)


def decision_cpu_by_batch(name: str, config, records, k_max: int) -> dict[int, float]:
    """:func:`decision_cpu_s` for a served run's ``records`` (``real.serve``: the rows of one
    batched round share its end time ``now_s``): mean seconds per round by batch size, every
    round replayed as the engine ran it (one ``plan`` for the batch, each row's ``observe``)."""
    rounds: dict[float, list] = {}
    for r in records:
        rounds.setdefault(r.now_s, []).append(r)
    spent = _replay_cpu(name, config, [rounds[t] for t in sorted(rounds)], k_max)
    return {b: float(np.mean(v)) for b, v in sorted(spent.items())}


def _replay_cpu(name: str, config, rounds: list[list], k_max: int) -> dict[int, list[float]]:
    """Seconds of CPU of each round (rows of ``RoundRecord``s, in time order), by batch size; a
    request's controller is made at its first row (a request's round 0)."""
    import time

    from control.batch import BatchContext, RoundStats, plan_round
    from control.registry import make_controller, make_planner

    planner = make_planner(name, config)
    ctrls: dict[int, object] = {}
    spent: dict[int, list[float]] = {}
    for rows in rounds:
        for r in rows:
            if r.round == 0 or r.request_id not in ctrls:
                ctrls[r.request_id] = make_controller(name, config)
        members = [ctrls[r.request_id] for r in rows]
        ctx = sum(r.context_tokens for r in rows)
        stats = RoundStats.of_rows(rows)
        t0 = time.perf_counter()
        plan_round(planner, members, rows[0].now_s, BatchContext(len(rows), ctx, k_max))
        for c, r in zip(members, rows):
            c.observe(r.observation())
        if planner is not None:
            planner.observe_round(stats)
        spent.setdefault(len(rows), []).append(time.perf_counter() - t0)
    return spent


def predict(
    scenario_path: Path, controller: str, config, seeds=(0,), extra_overhead_s: float = 0.0
) -> tuple[dict, object]:
    """Mean metrics over ``seeds`` (replay is deterministic: one seed), first run's result;
    ``extra_overhead_s`` is added to the scenario's round overhead (a controller's own CPU per
    round beyond the profile's, :func:`decision_cpu_s`)."""
    from sim import load_scenario, simulate

    scn = load_scenario(scenario_path)
    if extra_overhead_s > 0.0:
        base = scn.latency.round_overhead_s
        scn = scn.with_overrides({"latency.round_overhead_s": base + extra_overhead_s})
    ms, first = [], None
    for s in seeds:
        res = simulate(scn, controller, config, seed=int(s), trace=True, baseline=False)
        ms.append(sim_metrics(res))
        first = first if first is not None else res
    out = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
    return out, first
