"""The one exception the Spark source raises for problems a user can fix."""

from __future__ import annotations

from disd.errors import DisError


class DisSourceError(DisError):
    """A bad option, an unreachable DIS, an unknown table or column: the message says which and
    what to do.  Spark shows it inside its own exception (``AnalysisException`` at ``load()``,
    ``PythonException`` when a query runs), after ``DisSourceError:``."""

    def __init__(self, message: str) -> None:
        super().__init__(f"dis source: {message}")
