"""A process of ours starts no BLAS threads: ``disd`` keeps numpy's OpenBLAS at one thread
(``disd/__init__.py``), because its per-core threads spin at import for CPU no process of ours
needs, and every `dis serve`, tailer and Kafka fetch process pays it at start."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import os
import disd  # first, as every process of ours imports it before numpy
import numpy
print(len(os.listdir("/proc/self/task")))
"""


def _threads(env: dict[str, str], script: str = SCRIPT) -> int:
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_importing_numpy_after_disd_starts_no_blas_thread():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads(env) == 1


def test_an_operator_can_still_ask_for_blas_threads():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    assert _threads(env) == _threads(env, SCRIPT.replace("import disd", "pass"))
