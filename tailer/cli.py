"""``dis-tailer --config config/tailer.yaml``: run the tailer until SIGTERM/SIGINT.

Logs are structlog JSON lines on stderr (console rendering when stderr is a terminal, unless
``--json-logs``).  Under systemd (``Type=notify``, ``NOTIFY_SOCKET`` set) it sends READY=1 once
tailing, WATCHDOG=1 pings when ``WatchdogSec`` is set, and STOPPING=1 on shutdown.  Exit status:
0 after a signal, 2 on a configuration error, 1 when the metrics endpoint cannot listen.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING, Sequence

from disd.collector import settle_after_start

if TYPE_CHECKING:
    from disd.tailer.config import TailerConfig
    from disd.tailer.core import Tailer


def raise_open_files() -> None:
    """Raise the soft descriptor limit to the hard one: the tailer keeps the file it follows open
    for every location (10,000 locations, 10,000 descriptors), and a soft limit of 1,024 is a
    common default far below the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def start_tailing(cfg: "TailerConfig") -> "Tailer":
    """The tailer made, then the garbage collector's settings (``disd.collector.settle_after_start``:
    every object made so far out of its passes, its thresholds raised), then started; OSError if
    its metrics endpoint cannot listen.  Settled before the start, the streams, files and requests
    made afterwards are collected as before."""
    from disd.tailer.core import Tailer

    tailer = Tailer(cfg)
    settle_after_start()
    return tailer.start()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dis-tailer", description="stream binary logs to the DIS")
    p.add_argument("--config", default="config/tailer.yaml", help="tailer YAML (default: %(default)s)")
    p.add_argument("--json-logs", action="store_true", help="JSON log lines even on a terminal")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)

    import structlog

    from disd.config import ConfigError
    from disd.logconfig import configure_logging
    from disd.notify import Notifier, watchdog_interval_s
    from disd.tailer.config import load_tailer_config

    from disd.allocator import TAILER, tune_malloc

    tune_malloc(TAILER)  # its requests and the buffers under them are reused (disd.allocator)
    raise_open_files()
    configure_logging(json=True if args.json_logs else None, level=args.log_level)
    log = structlog.get_logger("disd.tailer")
    try:
        cfg = load_tailer_config(args.config)
    except ConfigError as e:
        print(f"dis-tailer: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received, stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    notifier = Notifier()
    try:
        tailer = start_tailing(cfg)
    except OSError as e:  # the metrics endpoint cannot listen
        print(f"dis-tailer: {e}", file=sys.stderr)
        return 1
    notifier.ready("tailing " + ", ".join(tailer.dirs))
    ping = watchdog_interval_s() if notifier.enabled else None
    while not stop.wait(ping or 1.0):
        # pinged only while the event loop that runs every location answers: a loop stuck in a
        # call stops the pings, and systemd restarts the tailer after WatchdogSec
        if ping and tailer.responsive(ping):
            notifier.watchdog()
        elif ping:
            log.warning("the event loop did not answer within the watchdog interval: no WATCHDOG=1 sent",
                        wait_s=ping)
    notifier.stopping()
    tailer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
