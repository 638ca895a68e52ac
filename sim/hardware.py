"""GPU presets (datasheet, dense) and the resolved numbers the latency model uses.

``bandwidth_gbps`` and ``nvlink_gbps`` are GB/s (10^9 bytes per second), ``peak_tflops`` dense
bf16/fp16 TFLOP/s, ``fp8_tflops`` dense fp8 (equal to bf16 on GPUs without fp8 tensor cores).
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
    # NVLink all-reduce latency ~10-30 us.
    allreduce_latency_s: float = param(2e-5, lo=0.0, hi=1e-2, doc="latency per all-reduce, s")

    def resolved(self) -> Hardware:
        bw, tf, tf8, nv, mem = HARDWARE_PRESETS[self.preset]
        return Hardware(
            name=self.preset,
            bandwidth_bytes_s=(self.bandwidth_gbps or bw) * 1e9,
            peak_flops={"bf16": (self.peak_tflops or tf) * 1e12,
                        "fp16": (self.peak_tflops or tf) * 1e12,
                        "fp8": (self.fp8_tflops or tf8) * 1e12},
            nvlink_bytes_s=(self.nvlink_gbps or nv) * 1e9,
            mem_bytes=(self.mem_gb or mem) * 1e9,
            bw_efficiency=self.bw_efficiency,
            compute_efficiency=self.compute_efficiency,
            launch_overhead_s=self.launch_overhead_s,
            allreduce_latency_s=self.allreduce_latency_s,
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


def hardware_preset(name: str) -> Hardware:
    if name not in HARDWARE_PRESETS:
        raise ConfigError(f"unknown hardware preset '{name}'; allowed: {', '.join(HARDWARE_PRESETS)}")
    return HardwareConfig(preset=name).resolved()
