"""The tailer: watches binary log directories and streams them to the DIS over gRPC."""

from disd.tailer.config import TailerConfig, load_tailer_config, parse_tailer_config
from disd.tailer.core import Tailer

__all__ = ["Tailer", "TailerConfig", "load_tailer_config", "parse_tailer_config"]
