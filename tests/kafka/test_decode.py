"""Decoding a batch of messages to the table's columns (``disd.kafka.decode``), in process:
JSON with every kind of column source, a poison message amid good ones, and binary-log frames."""

from __future__ import annotations

import json

import numpy as np

from disd.binlog import normalize_columns
from disd.binlog.format import encode_frame, encode_rows
from disd.kafka import parse_kafka_config
from disd.kafka.decode import Batch, Decoder
from disd.schema import SchemaRegistry
from support import SCHEMAS

REG = SchemaRegistry.load_dir(str(SCHEMAS))
TRADE = REG.get("Market", "Trade")


def decoder(**source) -> Decoder:
    src = {"topic": "t", "table": "Market.Trade", "column_partition": "2026-11-23"}
    src.update(source)
    return Decoder(parse_kafka_config({"bootstrap_servers": "b:1", "sources": {"s": src}}, "x", REG).sources[0])


def batch(values, offsets=None, **kw) -> Batch:
    n = len(values)
    offsets = np.arange(10, 10 + n) if offsets is None else np.asarray(offsets)
    return Batch(values, offsets.astype(np.int64), kw.pop("ts", np.full(n, 1_795_392_000_123, np.int64)), 4, **kw)


def test_json_with_key_header_timestamp_and_offset():
    d = decoder(columns={"Timestamp": "timestamp", "Sym": "header.sym", "Price": "value.p", "Size": "offset"})
    b = batch([b'{"p": 1.5}', b'{"p": 2, "other": [1]}', b'{}'],
              headers=[[("sym", b"AAPL")], [("x", b"1"), ("sym", b"MSFT")], None])
    out = Decoder.decode(d, b)
    t = dict(zip(TRADE.column_names, out.columns))
    assert t["Sym"].to_pylist() == ["AAPL", "MSFT", None]
    assert t["Price"].to_pylist() == [1.5, 2.0, None]
    assert t["Size"].to_pylist() == [10, 11, 12]
    assert t["Timestamp"].cast("int64").to_pylist() == [1_795_392_000_123_000_000] * 3
    assert out.ok.all() and not out.poison and out.row_offsets.tolist() == [10, 11, 12]


def test_a_poison_message_amid_good_ones_is_named_and_the_rest_kept():
    d = decoder(columns={"Size": "value.n", "Sym": "key"})
    vals = [json.dumps({"n": i}).encode() for i in range(5)]
    vals[2] = b'{"n": 3000000000}'  # does not fit an int
    keys = [b"a", b"b", b"c", b"\xff", b"e"]  # message 3: a key that is not UTF-8
    out = d.decode(batch(vals, keys=keys))
    assert out.ok.tolist() == [True, True, False, False, True]
    assert [i for i, _ in out.poison] == [2, 3]
    assert "Size" in out.poison[0][1] and "UTF-8" in out.poison[1][1]
    assert dict(zip(TRADE.column_names, out.columns))["Size"].to_pylist() == [0, 1, 4]
    assert out.row_offsets.tolist() == [10, 11, 14]


def test_json_line_breaks_and_tombstones():
    d = decoder(columns={"Size": "value.n"})
    out = d.decode(batch([b'{\n"n": 1}', None, b'{"n": 2}']))
    assert out.ok.tolist() == [True, False, True] and "null value" in out.poison[0][1]


def test_binlog_frames_one_or_more_a_message():
    d = decoder(format="binlog")
    rows = {"Timestamp": np.arange(5, dtype=np.int64) + 1_795_392_000_000_000_000, "Sym": list("abcde"),
            "Price": np.arange(5) * 1.0, "Size": np.arange(5, dtype=np.int32)}
    cols = normalize_columns(TRADE, rows)

    def frame(a, b):
        payload, n = encode_rows(TRADE, [c.slice(a, b - a) for c in cols], np.full(b - a, 3, np.uint8))
        return encode_frame(payload, n)

    out = d.decode(batch([frame(0, 2) + frame(2, 3), frame(3, 5), b"garbage"]))
    assert out.ok.tolist() == [True, True, False]
    assert dict(zip(TRADE.column_names, out.columns))["Size"].to_pylist() == [0, 1, 2, 3, 4]
    assert out.row_offsets.tolist() == [10, 10, 10, 11, 11]
