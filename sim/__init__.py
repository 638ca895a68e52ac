"""sim: a SimPy discrete-event simulator of speculative decoding on GPU clusters.

``from sim import load_scenario, simulate, compare, compare_runs, SimConfig, SimResult``
"""

from sim.api import Comparison, SimResult, compare, compare_runs, simulate
from sim.config import SimConfig, load_scenario

__all__ = [
    "Comparison",
    "SimConfig",
    "SimResult",
    "compare",
    "compare_runs",
    "load_scenario",
    "simulate",
]
