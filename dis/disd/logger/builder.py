"""IntradayLoggerBuilder: configures a logger, then ``build()`` starts it."""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import socket
import zoneinfo
from typing import Any, Callable, Sequence

from disd.logger.errors import LoggerValueError, LoggerTypeError
from disd.binlog import NamespaceSet
from disd.logger.api import IntradayLogger
from disd.logger.config import LoggerConfig, Rollover
from disd.logger.versions import check_log_dir
from disd.logger.ownership import OnLocationInUse, claim_location
from disd.logger.partition import PartitionFunction
from disd.names import NameKind, legalize, validate_name
from disd.schema import TableSchema, coerce_schema

_DEFAULT_QUEUE_ROWS = 1 << 18
_DEFAULT_MAX_OPEN_FILES = 128
_DEFAULT_WRITE_DELAY = 0.002  # seconds


def _system_clock() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class IntradayLoggerBuilder:
    """Configures and builds an IntradayLogger; every setter returns the builder."""

    def __init__(self, schema: TableSchema | str | os.PathLike[str]) -> None:
        self._schema = coerce_schema(schema if isinstance(schema, TableSchema) else pathlib.Path(schema))
        self._process_name: str | None = None
        self._log_dir: pathlib.Path = pathlib.Path("var/logs")
        self._namespace_set = NamespaceSet.SYSTEM
        self._partition_value: str | None = None
        self._partition_fn: PartitionFunction | None = None
        self._tz: dt.tzinfo = dt.timezone.utc
        self._internal_partition: str | None = None
        self._suffix: str | None = None
        self._format_suffix: str | None = None
        self._version_suffix = False
        self._rollover = Rollover.HOURLY
        self._fixed_stamp: dt.datetime | None = None
        self._queue_rows = _DEFAULT_QUEUE_ROWS
        self._max_open = _DEFAULT_MAX_OPEN_FILES
        self._linger = _DEFAULT_WRITE_DELAY
        self._clock: Callable[[], dt.datetime] = _system_clock
        self._host_name: Callable[[], str] = socket.gethostname
        self._on_in_use = OnLocationInUse.REFUSE

    def set_process_name(self, name: str) -> "IntradayLoggerBuilder":
        """Names the writing process; prefixes an internal partition taken from the host name."""
        if not isinstance(name, str) or not name:
            raise LoggerValueError("process name must be a non-empty string")
        self._process_name = name
        return self

    def set_log_dir(self, path: str | os.PathLike[str]) -> "IntradayLoggerBuilder":
        self._log_dir = pathlib.Path(path)
        return self

    def set_namespace_set(self, value: str | NamespaceSet) -> "IntradayLoggerBuilder":
        """``"System"`` (default) or ``"User"``."""
        try:
            self._namespace_set = NamespaceSet(value)
        except ValueError:
            raise LoggerValueError(f"namespace set must be 'System' or 'User', not {value!r}") from None
        return self

    def set_column_partition_value(self, value: str) -> "IntradayLoggerBuilder":
        """Every row goes to this column partition (takes precedence over everything else)."""
        self._partition_value = validate_name(NameKind.COLUMN_PARTITION, value)
        return self

    def set_column_partition_function(
        self, fn: Callable[[Any], Any], *, columns: Sequence[str] | str | None = None, vectorized: bool = False
    ) -> "IntradayLoggerBuilder":
        """Compute each row's column partition.

        By default ``fn(row) -> str`` gets a dict of column name to value (timestamps as int ns,
        chars as int, nulls None); with ``columns`` only those columns, and ``log_batch`` calls it
        once per distinct combination of their values.  With ``vectorized=True``,
        ``fn(table) -> str | array of str`` gets a pyarrow Table (of ``columns`` or all columns)
        and returns one partition for all rows or one per row.
        """
        if not callable(fn):
            raise LoggerTypeError("the column partition function must be callable")
        self._partition_fn = PartitionFunction(fn, self._schema, columns, vectorized)
        return self

    def set_time_zone_name(self, name: str) -> "IntradayLoggerBuilder":
        """Time zone of the write-time date partition, of hourly rollover and of file names."""
        try:
            self._tz = zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise LoggerValueError(f"unknown time zone {name!r}") from None
        return self

    def set_internal_partition(self, name: str) -> "IntradayLoggerBuilder":
        """Use this internal partition instead of one derived from the host name."""
        self._internal_partition = validate_name(NameKind.INTERNAL_PARTITION, name)
        return self

    def set_internal_partition_suffix(self, suffix: str | None) -> "IntradayLoggerBuilder":
        self._suffix = suffix or None
        return self

    def set_log_format_suffix(self, suffix: str | int | None) -> "IntradayLoggerBuilder":
        """Appended last to the internal partition (an int is written in decimal)."""
        self._format_suffix = None if suffix is None or suffix == "" else str(suffix)
        return self

    def set_suffix_internal_partition_with_log_format(self, on: bool = True) -> "IntradayLoggerBuilder":
        """Append ``-<schema version>`` to the internal partition, after every other suffix
        (``ABC-4`` for version 4): each schema version of the table then writes its own
        locations, as a location holds one version only."""
        if not isinstance(on, bool):
            raise LoggerTypeError(f"set_suffix_internal_partition_with_log_format takes True or False, not {on!r}")
        self._version_suffix = on
        return self

    def set_rollover(self, mode: Rollover | str, fixed_timestamp: dt.datetime | None = None) -> "IntradayLoggerBuilder":
        """``hourly`` (default), ``daily`` or ``fixed``; ``fixed_timestamp`` names the fixed files
        (default: the time the logger is built)."""
        try:
            self._rollover = Rollover(mode)
        except ValueError:
            raise LoggerValueError(f"rollover must be {', '.join(r.value for r in Rollover)}, not {mode!r}") from None
        if fixed_timestamp is not None and fixed_timestamp.tzinfo is None:
            fixed_timestamp = fixed_timestamp.replace(tzinfo=dt.timezone.utc)
        self._fixed_stamp = fixed_timestamp
        return self

    def set_queue_size(self, rows: int) -> "IntradayLoggerBuilder":
        """At most this many rows wait for the writer; callers block beyond it."""
        try:
            rows = int(rows)
        except (TypeError, ValueError):
            raise LoggerValueError(f"queue size must be a whole number of rows, not {rows!r}") from None
        if rows < 1:
            raise LoggerValueError("queue size must be at least 1 row")
        self._queue_rows = rows
        return self

    def set_max_write_delay(self, seconds: float) -> "IntradayLoggerBuilder":
        """How long the writer, woken by a row, waits for more to write with it (default 2 ms;
        0 writes at once).  Bounds how late a row reaches the OS under light load."""
        if not 0 <= float(seconds) <= 1:
            raise LoggerValueError("write delay must be between 0 and 1 second")
        self._linger = float(seconds)
        return self

    def set_max_open_files(self, n: int) -> "IntradayLoggerBuilder":
        """Files kept open at once (least recently written ones are closed, and reopened to
        append if written again)."""
        if int(n) < 1:
            raise LoggerValueError("max open files must be at least 1")
        self._max_open = int(n)
        return self

    def set_on_location_in_use(self, mode: OnLocationInUse | str) -> "IntradayLoggerBuilder":
        """What ``build()`` does when another live logger writes this table's internal partition in
        the log directory: ``"refuse"`` (default: raise ``LocationInUseError`` naming it) or
        ``"new_partition"`` (take the first free of ``<name>_2``, ``<name>_3``, ...; for pools of
        identical worker processes).  Why refusing is the default: ``disd.logger.ownership``."""
        try:
            self._on_in_use = OnLocationInUse(mode)
        except ValueError:
            raise LoggerValueError(f"on location in use must be 'refuse' or 'new_partition', not {mode!r}") from None
        return self

    def set_clock(self, clock: Callable[[], dt.datetime]) -> "IntradayLoggerBuilder":
        """The source of "now" (a datetime; naive means UTC), read by the writer thread; for
        tests of rollover and partitions."""
        if not callable(clock):
            raise LoggerTypeError("clock must be callable")
        self._clock = clock
        return self

    def internal_partition(self) -> str:
        """The internal partition this configuration writes to (with ``new_partition``, the one
        it writes to unless another logger holds it: the built logger's ``internal_partition``
        says which it took)."""
        return self._internal_partition_name(1)

    def _internal_partition_name(self, instance: int) -> str:
        """The internal partition of the ``instance``-th logger of this configuration (1: the
        configured name; n > 1: ``_<n>`` after every suffix but the version's)."""
        if self._internal_partition is not None:
            base = self._internal_partition
        else:
            base = legalize(self._host_name())
            if self._process_name:
                base = legalize(f"{self._process_name}_{base}")
        parts = [base] + [p for p in (self._suffix, self._format_suffix) if p]
        if instance > 1:
            parts.append(str(instance))
        name = "_".join(parts)
        if self._version_suffix:
            name = f"{name}-{self._schema.version}"
        return validate_name(NameKind.INTERNAL_PARTITION, name)

    def build(self) -> IntradayLogger:
        """Start the logger.  It holds its location (``disd.logger.ownership``) until ``close()``:
        ``LocationInUseError`` when another live logger holds it (unless ``new_partition``)."""
        self._internal_partition_name(1)  # a bad name is refused before anything is created
        self._log_dir.mkdir(parents=True, exist_ok=True)
        check_log_dir(self._log_dir, self._schema)  # a refused version creates nothing, not even a lock
        internal_partition, lock = claim_location(self._log_dir, self._schema, self._internal_partition_name,
                                                  self._on_in_use, self._process_name)
        try:
            return IntradayLogger(self._config(internal_partition), lock)
        except BaseException:
            lock.release()
            raise

    def _config(self, internal_partition: str) -> LoggerConfig:
        return LoggerConfig(
            schema=self._schema,
            process_name=self._process_name,
            log_dir=self._log_dir,
            namespace_set=self._namespace_set,
            internal_partition=internal_partition,
            partition_value=self._partition_value,
            partition_fn=None if self._partition_value is not None else self._partition_fn,
            tz=self._tz,
            rollover=self._rollover,
            fixed_stamp=self._fixed_stamp,
            queue_rows=self._queue_rows,
            max_open_files=self._max_open,
            write_delay=self._linger,
            clock=self._clock,
        )
