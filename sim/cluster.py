"""A deployment made concrete: latency functions of target and drafter, memory budget, GPU count.

An impossible cluster (weights that do not fit, a TP degree that does not divide the heads) is a
one-line :class:`ConfigError`.
"""

from __future__ import annotations

from control.costmodel import verify_seed_row
from control.errors import ConfigError
from sim.block import BlockForward
from sim.config import SimConfig
from sim.latency import (
    Constant,
    LatencyBackend,
    Roofline,
    Table,
    phase_seconds,
    table_block_size,
    table_models,
)


class Cluster:
    def __init__(self, scn: SimConfig, use_drafter: bool = True) -> None:
        dep, lat = scn.deployment, scn.latency
        hw = scn.hardware.resolved()
        tgt = scn.target.resolved("target")
        dr = scn.drafter.resolved("drafter")
        tp = dep.tp
        colocated = dep.drafter_placement == "colocated"
        dtp = dep.drafter_tp or (tp if colocated else 1)
        self.use_drafter = use_drafter
        self.colocated, self.tp, self.dtp = colocated, tp, dtp
        self.replicas, self.latency_backend = dep.replicas, lat.backend
        for name, m, t in (("target", tgt, tp), ("drafter", dr, dtp)):
            if m.heads % t:
                raise ConfigError(
                    f"impossible cluster: {name} {m.name} has {m.heads} attention "
                    f"heads, not divisible by tensor-parallel degree {t}"
                )
            if m.kv_heads % t and t % m.kv_heads:
                raise ConfigError(
                    f"impossible cluster: {name} {m.name} has {m.kv_heads} KV heads; "
                    f"TP {t} neither divides nor is a multiple of it"
                )
        if colocated and dtp > tp:
            raise ConfigError(
                f"impossible cluster: a colocated drafter (drafter_tp {dtp}) cannot "
                f"use more GPUs than its target replica (tp {tp})"
            )
        usable = hw.mem_bytes * dep.kv_memory_fraction
        w_gpu = tgt.weight_bytes / tp
        if use_drafter and colocated:
            w_gpu += dr.weight_bytes / dtp
        if w_gpu >= usable:
            raise ConfigError(
                f"impossible cluster: weights need {w_gpu / 1e9:.1f} GB per GPU ({tgt.name} "
                f"{tgt.dtype} on TP {tp}"
                + (f" + drafter {dr.name} on TP {dtp}" if use_drafter and colocated else "")
                + f") but only {usable / 1e9:.1f} GB of {hw.mem_bytes / 1e9:.0f} GB "
                f"({hw.name} x kv_memory_fraction {dep.kv_memory_fraction}) is usable"
            )
        if use_drafter and not colocated and dr.weight_bytes / dtp >= usable:
            raise ConfigError(
                f"impossible cluster: drafter {dr.name} needs "
                f"{dr.weight_bytes / dtp / 1e9:.1f} GB per GPU on TP {dtp}, "
                f"{usable / 1e9:.1f} GB usable"
            )
        self.kv_budget_bytes = (usable - w_gpu) * tp
        self.kv_bytes_per_token = tgt.kv_bytes_per_token + (
            dr.kv_bytes_per_token if use_drafter and colocated else 0.0
        )
        self.num_gpus = dep.replicas * (tp + (dtp if use_drafter and not colocated else 0))
        self.hw, self.target_dims, self.drafter_dims = hw, tgt, dr
        self.roof_t = Roofline(tgt, hw, tp)
        self.roof_d = Roofline(dr, hw, dtp)
        self._latency(scn)

    def _latency(self, scn: SimConfig) -> None:
        """The latency backends of target and drafter, and a measured table's draft phase."""
        lat = scn.latency
        self.lat_t: LatencyBackend
        self.lat_d: LatencyBackend
        # a measured table's whole draft phase by (drafting rows, steps, context): the engine's
        # propose call, its fixed cost and a first step unlike the others included (None:
        # a phase is `steps` drafter steps)
        self.phase: Table | None = None
        table_block = 0  # the block size a measured table's drafter was profiled with
        if lat.backend == "roofline":
            self.lat_t, self.lat_d = self.roof_t, self.roof_d
        elif lat.backend == "table":
            if not lat.table_path:
                raise ConfigError("latency.backend = 'table' needs latency.table_path")
            self.lat_t = Table(lat.table_path, lat.target_name)
            self.lat_d = Table(lat.table_path, lat.drafter_name)
            if lat.draft_phase_name in table_models(lat.table_path):
                self.phase = Table(lat.table_path, lat.draft_phase_name)
            table_block = table_block_size(lat.table_path)
        else:
            self.lat_t = Constant(lat.constant_target_s, lat.constant_prefill_s)
            self.lat_d = Constant(lat.constant_drafter_s, 0.0)
        #: a block drafter's B (sim.block), 0 for an autoregressive drafter: its draft phase is
        #: one forward at B tokens per drafting row whatever k <= B. A measured table's
        #: draft-phase rows apply when they timed a block drafter of that B (the profile's
        #: ``block-drafter`` row says so: one forward keeping k slots, at the round's largest
        #: k); those of an autoregressive drafter time k steps, so they do not apply.
        self.block_size = scn.draft.resolved_block_size() if scn.draft.kind == "block" else 0
        if lat.backend == "table":
            self._check_table_kind(lat.table_path, table_block)
        if self.block_size:
            self.lat_d = BlockForward(self.lat_d, self.block_size)
            if lat.backend != "table" or not table_block:
                self.phase = None

    def _check_table_kind(self, path, table_block: int) -> None:
        """One line when the drafter kind or block size of the scenario is not the one whose
        draft phase the table timed."""
        if table_block and not self.block_size:
            raise ConfigError(
                f"{path}: latency table profiled a block drafter (block size {table_block}); "
                f"its draft-phase rows are one block forward, not k steps: set "
                f"draft.kind = 'block' and draft.block_size = {table_block}"
            )
        if table_block and table_block != self.block_size:
            raise ConfigError(
                f"{path}: latency table profiled a block drafter of block size {table_block}, "
                f"the scenario's draft.block_size is {self.block_size}"
            )

    def cost_seed_rows(
        self, max_batch: int, max_draft: int | None, ctxs: tuple[int, ...] = (64, 192)
    ) -> list[tuple[str, int, int, float, float]]:
        """The real engine's start-up cost profile (``real.profile.startup_cost_rows``, the
        same grid: batches 1, 2, 4, .. up to ``max_batch``, two contexts per row, draft
        lengths up to the cap, 16 when none) read off the latency model. A block drafter's
        rows are as the engine writes them: a draft row of k "steps" per draft length k (up to
        the engine's cap, not B), timing one forward keeping min(k, B) slots."""
        k_max = 16 if max_draft is None else max(1, min(max_draft, 64))
        ks = sorted({0, 1, 2, 3, 5, k_max // 2, k_max})
        batches = sorted({1, max_batch} | {2**i for i in range(1, 12) if 2**i < max_batch})
        rows = []
        for B in batches:
            for c in ctxs:
                ctx = float(B * c)
                for k in ks:
                    v = self.lat_t.seconds(B, B * (k + 1), ctx)
                    rows.append(verify_seed_row(B, k + 1, ctx, v))
                    if k and self.use_drafter:
                        rows.append(("draft", B, k, ctx, self.draft_phase_s(B, k, ctx, k)))
        return rows

    def draft_phase_s(self, drafting: int, steps: int, context_sum: float, max_k: int = 0) -> float:
        """A draft phase of ``steps`` drafter steps over ``drafting`` rows (no prompt chunk, no
        catch-up): the table's draft-phase rows where it has them, else ``steps`` steps. A block
        drafter's is one forward whatever ``steps`` (> 0): a block-drafter table's draft-phase
        row at ``min(max_k, B)`` kept slots (``max_k``, the round's largest k; 0: B), else one
        forward at B tokens per row."""
        if self.block_size and steps:
            if self.phase is not None:
                kept = min(max_k, self.block_size) if max_k > 0 else self.block_size
                return self.phase.seconds(drafting, drafting * kept, context_sum)
            steps = 1
        return phase_seconds(self.phase, self.lat_d, drafting, steps, context_sum)

    def provenance(self) -> dict:
        """What a run folder's ``summary.json`` records about the deployment (reports read it):
        GPU, target and drafter (name, parameters), tensor parallelism, GPU count."""
        return {
            "hardware": self.hw.name,
            "target": self.target_dims.name,
            "target_params": self.target_dims.total_params,
            "drafter": self.drafter_dims.name,
            "drafter_params": self.drafter_dims.total_params,
            "tensor_parallel": self.tp,
            "drafter_tensor_parallel": self.dtp,
            "drafter_placement": "colocated" if self.colocated else "separate",
            "replicas": self.replicas,
            "num_gpus": self.num_gpus,
            "latency_backend": self.latency_backend,
        }
