"""``dis-tailer --config config/tailer.yaml``: run the tailer until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dis-tailer", description="stream binary logs to the DIS")
    p.add_argument("--config", default="config/tailer.yaml")
    p.add_argument("--json-logs", action="store_true")
    args = p.parse_args(argv)

    from disd.config import ConfigError
    from disd.logs import configure_logging
    from disd.notify import Notifier
    from disd.tailer.config import load_tailer_config
    from disd.tailer.core import Tailer

    configure_logging(json=True if args.json_logs else None)
    try:
        cfg = load_tailer_config(args.config)
    except ConfigError as e:
        print(f"dis-tailer: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    notifier = Notifier()
    tailer = Tailer(cfg).start()
    notifier.ready("tailing " + ", ".join(cfg.log_dirs))
    while not stop.wait(1.0):
        pass
    notifier.stopping()
    tailer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
