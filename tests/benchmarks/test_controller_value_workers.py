"""``benchmarks/controller_value.py --workers N``: the cells are those of one process."""

import importlib.util
from pathlib import Path

from control.registry import make_config
from sim.config import load_scenario

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "controller_value.py"
_spec = importlib.util.spec_from_file_location("controller_value", _PATH)
cv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cv)


def test_two_workers_give_the_cells_of_one_in_the_same_order(capsys):
    base = load_scenario(Path(cv.ROOT) / "configs" / "tiny.toml")
    small = {**cv.OUTPUT, "workload.output.mean_tokens": 32.0, "workload.output.max_tokens": 64}
    cells = [
        (
            "iid-0.75",
            "B=4",
            {
                **small,
                **cv.REGIMES["iid-0.75"],
                "deployment.max_batch": 4,
                "workload.arrival": "capacity",
                "workload.num_requests": 8,
            },
            "throughput",
        ),
        (
            "beta-0.75",
            "light",
            {**small, **cv.REGIMES["beta-0.75"], "workload.num_requests": 12},
            "tpot",
        ),
    ]
    entries = {
        "fixed:k=0": ("fixed", make_config("fixed", {"k": 0})),
        "fixed:k=3": ("fixed", make_config("fixed", {"k": 3})),
        "dspark-default": ("dspark", make_config("dspark")),
    }
    # 8 requests on seeds 0, 1 fall short of 20: a third seed runs (cell_seeds)
    one = cv.run_cells(base, cells, entries, [0, 1], 20, 1, 0.0)
    two = cv.run_cells(base, cells, entries, [0, 1], 20, 2, 0.0)
    assert one == two
    assert [(r["regime"], r["controller"]) for r in one] == [
        (reg, label) for reg in ("iid-0.75", "beta-0.75") for label in entries
    ]
    assert [len(r["seed_values"].split(";")) for r in one] == [3, 3, 3, 2, 2, 2]
    lines = capsys.readouterr().out.splitlines()  # one line per cell, per run
    assert (
        sorted(x.split()[:2] for x in lines)
        == [["beta-0.75", "light"]] * 2 + [["iid-0.75", "B=4"]] * 2
    )
