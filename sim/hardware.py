"""GPU presets (datasheet, dense) and the resolved numbers the latency model uses.

``bandwidth_gbps`` and ``nvlink_gbps`` are GB/s (10^9 bytes per second), ``peak_tflops`` dense
bf16/fp16 TFLOP/s, ``fp8_tflops`` dense fp8 (equal to bf16 on GPUs without fp8 tensor cores).

Where each default comes from:

- bandwidth, TFLOP/s, NVLink, memory: the vendors' datasheets (SXM parts).
- ``bw_efficiency`` 0.8, ``compute_efficiency`` 0.65: the usual achievable fractions (decode
  GEMVs, large GEMMs); a fit with them free improves the profiled table below only marginally
  (RMS 6.4% -> 5.8%), so they keep these round values.
- ``allreduce_latency_s`` (per preset), ``nvlink_efficiency``, ``weight_read_growth``: fitted
  (least squares on log time) to Vidur's profiled non-attention step times of Llama-2-70B at
  TP4/TP8 on A100 and H100 DGX nodes (``../shared/data/vidur-70b/``; Agrawal et al., "Vidur",
  MLSys 2024, MIT). ``benchmarks/calibrate_vidur.py`` redoes the fit and prints every cell;
  ``tests/sim/test_calibration.py`` holds every cell within 15% (fit: RMS 6.4%, worst 11.6%,
  A100 TP4 batch 32, where the profiled all-reduce itself is anomalous). The fitted latency
  is per all-reduce *as seen by a layer*: it absorbs the layer's small non-GEMM kernels (norms,
  RoPE, residual adds), which TP4/TP8 data cannot tell apart from the collective; H200 shares
  H100's NVLink 4 / NVSwitch and takes its value.
- ``layer_overhead_s`` 0 (see above: folded into the all-reduce latency under TP), and
  ``attention_floor_s`` 0: the shared table excludes attention, so nothing here fits a floor;
  set it (e.g. ~5e-6 s per layer for a FlashAttention decode kernel) to model one.
- ``launch_overhead_s`` 3e-4: a CUDA-graph launched forward's fixed host/launch cost (not in
  the profiled table, which has no CPU or scheduling overhead).
"""

from __future__ import annotations

from dataclasses import dataclass

from control.configio import param
from control.errors import ConfigError

# name: (HBM GB/s, bf16 TFLOP/s, fp8 TFLOP/s, NVLink GB/s per GPU, memory GB)
HARDWARE_PRESETS: dict[str, tuple[float, float, float, float, float]] = {
    "A100-SXM-80GB": (2039.0, 312.0, 312.0, 600.0, 80.0),
    "H100-SXM": (3350.0, 989.0, 1979.0, 900.0, 80.0),
    "H200-SXM": (4800.0, 989.0, 1979.0, 900.0, 141.0),
}
# Fitted to ../shared/data/vidur-70b/ (benchmarks/calibrate_vidur.py): latency per all-reduce,
# seconds (A100 NVLink 3: 86 us; H100 NVLink 4: 63 us; H200: H100's interconnect).
ALLREDUCE_LATENCY_S: dict[str, float] = {
    "A100-SXM-80GB": 8.6e-5,
    "H100-SXM": 6.3e-5,
    "H200-SXM": 6.3e-5,
}
#: fitted: ring all-reduce traffic moves at this fraction of the datasheet NVLink bandwidth.
NVLINK_EFFICIENCY = 0.28
#: fitted: weight reads of a forward of 64+ tokens take this much longer than of 1 token (the
#: profiled decode step grows ~+9-17% from batch 1 to 64), linear in between.
WEIGHT_READ_GROWTH = 0.13
#: tokens at which the weight-read growth saturates.
WEIGHT_READ_GROWTH_TOKENS = 64


@dataclass(frozen=True)
class HardwareConfig:
    # the standard scenario's GPU.
    preset: str = param("H100-SXM", choices=tuple(HARDWARE_PRESETS), doc="GPU preset")
    # None = the preset's datasheet value.
    bandwidth_gbps: float | None = param(None, lo=1.0, hi=1e5, doc="HBM bandwidth, GB/s")
    # None = the preset's datasheet value.
    peak_tflops: float | None = param(None, lo=0.1, hi=1e5, doc="dense bf16/fp16 TFLOP/s")
    # None = the preset's datasheet value.
    fp8_tflops: float | None = param(None, lo=0.1, hi=1e5, doc="dense fp8 TFLOP/s")
    # None = the preset's datasheet value.
    mem_gb: float | None = param(None, lo=1.0, hi=1e4, doc="GPU memory, GB")
    # None = the preset's datasheet value.
    nvlink_gbps: float | None = param(None, lo=1.0, hi=1e5, doc="NVLink bandwidth per GPU, GB/s")
    # decode kernels reach ~80% of HBM bandwidth in practice.
    bw_efficiency: float = param(0.8, lo=0.05, hi=1.0, doc="achievable fraction of bandwidth")
    # large GEMMs reach ~60-70% of dense peak.
    compute_efficiency: float = param(0.65, lo=0.05, hi=1.0, doc="achievable fraction of peak")
    # CUDA-graph launched forward: a few hundred microseconds of fixed cost.
    launch_overhead_s: float = param(3e-4, lo=0.0, hi=1.0, doc="fixed cost per forward pass, s")
    # None = the preset's value fitted to profiled Llama-2-70B TP4/TP8 steps (63-86 us).
    allreduce_latency_s: float | None = param(
        None, lo=0.0, hi=1e-2, doc="latency per all-reduce, s"
    )
    # fitted to the profiled prefill steps (ring all-reduce of mid-size messages).
    nvlink_efficiency: float = param(
        NVLINK_EFFICIENCY,
        lo=0.01,
        hi=1.0,
        doc="achievable fraction of NVLink bandwidth in all-reduce",
    )
    # under TP it is folded into allreduce_latency_s (the fit cannot tell them apart).
    layer_overhead_s: float = param(
        0.0, lo=0.0, hi=1e-2, doc="fixed cost per layer per forward (small kernels), s"
    )
    # fitted: profiled decode steps grow ~9-17% from batch 1 to 64 at equal weights.
    weight_read_growth: float = param(
        WEIGHT_READ_GROWTH, lo=0.0, hi=10.0, doc="extra weight-read time at 64+ tokens per forward"
    )
    # no attention in the profiled table: no floor unless set.
    attention_floor_s: float = param(
        0.0, lo=0.0, hi=1e-2, doc="least time of one layer's attention kernel, s"
    )
    # None: the preset's fitted all-reduce latency and datasheet NVLink. A path: the
    # collectives.csv of `dspark real profile --tp N` (sim.collectives.fit_allreduce) gives
    # the all-reduce latency (unless allreduce_latency_s is set) and the achieved bandwidth.
    collectives_path: str | None = param(
        None, doc="measured collectives.csv: all-reduce latency and bandwidth"
    )

    def resolved(self) -> Hardware:
        bw, tf, tf8, nv, mem = HARDWARE_PRESETS[self.preset]
        lat, nv_eff = ALLREDUCE_LATENCY_S[self.preset], self.nvlink_efficiency
        nv_bytes_s = (self.nvlink_gbps or nv) * 1e9
        if self.collectives_path is not None:  # measured: achieved bandwidth, efficiency 1
            from sim.collectives import fit_allreduce

            lat, nv_bytes_s = fit_allreduce(self.collectives_path)
            nv_eff = 1.0
        return Hardware(
            name=self.preset,
            bandwidth_bytes_s=(self.bandwidth_gbps or bw) * 1e9,
            peak_flops={
                "bf16": (self.peak_tflops or tf) * 1e12,
                "fp16": (self.peak_tflops or tf) * 1e12,
                "fp8": (self.fp8_tflops or tf8) * 1e12,
            },
            nvlink_bytes_s=nv_bytes_s,
            mem_bytes=(self.mem_gb or mem) * 1e9,
            bw_efficiency=self.bw_efficiency,
            compute_efficiency=self.compute_efficiency,
            launch_overhead_s=self.launch_overhead_s,
            allreduce_latency_s=(
                self.allreduce_latency_s if self.allreduce_latency_s is not None else lat
            ),
            nvlink_efficiency=nv_eff,
            layer_overhead_s=self.layer_overhead_s,
            weight_read_growth=self.weight_read_growth,
            attention_floor_s=self.attention_floor_s,
        )


@dataclass(frozen=True)
class Hardware:
    """Resolved numbers, SI units."""

    name: str
    bandwidth_bytes_s: float
    peak_flops: dict
    nvlink_bytes_s: float
    mem_bytes: float
    bw_efficiency: float
    compute_efficiency: float
    launch_overhead_s: float
    allreduce_latency_s: float
    nvlink_efficiency: float = 1.0
    layer_overhead_s: float = 0.0
    weight_read_growth: float = 0.0
    attention_floor_s: float = 0.0


def hardware_preset(name: str) -> Hardware:
    if name not in HARDWARE_PRESETS:
        raise ConfigError(
            f"unknown hardware preset '{name}'; allowed: {', '.join(HARDWARE_PRESETS)}"
        )
    return HardwareConfig(preset=name).resolved()
