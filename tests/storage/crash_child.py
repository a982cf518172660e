"""The writer process of the SIGKILL test.

Opens the location (recovering it), prints ``READY <committed rows>``, then ingests every log of
a directory from the location's resume point on, a few frames per call, with fast flush and
checkpoint clocks running, so a kill can land anywhere: mid-write, mid-flush, mid-fsync, between
the temp record and its rename.  Prints ``DONE <rows>`` when everything is ingested.

    python crash_child.py DB_ROOT LOG_DIR PAUSE_S SEED
"""

import pathlib
import random
import sys
import time

from disd.binlog import LogFileName, decode_frames
from disd.storage import ImportConfig, StorageEngine

from storage.util import KEY, SCHEMAS, TRADE, frames, sub_run


def main() -> None:
    db_root, log_dir, pause, seed = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    eng = StorageEngine(db_root, SCHEMAS, import_default=ImportConfig(flush_interval_ms=5, checkpoint_interval_ms=15))
    eng.start()
    loc = eng.location(KEY)
    if loc.in_error:
        print("ERROR", loc.error, flush=True)
        sys.exit(3)
    rp = loc.resume_point
    logs = sorted(log_dir.iterdir(), key=lambda p: LogFileName.parse(p.name).sort_key)
    todo = []  # (file name, bytes, frames) from the resume point on, scanned before READY
    started = rp.file_name is None
    for path in logs:
        if not started:
            if path.name != rp.file_name:
                continue  # wholly ingested before the resume point
            started = True
            todo.append((path.name, *frames(path, TRADE, rp.offset)))
        else:
            todo.append((path.name, *frames(path, TRADE)))
    print("READY", loc.committed_rows, flush=True)
    for name, data, run in todo:
        i = 0
        while i < len(run.starts):
            j = min(len(run.starts), i + rng.randint(1, 4))
            sub = sub_run(run, i, j)
            loc.ingest(name, sub, decode_frames(data, 0, sub, TRADE))
            i = j
            if pause:
                time.sleep(pause)
    eng.close()
    print("DONE", loc.committed_rows, flush=True)


if __name__ == "__main__":
    main()
