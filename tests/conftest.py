import os
import sys

import pytest

from support import ALL_TYPES, TRADE, running_dis


@pytest.fixture
def trade_schema():
    return TRADE


@pytest.fixture
def all_types_schema():
    return ALL_TYPES


@pytest.fixture
def dis(tmp_path):
    """A DIS in this process over an empty database (``tmp_path / "db"``), on ports the kernel
    chose (``dis.port``, ``dis.metrics_port``)."""
    with running_dis(tmp_path / "db") as srv:
        yield srv


@pytest.fixture(scope="session")
def python_exe():
    return sys.executable


def pytest_collection_modifyitems(config, items):
    """Tests marked ``breaks`` prove that a check catches a product broken on purpose (the
    real-fault power cuts, partitions and starvation against a DIS broken on purpose).  Each costs
    minutes that CI's budget does not have, so they are not collected unless
    ``DIS_REALFAULTS_BREAKS=1`` asks for them (deselected, not skipped: nothing is missing)."""
    if os.environ.get("DIS_REALFAULTS_BREAKS"):
        return
    keep = [i for i in items if i.get_closest_marker("breaks") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("breaks") is not None])
        items[:] = keep
