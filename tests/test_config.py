"""The daemon's YAML configuration: the sample file, defaults, and errors that name the key."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from disd.config import ConfigError, load_dis_config, parse_dis_config
from disd.storage import StorageEngine
from support import BIN, ROOT, dis_settings, start_dis_server


def test_the_sample_config_loads_with_its_values():
    cfg = load_dis_config(ROOT / "config" / "dis.yaml")
    assert cfg.port == 22021 and cfg.storage.max_open_files == 512 and cfg.storage.block_size_bytes == 65536
    assert (cfg.storage.io_retry_initial_ms, cfg.storage.io_retry_max_ms) == (1000, 60000)
    assert cfg.import_tables["Market.Trade"].flush_interval_ms == 50
    assert cfg.import_default.checkpoint_interval_ms == 30000


def test_io_retry_backoff_reaches_the_storage_engine(tmp_path):
    srv = start_dis_server(tmp_path / "db", storage={"io_retry_initial_ms": 250, "io_retry_max_ms": 4000})
    try:
        assert isinstance(srv.engine, StorageEngine)
        assert (srv.engine.storage.io_retry_initial_ms, srv.engine.storage.io_retry_max_ms) == (250, 4000)
    finally:
        srv.stop(0.5)


@pytest.mark.parametrize("storage, words", [
    ({"io_retry_initial_ms": 0}, "storage.io_retry_initial_ms"),
    ({"io_retry_initial_ms": 5000, "io_retry_max_ms": 1000}, "storage.io_retry_max_ms: must be at least"),
    ({"io_retry_max_ms": "soon"}, "storage.io_retry_max_ms"),
    ({"block_size_bytes": 1000}, "storage.block_size_bytes: must be a power of two"),
])
def test_bad_storage_settings_name_the_key(storage, words):
    with pytest.raises(ConfigError) as e:
        parse_dis_config({"storage": storage}, "dis.yaml")
    assert words in str(e.value) and "dis.yaml" in str(e.value)


# -- every table and column dis.yaml names is declared by a schema ----------------------------------
#: (import.tables, the key the error names, words of the problem): typos a user makes
NAMING_TYPOS = [
    ({"Market.Trad": {"last_by": ["Sym"]}}, "import.tables.Market.Trad",
     ["no schema declares table Market.Trad", "did you mean Market.Trade", "Market.Quote, Market.Trade"]),
    ({"Nope.Quote": {"flush_interval_ms": 10}}, "import.tables.Nope.Quote", ["no schema declares table Nope.Quote"]),
    ({"Market.Trade": {"last_by": ["Symm"]}}, "import.tables.Market.Trade.last_by[0]",
     ["Market.Trade has no column 'Symm'", "did you mean Sym"]),
    ({"Market.Trade": {"last_by": ["Sym", "Price", "Sym"]}}, "import.tables.Market.Trade.last_by[2]",
     ["names column Sym twice"]),
]


def _with_tables(db_root, tables: dict) -> dict:
    data = dis_settings(db_root)
    data["import"]["tables"] = tables
    return data


@pytest.mark.parametrize("tables, key, words", NAMING_TYPOS)
def test_a_table_or_column_no_schema_declares_stops_the_start_naming_the_key(tmp_path, tables, key, words):
    from disd.server.daemon import DisServer

    server = DisServer(parse_dis_config(_with_tables(tmp_path / "db", tables), "dis.yaml"))
    try:
        with pytest.raises(ConfigError) as e:
            server.start()
    finally:
        server.stop(0)
    assert e.value.key == key, str(e.value)
    assert str(e.value).startswith(f"dis.yaml: {key}: ") and all(w in e.value.problem for w in words), str(e.value)
    assert not (tmp_path / "db").exists()  # refused before the database root is touched


def test_declared_tables_and_columns_pass_the_check():
    cfg = parse_dis_config(_with_tables("unused", {"Market.Trade": {"last_by": ["Sym", "Size"]},
                                                   "Market.Quote": {"flush_interval_ms": 10}}), "dis.yaml")
    from disd.schema import SchemaRegistry
    from disd.server.daemon import check_config

    assert check_config(cfg, SchemaRegistry.load_dir(cfg.schemas)) is None  # no import.kafka: nothing to return


def _run_dis(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dis"), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_dis_serve_and_dis_verify_refuse_a_typo_naming_the_key(tmp_path):
    """The real commands: ``dis serve`` exits 2 with one line naming the file and the key (as for
    any other configuration error), ``dis verify --config`` exits 2 with the same line (as for a
    configuration it cannot read) instead of checking 0 locations and exiting 0."""
    (tmp_path / "db").mkdir()  # verify checks an existing database root
    for tables, key, words in NAMING_TYPOS[::2]:
        path = tmp_path / "dis.yaml"
        path.write_text(yaml.safe_dump(_with_tables(tmp_path / "db", tables)))
        serve = _run_dis("serve", "--config", str(path), cwd=tmp_path)
        verify = _run_dis("verify", "--config", str(path), cwd=tmp_path)
        for r, cmd in ((serve, "serve"), (verify, "verify")):
            assert r.returncode == 2, (cmd, r.returncode, r.stdout + r.stderr)
            assert r.stderr.startswith(f"dis {cmd}: {path}: {key}: "), r.stderr
            assert all(w in r.stderr for w in words) and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "db" / "dis.lock").exists()


def test_dis_verify_checks_the_kafka_sources_as_dis_serve_does(tmp_path):
    (tmp_path / "db").mkdir()
    data = dis_settings(tmp_path / "db")
    data["import"]["kafka"] = {"bootstrap_servers": "127.0.0.1:1", "sources": {"s": {
        "topic": "t", "table": "Market.Trades", "column_partition": "2026-11-23"}}}
    path = tmp_path / "dis.yaml"
    path.write_text(yaml.safe_dump(data))
    r = _run_dis("verify", "--config", str(path), cwd=tmp_path)
    assert r.returncode == 2 and f"{path}: import.kafka.sources.s.table: no schema declares table Market.Trades" \
        in r.stderr and "did you mean Market.Trade" in r.stderr, r.stdout + r.stderr
