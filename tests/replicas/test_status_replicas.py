"""``dis status --routing`` over a replica set of real ``dis serve`` processes (docs/replicas.md,
"Status, metrics and alerts"): a location is counted once however many replicas hold it, with the
most advanced replica's rows (as ``dis ls --routing`` lists it); a replica whose location is in
error shows that error as its health, and the exit status says so (README, "Tools")."""

from __future__ import annotations

import json
import subprocess

from support import BIN, start_dis_process, wait_for

from .readers_support import published, replica_set, write_logs

ROWS = 1500
LOCATIONS = 3


def dis_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dis"), *args], capture_output=True, text=True, timeout=60)


def table_line(text: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith("Market.Trade  "))


def checkpointed(address: str) -> bool:
    from disd.client import connect

    with connect(address, retry_s=0) as c:
        locs = c.status().locations
    return len(locs) == LOCATIONS and all(loc.checkpointed_rows == ROWS for loc in locs)


def test_status_routing_counts_a_replica_set_once_and_a_location_in_error_is_not_ok(tmp_path):
    rs = replica_set(tmp_path)
    try:
        total = write_logs(rs.logs, LOCATIONS, ROWS)
        for r in rs.replicas:
            wait_for(lambda r=r: published(r.address) == total and checkpointed(r.address), 60, 0.1,
                     f"{total} rows checkpointed at {r.name}")

        # Both replicas healthy: each location once, with its rows once; exit 0.
        st = dis_cli("status", "--routing", str(rs.routing))
        assert st.returncode == 0, st.stdout + st.stderr
        assert table_line(st.stdout) == ["Market.Trade", str(LOCATIONS), str(total), f"{LOCATIONS}/{LOCATIONS}", "0"]
        ls = dis_cli("ls", "--routing", str(rs.routing))
        assert f"({LOCATIONS} locations, {total} rows)" in ls.stdout, ls.stdout
        st = dis_cli("status", "--routing", str(rs.routing), "--json")
        assert st.returncode == 0, st.stderr
        rep = json.loads(st.stdout)
        assert rep["ok"] is True
        assert rep["tables"] == [{"table": "Market.Trade", "locations": LOCATIONS, "rows": total,
                                  "tailers": LOCATIONS, "errors": 0, "tailer_problems": 0}]
        # the per-replica detail stays: every location at every replica
        assert len(rep["locations"]) == 2 * LOCATIONS
        assert {(r["health"], r["rows"], r["lag"]) for r in rep["replicas"]["locations"]} == {("ok", ROWS, 0)}

        # Break one location of dis-b: stop it, cut a column file below its checkpoint, restart.
        b = rs.replicas[1]
        b.tailer.kill9()
        b.proc.kill9()
        loc_dir = next(p.parent for p in (b.dir / "db").rglob("table.size") if "feed0" in str(p)
                       and "2026-11-22" in str(p))
        size_file = loc_dir / "Size.dat"
        size_file.write_bytes(size_file.read_bytes()[:-100])  # 4-byte ints: 6000 bytes checkpointed
        broken = "Market.Trade/feed0/2026-11-22"
        verify = dis_cli("verify", "--config", str(b.config))
        assert verify.returncode == 1 and "BAD" in verify.stdout, verify.stdout + verify.stderr
        b.proc = start_dis_process(b.dir, b.config)

        st = dis_cli("status", "--routing", str(rs.routing))
        assert st.returncode == 1, st.stdout + st.stderr
        assert "Traceback" not in st.stdout + st.stderr
        # still counted once, at the rows of the replica that has them; the error counted
        assert table_line(st.stdout)[:3] == ["Market.Trade", str(LOCATIONS), str(total)]
        assert table_line(st.stdout)[4] == "1"
        lines = st.stdout.splitlines()
        # the location's line of dis-b, and its replica line: the error, not "ok"
        row = next(line for line in lines if line.split()[:2] == [broken, b.address])
        assert "column file Size.dat has 5900 bytes, fewer than the 6000 checkpointed" in row, row
        row = next(line for line in lines if line.startswith(broken) and " dis-b " in line)
        assert row.split()[2:6] == [b.address, "0", str(ROWS), "ERROR:"], row
        assert row.endswith("column file Size.dat has 5900 bytes, fewer than the 6000 checkpointed"), row
        assert next(line for line in st.stdout.splitlines() if line.startswith("market ") and "dis-b" in line).endswith(
            "ERROR: 1 location in error")
        st = dis_cli("status", "--routing", str(rs.routing), "--json")
        assert st.returncode == 1
        rep = json.loads(st.stdout)
        assert rep["ok"] is False
        assert rep["tables"][0]["locations"] == LOCATIONS and rep["tables"][0]["rows"] == total
        assert rep["tables"][0]["errors"] == 1
        by = {(f"{r['namespace']}.{r['table']}/{r['internal_partition']}/{r['column_partition']}", r["replica"]): r
              for r in rep["replicas"]["locations"]}
        bad = by[(broken, "dis-b")]
        assert bad["health"] == "error" and "column file Size.dat has 5900 bytes" in bad["error"], bad
        assert [r["locations_in_error"] for r in rep["replicas"]["entries"][0]["replicas"]] == [0, 1]
        assert by[(broken, "dis-a")]["health"] == "ok" and by[(broken, "dis-a")]["error"] is None
        assert all(r["health"] == "ok" for k, r in by.items() if k[0] != broken)

        # A plain --address of the healthy replica: exit 0; of the broken one: exit 1.
        assert dis_cli("status", "--address", rs.replicas[0].address).returncode == 0
        assert dis_cli("status", "--address", b.address).returncode == 1
    finally:
        rs.stop()
