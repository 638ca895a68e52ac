"""Microbenchmark: µs per decide()+observe() pair of each controller (the simulator's hot path).

Run: ``.venv/bin/python examples/bench_controllers.py [names...]``. Observations are built once
(the driver's cost is not counted); k = 6, accepted cycles 0..6, a sentence end every 9th round.
"""

from __future__ import annotations

import sys
import time

from control import Observation, controller_names, make_controller


def bench(name: str, pairs: int = 200_000) -> float:
    obs = [
        Observation(
            now_s=0.01 * i,
            drafted=6,
            accepted=min(6, (i * 5) % 8),
            draft_s=0.002,
            verify_s=0.02,
            sentence_ends=(i % 5,) if i % 9 == 0 else (),
        )
        for i in range(1000)
    ]
    c = make_controller(name)
    if c.needs_future:
        c.set_future(3)
    t = time.perf_counter()
    for _ in range(pairs // 1000):
        for o in obs:
            c.decide(0.0)
            c.observe(o)
    return (time.perf_counter() - t) / pairs * 1e6


if __name__ == "__main__":
    for name in sys.argv[1:] or controller_names():
        print(f"{name:16s} {bench(name):6.2f} us per decide+observe")
