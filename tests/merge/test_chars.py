"""One answer for a ``char`` column everywhere (docs/storage-format.md, "What a char reads as"): the
client's ``read_table`` and ``last_by``, both readers of Spark's ``dis`` source (rows and the
``lastBy`` view), and the Parquet a merge writes all give the same one-character strings, nulls
and U+FFFD for half a surrogate pair included."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from disd.binlog import LocationKey
from disd.client import connect
from disd.config import parse_dis_config
from disd.historical.merge import IntradaySource, MergeRequest, MergeSettings, merge
from disd.server.daemon import DisServer
from disd.storage.lastby import parquet_last_by
from support import CHAR_STRINGS, Feeder, dis_settings, quote_rows

from .helpers import D1

pytestmark = pytest.mark.spark


def by_sym(t: pa.Table) -> dict:
    return dict(zip(t.column("Sym").to_pylist(), t.column("Exchange").to_pylist()))


def test_a_char_reads_the_same_from_the_client_spark_and_merged_parquet(spark, tmp_path):
    settings = dis_settings(tmp_path / "intraday")
    settings["import"]["tables"] = {"Market.Quote": {"last_by": ["Sym"]}}
    srv = DisServer(parse_dis_config(settings, "<t>"))
    srv.start()
    try:
        key = LocationKey("Market", "Quote", "feed1", D1)
        Feeder(srv).append(key, quote_rows())
        srv.engine.location(key).checkpoint()
        address = f"127.0.0.1:{srv.port}"
        expected = {f"S{i}": s for i, s in enumerate(CHAR_STRINGS)}

        with connect(address, retry_s=0) as c:
            client_rows = c.read_table("Market", "Quote")
            client_view = c.last_by("Market", "Quote")
        assert client_rows.schema.field("Exchange").type == pa.string()
        assert by_sym(client_rows) == expected and by_sym(client_view) == expected

        def load(**opts):
            r = spark.read.format("dis").option("address", address).option("table", "Market.Quote")
            for k, v in opts.items():
                r = r.option(k, v)
            return r.load().select("Sym", "Exchange").toArrow()

        spark_rows = load()
        assert spark_rows.schema.field("Exchange").type == pa.string()
        assert by_sym(spark_rows) == expected
        assert by_sym(load(view="lastBy")) == expected

        db = tmp_path / "db"
        result = merge(spark, MergeRequest("Market", "Quote", D1, str(db), IntradaySource(address=address),
                                           settings=MergeSettings(("Bid",))))
        assert result.status == "merged" and result.rows == len(CHAR_STRINGS)
        files = sorted(str(f) for f in pathlib.Path(result.path).glob("*.parquet"))
        merged = pa.concat_tables([pq.read_table(f) for f in files])
        assert merged.schema.field("Exchange").type == pa.string()
        assert by_sym(merged) == expected
        assert by_sym(parquet_last_by(files, ["Sym"])) == by_sym(client_view)
    finally:
        srv.stop(0.5)
