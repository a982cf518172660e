"""A merge that SIGKILLs itself at a named step: the publishing half of the kill test.

    python kill_child.py DB_ROOT VALUE STEP       (STEP "none": run to the end)

Spark's writer is replaced by pyarrow (the checkpointed column files decoded with
``disd.storage.columns`` and written as Spark names its part files, with its markers), so the
child starts in a second and every step of ``disd.historical.merge`` after the write is the real
code.  The Spark job itself is killed at random points in test_merge_spark_kill.py.  Prints
``RESULT <status> <rows>`` when it completes.
"""

import os
import signal
import sys
import uuid

import pyarrow.parquet as pq

from disd.historical import merge as m
from disd.historical.intraday import checkpointed_locations
from disd.storage.columns import decode_table

from support import SCHEMAS as SCHEMAS_DIR


def main() -> None:
    db_root, value, kill_at = sys.argv[1], sys.argv[2], sys.argv[3]

    def step(name: str) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def pyarrow_writer(spark, req, snap, sort_by, staging):  # merge.write_staging's signature
        staging.mkdir()
        for i, loc in enumerate(checkpointed_locations(req.db_root, snap.schema, lambda v: v == req.value)):
            files = {}
            for name, size in loc.files.items():
                with open(os.path.join(loc.path, name), "rb") as f:
                    files[name] = f.read(size)
            name = f"part-{i:05d}-{uuid.uuid4()}-c000.snappy.parquet"
            pq.write_table(decode_table(snap.schema, files, loc.rows), staging / name, row_group_size=4096)
            (staging / f".{name}.crc").write_bytes(b"")
            step("writing")
        (staging / "_SUCCESS").write_bytes(b"")

    m.write_staging = pyarrow_writer
    req = m.MergeRequest("Market", "Trade", value, db_root, m.IntradaySource(schemas=str(SCHEMAS_DIR)), quiet_s=0)
    r = m.merge(None, req, step)
    print("RESULT", r.status, r.rows, flush=True)


if __name__ == "__main__":
    main()
