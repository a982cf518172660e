"""End to end on loopback with the real daemons: logger -> files -> dis-tailer -> dis serve -> client.

Durability is proved by SIGKILL: the DIS or the tailer is killed mid-stream and restarted, and
the final table must equal exactly the committed rows logged (no loss, no duplicates)."""

from __future__ import annotations

import threading
import time

import pytest

from disd.client import connect
from disd.logger import IntradayLoggerBuilder
from support import (ROOT, free_port_pair, start_dis_process, start_tailer, trade_rows, wait_for, write_dis_config,
                     write_tailer_config)

pytestmark = pytest.mark.slow
SCHEMA = ROOT / "config" / "schemas" / "Market.Trade.yaml"


def make_logger(log_dir, partition="2026-11-22", suffix=None):
    b = (IntradayLoggerBuilder(str(SCHEMA)).set_process_name("feed").set_log_dir(str(log_dir))
         .set_namespace_set("System").set_column_partition_value(partition).set_internal_partition("feed1"))
    if suffix:
        b = b.set_internal_partition_suffix(suffix)
    return b.build()


class Writer(threading.Thread):
    """Logs numbered rows: atomic batches, plain batches, and row-by-row transactions, including
    abandoned transactions whose rows must never appear."""

    def __init__(self, log, batches: int, rows: int, pause_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.log, self.batches, self.rows, self.pause_s = log, batches, rows, pause_s
        self.committed = 0
        self.error = None

    def run(self) -> None:
        try:
            for i in range(self.batches):
                if i % 5 == 4:
                    try:
                        with self.log.transaction():
                            self.log.log(Sym="GONE", Size=-1, Price=0.0)
                            raise RuntimeError("abandon")
                    except RuntimeError:
                        pass
                    with self.log.transaction():
                        for j in range(3):
                            self.log.log(Sym="TX", Price=1.0, Size=self.committed + j,
                                         Timestamp=1_763_800_000_000_000_000)
                    self.committed += 3
                else:
                    self.log.log_batch(trade_rows(self.committed, self.rows), atomic=(i % 2 == 0))
                    self.committed += self.rows
                time.sleep(self.pause_s)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def read_sizes(port: int) -> list[int]:
    with connect(f"127.0.0.1:{port}") as c:
        return c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist()


def rows_visible(port: int) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.locations("Market", "Trade"))


def test_rows_logged_are_read_back(tmp_path):
    port = free_port_pair()
    logs = tmp_path / "logs"
    logs.mkdir()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port))
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs))
    try:
        log = make_logger(logs)
        w = Writer(log, batches=10, rows=1000)
        w.run()
        log.close()
        assert w.error is None
        wait_for(lambda: rows_visible(port) == w.committed, 60, what=f"{w.committed} rows visible")
        assert read_sizes(port) == list(range(w.committed))
        with connect(f"127.0.0.1:{port}") as c:
            t = c.read_table("Market", "Trade")
        assert "GONE" not in set(t.column("Sym").to_pylist())
        assert t.column("Price").to_pylist()[:3] == [0.0, 0.25, 0.5]
    finally:
        assert tailer.terminate() == 0, tailer.log_text()[-2000:]
        assert dis.terminate() == 0, dis.log_text()[-2000:]


@pytest.mark.parametrize("victim", ["dis", "tailer"])
def test_kill9_mid_stream_loses_and_duplicates_nothing(tmp_path, victim):
    port = free_port_pair()
    logs = tmp_path / "logs"
    logs.mkdir()
    dis_cfg = write_dis_config(tmp_path, port)
    tailer_cfg = write_tailer_config(tmp_path, port, logs)
    dis = start_dis_process(tmp_path, dis_cfg)
    tailer = start_tailer(tmp_path, tailer_cfg)
    log = make_logger(logs)
    w = Writer(log, batches=60, rows=2000, pause_s=0.02)
    w.start()
    try:
        for _ in range(2):
            time.sleep(0.6)
            if victim == "dis":
                dis.kill9()
                time.sleep(0.3)
                dis = start_dis_process(tmp_path, dis_cfg)
            else:
                tailer.kill9()
                time.sleep(0.3)
                tailer = start_tailer(tmp_path, tailer_cfg)
        w.join(120)
        log.close()
        assert w.error is None, w.error
        wait_for(lambda: rows_visible(port) == w.committed, 90, what=f"{w.committed} rows visible")
        sizes = read_sizes(port)
        assert len(sizes) == w.committed
        assert sizes == list(range(w.committed))
    finally:
        tailer.terminate()
        dis.terminate()
