"""The end-to-end tests of schema versions use the run's one local Spark session
(tests/spark/conftest.py), with the JVM reader on its classpath."""

from __future__ import annotations

import pytest

from spark.conftest import spark_session  # noqa: F401 - the shared local session


@pytest.fixture
def jvm_spark(spark_session):  # noqa: F811
    from disd.spark import jvm

    assert jvm.jvm_source_loaded(spark_session), "the JVM reader is not on the session's classpath: run `make jar`"
    return spark_session
