"""A ``char`` column reads as a one-character string from every Python read path (docs/storage-format.md,
"What a char reads as"): ``Client.read_table``, ``read_location``, ``last_by``, ``subscribe_last_by``
and ``table_from_blocks`` over the column files, as Spark and merged Parquet give it (compared in
tests/merge/test_chars.py).  A null char (the sentinel 0xFFFF) is null; half of a surrogate pair, which
no one-character string can hold, reads as U+FFFD."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from disd.binlog import LocationKey
from disd.blocks import LocalColumnFiles
from disd.client import connect, table_from_blocks
from disd.config import parse_dis_config
from disd.server.daemon import DisServer
from support import CHAR_CODES, CHAR_STRINGS, SCHEMAS, Feeder, dis_settings, quote_rows

KEY = LocationKey("Market", "Quote", "feed1", "2026-11-22")
STRINGS = CHAR_STRINGS


@pytest.fixture(scope="module")
def quote_dis(tmp_path_factory):
    db = tmp_path_factory.mktemp("chars") / "db"
    settings = dis_settings(db)
    settings["import"]["tables"] = {"Market.Quote": {"last_by": ["Sym"]}}
    srv = DisServer(parse_dis_config(settings, "<t>"))
    srv.start()
    Feeder(srv).append(KEY, quote_rows())
    srv.engine.location(KEY).checkpoint()
    yield srv, db
    srv.stop(0.5)


def test_the_client_reads_a_char_as_a_one_character_string(quote_dis):
    srv, _ = quote_dis
    with connect(f"127.0.0.1:{srv.port}", retry_s=0) as c:
        t = c.read_table("Market", "Quote")
        assert t.schema.field("Exchange").type == pa.string()
        assert t.column("Exchange").to_pylist() == STRINGS
        assert c.read_table("Market", "Quote", columns=["Exchange"]).column("Exchange").to_pylist() == STRINGS
        [snap] = c.locations("Market", "Quote")
        part = c.read_location(snap, ["Exchange", "Sym"], 2, 5)
        assert part.schema.field("Exchange").type == pa.string()
        assert part.column("Exchange").to_pylist() == STRINGS[2:5]
        # an empty read has the same types
        assert c.read_table("Market", "Quote", partitions=["2000-01-01"]).schema.field("Exchange").type == pa.string()

        view = c.last_by("Market", "Quote")
        assert view.schema.field("Exchange").type == pa.string()
        assert dict(zip(view.column("Sym").to_pylist(), view.column("Exchange").to_pylist())) == {
            f"S{i}": s for i, s in enumerate(STRINGS)}
        msg, state = next(iter(c.subscribe_last_by("Market", "Quote")))
        assert msg.full and state.column("Exchange").to_pylist() == STRINGS


def test_the_column_files_read_directly_give_the_same_strings(quote_dis):
    _, db = quote_dis
    from disd.schema import SchemaRegistry

    schema = SchemaRegistry.load_dir(SCHEMAS).get("Market", "Quote")
    source = LocalColumnFiles(str(db), [schema])
    try:
        t = table_from_blocks(source, schema)
    finally:
        source.close()
    assert t.schema.field("Exchange").type == pa.string()
    assert t.column("Exchange").to_pylist() == STRINGS


def test_char_strings_is_the_one_conversion():
    from disd.values import char_strings

    codes = pa.array(CHAR_CODES, pa.uint16())
    assert char_strings(codes).to_pylist() == STRINGS
    # a slice, a chunked array, and strings already converted
    assert char_strings(codes.slice(3, 4)).to_pylist() == STRINGS[3:7]
    chunked = pa.chunked_array([codes.slice(0, 5), codes.slice(5)])
    assert char_strings(chunked).to_pylist() == STRINGS
    assert char_strings(pa.array(STRINGS)).to_pylist() == STRINGS
    assert char_strings(pa.array([], pa.uint16())).type == pa.string()
    # the null sentinel is null however it arrives (as the JVM reader reads it)
    assert char_strings(pa.array(np.array([0xFFFF, 66], np.uint16))).to_pylist() == [None, "B"]
