"""The logger's own errors (bad values raise TypeError/ValueError from the call instead)."""

from __future__ import annotations


class LoggerError(RuntimeError):
    """Base of the logger's own errors."""


class LoggerClosedError(LoggerError):
    """The logger was closed."""


class LoggerWriterError(LoggerError):
    """The writer thread failed; ``__cause__`` is what it failed with.  The logger is stopped."""
