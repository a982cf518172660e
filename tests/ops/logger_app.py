"""An application that logs Market.Trade rows as the logger's users do, for tests with real
processes: ``python logger_app.py LOG_DIR START COUNT PROCESS_NAME [refuse|new_partition]``.

It builds its logger, prints ``built <internal partition>`` (the location is held from then on),
logs rows ``START .. START+COUNT-1`` (``support.trade_rows``: Size = the row's number) 100 at a
time, 0.1 s apart, and closes.  A location another logger holds: the error on stderr, exit 3."""

from __future__ import annotations

import sys
import time

from disd.logger import IntradayLoggerBuilder, LocationInUseError
from support import SCHEMAS, trade_rows


def main() -> int:
    log_dir, start, count, process_name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mode = sys.argv[5] if len(sys.argv) > 5 else "refuse"
    builder = (IntradayLoggerBuilder(SCHEMAS / "Market.Trade.yaml").set_process_name(process_name)
               .set_log_dir(log_dir).set_column_partition_value("2026-11-22").set_on_location_in_use(mode))
    try:
        log = builder.build()
    except LocationInUseError as e:
        print(e, file=sys.stderr, flush=True)
        return 3
    print("built", log.internal_partition, flush=True)
    for i in range(start, start + count, 100):
        log.log_batch(trade_rows(i, min(100, start + count - i)))
        time.sleep(0.1)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
