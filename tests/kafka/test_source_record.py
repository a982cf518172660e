"""The checkpoint's source record of a Kafka location, and that a tailed location's record is
written and read exactly as before (docs/storage-format.md)."""

from __future__ import annotations

import json

import pytest

from disd.storage.checkpoint import CheckpointError, CheckpointRecord, SourcePosition

TAILED = SourcePosition("Market.Trade.System.ip.2026-11-22.bin.2026-11-22.090000.000+0000", 40123, 2)


def body(rec: CheckpointRecord) -> dict:
    return json.loads(rec.to_bytes().split(b"\n")[1])


def test_a_tailed_record_has_no_kafka_keys_and_reads_back_equal():
    rec = CheckpointRecord(3, {"Size.dat": 12}, TAILED, "fp", time=1.0)
    assert body(rec)["source"] == {"file": TAILED.file_name, "offset": 40123, "skip_rows": 2}
    back = CheckpointRecord.from_bytes(rec.to_bytes())
    assert back == rec and back.source.topic is None and back.source.partition is None


def test_a_kafka_record_names_topic_partition_and_next_offset():
    src = SourcePosition(None, 1000, 0, "md.trades", 2)
    rec = CheckpointRecord(500, {"Size.dat": 2000}, src, "fp", time=1.0)
    assert body(rec)["source"] == {"file": None, "offset": 1000, "skip_rows": 0, "topic": "md.trades", "partition": 2}
    assert CheckpointRecord.from_bytes(rec.to_bytes()).source == src


def test_a_negative_partition_is_refused():
    data = CheckpointRecord(0, {}, SourcePosition(None, 0, 0, "t", 0), "fp", time=1.0).body()
    data["source"]["partition"] = -1
    from disd.storage.checkpoint import RECORD

    with pytest.raises(CheckpointError, match="negative"):
        CheckpointRecord.from_bytes(RECORD.encode(data))
