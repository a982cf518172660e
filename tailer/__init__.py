"""The tailer (``dis-tailer``): watches log directories and streams binary logs to the DIS.

    from disd.tailer import Tailer, parse_tailer_config
    t = Tailer(parse_tailer_config({"dis": "127.0.0.1:22021", "log_dirs": ["var/logs"]})).start()
    t.wait_idle(30); t.status(); t.stop()

See docs/tailer.md.
"""

from disd.tailer.config import TailerConfig, load_tailer_config, parse_tailer_config
from disd.tailer.core import Tailer

__all__ = ["Tailer", "TailerConfig", "load_tailer_config", "parse_tailer_config"]
