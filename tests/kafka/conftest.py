import pytest

from support.kafka_mock import MockCluster


@pytest.fixture
def mock_kafka():
    """librdkafka's mock cluster in its own process, with topic ``trades`` (3 partitions) and
    ``one`` (1 partition)."""
    with MockCluster("trades:3", "one:1") as mc:
        yield mc
