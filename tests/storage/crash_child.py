"""A writer process for the kill -9 test: resumes a location from its checkpoint and ingests the
rest of a log frame by frame, with fast flush and checkpoint clocks running."""

import pathlib
import sys
import time

from disd.binlog import decode_frames, decode_header, scan_frames
from disd.storage import ImportConfig, StorageEngine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from storage.util import KEY, SCHEMAS, TRADE  # noqa: E402


def main() -> None:
    db_root, log_path, pause = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3])
    eng = StorageEngine(db_root, SCHEMAS, import_default=ImportConfig(flush_interval_ms=5, checkpoint_interval_ms=15))
    eng.start()
    loc = eng.location(KEY)
    rp = loc.resume_point
    data = log_path.read_bytes()
    hdr = decode_header(data)
    start = rp.offset if rp.file_name == log_path.name else hdr.size
    run = scan_frames(data, 0, TRADE, start=start)
    for i in range(len(run.starts)):
        sub = type(run)(base=0, starts=run.starts[i:i + 1], ends=run.ends[i:i + 1],
                        row_counts=run.row_counts[i:i + 1], end_offset=run.ends[i])
        loc.ingest(log_path.name, sub, decode_frames(data, 0, sub, TRADE))
        time.sleep(pause)
    eng.close()
    print("DONE", loc.committed_rows, flush=True)


if __name__ == "__main__":
    main()
