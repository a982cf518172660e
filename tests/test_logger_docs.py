"""docs/logger.md and the README's logger example are true of the code: every Python block runs
(in order, in a scratch copy of the checkout's layout, the last section against a real ``dis
serve`` and ``dis-tailer``), a ``print`` whose line carries a comment prints what the comment says,
the builder table states the code's defaults, and every setter, logger method and error class the
logger has is documented."""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from typing import Any

import pytest
import yaml

import disd.logger as logger_pkg
from disd.binlog import read_file
from disd.logger import IntradayLogger, IntradayLoggerBuilder, LocationInUseError
from disd.logger.errors import LoggerTypeError, LoggerValueError
from disd.names import legalize
from support import BIN, ROOT, free_port_pair, start_dis_process, start_tailer, write_dis_config, write_tailer_config

DOC = ROOT / "docs" / "logger.md"
README = ROOT / "README.md"
#: The address the doc's examples use: the DIS of config/dis.yaml.
DOC_ADDRESS = "127.0.0.1:22021"


def python_blocks(md: pathlib.Path) -> list[tuple[int, str]]:
    """(line number of the block's first line of code, code) of each ```python block."""
    text = md.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def expected_output(comment: str) -> re.Pattern[str]:
    """What a ``print(...)  # comment`` line promises: the comment, where ``...`` and a
    ``<placeholder>`` stand for anything."""
    parts = re.split(r"(\.\.\.|<[a-z][a-z _-]*>)", comment.strip())
    return re.compile("".join(".*?" if i % 2 else re.escape(p) for i, p in enumerate(parts)), re.S)


def promised_prints(code: str) -> dict[int, re.Pattern[str]]:
    """Line (in the block) -> what the ``print`` on it promises, for lines ``print(...)  # ...``."""
    out = {}
    for node in ast.walk(ast.parse(code)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
            line = code.splitlines()[node.lineno - 1]
            m = re.search(r"\)\s+#\s(.*)$", line)
            if m:
                out[node.lineno] = expected_output(m.group(1))
    return out


def run_blocks(md: pathlib.Path, blocks: list[tuple[int, str]], namespace: dict[str, Any],
               replace: dict[str, str] | None = None) -> None:
    """Run ``blocks`` in order in ``namespace``; each commented ``print`` must be reached and print
    what its comment says."""
    for first_line, code in blocks:
        name = f"{md.name}:{first_line}"
        printed: dict[int, list[str]] = {}

        def recording_print(*args: Any, sep: str = " ", **kw: Any) -> None:
            frame = sys._getframe(1)  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
            if frame.f_code.co_filename == name:
                printed.setdefault(frame.f_lineno, []).append(sep.join(map(str, args)))
            builtins.print(*args, sep=sep, **kw)

        runnable = code
        for old, new in (replace or {}).items():
            runnable = runnable.replace(old, new)
        namespace["print"] = recording_print
        try:
            exec(compile(runnable, name, "exec"), namespace)  # noqa: S102 - the doc's own examples
        except Exception as e:
            raise AssertionError(f"the block at {name} fails: {e!r}") from e
        for line, pattern in promised_prints(code).items():
            where = f"{md.name}:{first_line + line - 1}"
            assert line in printed, f"{where}: the print is never reached"
            for text in printed[line]:
                assert pattern.fullmatch(text), f"{where} prints {text!r}, not what its comment says"


def scratch_checkout(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A working directory laid out as a checkout's root for the examples: config/schemas."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "config" / "schemas", work / "config" / "schemas")
    monkeypatch.chdir(work)
    return work


def section(md: pathlib.Path, heading: str) -> str:
    text = md.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_the_output_check_takes_placeholders_and_refuses_other_text():
    pattern = expected_output("LockHolder(host='<host>', pid=<pid>, what='a logger: ...')")
    assert pattern.fullmatch("LockHolder(host='h1', pid=42, what='a logger: x.py')")
    assert not pattern.fullmatch("LockHolder(host='h1', pid=42, what='dis serve')")
    assert promised_prints("x = 1\nprint(x)   # 1\nprint(x)\n").keys() == {2}


def test_every_example_of_the_logger_doc_runs_against_a_real_dis_and_tailer(tmp_path, monkeypatch):
    """The doc's blocks in order, as a user runs them from a checkout with ``dis serve`` and
    ``dis-tailer`` started by its "Where the logs go" (on free ports instead of 22021)."""
    work = scratch_checkout(tmp_path, monkeypatch)
    port = free_port_pair()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port))
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, work / "var" / "logs"))
    try:
        namespace: dict[str, Any] = {"__name__": "logger_doc"}
        run_blocks(DOC, python_blocks(DOC), namespace, {DOC_ADDRESS: f"127.0.0.1:{port}"})
        assert [r["Sym"] for r in namespace["rows"].to_pylist() if r["Sym"] in ("X", "Y", "Z")] == ["X", "Y", "Z"]
        # the lock files the doc names, beside the logs; the tailer took none of them for a log
        assert (work / "var" / "logs" / ".Market.Trade.web.lock").exists()
        assert (work / "var" / "logs" / ".Market.Trade.web_2.lock").exists()
        assert ".lock" not in tailer.log_text()
        # the commands of "Where the logs go" (dis status at the test's port)
        status = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        app = legalize(f"app_{legalize(socket.gethostname())}")
        assert f"Market.Trade/{app}/" in status.stdout, status.stdout
        dumped = subprocess.run([str(BIN / "dis"), "binlog", "dump", str(namespace["log"].files[0])],
                                capture_output=True, text=True, timeout=60)
        assert dumped.returncode == 0 and "Z" in dumped.stdout, dumped.stdout + dumped.stderr
    finally:
        tailer.terminate()
        dis.terminate()


def test_the_sample_configs_are_what_the_doc_says():
    """The doc's "Where the logs go" relies on config/tailer.yaml watching the builder's default
    log directory and sending to config/dis.yaml's DIS."""
    tailer = yaml.safe_load((ROOT / "config" / "tailer.yaml").read_text())
    dis = yaml.safe_load((ROOT / "config" / "dis.yaml").read_text())
    assert tailer["log_dirs"] == [str(IntradayLoggerBuilder(ROOT / "config/schemas/Market.Trade.yaml")._log_dir)]  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
    assert tailer["dis"] == DOC_ADDRESS == f"{dis['server']['host']}:{dis['server']['port']}"
    text = section(DOC, "Where the logs go")
    assert "config/tailer.yaml" in text and "config/dis.yaml" in text and DOC_ADDRESS in text


def test_the_readme_logger_example_runs_and_logs_its_rows(tmp_path, monkeypatch):
    work = scratch_checkout(tmp_path, monkeypatch)
    blocks = [(n, code) for n, code in python_blocks(README) if "IntradayLoggerBuilder" in code]
    assert blocks, "the README has no logger example"
    assert "docs/logger.md" in README.read_text()
    run_blocks(README, blocks, {"__name__": "readme"})
    logs = sorted((work / "var" / "logs").glob("Market.Trade.*"))
    assert logs, "the README's example wrote no log into var/logs"
    rows = [r for f in logs for r in read_file(f).table.to_pylist()]
    assert [r["Sym"] for r in rows] == ["AAPL", "MSFT", "IBM"]


def builder_table() -> dict[str, tuple[str, str]]:
    """setter name -> (default, what) from the doc's table of setters."""
    rows = {}
    for line in section(DOC, "The builder").splitlines():
        m = re.match(r"\| `(set_\w+)\(.*?\)` \| (.*?) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def public_names(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_every_setter_of_the_builder_is_in_the_table_and_every_method_is_documented():
    table = builder_table()
    setters = {n for n in public_names(IntradayLoggerBuilder) if n.startswith("set_")}
    assert setters == set(table), f"setters not in the doc's table: {setters - set(table)}; " \
                                  f"in the table but not in the code: {set(table) - setters}"
    text = DOC.read_text()
    for name in public_names(IntradayLoggerBuilder) - setters:
        assert f"`{name}(" in text, f"IntradayLoggerBuilder.{name} is not documented"
    # the built logger: its methods and attributes (set in __init__ as well as the class's)
    init_attrs = set(re.findall(r"self\.([a-z]\w*)(?:: [^=]+)? = ", inspect.getsource(IntradayLogger.__init__)))
    for name in public_names(IntradayLogger) | init_attrs:
        assert f"`{name}" in text, f"IntradayLogger.{name} is not documented"


def test_the_builder_table_states_the_defaults_of_the_code(tmp_path, monkeypatch):
    scratch_checkout(tmp_path, monkeypatch)
    import datetime as dt

    b = IntradayLoggerBuilder("config/schemas/Market.Trade.yaml").set_clock(lambda: dt.datetime(2026, 11, 22, 23, 30))
    log = b.build()
    try:
        with pytest.raises(LocationInUseError):
            IntradayLoggerBuilder("config/schemas/Market.Trade.yaml").build()
        log.log(Sym="A")
        log.flush()
        name = log.files[0].name
    finally:
        log.close()
    host = legalize(socket.gethostname())
    assert log.internal_partition == b.internal_partition() == host  # no suffix, no version by default
    assert name == f"Market.Trade.System.{host}.2026-11-22.bin.2026-11-22.233000.000+0000"  # UTC, write time
    expected = {
        "set_log_dir": f"`{log.log_dir}`",
        "set_process_name": "none" if log.process_name is None else f"`{log.process_name}`",
        "set_internal_partition": "the host name",
        "set_internal_partition_suffix": "none",
        "set_log_format_suffix": "none",
        "set_suffix_internal_partition_with_log_format": f"`{b._version_suffix}`",  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
        "set_column_partition_value": "none",
        "set_column_partition_function": "none",
        "set_time_zone_name": "`UTC`",
        "set_rollover": f"`{log.rollover.value}`",
        "set_namespace_set": f"`{log.namespace_set.value}`",
        "set_on_location_in_use": f"`{b._on_in_use.value}`",  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
        "set_queue_size": f"{log._queue.capacity:,} rows",  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
        "set_max_write_delay": f"{b._linger} ({b._linger * 1000:g} ms)",  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
        "set_max_open_files": f"{b._max_open}",  # noqa: SLF001 - the docs name these settings' defaults, which the test reads
        "set_clock": "the system clock",
    }
    table = builder_table()
    for setter, default in expected.items():
        assert table[setter][0].startswith(default), f"{setter}: the doc says {table[setter][0]!r}, the code {default!r}"


def raised_classes() -> set[str]:
    """Names of the exception classes ``raise``d in disd/logger/ (calls of a function that makes
    an error, such as ``bad(v)``, are not classes and not counted)."""
    names = set()
    for path in pathlib.Path(logger_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                names.add(node.exc.func.id)
    names.discard("AssertionError")  # an invariant's (unreachable), not an error a user meets
    return {n for n in names if isinstance(getattr(builtins, n, None) or _logger_name(n), type)}


def _logger_name(name: str) -> Any:
    for module in (logger_pkg, sys.modules["disd.logger.errors"]):
        with contextlib.suppress(AttributeError):
            return getattr(module, name)
    return None


def test_every_error_the_logger_raises_is_in_the_errors_table():
    table = section(DOC, "Errors")
    documented = set(re.findall(r"^\| `(\w+)`", table, re.M)) | set(re.findall(r"^\| `\w+`, `(\w+)`", table, re.M))
    exported = {n for n in logger_pkg.__all__ if isinstance(getattr(logger_pkg, n), type)
                and issubclass(getattr(logger_pkg, n), BaseException)}
    assert raised_classes() >= {"LoggerValueError", "LocationInUseError", "LoggerError"}  # the scan works
    missing = (exported | raised_classes() | {LoggerValueError.__name__, LoggerTypeError.__name__}) - documented
    assert not missing, f"errors of the logger missing from docs/logger.md's Errors table: {sorted(missing)}"
