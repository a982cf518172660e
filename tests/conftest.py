import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "config" / "schemas"


@pytest.fixture
def trade_schema():
    from disd.schema import load_schema

    return load_schema(SCHEMAS / "Market.Trade.yaml")


@pytest.fixture
def all_types_schema():
    from disd.schema import TableSchema

    return TableSchema.from_dict(
        {
            "namespace": "Test",
            "table": "AllTypes",
            "columns": [
                {"name": n, "type": n.lower()}
                for n in ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "Char", "String", "Timestamp"]
            ]
            + [{"name": "Other", "type": "string"}],
        }
    )


@pytest.fixture(scope="session")
def python_exe():
    return sys.executable
