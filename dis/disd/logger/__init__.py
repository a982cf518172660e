"""The Python logger: how applications write binary logs, modelled on IntradayLoggerBuilder.

    log = (IntradayLoggerBuilder("config/schemas/Market.Trade.yaml")   # or a TableSchema
           .set_process_name("feed").set_log_dir("var/logs").set_namespace_set("System")
           .set_column_partition_value("2026-11-22")
           .build())
    log.log(Timestamp=..., Sym="AAPL", Price=1.5, Size=100)      # one SingleRow
    with log.transaction():                                      # Start, None..., End
        log.log(...); log.log(...)
    log.log_batch(table)                # pyarrow Table/RecordBatch or dict of columns; SingleRows
    log.log_batch(table, atomic=True)   # ... or one transaction
    log.flush()                         # wait until everything logged so far is in the OS
    log.close()                         # write what is queued, fsync, close

Threads and the queue
    Callers hand work to one writer thread through a bounded queue whose capacity is counted in
    rows (``set_queue_size``).  A caller that finds it full blocks until the writer has taken
    what is queued: backpressure, instead of memory growing without bound.  (A batch larger than
    the whole queue is admitted when the queue is empty, so nothing waits forever.)  The writer
    takes everything queued at once, turns consecutive small items of one file into one batch
    of columns, encodes it with whole-batch numpy operations (``disd.binlog.format``) and hands
    it to the OS with one ``write`` per file (``disd.binlog.BinlogWriter`` cuts it into frames
    by rows, transactions and bytes), after waiting at most ``set_max_write_delay`` (2 ms by
    default) for more rows: a row logged under light load is in the file (visible to a tailer)
    within a few milliseconds.  Nothing is fsynced per row;
    ``flush(fsync=True)`` and ``close()`` fsync, and so does every file closed by a rollover.

    Values are checked and converted on the calling thread, so a bad value raises from
    ``log``/``log_batch`` itself and never reaches the writer.  The error (TypeError or
    ValueError) names the table and the column, and for ``log_batch`` the first offending row
    (its index in the batch); ``log_batch`` converts whole columns and looks for that row only
    after a conversion failed.  A char column takes one-character strings (one UTF-16 code
    unit) or code units, a bool column booleans or the numbers 0 and 1.  Numpy arrays handed to
    ``log_batch`` are copied (Arrow would otherwise share their memory, and a caller reusing its
    buffer would change rows already logged).  If the writer thread fails (a full disk, an
    unwritable directory, a failing clock) the logger stops: every later call, and ``close()``,
    raises ``LoggerWriterError`` with the original error as its cause.

Transactions
    ``with log.transaction():`` collects the rows this thread logs inside the block, including
    ``log_batch`` calls, on the calling thread; when the block ends normally they are queued as
    one unit, so no other thread's rows can ever come between them, and written as
    StartTransaction, None..., EndTransaction (a one-row transaction is written as one
    SingleRow: a row cannot be both Start and End).  Transactions do not nest.

    A transaction abandoned by an exception inside ``with`` is never seen by readers.  The
    guarantee needed is only that its End is never written (the DIS publishes no row of a
    transaction before its End, and treats a Start or SingleRow that arrives while a transaction
    is open as rolling the open one back); this logger goes further and writes none of its rows.
    It also ends the writer's current batch there, so the rows logged after an abandoned
    transaction begin a new frame.  A transaction's rows must all fall in one column partition
    (one location); ``ValueError`` otherwise, which abandons it.  Rows of a transaction stay in
    the caller's memory until the block ends (compacted to Arrow columns every 65,536 rows).

Internal partition
    ``set_internal_partition(name)`` if given (used as is), otherwise the legalized host name
    (dots and other illegal characters become ``_``), prefixed with ``<process name>_`` when a
    process name is set (as IntradayLoggerBuilder does for logs written directly, e.g.
    ``feed_host1``); then the optional ``set_internal_partition_suffix`` and the optional
    ``set_log_format_suffix``, each joined with ``_``; then, with
    ``set_suffix_internal_partition_with_log_format(True)``, ``-<schema version>`` (``ABC-4``
    for version 4 of the table, ``feed_host1_x-4`` with a suffix ``x``).  The result is checked
    by ``disd.names``.  The version suffix gives each schema version its own internal partition,
    so its own location: a location is written in exactly one version (docs/schema-versions.md),
    and loggers of two versions of a table, running at once or one after the other, then never
    write into the same location.

One writer per location
    A location (table, internal partition, column partition) takes one logger at a time.  Two
    logger processes on one location (two instances of one script with one process name, web
    workers on the default host-name partition, an overlapping restart) would each write files
    of it, and the tailer, which streams a location's files in order and only goes forward,
    could never send what one of them appended to a file older than the other's.  So
    ``build()`` takes an exclusive lock on ``<log_dir>/.<Ns>.<Table>.<Internal>.lock``
    (``flock``, freed by the kernel when the process dies, ``kill -9`` included) and the logger
    holds it until ``close()``; it covers every column partition of the internal partition.
    When another live logger holds it, ``build()`` raises ``LocationInUseError`` naming that
    process (host, pid, since, command) and the remedy: a distinct process name or internal
    partition.  That refusal is the default because the internal partition is the name people
    see for a process's rows: taking another one silently would scatter them over new locations
    at every overlapping restart and hide a configuration mistake.  With
    ``set_on_location_in_use("new_partition")`` (a pool of identical workers), the builder takes
    the first free of ``<name>_2``, ``<name>_3``, ... instead (before any ``-<version>``
    suffix); the built logger's ``internal_partition`` says which.  (docs/logger.md)

Schema versions
    A logger writes the version of its schema (``version:`` in the YAML) into every file's
    header.  When it is built, it reads the header of the newest log of its table already in the
    log directory (any internal or column partition); if that file is in another version and the
    change between the two, older to newer, is one the rules refuse (``disd.schemaversions``: a
    narrowed or changed type, a ``renamed_from`` naming nothing), or in the same version with
    other columns, ``build()`` raises ``LoggerSchemaError`` (also a ``ValueError``) naming the
    table, the versions, the column and the file, and writes nothing.  Loggers of two allowed
    versions may write into one directory at the same time; a file is only ever appended to in
    the version its header says (``FIXED`` rollover with the same stamp and another version is
    refused).

Column partition
    Precedence: a fixed value (``set_column_partition_value``); else a function of the row
    (``set_column_partition_function``); else the date, in the time zone of
    ``set_time_zone_name`` (default UTC), of the write time.  A function receives each row as a
    dict of column name to Python value (timestamps as int nanoseconds since the epoch, chars as
    int UTF-16 code units, nulls as None).  For ``log_batch`` it is called once per distinct
    combination of the ``columns=`` it names, found with vectorized dictionary encoding (or once
    per row when no columns are named); with ``vectorized=True`` it is instead called with a
    pyarrow Table and returns one partition (a str) or one per row.  A batch spanning several
    partitions is split and each partition's rows go to its own file, in their original order.

Files and rollover
    Files are named by ``disd.binlog.LogFileName``: ``<Ns>.<Table>.<System|User>.<Internal>.
    <Column>.bin.<time>``, where the time is the file's creation time in the configured zone,
    made strictly later than any existing file of the same location in the directory so that
    files order as they were written.  ``Rollover.HOURLY`` (default) starts a new file at each
    hour of the zone, ``DAILY`` only when the column partition changes, ``FIXED`` keeps one
    file per column partition for the logger's life, its time stamp fixed (given, or the
    build time), so a logger built again with the same stamp appends to the same file.  Times
    come from ``set_clock`` (default: the system clock), read by the writer thread, never
    allowed to run backwards.

Modules (each imports only those listed after it, never another's private names)
    ``builder``    IntradayLoggerBuilder: the settings, ``build()``
    ``api``        IntradayLogger: log, transaction, log_batch, flush, close (the caller's side)
    ``writer``     the writer thread: batches queued items, sets row flags, writes
    ``files``      which file rows go to (rollover), file names, open files; the clock
    ``versions``   the logger's schema version against the newest log already in its directory
    ``ownership``  one writer per location: the lock ``build()`` takes, ``LocationInUseError``
    ``config``     LoggerConfig (what ``build()`` hands the logger), Rollover
    ``partition``  column partition functions, per row and per batch
    ``rowqueue``   work items and the queue bounded in rows
    ``convert``    user values to column values; rows too big for a frame
    ``errors``     LoggerError and its kinds
"""

from disd.logger.api import IntradayLogger
from disd.logger.builder import IntradayLoggerBuilder
from disd.logger.config import Rollover
from disd.logger.errors import (
    LoggerClosedError,
    LoggerError,
    LoggerFlushTimeout,
    LoggerSchemaError,
    LoggerTypeError,
    LoggerValueError,
    LoggerWriterError,
)
from disd.logger.ownership import LocationInUseError

__all__ = [
    "IntradayLogger",
    "IntradayLoggerBuilder",
    "LocationInUseError",
    "LoggerClosedError",
    "LoggerError",
    "LoggerFlushTimeout",
    "LoggerSchemaError",
    "LoggerTypeError",
    "LoggerValueError",
    "LoggerWriterError",
    "Rollover",
]
