"""A DIS killed with ``kill -9`` loses what it had published but not checkpointed; a tailer whose
locations are stopped at a problem sends those rows, and tells of the problem, again as soon as
the restarted DIS answers, not a ``retry_refused_ms`` later.  Real ``dis serve`` and
``dis-tailer`` processes; three stopped locations: at a corrupt frame, before a file whose schema
change the rules refuse, and before a file the DIS refuses (a version-2 file in a version-1
location)."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

from disd.binlog import BinlogWriter, normalize_columns
from disd.schema import TableSchema
from server.versions_support import V2, V2_YAML, rows, schemas_dir
from support import (BIN, ROOT, TRADE, by_label, free_port, scrape, start_dis_process, start_tailer, wait_for,
                     write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

GARBAGE = b"\xde\xad\xbe\xef" * 25
ROWS = 2400
#: the tailer's retry period of a stopped location; everything must be back well before it
RETRY_MS = 60000
BACK_WITHIN_S = 12
NARROWED = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2, "columns": [
    {"name": c.name, "type": "short" if c.name == "Size" else c.type.value} for c in TRADE.columns]})


def name(ip: str, hour: int) -> str:
    return f"Market.Trade.System.{ip}.2026-11-22.bin.2026-11-22.{hour:02d}0000.000+0000"


def write(path, schema, start: int, n: int, frames: int = 24) -> int:
    with BinlogWriter(path, schema) as w:
        end = 0
        for part in np.array_split(np.arange(start, start + n), frames):
            end = w.write_rows(normalize_columns(schema, rows(schema, int(part[0]), len(part))),
                               np.full(len(part), 3, np.uint8))
        return end


def status(port: int) -> dict[str, dict]:
    r = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}", "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return {x["internal_partition"]: x for x in json.loads(r.stdout)["locations"]}


def test_rows_before_a_stopped_location_and_its_problem_are_back_at_once_after_a_kill9(tmp_path):
    port, dis_metrics = free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    corrupt_end = write(logs / name("corrupt", 9), TRADE, 0, ROWS)
    with open(logs / name("corrupt", 9), "ab") as f:
        f.write(GARBAGE)
    write(logs / name("narrowed", 9), TRADE, 0, ROWS)
    write(logs / name("narrowed", 10), NARROWED, ROWS, 10, frames=1)
    write(logs / name("newer", 9), TRADE, 0, ROWS)
    write(logs / name("newer", 10), V2, ROWS, 10, frames=1)
    expected = {"corrupt": f"corrupt binary log {name('corrupt', 9)} at byte {corrupt_end}: ",
                "narrowed": f"schema change from {name('narrowed', 9)} (version 1) to {name('narrowed', 10)} "
                            "(version 2) is not allowed",
                "newer": f"the DIS refuses the stream of {name('newer', 10)}: location Market/Trade/newer/2026-11-22 "
                         "is written in schema version 1"}
    # published at once, never checkpointed: a kill -9 takes every row back
    cfg = write_dis_config(tmp_path, port, dis_metrics, schemas=schemas_dir(tmp_path, "schemas", V2_YAML),
                           checkpoint_ms=3_600_000)
    dis = start_dis_process(tmp_path, cfg)
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs, retry_refused_ms=RETRY_MS,
                                                        max_backoff_ms=500))

    def everything_there():
        locs = status(port)
        if set(locs) != set(expected):
            return None
        for ip, text in expected.items():
            loc = locs[ip]
            problem = (loc["tailer_problem"] or {}).get("problem", "")
            if loc["rows"] != ROWS or not problem.startswith(text):
                return None
        return locs

    try:
        locs = wait_for(everything_there, 30, 0.2, "the rows and the problems")
        assert all(x["checkpointed_rows"] == 0 for x in locs.values()), locs
        time.sleep(1)  # the stopped locations are in their minute-long wait

        dis.kill9()
        dis = start_dis_process(tmp_path, cfg)
        restarted = time.monotonic()
        # the restarted DIS truncated every location back to its checkpoint: nothing
        locs = wait_for(everything_there, BACK_WITHIN_S, 0.2,
                        f"every row and problem back within {BACK_WITHIN_S} s of the restart "
                        f"(the retry period is {RETRY_MS / 1000:g} s)")
        took = time.monotonic() - restarted
        assert took < BACK_WITHIN_S
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {
            f"Market/Trade/{ip}/2026-11-22": 1.0 for ip in expected}
    finally:
        tailer_rc = tailer.terminate()
        dis_rc = dis.terminate()
    assert tailer_rc == 0 and dis_rc == 0
