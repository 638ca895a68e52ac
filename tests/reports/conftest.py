import matplotlib

matplotlib.use("Agg")

import pytest

from tests.reports.fixtures import write_all


@pytest.fixture(scope="package")
def run_root(tmp_path_factory):
    """The fixed set of synthetic run folders (one of each kind, plus scaling and multi-objective)."""
    root = tmp_path_factory.mktemp("runs")
    write_all(root)
    return root


@pytest.fixture(scope="package")
def built_report(run_root, tmp_path_factory):
    from reports import make_report

    out = tmp_path_factory.mktemp("report")
    return make_report([run_root], out)
