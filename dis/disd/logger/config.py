"""What a built logger runs with: ``LoggerConfig``, made by ``IntradayLoggerBuilder.build``."""

from __future__ import annotations

import datetime as dt
import pathlib
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from disd.binlog import NamespaceSet
from disd.logger.partition import PartitionFunction
from disd.schema import TableSchema


class Rollover(str, Enum):
    HOURLY = "hourly"
    DAILY = "daily"
    FIXED = "fixed"


@dataclass(frozen=True)
class LoggerConfig:
    schema: TableSchema
    process_name: str | None
    log_dir: pathlib.Path
    namespace_set: NamespaceSet
    internal_partition: str
    partition_value: str | None  # every row's column partition, when fixed
    partition_fn: PartitionFunction | None  # None when partition_value is set
    tz: dt.tzinfo
    rollover: Rollover
    fixed_stamp: dt.datetime | None  # names the files of Rollover.FIXED (None: the build time)
    queue_rows: int
    max_open_files: int
    write_delay: float  # seconds
    clock: Callable[[], dt.datetime]

    @property
    def by_write_time(self) -> bool:
        """Rows go to the date partition of the time they are written."""
        return self.partition_value is None and self.partition_fn is None
