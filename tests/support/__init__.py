"""The helpers the tests share, one of each: paths, waiting, Market.Trade rows and logs, a DIS in
this process or as a real ``dis serve`` process (both from one config writer), and Prometheus
samples.  ``tests/`` is on ``sys.path`` (the rootdir conftest), so tests import ``support``."""

from .dis import Feeder, dis_config, dis_settings, loaded_dis, running_dis, start_dis_server, write_dis_config
from .metrics import by_label, sample, scrape
from .paths import BIN, ROOT, SCHEMAS, TESTS
from .processes import (Proc, dis_healthy, free_port, free_port_pair, start_dis_process, start_tailer, subprocess_env,
                        write_tailer_config)
from .rows import (ALL_TYPES, CHAR_CODES, CHAR_STRINGS, START_NS, SYMS, TRADE, append_rows, log_name, quote_rows,
                   trade_rows, write_log)
from .waiting import wait_for

__all__ = [
    "ALL_TYPES", "BIN", "CHAR_CODES", "CHAR_STRINGS", "ROOT", "SCHEMAS", "START_NS", "SYMS", "TESTS", "TRADE",
    "append_rows", "by_label", "dis_config", "dis_healthy", "dis_settings", "Feeder", "free_port", "free_port_pair",
    "loaded_dis", "log_name", "Proc", "quote_rows", "running_dis", "sample", "scrape", "start_dis_process",
    "start_dis_server", "start_tailer", "subprocess_env", "trade_rows", "wait_for", "write_dis_config", "write_log",
    "write_tailer_config",
]
