"""sim: a SimPy discrete-event simulator of speculative decoding on GPU clusters.

``from sim import load_scenario, simulate, compare, SimConfig, SimResult``
"""

from sim.api import SimResult, compare, simulate
from sim.config import SimConfig, load_scenario

__all__ = ["SimConfig", "SimResult", "compare", "load_scenario", "simulate"]
