"""The root of every error the product raises on purpose.

A user catches the product's errors in one ``except disd.errors.DisError`` and still gets the
builtin base a caller may rely on (``ConfigError`` is a ``ValueError``, ``UnknownTableError`` a
``LookupError``): each class derives from ``DisError`` *and* keeps its builtin base.  Errors are
defined beside the code that raises them; this module only gives them a common ancestor.
"""

from __future__ import annotations

__all__ = ["DisError"]


class DisError(Exception):
    """An error of dis: bad input, a refused request, a damaged file, a failed operation."""
