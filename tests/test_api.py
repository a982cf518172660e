"""The public API is what docs/api.md lists: each module a user imports declares ``__all__``, and
the page lists exactly those names, module by module, each one there to import."""

from __future__ import annotations

import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The modules a user imports; everything else in ``disd`` is internal.
PUBLIC_MODULES = ("disd.client", "disd.logger", "disd.spark", "disd.errors", "disd.schema")


def documented(text: str) -> dict[str, list[str]]:
    """Module -> the names its section of docs/api.md lists: a ``## `module``` heading, then the
    first cell (a name in backquotes) of each row of the table under it."""
    out: dict[str, list[str]] = {}
    module = None
    for line in text.splitlines():
        heading = re.fullmatch(r"## `([\w.]+)`\s*", line)
        if heading:
            module = out.setdefault(heading.group(1), [])
        elif line.startswith("## "):
            module = None
        elif module is not None:
            row = re.match(r"\| `(\w+)` \|", line)
            if row:
                module.append(row.group(1))
    return out


def test_the_page_lists_exactly_the_names_each_public_module_exports():
    listed = documented((ROOT / "docs" / "api.md").read_text())
    assert sorted(listed) == sorted(PUBLIC_MODULES)
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} declares no __all__"
        assert len(set(listed[name])) == len(listed[name]), f"{name}: a name listed twice"
        assert sorted(listed[name]) == sorted(exported), name
        assert [n for n in exported if not hasattr(module, n)] == [], name


def test_the_errors_a_logger_user_catches_come_from_disd_logger():
    from disd.errors import DisError
    from disd.logger import LoggerTypeError, LoggerValueError

    assert issubclass(LoggerValueError, ValueError) and issubclass(LoggerValueError, DisError)
    assert issubclass(LoggerTypeError, TypeError) and issubclass(LoggerTypeError, DisError)


def test_the_check_reads_names_per_module_and_only_in_their_tables():
    text = """# Public API
| `NotAModule` | prose before any module |
## `disd.a`
Some words with `Backquoted` names.
| name | what |
|---|---|
| `one` | the first |
| `Two` | the second |
## `disd.b`
| `three` | x |
## Notes
| `four` | not a module's |
"""
    assert documented(text) == {"disd.a": ["one", "Two"], "disd.b": ["three"]}
