"""Where things are: the repository, the tests, the schemas, the installed commands."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: the directory of the repository's table schemas (config/schemas)
SCHEMAS = ROOT / "config" / "schemas"
#: where ``dis`` and ``dis-tailer`` of this environment are installed
BIN = pathlib.Path(sys.executable).parent
