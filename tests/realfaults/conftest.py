"""Every test here is marked ``realfaults`` (``pytest -m realfaults`` runs them alone)."""

import pytest


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    for item in items:
        if "/realfaults/" in str(item.fspath):
            item.add_marker(pytest.mark.realfaults)
