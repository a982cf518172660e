"""Schema versions on the tailer's side: a location whose files change version reopens its stream
for the new version; a change the rules refuse (``disd.schemaversions``) stops the location
before the file, reported, rows kept, until the file is replaced; a DIS that refuses the new
version (FAILED_PRECONDITION) keeps the rows in the log, and its message becomes the location's
problem, told to the DIS through a stream of the previous version."""

from __future__ import annotations

import grpc
import pytest

from disd.binlog import read_file
from disd.schema import TableSchema
from disd.tailer import Tailer
from support import TRADE, wait_for

from .fakedis import FakeDis
from .helpers import config, name, sizes_from_rows, write

LOC = "Market/Trade/ip1/2026-11-22"
LOC2 = "Market/Trade/ip2/2026-11-22"


def trade(version: int, size: str = "int", venue: bool = False) -> TableSchema:
    cols = [{"name": c.name, "type": size if c.name == "Size" else c.type.value} for c in TRADE.columns]
    if venue:
        cols.append({"name": "Venue", "type": "string"})
    return TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": version, "columns": cols})


V1 = trade(1)
V2 = trade(2, size="long", venue=True)  # allowed: Size widens, Venue is added
NARROWED = trade(2, size="short")  # refused: int -> short


@pytest.fixture
def dis():
    d = FakeDis(accepts_reports=True).start()
    yield d
    d.stop()


def rows_of(st, file_name):
    return sizes_from_rows(bytes(st.data[file_name])) if file_name in st.data else []


def test_files_going_from_version_1_to_2_reopen_the_stream_with_the_new_version(tmp_path, dis):
    write(tmp_path / name(hour=9), 3, 0, schema=V1)
    write(tmp_path / name(hour=10), 3, 3, schema=V2)
    # a version with the same columns as the one before still gets its own stream
    write(tmp_path / name(hour=11), 2, 6, schema=trade(3, size="long", venue=True))
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
        assert t.status()[LOC]["problem"] is None
    st = dis.log_of("ip1")
    assert list(dict.fromkeys(st.opens)) == [V1.fingerprint, V2.fingerprint], st.opens
    assert list(dict.fromkeys(st.open_versions)) == [1, 2, 3], st.open_versions
    assert rows_of(st, name(hour=9)) == [0, 1, 2] and rows_of(st, name(hour=10)) == [3, 4, 5]
    assert rows_of(st, name(hour=11)) == [6, 7]
    assert not dis.errors and all(r == "" for r in st.reports)


@pytest.mark.parametrize("first,second,older,newer", [(V1, NARROWED, 1, 2), (trade(2, size="short"), V1, 1, 2)],
                         ids=["narrowed", "lower-version-after-a-higher"])
def test_a_refused_schema_change_stops_the_location_reported_and_keeps_the_rows(tmp_path, dis, first, second,
                                                                              older, newer):
    f1, f2 = name(hour=9), name(hour=10)
    write(tmp_path / f1, 3, 0, schema=first)
    write(tmp_path / f2, 3, 3, schema=second)
    bad = (tmp_path / f2).read_bytes()
    write(tmp_path / name(ip="ip2"), 2, 0, schema=V1)  # another location goes on meanwhile
    with Tailer(config(dis.address, tmp_path)) as t:
        report = wait_for(lambda: (lambda r: r if r and "not allowed" in r else None)(
            (dis.log_of("ip1").reports or [None])[-1]), 20, what="the refused change reported")
        assert report.startswith(f"schema change from {f1} (version {first.version}) to {f2} "
                                 f"(version {second.version}) is not allowed: Market.Trade version {older} -> "
                                 f"{newer}: column 'Size': "), report
        assert "narrows" in report and report.endswith(f"the location stops before {f2}, its rows kept"), report
        st = t.status()[LOC]
        assert st["state"] == "refused" and st["problem"] == report and st["error"] == report, st
        # looked at again (and told again) without crashing; nothing of the file is sent
        n = len(dis.log_of("ip1").reports)
        wait_for(lambda: len(dis.log_of("ip1").reports) > n, 20, what="reported again")
        assert rows_of(dis.log_of("ip1"), f1) == [0, 1, 2] and f2 not in dis.log_of("ip1").data
        assert rows_of(dis.log_of("ip2"), name(ip="ip2")) == [0, 1]
        assert not t.wait_idle(0.5)  # rows are waiting: never counted as done
        assert all(w.is_alive() for w in t.workers())
        assert (tmp_path / f2).read_bytes() == bad  # the rows are kept
        # the operator replaces the file with one of an allowed schema: the location goes on
        (tmp_path / f2).unlink()
        write(tmp_path / f2, 3, 3, schema=trade(newer, size="long"))
        assert t.wait_idle(20)
        wait_for(lambda: dis.log_of("ip1").reports[-1] == "", 20, what="the problem resolved")
        assert t.status()[LOC]["problem"] is None
    assert rows_of(dis.log_of("ip1"), f2) == [3, 4, 5]
    assert not dis.errors


def test_a_version_the_dis_refuses_keeps_its_rows_and_the_refusal_is_the_locations_problem(tmp_path):
    refusal = ("location Market/Trade/ip1/2026-11-22 is written in version 1 of Market.Trade, the log is "
               "version 2: put each version in its own internal partition")
    dis = FakeDis(accepts_reports=True,
                  refuse_versions={2: (grpc.StatusCode.FAILED_PRECONDITION, refusal)}).start()
    try:
        f1, f2 = name(hour=9), name(hour=10)
        write(tmp_path / f1, 3, 0, schema=V1)
        write(tmp_path / f2, 3, 3, schema=V2)
        with Tailer(config(dis.address, tmp_path)) as t:
            report = wait_for(lambda: (lambda r: r if r and "refuses" in r else None)(
                (dis.log_of("ip1").reports or [None])[-1]), 20, what="the refusal reported")
            assert report == (f"the DIS refuses the stream of {f2}: {refusal}; its rows stay in the log and are "
                              "sent once the DIS takes them"), report
            assert t.status()[LOC]["problem"] == report
            assert rows_of(dis.log_of("ip1"), f1) == [0, 1, 2] and f2 not in dis.log_of("ip1").data
            # retried: version 2 again, each time after a stream of version 1 that reports
            wait_for(lambda: dis.log_of("ip1").open_versions.count(2) >= 3, 20, what="retries")
            assert f2 not in dis.log_of("ip1").data
            assert read_file(tmp_path / f2).table.column("Size").to_pylist() == [3, 4, 5]
            dis.refuse_versions.clear()  # the DIS now takes version 2 (declared, restarted)
            assert t.wait_idle(20)
            wait_for(lambda: dis.log_of("ip1").reports[-1] == "", 20, what="the problem resolved")
            assert t.status()[LOC]["problem"] is None
        assert rows_of(dis.log_of("ip1"), f2) == [3, 4, 5]
        assert not dis.errors
    finally:
        dis.stop()


def test_the_real_dis_shows_its_refusal_of_a_newer_version_as_the_tailer_problem(tmp_path, capsys):
    """A real DIS that holds Market.Trade version 1 only refuses a version 2 log with
    FAILED_PRECONDITION: ``dis status`` shows the refusal as the location's TAILER PROBLEM, the
    version 1 rows are in, and the version 2 file is left as it was."""
    import json

    from disd.cli import main
    from support import running_dis

    logs = tmp_path / "logs"
    logs.mkdir()
    f1, f2 = name(hour=9), name(hour=10)
    write(logs / f1, 3, 0, schema=V1)
    write(logs / f2, 2, 3, schema=trade(2, venue=True))
    before = (logs / f2).read_bytes()
    with running_dis(tmp_path / "db") as srv, Tailer(config(f"127.0.0.1:{srv.port}", logs)) as t:
        def shown():
            capsys.readouterr()
            assert main(["status", "--address", f"127.0.0.1:{srv.port}", "--json"]) == 0
            loc = json.loads(capsys.readouterr().out)["locations"][0]
            return loc if loc["tailer_problem"] and loc["rows"] == 3 else None

        loc = wait_for(shown, 30, what="the refusal shown by dis status")
        problem = loc["tailer_problem"]["problem"]
        assert problem.startswith(f"the DIS refuses the stream of {f2}: "), problem
        assert "schema version 2 of Market.Trade in the log is newer than the version the DIS declares (1)" in problem
        assert problem.endswith("its rows stay in the log and are sent once the DIS takes them")
        assert t.status()[LOC]["problem"] == problem
        assert not t.wait_idle(0.5)  # the version 2 rows wait in their file
    assert (logs / f2).read_bytes() == before
