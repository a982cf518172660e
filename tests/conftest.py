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
