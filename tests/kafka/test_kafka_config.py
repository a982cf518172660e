"""``import.kafka`` checked against the table schema when the DIS starts: every problem is a
ConfigError naming the key, and ``dis serve`` exits 2 with it instead of a traceback."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from disd.config import ConfigError
from disd.kafka import parse_kafka_config
from disd.schema import SchemaRegistry
from support import BIN, SCHEMAS, free_port_pair, write_dis_config

SCHEMA_REG = SchemaRegistry.load_dir(str(SCHEMAS))


def parse(**source):
    src = {"topic": "trades", "table": "Market.Trade", "column_partition": {"column": "Timestamp"}}
    src.update(source)
    return parse_kafka_config({"bootstrap_servers": "b:9092", "sources": {"trades": src}}, "dis.yaml", SCHEMA_REG)


@pytest.mark.parametrize("source,key,words", [
    ({"table": "Market.Nope"}, "import.kafka.sources.trades.table", "no schema"),
    ({"columns": {"Nope": "value.x"}}, "import.kafka.sources.trades.columns.Nope", "no column"),
    ({"columns": {"Price": "key"}}, "import.kafka.sources.trades.columns.Price", "string column"),
    ({"columns": {"Size": "value"}}, "import.kafka.sources.trades.columns.Size", "value.<field>"),
    ({"columns": {"Size": {"from": "value.n", "unit": "ms"}}}, "import.kafka.sources.trades.columns.Size.unit",
     "timestamp column"),
    ({"column_partition": {"column": "Sym"}}, "import.kafka.sources.trades.column_partition.column", "not a timestamp"),
    ({"column_partition": None}, "import.kafka.sources.trades.column_partition", "required"),
    ({"format": "avro"}, "import.kafka.sources.trades.format", "json, binlog"),
    ({"format": "binlog", "columns": {"Size": "value.n"}}, "import.kafka.sources.trades.columns", "no mapping"),
    ({"on_poison": "ignore"}, "import.kafka.sources.trades.on_poison", "stop or skip"),
    ({"topic": "a/b"}, "import.kafka.sources.trades.topic", "topic name"),
    ({"colums": {}}, "import.kafka.sources.trades.colums", "unknown key"),
    ({"fetch_processes": 0}, "import.kafka.sources.trades.fetch_processes", "integer 1..64"),
    ({"fetch_processes": 65}, "import.kafka.sources.trades.fetch_processes", "integer 1..64"),
    ({"fetch_processes": "two"}, "import.kafka.sources.trades.fetch_processes", "must be int"),
    ({"fetch_processes": True}, "import.kafka.sources.trades.fetch_processes", "must be int"),
])
def test_config_errors_name_the_key(source, key, words):
    with pytest.raises(ConfigError) as e:
        parse(**source)
    assert e.value.key == key and words in e.value.problem, str(e.value)


def test_reserved_properties_refused():
    with pytest.raises(ConfigError) as e:
        parse_kafka_config({"bootstrap_servers": "b:1", "properties": {"enable.auto.commit": True},
                            "sources": {"s": {"topic": "t", "table": "Market.Trade", "column_partition": "x"}}},
                           "dis.yaml", SCHEMA_REG)
    assert e.value.key == "import.kafka.properties.enable.auto.commit"


def test_defaults_map_every_column_from_its_value_field():
    cfg = parse()
    [s] = cfg.sources
    assert [(c.column, c.part, c.name) for c in s.columns] == [(c.name, "value", c.name) for c in s.schema.columns]
    assert s.on_poison == "stop" and s.internal_partition(2) == "trades-2"
    assert s.fetch_processes is None and parse(fetch_processes=3).sources[0].fetch_processes == 3
    assert cfg.client_properties()["enable.auto.commit"] is False


def test_dis_serve_exits_naming_the_key(tmp_path):
    path = write_dis_config(tmp_path, free_port_pair())
    data = yaml.safe_load(path.read_text())
    data["import"]["kafka"] = {"bootstrap_servers": "127.0.0.1:1", "sources": {"s": {
        "topic": "t", "table": "Market.Trade", "column_partition": "2026-11-23", "columns": {"Size": "value"}}}}
    path.write_text(yaml.safe_dump(data))
    r = subprocess.run([str(BIN / "dis"), "serve", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "import.kafka.sources.s.columns.Size" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("value,words", [(999, "must be >= 1000"), ("soon", "must be int")])
def test_stall_timeout_is_checked(value, words):
    with pytest.raises(ConfigError) as e:
        parse_kafka_config({"bootstrap_servers": "b:1", "stall_timeout_ms": value,
                            "sources": {"s": {"topic": "t", "table": "Market.Trade", "column_partition": "x"}}},
                           "dis.yaml", SCHEMA_REG)
    assert e.value.key == "import.kafka.stall_timeout_ms" and words in e.value.problem, str(e.value)
    assert parse(fetch_processes=1).stall_timeout_ms == 30_000
