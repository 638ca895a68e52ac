"""sim: a SimPy discrete-event simulator of speculative decoding on GPU clusters.

``from sim import load_scenario, simulate, compare, compare_runs, SimConfig, SimResult``
"""

from sim.api import SimResult, simulate
from sim.compare import Comparison, compare, compare_runs
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
