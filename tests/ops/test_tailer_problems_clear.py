"""A tailer problem clears as soon as its cause is gone, with ``dis serve``, ``dis-tailer`` and logger
processes: a version-2 file logged into a version-1 location (refused by the DIS) moved out of
the log directory, the file of a schema change the rules refuse moved out, a file with a corrupt
frame removed, another repaired by replacing it, and a misnamed file removed.  Each location then
goes on with its other files, and ``dis status --json`` and ``dis_location_tailer_problem`` say
so within seconds, although the tailer looks at a stopped location again only every minute
(``retry_refused_ms``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from disd.binlog import BinlogWriter, normalize_columns
from server.versions_support import V2_YAML, schemas_dir
from disd.schema import TableSchema
from support import (BIN, ROOT, SCHEMAS, TESTS, TRADE, by_label, free_port, scrape, start_dis_process, start_tailer,
                     subprocess_env, wait_for, write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

GARBAGE = b"\xde\xad\xbe\xef" * 25
#: how long after its cause is gone a problem may still be shown (the retry period is 60 s)
CLEARS_WITHIN_S = 10
#: Market.Trade version 2 with Size narrowed from int to short: a change the rules refuse
NARROWED = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2, "columns": [
    {"name": c.name, "type": "short" if c.name == "Size" else c.type.value} for c in TRADE.columns]})


def loc(ip: str) -> str:
    return f"Market/Trade/{ip}/2026-11-22"


def name(ip: str, hour: int) -> str:
    return f"Market.Trade.System.{ip}.2026-11-22.bin.2026-11-22.{hour:02d}0000.000+0000"


def status(port: int) -> dict:
    r = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}", "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def by_location(rep: dict) -> dict[str, dict]:
    return {loc(x["internal_partition"]): x for x in rep["locations"]}


def log_rows(schema, log_dir, ip: str, start: int, n: int) -> None:
    """A logger process writing ``n`` rows into ``log_dir`` (a new file: a new process)."""
    r = subprocess.run([sys.executable, str(TESTS / "ops" / "log_rows.py"), str(schema), str(log_dir), ip,
                        str(start), str(n)], capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert r.returncode == 0, r.stdout + r.stderr


def write(path, schema, start: int, n: int) -> int:
    with BinlogWriter(path, schema) as w:
        return w.write_rows(normalize_columns(schema, {"Size": np.arange(start, start + n)}),
                            np.full(n, 3, np.uint8))


def test_every_kind_of_problem_clears_within_seconds_once_its_cause_is_gone(tmp_path):
    port, dis_metrics = free_port(), free_port()
    v2_schemas = schemas_dir(tmp_path, "schemas-v2", V2_YAML)  # the DIS declares versions 1 and 2
    v1_yaml, v2_yaml = SCHEMAS / "Market.Trade.yaml", v2_schemas / "Market.Trade.yaml"
    app, other, away = tmp_path / "app-logs", tmp_path / "logs", tmp_path / "away"
    for d in (app, other, away):
        d.mkdir()
    # ip2: a change the rules refuse (Size int -> short), a version-1 file waiting behind it
    write(other / name("ip2", 9), TRADE, 0, 3)
    write(other / name("ip2", 10), NARROWED, 3, 2)
    write(other / name("ip2", 11), TRADE, 5, 2)
    # ip3: a corrupt frame at the end of its last file
    write(other / name("ip3", 9), TRADE, 0, 4)
    write(other / name("ip3", 10), TRADE, 4, 3)
    with open(other / name("ip3", 10), "ab") as f:
        f.write(GARBAGE)
    # ip4: a corrupt frame, and a misnamed file
    ip4_end = write(other / name("ip4", 9), TRADE, 0, 2)
    with open(other / name("ip4", 9), "ab") as f:
        f.write(GARBAGE)
    bak = other / (name("ip4", 12) + ".bak")
    write(bak, TRADE, 100, 1)

    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port, dis_metrics, schemas=v2_schemas,
                                                        checkpoint_ms=200))
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, [], log_dirs=[str(app), str(other)],
                                                        retry_refused_ms=60000, max_backoff_ms=500))
    try:
        # ip1, as the user did: a version-1 application, then a version-2 build of it logging into
        # the same internal partition (no version suffix): the DIS refuses its file
        log_rows(v1_yaml, app, "ip1", 0, 300)
        wait_for(lambda: by_location(status(port)).get(loc("ip1"), {}).get("rows") == 300, 30, 0.2,
                 what="the version-1 rows")
        before = set(app.iterdir())
        log_rows(v2_yaml, app, "ip1", 300, 200)
        (v2_file,) = set(app.iterdir()) - before

        seen: list[dict] = [{}]

        def shown():
            locs = by_location(status(port))
            problems = seen[0] = {k: (v["tailer_problem"] or {}).get("problem", "") for k, v in locs.items()}
            ok = (problems.get(loc("ip1"), "").startswith(f"the DIS refuses the stream of {v2_file.name}: ")
                  and "is not allowed: Market.Trade version 1 -> 2: column 'Size'" in problems.get(loc("ip2"), "")
                  and f"corrupt binary log {name('ip3', 10)} at byte" in problems.get(loc("ip3"), "")
                  and f"corrupt binary log {name('ip4', 9)} at byte {ip4_end}" in problems.get(loc("ip4"), "")
                  and f"file {bak.name} is not streamed: unexpected suffix '.bak'" in problems.get(loc("ip4"), ""))
            return locs if ok else None

        try:
            locs = wait_for(shown, 30, 0.3, "every problem shown")
        except AssertionError:
            raise AssertionError(f"not every problem shown: {seen[0]}") from None
        assert {k: v["rows"] for k, v in locs.items()} == {loc("ip1"): 300, loc("ip2"): 3, loc("ip3"): 7,
                                                           loc("ip4"): 2}
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {
            loc("ip1"): 1.0, loc("ip2"): 1.0, loc("ip3"): 1.0, loc("ip4"): 1.0}
        time.sleep(1)  # the tailer's stopped locations are now in their minute-long wait

        # the causes go, as docs/tailer.md says: files moved out of the log directory, removed,
        # or replaced by a repaired copy
        os.rename(v2_file, away / v2_file.name)
        os.rename(other / name("ip2", 10), away / name("ip2", 10))
        (other / name("ip3", 10)).unlink()
        bak.unlink()
        repaired = away / name("ip4", 9)
        repaired.write_bytes((other / name("ip4", 9)).read_bytes()[:ip4_end])
        write(repaired, TRADE, 2, 3)
        os.rename(repaired, other / name("ip4", 9))
        log_rows(v1_yaml, app, "ip1", 300, 500)  # the version-1 application goes on
        fixed = time.monotonic()

        def cleared():
            rep = status(port)
            locs = by_location(rep)
            seen[0] = {k: (v["rows"], (v["tailer_problem"] or {}).get("problem")) for k, v in locs.items()}
            if any(v["tailer_problem"] for v in locs.values()):
                return None
            return rep if {k: v["rows"] for k, v in locs.items()} == {
                loc("ip1"): 800, loc("ip2"): 5, loc("ip3"): 7, loc("ip4"): 5} else None

        try:
            rep = wait_for(cleared, CLEARS_WITHIN_S, 0.3, "every problem cleared")
        except AssertionError:
            raise AssertionError(f"not cleared within {CLEARS_WITHIN_S} s: (rows, problem) {seen[0]}") from None
        took = time.monotonic() - fixed
        assert rep["tables"][0]["errors"] == 0 and rep["tables"][0]["tailer_problems"] == 0
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {
            loc("ip1"): 0.0, loc("ip2"): 0.0, loc("ip3"): 0.0, loc("ip4"): 0.0}, took

        # and it stays cleared: the tailer does not tell a restarted DIS of the removed files
        assert dis.terminate() == 0
        dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port, dis_metrics, schemas=v2_schemas,
                                                            checkpoint_ms=200))
        wait_for(lambda: by_location(status(port)).get(loc("ip1"), {}).get("tailer") is not None, 20, 0.3,
                 "the tailer back on the restarted DIS")
        time.sleep(2)
        assert not any(v["tailer_problem"] for v in by_location(status(port)).values())
    finally:
        tailer_rc = tailer.terminate()
        dis_rc = dis.terminate()
    assert tailer_rc == 0 and dis_rc == 0


def test_a_log_truncated_below_what_was_sent_is_a_problem_until_it_is_moved_away(tmp_path):
    """A followed log cut shorter than what the DIS already has of it: the tailer warns once (the
    file, its size, the offset sent), reports it (TAILER PROBLEM), and sends nothing more of it,
    not again from the start and not what a writer puts there again; the location goes on with
    its newer files, and the problem clears once the file is moved out of the log directory."""
    port, dis_metrics = free_port(), free_port()
    logs, away = tmp_path / "logs", tmp_path / "away"
    logs.mkdir()
    away.mkdir()
    f1 = logs / name("ip1", 9)
    with BinlogWriter(f1, TRADE) as w:
        for i in range(10):
            sent = w.write_rows(normalize_columns(TRADE, {"Size": np.arange(i * 10, i * 10 + 10)}),
                                np.full(10, 3, np.uint8))
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port, dis_metrics, checkpoint_ms=200))
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs, retry_refused_ms=60000,
                                                        max_backoff_ms=500))

    def ip1() -> dict:
        return by_location(status(port)).get(loc("ip1"), {})

    try:
        wait_for(lambda: ip1().get("rows") == 100, 30, 0.2, "the file's rows")
        os.truncate(f1, sent // 2)  # a writer that reopened the file with O_TRUNC, or an operator
        problem = (f"log {f1.name} was truncated to {sent // 2} bytes, below the {sent} bytes of it already sent "
                   "to the DIS: nothing more of it is sent")
        shown = wait_for(lambda: (ip1().get("tailer_problem") or {}).get("problem", "").startswith(problem) and ip1(),
                         CLEARS_WITHIN_S, 0.2, "the truncation shown in dis status")
        assert shown["rows"] == 100
        # a writer writes it anew, past the old end (the same inode): none of it is sent (the bytes
        # at the old offset belong to other rows now), and nothing is sent again
        anew = away / "anew"
        for i in range(30):
            write(anew, TRADE, 1000 + i * 10, 10)
        assert anew.stat().st_size > sent
        f1.write_bytes(anew.read_bytes())
        write(logs / name("ip1", 10), TRADE, 100, 5)  # a newer file: the location goes on
        wait_for(lambda: ip1().get("rows") == 105, CLEARS_WITHIN_S, 0.2, "the newer file's rows")
        time.sleep(1)
        st = ip1()
        assert st["rows"] == 105 and st["error"] is None and st["tailer_problem"]["problem"].startswith(problem), st
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {loc("ip1"): 1.0}
        warned = [e for e in map(json.loads, filter(lambda line: line.startswith("{"), tailer.log_text().splitlines()))
                  if "truncated" in e["event"]]
        assert [(e["level"], e["file"], e["size"], e["sent_offset"]) for e in warned] == [
            ("warning", str(f1), sent // 2, sent)], warned

        os.rename(f1, away / f1.name)
        wait_for(lambda: ip1().get("tailer_problem") is None, CLEARS_WITHIN_S, 0.2, "the problem cleared")
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {loc("ip1"): 0.0}
        assert ip1()["rows"] == 105
    finally:
        tailer_rc = tailer.terminate()
        dis_rc = dis.terminate()
    assert tailer_rc == 0 and dis_rc == 0
