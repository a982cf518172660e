"""Coverage-guided fuzzing of the binary-log decoder with atheris (libFuzzer), a few seconds per
run, seeded with valid logs of each schema (with and without re-sealed checksums)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import atheris  # noqa: F401 - the test extra installs it; the harness runs it in a subprocess

from .helpers import valid_log

HARNESS = pathlib.Path(__file__).with_name("atheris_binlog.py")


def test_atheris_decoder_fuzz_finds_no_crash(tmp_path):
    from disd.schema import SchemaRegistry

    reg = SchemaRegistry.load_dir(pathlib.Path(__file__).resolve().parents[2] / "config" / "schemas")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    trade = valid_log(tmp_path, reg.get("Market", "Trade"))
    # mode byte 0: raw file bytes (header included); 2|4: schema header supplied, frames re-sealed
    (corpus / "trade-raw").write_bytes(b"\x00" + trade)
    from disd.binlog import decode_header

    hsize = decode_header(trade).size
    (corpus / "trade-frames").write_bytes(b"\x06" + trade[hsize:])
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    r = subprocess.run(
        [sys.executable, str(HARNESS), "-runs=200000", "-max_total_time=6", "-rss_limit_mb=2048",
         f"-artifact_prefix={artifacts}/", str(corpus)],
        capture_output=True, text=True, timeout=120,
    )
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert not list(artifacts.iterdir()), tail
    # it really ran: libFuzzer reports how many inputs it executed
    assert "Done" in r.stderr and "runs in" in r.stderr, tail
