"""The daemon's YAML configuration: the sample file, defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from disd.config import ConfigError, load_dis_config, parse_dis_config
from disd.storage import StorageEngine
from support import ROOT, start_dis_server


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
