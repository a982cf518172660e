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
        ({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": "threads"}, "stream_runtime"),
        ({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": "asyncio"}, "stream_runtime"),
        ({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": 1}, "stream_runtime"),
        ({"dis": "a:1", "log_dirs": ["x"], "keepalive_ms": 500}, "keepalive_ms"),
        ({"dis": "a:1", "log_dirs": ["x"], "keepalive_timeout_ms": 0}, "keepalive_timeout_ms"),
        ({"dis": "a:1", "log_dirs": ["x"], "ack_timeout_ms": 999}, "ack_timeout_ms"),
        ({"dis": "a:1", "log_dirs": ["x"], "ack_timeout_ms": "15s"}, "ack_timeout_ms"),
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
    # a DIS that stops answering: left within keepalive_ms + keepalive_timeout_ms, or ack_timeout_ms
    assert (cfg.keepalive_ms, cfg.keepalive_timeout_ms, cfg.ack_timeout_ms) == (2000, 3000, 60000)


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_a_removed_runtime_is_named_as_removed(runtime):
    """``stream_runtime`` takes ``multiplexed`` only: a file that still names one of the removed
    runtimes is refused, saying so, not as an unknown value."""
    with pytest.raises(ConfigError) as ei:
        parse_tailer_config({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": runtime}, "tailer.yaml")
    assert str(ei.value).startswith(f"tailer.yaml: stream_runtime: the {runtime!r} runtime was removed"), str(ei.value)
    assert "multiplexed" in str(ei.value)
    assert parse_tailer_config({"dis": "a:1", "log_dirs": ["x"], "stream_runtime": "multiplexed"}).stream_runtime \
        == "multiplexed"


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


@pytest.mark.parametrize("data, key, hint", [
    ({"dis": "a:1", "log_dir": ["x"]}, "log_dir", "did you mean log_dirs?"),
    ({"Dis": "a:1", "log_dirs": ["x"]}, "Dis", "did you mean dis?"),
    ({"dis": "a:1", "log_dirs": ["x"], "token-file": "t"}, "token-file", "did you mean token_file?"),
    ({"dis": "a:1", "log_dirs": ["x"], "chunk_byte": 0}, "chunk_byte", "did you mean chunk_bytes?"),
    ({"dis": "a:1", "log_dirs": ["x"], "retention": {"mod": "delete"}}, "retention.mod", "did you mean mode?"),
    ({"dis": "a:1", "log_dirs": ["x"], "zzz": 1}, "zzz",
     "known keys: ack_timeout_ms, chunk_bytes, csv_tables, dis, keepalive_ms, keepalive_timeout_ms, log_dirs"),
])
def test_an_unknown_key_is_named_first_with_the_close_known_key(data, key, hint):
    """A misspelt key is what is wrong, not the required key it leaves missing (``log_dir:``
    reported as ``log_dirs: must be a non-empty list`` sends the user looking in the wrong place)."""
    with pytest.raises(ConfigError) as ei:
        parse_tailer_config(data, "tailer.yaml")
    assert ei.value.key == key and str(ei.value).startswith(f"tailer.yaml: {key}: unknown key"), str(ei.value)
    assert hint in ei.value.problem, str(ei.value)


def test_dis_tailer_names_the_misspelt_key_and_exits_2(tmp_path):
    import subprocess

    from support import BIN

    path = tmp_path / "tailer.yaml"
    path.write_text("dis: 127.0.0.1:22021\nlog_dir: [var/logs]\n")
    r = subprocess.run([str(BIN / "dis-tailer"), "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"dis-tailer: {path}: log_dir: unknown key (did you mean log_dirs?)" in r.stderr, r.stderr
    assert "log_dirs: must be" not in r.stderr and "Traceback" not in r.stderr
