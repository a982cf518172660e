"""The logger's errors, all under ``disd.errors.DisError``.

A bad value or setting raises ``LoggerValueError`` / ``LoggerTypeError``, which are also
``ValueError`` / ``TypeError``: callers may catch the builtin, the product's root, or these.
"""

from __future__ import annotations

from disd.errors import DisError


class LoggerError(DisError, RuntimeError):
    """Base of the logger's own errors (a state of the logger, not a bad value)."""


class LoggerClosedError(LoggerError):
    """The logger was closed."""


class LoggerFlushTimeout(LoggerError, TimeoutError):
    """``flush(timeout)`` returned before the writer had written everything logged before it."""


class LoggerWriterError(LoggerError):
    """The writer thread failed; ``__cause__`` is what it failed with.  The logger is stopped."""


class LoggerSchemaError(LoggerError, ValueError):
    """The logger's schema cannot be written next to the logs already in its directory: a change
    of version the rules refuse, or the same version with other columns.  The message names the
    table, both versions, the column (or both fingerprints) and the file."""


class LoggerValueError(DisError, ValueError):
    """A value, row or setting the logger cannot take; the message names the table, the column and
    the row where there is one."""


class LoggerTypeError(DisError, TypeError):
    """A value or setting of the wrong kind."""
