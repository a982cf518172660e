"""The last-by state of a location in this process, over real files: equal to the recomputed
last-by after every publish (one key or two, nulls included), loaded from its file or rebuilt
when the file is damaged, bounded by ``lastby_max_keys``, and refused when misdeclared."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from disd.config import ConfigError, ImportConfig, parse_dis_config
from disd.names import LocationKey
from disd.schema import SchemaRegistry
from disd.server.daemon import DisServer
from disd.storage import StorageEngine
from disd.storage.checkpoint import read_record
from disd.storage.lastby import LastByError, combine, last_by
from support import SCHEMAS, Feeder, dis_settings

from .support_lastby import random_updates, with_last_by

KEY = LocationKey("Market", "Trade", "A", "2026-11-22")


def _server(db, **kw):
    srv = DisServer(parse_dis_config(with_last_by(dis_settings(db, flush_ms=60000, checkpoint_ms=600000), **kw), "<t>"))
    srv.start()
    return srv


def test_state_equals_the_last_by_after_every_publish_with_one_or_two_keys(tmp_path):
    for keys in (("Sym",), ("Sym", "Size")):
        srv = _server(tmp_path / "-".join(keys), keys=keys)
        try:
            feeder = Feeder(srv)
            loc = srv.engine.location(KEY)
            for i in range(6):
                t = random_updates(i * 3000, 3000, 2000, seed=1)
                if i == 2:  # null keys are a key of their own
                    t = t.set_column(1, "Sym", pc.if_else(pc.equal(pc.bit_wise_and(t["Size"], 3), 1),
                                                          pa.nulls(len(t), pa.string()), t["Sym"]))
                if len(keys) == 2:
                    t = t.set_column(3, "Size", pc.bit_wise_and(t["Size"], 1))
                feeder.append(KEY, t)
                state = loc.lastby.snapshot()
                assert state.rows == loc.published_rows == (i + 1) * 3000
                assert state.table.equals(last_by(loc.read_table(), keys))
        finally:
            srv.stop(0.5)


def test_state_is_loaded_from_its_file_and_rebuilt_when_the_file_is_damaged(tmp_path):
    db = tmp_path / "db"
    srv = _server(db)
    try:
        Feeder(srv).append(KEY, random_updates(0, 5000, 1000, seed=2))
    finally:
        srv.stop(0.5)  # checkpoints
    loc_dir = db / "Intraday/Market/Trade/A/2026-11-22/Trade"
    rec = read_record(loc_dir)
    assert rec.lastby["rows"] == 5000 and rec.lastby["keys"] == 1000
    assert sorted(n for n in os.listdir(loc_dir) if n.startswith("lastby.")) == [rec.lastby["file"]]
    srv = _server(db)
    try:
        loc = srv.engine.location(KEY)
        assert loc.lastby.durable_ref == rec.lastby  # loaded
        expected = last_by(loc.read_table(), ["Sym"])
        assert loc.lastby.snapshot().table.equals(expected)
    finally:
        srv.stop(0.5)
    state = loc_dir / rec.lastby["file"]
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    srv = _server(db)
    try:
        loc = srv.engine.location(KEY)
        assert loc.lastby.durable_ref is None  # rebuilt from the rows, never the damaged file
        assert loc.lastby.snapshot().table.equals(expected)
        assert not loc.in_error
    finally:
        srv.stop(0.5)


def test_more_keys_than_the_limit_stop_the_location_with_a_clear_error(tmp_path):
    srv = _server(tmp_path / "db", max_keys=500)
    try:
        feeder = Feeder(srv)
        feeder.append(KEY, random_updates(0, 400, 400, seed=3))
        loc = srv.engine.location(KEY)
        assert loc.published_rows == 400
        feeder.append(KEY, random_updates(400, 1000, 1000, seed=3))
        assert loc.in_error and loc.lastby.snapshot().rows == 400  # stopped; no update past the limit
        assert "Market.Trade" in loc.error and "lastby_max_keys=500" in loc.error
        assert len(loc.lastby.snapshot().table) == 400  # the state as it was, never past the limit
    finally:
        srv.stop(0.5)


def test_misdeclared_keys_are_refused_naming_the_table_and_column(tmp_path):
    with pytest.raises(ConfigError, match=r"import.tables.Market.Trade.last_by\[0\]: Market.Trade has no column "
                                          r"'Symbol'; did you mean Sym\?"):
        _server(tmp_path / "db", keys=("Symbol",))  # dis.yaml: refused at start
    engine = StorageEngine(str(tmp_path / "db"), SchemaRegistry.load_dir(SCHEMAS),
                           import_tables={"Market.Trade": ImportConfig(last_by=("Symbol",))})
    try:  # the engine given such keys another way: the location stops, naming them
        loc = engine.location(KEY)
        assert loc.in_error and "Market.Trade" in loc.error and "'Symbol'" in loc.error
    finally:
        engine.close()
    bad = dis_settings(tmp_path / "db2")
    bad["import"]["default"]["last_by"] = ["Sym"]
    with pytest.raises(ConfigError, match="import.default.last_by"):
        parse_dis_config(bad, "<t>")
    bad = with_last_by(dis_settings(tmp_path / "db3"), keys=())
    with pytest.raises(ConfigError, match=r"import.tables.Market.Trade.last_by"):
        parse_dis_config(bad, "<t>")
    with pytest.raises(LastByError, match="'Nope'"):
        last_by(random_updates(0, 10, 5, seed=0), ["Nope"])


def test_subscription_sends_the_full_state_then_the_changed_keys(tmp_path):
    from disd.client import connect

    srv = _server(tmp_path / "db")
    try:
        feeder = Feeder(srv)
        feeder.append(KEY, random_updates(0, 3000, 1000, seed=4))
        with connect(f"127.0.0.1:{srv.port}") as c:
            stream = c.subscribe_last_by("Market", "Trade")
            m, t = next(stream)
            assert m.full and m.rows == 3000 and len(t) == 1000
            more = random_updates(3000, 50, 1000, seed=4)
            feeder.append(KEY, more)
            m, t = next(stream)
            assert not m.full and m.rows == 3050
            assert t.sort_by("Sym").equals(last_by(more, ["Sym"]).sort_by("Sym"))  # the changed keys, once
            stream.close()
            view = c.last_by("Market", "Trade")
            assert view.drop_columns(["Date"]).equals(last_by(srv.engine.location(KEY).read_table(), ["Sym"]))
    finally:
        srv.stop(0.5)


def test_a_table_view_takes_each_key_from_the_latest_column_partition():
    a = random_updates(0, 100, 20, seed=5)
    b = random_updates(100, 30, 20, seed=6)
    view = combine([(LocationKey("Market", "Trade", "A", "2026-11-23"), last_by(b, ["Sym"])),
                    (LocationKey("Market", "Trade", "A", "2026-11-22"), last_by(a, ["Sym"]))],
                   ["Sym"], "Date", a.schema)
    expected = last_by(pa.concat_tables([a, b]), ["Sym"])
    assert view.drop_columns(["Date"]).sort_by("Sym").equals(expected.sort_by("Sym"))


def _ingest(srv, feeder, table, flags) -> None:
    """Rows with their transaction flags into KEY as the Ingest service would (one frame)."""
    import numpy as np

    from disd.binlog import normalize_columns
    from disd.binlog.format import decode_frames, encode_frame, encode_rows, scan_frames

    schema = srv.schemas.get(KEY.namespace, KEY.table)
    payload, rows = encode_rows(schema, normalize_columns(schema, table), np.asarray(flags, np.uint8))
    frame = encode_frame(payload, rows)
    base = feeder.offsets.get(KEY, 4096)
    run = scan_frames(frame, base, schema)
    srv.engine.location(KEY).ingest(feeder.log_name(KEY), run, decode_frames(frame, base, run, schema))
    feeder.offsets[KEY] = base + len(frame)


def test_state_takes_only_committed_rows_from_the_appended_arrays(tmp_path):
    """The state's input comes from the arrays ingestion appended: rows of an open transaction
    are not in it at a publish, rolled-back and abandoned rows never, and a value equal to its
    column's null sentinel is null as a read of the files returns it."""
    START, END, NONE = 1, 2, 0
    srv = _server(tmp_path / "db")
    try:
        feeder = Feeder(srv)
        loc = srv.engine.location(KEY)
        sentinel = srv.schemas.get("Market", "Trade").column("Size").type.null_sentinel
        t = random_updates(0, 400, 50, seed=6)
        t = t.set_column(3, "Size", pa.array([sentinel if i % 7 == 0 else i for i in range(400)], pa.int32()))
        # rows 0-99 commit one by one; 100-149 open a transaction left open at the publish
        _ingest(srv, feeder, t.slice(0, 150), [0] * 100 + [START] + [NONE] * 49)
        loc.flush()
        assert loc.published_rows == 100 and loc.lastby.snapshot().rows == 100
        assert loc.lastby.snapshot().table.equals(last_by(loc.read_table(), ["Sym"]))
        loc.rollback()  # the open transaction's rows go
        # a transaction abandoned by a second Start inside one frame, then committed rows
        _ingest(srv, feeder, t.slice(150, 100), [START] + [NONE] * 29 + [START] + [NONE] * 68 + [END])
        _ingest(srv, feeder, t.slice(250, 150), [0] * 150)
        loc.flush()
        assert loc.published_rows == 100 + 70 + 150
        state = loc.lastby.snapshot()
        assert state.rows == loc.published_rows
        rows = loc.read_table()
        assert state.table.equals(last_by(rows, ["Sym"]))
        assert rows["Size"].null_count > 0 and state.table["Size"].null_count > 0  # sentinels read as null
        assert loc.lastby.rows_read_back == 0  # every publish's rows came from the appended arrays
        kept = pa.concat_tables([t.slice(0, 100), t.slice(180, 70), t.slice(250, 150)])
        assert rows.column("Sym").equals(kept.column("Sym"))  # what the files hold: no rolled-back rows
    finally:
        srv.stop(0.5)
