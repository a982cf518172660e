"""The compiled reader (``disd.kafka.batchread``, C ``disd.kafka.rdbatch``) against
confluent-kafka's ``consume``, both on real consumers of librdkafka's mock cluster: the same
rows, offsets, poison messages and error events (partition EOF) from the same topic, also from an
assignment at an offset; the client's callbacks (its logger) run during a compiled ``consume``;
and when the check fails, the fetcher falls back to ``consume`` and says so once."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer

from disd.binlog import normalize_columns
from disd.binlog.format import encode_frame, encode_rows

from disd.kafka import batchread
from disd.kafka.decode import Packed
from disd.kafka.fetcher import OFFSET_COLUMN, Fetcher

from .test_kafka_config import parse

DAY_MS = 1_795_392_000_000
PARTS = 3


def produce_mixed(bootstrap: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """``n`` messages over the 3 partitions of ``trades``: JSON rows, with a null value, bad
    JSON, a value holding a line break, a null key, a key that is not UTF-8 among them.
    Returns (partition, key, value) of each, in order."""
    sent = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        key: bytes | None = f"S{i % 5}".encode()
        value: bytes | None = json.dumps({"ts": DAY_MS + i, "size": i}).encode()
        if i == 40:
            value = None
        elif i == 71:
            value = b"{bad"
        elif i == 95:
            value = b'{"ts": %d,\n "size": %d}' % (DAY_MS + i, i)
        elif i == 120:
            key = None
        elif i == 133:
            key = b"\xff\xfe"
        sent.append((i % PARTS, key, value))
        p.produce("trades", value=value, key=key, partition=i % PARTS)
    assert p.flush(30) == 0
    return sent


def produce_frames(bootstrap: str, n: int) -> None:
    """``n`` messages of binary-log frames of Market.Trade (one or two frames a message) over
    the 3 partitions, with an empty value and a torn frame among them."""
    from .test_kafka_config import SCHEMA_REG

    trade = SCHEMA_REG.get("Market", "Trade")
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        rows = {"Timestamp": np.arange(3, dtype=np.int64) + DAY_MS * 1_000_000 + i, "Sym": ["a", "bc", f"s{i}"],
                "Price": np.arange(3) * 1.5 + i, "Size": np.arange(3, dtype=np.int32) + i}
        cols = normalize_columns(trade, rows)
        frames = b""
        for a, b in ((0, 1), (1, 3)) if i % 2 else ((0, 3),):
            payload, k = encode_rows(trade, [c.slice(a, b - a) for c in cols], np.full(b - a, 3, np.uint8))
            frames += encode_frame(payload, k)
        value = b"" if i == 20 else frames[:-3] if i == 31 else frames
        p.produce("trades", value=value, partition=i % PARTS)
    assert p.flush(30) == 0


def fetcher(bootstrap: str, compiled: bool, sent: list, **props) -> Fetcher:
    columns = {"Sym": "key", "Size": "value.size", "Timestamp": {"from": "value.ts", "unit": "ms"}}
    binlog = props.pop("binlog", False)
    src = parse(**({"format": "binlog"} if binlog else {"columns": columns}), on_poison="skip",
                batch_size=64).sources[0]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False,
                  "enable.partition.eof": True, **props})
    f = Fetcher(src, c, lambda h, b: sent.append((h, b)))
    if not compiled:
        f._chosen = True  # noqa: SLF001 - the reference path, chosen by the test
    return f


def run(f: Fetcher, sent: list, start: int, n: int) -> dict:
    """Fetch until every partition's messages from ``start`` are in and each has said EOF;
    returns rows, poison and error events by partition."""
    c = f.consumer
    try:
        c.list_topics("trades", timeout=5)
        for p in range(PARTS):
            f.handle(("assign", p, start, 1))
        eofs: set = set()
        t0 = time.monotonic()
        while len(eofs) < PARTS and time.monotonic() - t0 < 30:
            f.fetch_once(0.1)
            eofs = {h[2] for h, _ in sent if h[0] == "error"}
        out: dict = {"rows": {}, "poison": {}, "errors": sorted(h for h, _ in sent if h[0] == "error"),
                     "packed": [isinstance(b.values, Packed) for h, b in sent if h[0] == "decode"]}
        for h, b in sent:
            if h[0] != "decode":
                continue
            header, body = f.encode(h, b)
            _, p, gen, first, end, messages, nbytes, poison, _drained = header
            rows = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
            out["rows"].setdefault(p, []).append(rows)
            out["poison"].setdefault(p, []).extend(poison)
            out.setdefault("nbytes", 0)
            out["nbytes"] += nbytes
        out["rows"] = {p: pa.concat_tables(t).to_pydict() for p, t in out["rows"].items()}
        return out
    finally:
        c.close()


@pytest.mark.parametrize("start", [0, 7])
def test_compiled_reader_yields_what_consume_yields(mock_kafka, start):
    """Both paths on the same topic, from offset 0 and from offset 7 (a restart's resume point):
    the same rows with their offsets, the same poison messages and error events, and the
    compiled path really packed (no ``Message`` objects)."""
    n = 150
    produced = produce_mixed(mock_kafka.bootstrap, n)
    sent_py: list = []
    ref = run(fetcher(mock_kafka.bootstrap, False, sent_py), sent_py, start, n)
    sent_c: list = []
    f = fetcher(mock_kafka.bootstrap, True, sent_c)
    got = run(f, sent_c, start, n)
    assert f.reader is not None and got["packed"] and all(got["packed"])
    assert not any(ref["packed"])
    assert got["rows"] == ref["rows"] and got["poison"] == ref["poison"] and got["errors"] == ref["errors"]
    assert got["nbytes"] == ref["nbytes"]
    # and what they agree on is the topic: every message from `start`, but the poison ones
    for p in range(PARTS):
        mine = [(k, v) for q, k, v in produced if q == p][start:]
        offsets = got["rows"][p][OFFSET_COLUMN]
        assert offsets[0] == start and len(offsets) + len(got["poison"][p]) == len(mine)
    poison = {o * PARTS + p for p, ps in got["poison"].items() for o, _ in ps}
    assert poison == {i for i in (40, 71, 133) if i // PARTS >= start}  # 95 (a line break) and 120 (no key) are rows
    assert [e[3] for e in got["errors"]] == [-191] * PARTS  # partition EOF, once each
    by_offset = {p: dict(zip(r[OFFSET_COLUMN], zip(r["Sym"], r["Size"]))) for p, r in got["rows"].items()}
    assert by_offset[120 % PARTS][120 // PARTS] == (None, 120)
    assert by_offset[95 % PARTS][95 // PARTS] == ("S0", 95)


def test_compiled_reader_yields_what_consume_yields_of_binlog_values(mock_kafka):
    """The same with binary-log values (frames side by side, no separator): the same rows, and
    the empty value and the torn frame are the same poison messages."""
    produce_frames(mock_kafka.bootstrap, 60)
    sent_py: list = []
    ref = run(fetcher(mock_kafka.bootstrap, False, sent_py, binlog=True), sent_py, 0, 60)
    sent_c: list = []
    got = run(fetcher(mock_kafka.bootstrap, True, sent_c, binlog=True), sent_c, 0, 60)
    assert got["packed"] and all(got["packed"]) and not any(ref["packed"])
    assert got["rows"] == ref["rows"] and got["poison"] == ref["poison"] and got["errors"] == ref["errors"]
    assert {o * PARTS + p for p, ps in got["poison"].items() for o, _ in ps} == {20, 31}
    assert sum(len(r[OFFSET_COLUMN]) for r in got["rows"].values()) == 58 * 3


def test_client_callbacks_run_during_a_compiled_consume(mock_kafka):
    """confluent-kafka's logger is called from inside librdkafka's consume (its log lines come
    through the consumer's queue): it runs, and an exception it raises comes out of the call."""
    produce_mixed(mock_kafka.bootstrap, 30)
    lines: list = []

    class Log(logging.Logger):
        fail = False

        def log(self, level, msg, *args, **kwargs):  # noqa: ARG002 - logging.Logger.log's signature
            lines.append(msg % args)
            if self.fail:
                raise RuntimeError("logger failed")

    logger = Log("t")
    src = parse(columns={"Size": "value.size", "Timestamp": {"from": "value.ts", "unit": "ms"}}).sources[0]
    c = Consumer({"bootstrap.servers": mock_kafka.bootstrap, "group.id": "t", "enable.auto.commit": False,
                  "debug": "all"}, logger=logger)
    sent: list = []
    f = Fetcher(src, c, lambda h, b: sent.append((h, b)))
    try:
        c.list_topics("trades", timeout=5)
        f.handle(("assign", 0, 0, 1))
        before = len(lines)
        t0 = time.monotonic()
        while sum(len(b) for h, b in sent if h[0] == "decode") < 10 and time.monotonic() - t0 < 20:
            f.fetch_once(0.1)
        assert f.reader is not None and len(lines) > before
        logger.fail = True
        f.handle(("assign", 1, 0, 1))  # more of the client's log lines
        with pytest.raises(RuntimeError, match="logger failed"):
            for _ in range(200):
                f.fetch_once(0.05)
    finally:
        logger.fail = False  # the client's close logs too
        c.close()


def test_fallback_when_the_check_fails_is_logged_once(mock_kafka, monkeypatch):
    """A confluent-kafka the reader was not checked against: ``consume`` instead, said once,
    and the rows still come."""
    monkeypatch.setattr(batchread, "CHECKED_VERSIONS", ("0.0.0",))
    produce_mixed(mock_kafka.bootstrap, 30)
    sent: list = []
    f = fetcher(mock_kafka.bootstrap, True, sent)
    got = run(f, sent, 0, 30)
    assert f.reader is None and not any(got["packed"]) and sum(len(r[OFFSET_COLUMN]) for r in got["rows"].values()) == 30
    logs = [h for h, _ in sent if h[0] == "log"]
    assert len(logs) == 1 and "confluent-kafka's consume" in logs[0][2] and "0.0.0" in logs[0][3]["reason"]


def test_check_refuses_what_is_not_an_open_consumer(mock_kafka):
    """The layout check: not a ``Consumer`` (a ``Producer`` is another type), or a closed one:
    no reader, and the reason."""
    p = Producer({"bootstrap.servers": mock_kafka.bootstrap})
    reader, why = batchread.reader(p, "json", False, False, False)
    assert reader is None and "not a confluent_kafka Consumer" in why
    c = Consumer({"bootstrap.servers": mock_kafka.bootstrap, "group.id": "t"})
    assert batchread.reader(c, "json", False, False, False)[0] is not None
    c.close()
    reader, why = batchread.reader(c, "json", False, False, False)
    assert reader is None and "closed" in why
