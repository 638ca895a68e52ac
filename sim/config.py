"""The scenario: one frozen dataclass tree loaded from a TOML file (``load_scenario``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control.configio import from_mapping, param, read_toml, to_dict
from control.errors import ConfigError
from sim.acceptance import AcceptanceConfig
from sim.block import BLOCK_HEAD_CONCENTRATION, DraftConfig
from sim.hardware import HardwareConfig
from sim.latency import LatencyConfig
from sim.models import ModelConfig
from sim.paths import resolve_path
from sim.workload import WorkloadConfig


@dataclass(frozen=True)
class DeploymentConfig:
    # one replica unless the scenario says otherwise.
    replicas: int = param(1, lo=1, hi=100_000, doc="model replicas (each serves its own batch)")
    # one GPU per replica unless the scenario says otherwise.
    tp: int = param(1, lo=1, hi=1024, doc="tensor-parallel degree of the target")
    # sharing the target's GPUs is the common deployment.
    drafter_placement: str = param(
        "colocated",
        choices=("colocated", "separate"),
        doc="drafter on the target's GPUs or on its own",
    )
    # None = the target's tp (colocated) or 1 (separate).
    drafter_tp: int | None = param(None, lo=1, hi=1024, doc="drafter tensor-parallel degree")
    # spreads load evenly without state. least-outstanding: the replica with the fewest
    # requests in it; least-pending-tokens: the fewest prompt tokens waiting to be prefilled
    # (then the fewest requests), which splits bursts of long prompts by their work.
    routing: str = param(
        "round-robin",
        choices=("round-robin", "least-outstanding", "least-pending-tokens"),
        doc="how arrivals are assigned to replicas",
    )
    # vLLM's default max_num_seqs is 256.
    max_batch: int = param(256, lo=1, hi=100_000, doc="max running sequences per replica")
    # vLLM's default gpu_memory_utilization.
    kv_memory_fraction: float = param(
        0.9, lo=0.05, hi=1.0, doc="fraction of GPU memory usable for weights + KV cache"
    )
    # 1024: no cap beyond the controllers' own; a real engine's static cache caps k (k_max).
    max_draft_tokens: int = param(1024, lo=0, hi=1 << 20, doc="engine cap on a round's k")
    # off: a server does not know where a request will end; on mirrors an engine that stops at
    # max_new_tokens and never drafts past it (k <= remaining - 1).
    draft_within_length: bool = param(False, doc="cut k to the request's remaining tokens - 1")
    # vLLM / Sarathi-Serve: prompt chunks share each forward with the decode/verify rows under
    # a token budget; 'prefill-first' is the older policy (one pass prefills every admitted
    # prompt whole while the running decodes wait).
    scheduler: str = param(
        "chunked", choices=("chunked", "prefill-first"), doc="how prefills are scheduled"
    )
    # vLLM V1's default budget on GPUs under 70 GiB (and Sarathi-Serve's usual 2k chunk): a
    # 70B TP8 mixed pass of ~2k tokens stalls the decodes ~50 ms, not a whole long prompt.
    max_num_batched_tokens: int = param(
        2048, lo=1, hi=1 << 24, doc="token budget of one forward (chunked scheduler)"
    )
    # 0 = up to the budget; vLLM's long_prefill_token_threshold.
    prefill_chunk_tokens: int = param(
        0, lo=0, hi=1 << 24, doc="largest prompt chunk of one request per forward"
    )
    # arrival order, as vLLM's default scheduler; 'shortest-first' serves the prompt with the
    # fewest prefill tokens left first (admission and the budget's partial prefills): the
    # shortest-remaining-work rule that cuts median TTFT when bursts of long and short prompts
    # queue together, at the price of the longest prompts' TTFT (they wait while shorter ones come).
    prefill_order: str = param(
        "fcfs", choices=("fcfs", "shortest-first"), doc="which prompt is prefilled first"
    )
    # off: the round planner learns its costs from rounds alone; on mirrors the real engine,
    # which times itself at start-up and hands its planner that profile as a prior
    # (real.profile.startup_cost_rows): here the same grid read from the latency model.
    seed_planner_costs: bool = param(
        False, doc="give the round planner a start-up cost profile as its prior"
    )
    # vLLM's PagedAttention: blocks as tokens are produced, preemption by recompute;
    # 'reserve' holds prompt + full output from admission (knows the output length).
    kv_allocation: str = param(
        "paged", choices=("paged", "reserve"), doc="how KV memory is allocated"
    )
    # vLLM's default block size.
    kv_block_tokens: int = param(16, lo=1, hi=1 << 20, doc="tokens per KV block (paged)")
    # on: vLLM V1 and SGLang cache prompt prefixes by default; it acts only on traces with
    # hash_ids (JSONL) under paged KV, so other workloads are unchanged.
    prefix_caching: bool = param(
        True, doc="reuse resident KV blocks of equal prompt hashes (JSONL hash_ids, paged KV)"
    )


@dataclass(frozen=True)
class SloConfig:
    # interactive chat: first token within 2 s.
    ttft_s: float = param(2.0, lo=1e-6, doc="time-to-first-token SLO, s (> 0)")
    # ~20 tokens/s reading speed.
    tpot_s: float = param(0.05, lo=1e-6, doc="time-per-output-token SLO, s (> 0)")


@dataclass(frozen=True)
class SimSection:
    # None = run until every request finished.
    horizon_s: float | None = param(None, lo=0.0, doc="stop the simulation at this time")
    # no warm-up exclusion by default.
    warmup_s: float = param(0.0, lo=0.0, doc="requests arriving earlier are not measured")
    # the controller `dspark simulate` runs when none is named.
    controllers: tuple[str, ...] = param(("fixed", "dspark"), doc="controllers to compare")


@dataclass(frozen=True)
class SimConfig:
    # a name for reports.
    name: str = param("scenario", doc="scenario name")
    hardware: HardwareConfig = param(default_factory=HardwareConfig)
    # a default deployment that fits one GPU: Llama-3.1-8B with a Llama-3.2-1B drafter.
    target: ModelConfig = param(default_factory=lambda: ModelConfig(preset="Llama-3.1-8B"))
    drafter: ModelConfig = param(default_factory=lambda: ModelConfig(preset="Llama-3.2-1B"))
    # an autoregressive drafter (one token per forward) unless the scenario says 'block'.
    draft: DraftConfig = param(default_factory=DraftConfig)
    deployment: DeploymentConfig = param(default_factory=DeploymentConfig)
    workload: WorkloadConfig = param(default_factory=WorkloadConfig)
    acceptance: AcceptanceConfig = param(default_factory=AcceptanceConfig)
    latency: LatencyConfig = param(default_factory=LatencyConfig)
    slo: SloConfig = param(default_factory=SloConfig)
    sim: SimSection = param(default_factory=SimSection)
    # [controller.<name>] tables: controller configs by name.
    controller: dict = param(default_factory=dict, doc="controller configs by name")
    # folder the scenario was loaded from (relative paths resolve against it).
    base_dir: str = param("", doc="set by load_scenario")

    def with_overrides(self, overrides: dict[str, Any]) -> SimConfig:
        """A copy with dotted-key overrides, e.g. ``{"workload.rate_rps": 3.0}``; checked."""
        data = merge_overrides(to_dict(self), overrides)
        cfg = from_mapping(SimConfig, data, source="<overrides>")
        try:
            return _finish(cfg)
        except ConfigError as e:
            raise ConfigError(f"<overrides>: {e}") from None

    def controller_config(self, name: str) -> dict | None:
        c = self.controller.get(name)
        return dict(c) if c is not None else None


def _resolve(cfg: SimConfig, base: Path) -> SimConfig:
    w, a, lat = cfg.workload, cfg.acceptance, cfg.latency
    if a.model == "curve" and not a.position_rates and cfg.draft.curve():
        a = dataclasses.replace(a, position_rates=cfg.draft.curve())
    if a.head_concentration is None:  # the drafter's: a block drafter has a confidence head
        kappa = BLOCK_HEAD_CONCENTRATION if cfg.draft.kind == "block" else 0.0
        a = dataclasses.replace(a, head_concentration=kappa)
    if w.arrival == "trace" or (w.prompt.path or w.output.path):
        if w.arrival == "trace":
            w = dataclasses.replace(
                w, trace_path=resolve_path(w.trace_path, base, "workload.trace_path")
            )
        for side in ("prompt", "output"):
            lc = getattr(w, side)
            if lc.path:
                w = dataclasses.replace(
                    w,
                    **{
                        side: dataclasses.replace(
                            lc, path=resolve_path(lc.path, base, f"workload.{side}.path")
                        )
                    },
                )
    if a.model == "replay":
        if not a.replay_path:
            raise ConfigError("acceptance.model = 'replay' needs acceptance.replay_path")
        a = dataclasses.replace(
            a, replay_path=resolve_path(a.replay_path, base, "acceptance.replay_path")
        )
    if lat.backend == "table":
        if not lat.table_path:
            raise ConfigError("latency.backend = 'table' needs latency.table_path")
        lat = dataclasses.replace(
            lat, table_path=resolve_path(lat.table_path, base, "latency.table_path")
        )
    return dataclasses.replace(cfg, workload=w, acceptance=a, latency=lat, base_dir=str(base))


def _check(cfg: SimConfig) -> SimConfig:
    """Cross-field checks no single field can make (errors name the dotted key)."""
    from control.registry import controller_names, make_config

    s, names = cfg.sim, controller_names()
    cfg.draft.check()
    if cfg.acceptance.model == "curve" and not (cfg.acceptance.position_rates or cfg.draft.curve()):
        raise ConfigError(
            "acceptance.model = 'curve' needs acceptance.position_rates "
            "(or a draft.preset whose curve fills it)"
        )
    if s.horizon_s is not None and not (0 < s.horizon_s < math.inf):
        raise ConfigError(
            f"sim.horizon_s = {s.horizon_s!r} is out of range; allowed a finite number > 0 "
            "(leave it out to run until every request finished)"
        )
    if s.horizon_s is not None and s.warmup_s >= s.horizon_s:
        raise ConfigError(
            f"sim.warmup_s = {s.warmup_s!r} is not before the end of the run "
            f"(sim.horizon_s = {s.horizon_s!r}); allowed < sim.horizon_s"
        )
    if not s.controllers:
        raise ConfigError(
            "sim.controllers = []: name at least one controller; allowed: " + ", ".join(names)
        )
    for i, c in enumerate(s.controllers):
        if c not in names:
            raise ConfigError(
                f"sim.controllers[{i}] = {c!r} is unknown; allowed: " + ", ".join(names)
            )
    # every [controller.X] table, used or not: a misspelled name or key ends the run
    for name, table in cfg.controller.items():
        if not isinstance(table, dict):
            raise ConfigError(f"controller.{name}: expected a table [controller.{name}]")
        if name not in names:
            raise ConfigError(
                f"[controller.{name}] names no controller; allowed: " + ", ".join(names)
            )
        try:
            make_config(name, table, source="")
        except ConfigError as e:
            raise ConfigError(str(e).removeprefix(": ")) from None
    return cfg


def _finish(cfg: SimConfig) -> SimConfig:
    return _resolve(_check(cfg), Path(cfg.base_dir) if cfg.base_dir else Path.cwd())


#: dotted keys whose values are data paths (resolved against the scenario file's folder)
PATH_KEYS = (
    "workload.trace_path",
    "workload.prompt.path",
    "workload.output.path",
    "acceptance.replay_path",
    "latency.table_path",
)


def merge_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """``data`` with dotted-key overrides written in (``{"workload.rate_rps": 3.0}``)."""
    for key, value in overrides.items():
        parts = key.split(".")
        d = data
        for p in parts[:-1]:
            if not isinstance(d.get(p, {}), dict):
                raise ConfigError(f"override '{key}': '{p}' is not a table")
            d = d.setdefault(p, {})
        d[parts[-1]] = value
    return data


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Load a scenario TOML; relative data paths resolve against the file's folder.

    ``overrides`` (dotted keys, ``dspark simulate --set``) are written in before anything is
    checked or resolved, so an override can fix a path or value the file gets wrong; a relative
    path given as an override resolves against the current folder, where it was typed."""
    p = Path(path)
    data = read_toml(p)
    data.setdefault("name", p.stem)
    data["base_dir"] = str(p.resolve().parent)
    if overrides:
        data = merge_overrides(
            data,
            {
                k: str(Path(v).resolve()) if k in PATH_KEYS and isinstance(v, str) and v else v
                for k, v in overrides.items()
            },
        )
    try:
        cfg = from_mapping(SimConfig, data, source=str(p))
        cfg = _resolve(_check(cfg), Path(cfg.base_dir))
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
    return cfg
