"""The names ``bench/load.py`` and ``bench/pipeline.py`` import (they put ``tests/`` on
``sys.path``); ``hostile/test_load.py`` runs ``bench/load.py``.  The tests themselves use
``support``; this module only maps the benchmarks' names onto it."""

from __future__ import annotations

import pathlib

import yaml

from support import BIN, Proc, free_port, start_tailer, write_tailer_config
from support import start_dis_process as start_dis
from support import write_dis_config as _write_dis_config

__all__ = ["BIN", "Proc", "free_port", "start_dis", "start_tailer", "write_dis_config", "write_tailer_config"]


def write_dis_config(tmp: pathlib.Path, port: int, metrics_port: int | None = None, **sections) -> pathlib.Path:
    """``support.write_dis_config``, each keyword argument a top-level section that replaces the
    written one (as ``import``, a Python keyword, is passed)."""
    path = _write_dis_config(tmp, port, metrics_port)
    data = yaml.safe_load(path.read_text())
    data.update(sections)
    path.write_text(yaml.safe_dump(data))
    return path
