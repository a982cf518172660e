"""config/tailer.yaml: keys, defaults, and errors that name the file and the key."""

from __future__ import annotations

import pytest

from disd.config import ConfigError
from disd.tailer import load_tailer_config, parse_tailer_config

from support import ROOT, SCHEMAS


@pytest.mark.parametrize(
    "data,key",
    [
        ({"log_dirs": ["x"]}, "dis"),
        ({"dis": "a:1", "routing": "r.yaml", "log_dirs": ["x"]}, "dis"),
        ({"dis": "nohostport", "log_dirs": ["x"]}, "dis"),
        ({"dis": "a:99999", "log_dirs": ["x"]}, "dis"),
        ({"dis": "a:1"}, "log_dirs"),
        ({"dis": "a:1", "log_dirs": []}, "log_dirs"),
        ({"dis": "a:1", "log_dirs": "var/logs"}, "log_dirs"),
        ({"dis": "a:1", "log_dirs": ["x"], "chunk_bytes": 0}, "chunk_bytes"),
        ({"dis": "a:1", "log_dirs": ["x"], "chunk_bytes": 64 << 20, "max_in_flight_bytes": 128 << 20}, "chunk_bytes"),
        ({"dis": "a:1", "log_dirs": ["x"], "chunk_bytes": 2 << 20, "max_in_flight_bytes": 1 << 20}, "chunk_bytes"),
        ({"dis": "a:1", "log_dirs": ["x"], "max_in_flight_bytes": "8M"}, "max_in_flight_bytes"),
        ({"dis": "a:1", "log_dirs": ["x"], "poll_interval_ms": -1}, "poll_interval_ms"),
        ({"dis": "a:1", "log_dirs": ["x"], "poll_interval_ms": True}, "poll_interval_ms"),
        ({"dis": "a:1", "log_dirs": ["x"], "typo": 1}, "typo"),
        ({"dis": "a:1", "log_dirs": ["x"], "tls": {"cert": "c.pem", "key": "k.pem"}}, "tls.ca"),
        ({"dis": "a:1", "log_dirs": ["x"], "tls": {"ca": "/nonexistent/ca.pem"}}, "tls.ca"),
        ({"dis": "a:1", "log_dirs": ["x"], "tls": {"ca_file": "x"}}, "tls.ca_file"),
        ({"dis": "a:1", "log_dirs": ["x"], "token_file": "/nonexistent/token"}, "token_file"),
        ({"dis": "a:1", "log_dirs": ["x"], "csv_tables": ["Market.Quote"]}, "schemas"),
        ({"dis": "a:1", "log_dirs": ["x"], "csv_tables": ["Quote"], "schemas": str(SCHEMAS)}, "csv_tables[0]"),
        ({"dis": "a:1", "log_dirs": ["x"], "csv_tables": ["Market.Nope"], "schemas": str(SCHEMAS)}, "csv_tables[0]"),
        ({"dis": "a:1", "log_dirs": ["x"], "csv_tables": ["Market.Quote"], "schemas": "/nonexistent"}, "schemas"),
        ({"dis": "a:1", "log_dirs": ["x"], "metrics_port": 70000}, "metrics_port"),
        ({"dis": "a:1", "log_dirs": ["x"], "metrics_port": "9465"}, "metrics_port"),
        ({"dis": "a:1", "log_dirs": ["x"], "metrics_host": "0.0.0.0"}, "metrics_host"),
        ({"dis": "a:1", "log_dirs": ["x"], "metrics_port": 9465, "metrics_host": " "}, "metrics_host"),
        ({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": "trio"}, "stream_runtime"),
        ({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": 1}, "stream_runtime"),
    ],
)
def test_errors_name_the_file_and_key(data, key):
    with pytest.raises(ConfigError) as ei:
        parse_tailer_config(data, "tailer.yaml")
    assert str(ei.value).startswith(f"tailer.yaml: {key}: "), str(ei.value)


def test_defaults():
    cfg = parse_tailer_config({"dis": "127.0.0.1:22021", "log_dirs": ["var/logs"]})
    assert cfg.routing.addresses == ["127.0.0.1:22021"]
    assert cfg.max_in_flight_bytes == 8 << 20 and cfg.chunk_bytes == 4 << 20
    assert cfg.poll_interval_ms == 200 and cfg.state_dir == "var/tailer"
    assert cfg.csv_tables == {} and not cfg.security.tls and cfg.security.token is None
    assert cfg.metrics_port is None  # no endpoint unless asked for
    assert cfg.stream_runtime == "multiplexed"


def test_metrics_endpoint_keys():
    cfg = parse_tailer_config({"dis": "a:1", "log_dirs": ["x"], "metrics_port": 9465})
    assert (cfg.metrics_port, cfg.metrics_host) == (9465, "127.0.0.1")
    cfg = parse_tailer_config({"dis": "a:1", "log_dirs": ["x"], "metrics_port": 0, "metrics_host": "0.0.0.0"})
    assert (cfg.metrics_port, cfg.metrics_host) == (0, "0.0.0.0")


def test_routing_token_and_csv_tables(tmp_path):
    (tmp_path / "routing.yaml").write_text(
        "instances:\n  - {address: 127.0.0.1:1, tables: ['Market.*']}\n  - {address: 127.0.0.1:2}\n")
    (tmp_path / "token").write_text("s3cret\n")
    cfg = parse_tailer_config({"routing": str(tmp_path / "routing.yaml"), "log_dirs": ["a", "b", "a"],
                               "token_file": str(tmp_path / "token"), "csv_tables": ["Market.Quote"],
                               "schemas": str(SCHEMAS)})
    assert cfg.routing.owner("Market", "Trade").address == "127.0.0.1:1"
    assert cfg.routing.owner("Other", "T").address == "127.0.0.1:2"
    assert cfg.log_dirs == ["a", "b"]
    assert cfg.security.token == "s3cret"
    assert cfg.csv_tables["Market.Quote"].key == "Market.Quote"


def test_shipped_config_loads():
    cfg = load_tailer_config(ROOT / "config" / "tailer.yaml")
    assert cfg.log_dirs == ["var/logs"]


def test_bad_routing_file_is_named(tmp_path):
    (tmp_path / "routing.yaml").write_text("instances: []\n")
    with pytest.raises(ConfigError) as ei:
        parse_tailer_config({"routing": str(tmp_path / "routing.yaml"), "log_dirs": ["x"]}, "tailer.yaml")
    assert "routing.yaml: instances" in str(ei.value)
