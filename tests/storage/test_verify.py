"""``dis verify``: offline checks of every location against its checkpoint."""

from __future__ import annotations

import os

from disd.storage import StorageEngine
from disd.storage.checkpoint import FILE_NAME
from disd.storage.verify import verify_db
from support import ROOT, trade_rows, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file


def test_verify_reports_good_and_damaged_locations(tmp_path):
    db = tmp_path / "db"
    eng = StorageEngine(str(db), SCHEMAS)
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 100), [3] * 100)
    loc = eng.location(KEY)
    ingest_file(loc, tmp_path / LOG)
    eng.close()
    schemas = str(ROOT / "config" / "schemas")
    res = verify_db(str(db), schemas)
    assert res["ok_count"] == 1 and res["bad_count"] == 0 and res["locations"][0]["rows"] == 100
    os.truncate(loc.path / "Sym.dat", 10)
    res = verify_db(str(db), schemas)
    assert res["bad_count"] == 1 and "Sym.dat" in res["locations"][0]["problems"][0]
    os.unlink(loc.path / FILE_NAME)
    res = verify_db(str(db), schemas)
    assert res["bad_count"] == 1 and "table.size is missing" in res["locations"][0]["problems"][0]
