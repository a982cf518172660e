"""The last-by Spark tests use the run's one local Spark session (tests/spark/conftest.py)."""

from __future__ import annotations

from spark.conftest import spark_session  # noqa: F401 - the shared local session
