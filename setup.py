"""Build hooks that pyproject.toml cannot express.

* The tailer's source lives in the top-level ``tailer/`` folder but installs as ``disd.tailer``.
* The gRPC contract in ``proto/`` is compiled to Python by the build itself (``build_py``), so
  the generated modules are never edited by hand nor committed.
* The JVM Spark reader's jar is built from ``jvm/`` into ``disd/spark/jars/`` by ``jvm/build.py``
  when a JDK and PySpark are present: optional here, unless ``DIS_REQUIRE_JAR=1`` is set (``make
  dist`` and the Dockerfile's ``build-spark`` stage set it, so a wheel meant to carry the reader
  never quietly lacks it; ``make jar`` and ``make test`` require it too).
* ``disd.storage.newlocation`` and ``disd.storage.batchwrite`` (C, no dependency but the C
  library) create a new location's directories, record and column files, and write a location's
  flush, each in one call outside the interpreter's lock; ``disd.storage.lastbyindex`` keeps a
  last-by state's keys in a hash table between publishes; ``disd.binlog.rowencode`` encodes a
  frame's rows for the logger.  They are optional: without a C compiler the build goes on and
  all four are done from Python (``disd.storage.fsio``'s ``create_location`` and
  ``pwrite_all``, ``disd.storage.lastbykeys.ArrowKeys``, ``disd.binlog.format``'s
  ``encode_rows_numpy``), which the tests check against them; with
  ``DIS_REQUIRE_C_MODULES=1`` (``make dist``, the Dockerfile) a failed compile fails the build.
* ``disd.kafka.rdbatch`` (C) takes a batch of Kafka messages out of the librdkafka that
  confluent-kafka loaded, into flat buffers; optional the same way: without it (or with a
  confluent-kafka it was not checked against) ``disd.kafka.batchread`` falls back to the client's
  ``consume``.
* ``disd.storage.ingestcore`` (C) is a location's write state and the byte work of a batch of
  locations' chunks (frame scan and CRC32C, row checks, transactions, column bytes, writes)
  outside the interpreter's lock; optional the same way: without it the Python reference path
  (``disd.storage.writestate``, ``disd.storage.ingest``) does all of it.
"""

from __future__ import annotations

import os
import pathlib

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent.resolve()


def _required(name: str) -> bool:
    """Whether the environment variable ``name`` asks for a part the build may otherwise skip."""
    return os.environ.get(name, "") not in ("", "0")


def generate_protos() -> None:
    protos = sorted((ROOT / "proto").rglob("*.proto"))
    if not protos:
        return
    from grpc_tools import protoc  # build requirement, see pyproject.toml

    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={ROOT / 'dis'}",
        f"--pyi_out={ROOT / 'dis'}",
        f"--grpc_python_out={ROOT / 'dis'}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + ", ".join(map(str, protos)))


def build_jar() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dis_jvm_build", ROOT / "jvm" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod.build(require=_required("DIS_REQUIRE_JAR"))
    except mod.BuildError as e:  # only with DIS_REQUIRE_JAR: the wheel must carry the reader
        raise SystemExit(f"dis: cannot build the JVM Spark reader (DIS_REQUIRE_JAR is set): {e}") from None


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        generate_protos()
        build_jar()
        super().run()


optional_c = not _required("DIS_REQUIRE_C_MODULES")
packages = find_packages("dis", include=["disd", "disd.*"]) + ["disd.tailer"]

setup(
    packages=packages,
    package_dir={"": "dis", "disd.tailer": "tailer"},
    cmdclass={"build_py": BuildPyWithProtos},
    ext_modules=[Extension("disd.storage.newlocation",
                           ["dis/disd/storage/newlocation.c", "dis/disd/storage/newlocations.c"],
                           depends=["dis/disd/storage/newlocation.h"], optional=optional_c,
                           extra_compile_args=["-pthread"], extra_link_args=["-pthread"]),
                 Extension("disd.storage.batchwrite", ["dis/disd/storage/batchwrite.c"], optional=optional_c),
                 Extension("disd.storage.ingestcore",
                           ["dis/disd/storage/ingestcore.c", "dis/disd/storage/ingestscan.c",
                            "dis/disd/storage/ingestwrite.c", "dis/disd/storage/ingesttail.c"],
                           depends=["dis/disd/storage/ingestcore.h", "dis/disd/storage/ingeststate.h"],
                           optional=optional_c),
                 Extension("disd.storage.lastbyindex", ["dis/disd/storage/lastbyindex.c"], optional=optional_c),
                 Extension("disd.binlog.rowencode", ["dis/disd/binlog/rowencode.c"], optional=optional_c),
                 Extension("disd.kafka.rdbatch", ["dis/disd/kafka/rdbatch.c"], optional=optional_c,
                           libraries=["dl"])],
)
