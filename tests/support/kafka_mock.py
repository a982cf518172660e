"""librdkafka's mock Kafka cluster in a process of its own, for the Kafka tests and bench.

The mock cluster speaks the real Kafka wire protocol on loopback and lives inside the process
that created it, so this module is run as that process (``python -m support.kafka_mock
trades:3 ...``): it creates the cluster and the topics (name:partitions), prints the bootstrap
address on one line, and keeps the cluster up until its standard input closes or it is killed.

The Python binding does not expose the mock API (and its AdminClient's CreateTopics times out
"waiting for controller" against the mock), so this calls librdkafka's own C functions
(``rd_kafka_mock_cluster_new``, ``rd_kafka_mock_topic_create``, ``rd_kafka_mock_cluster_bootstraps``)
in the copy of librdkafka that confluent-kafka's wheel bundles, through ctypes.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess
import sys


def _librdkafka() -> ctypes.CDLL:
    import confluent_kafka

    libs = pathlib.Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        raise RuntimeError(f"no bundled librdkafka in {libs}")
    lib = ctypes.CDLL(str(found[0]))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    return lib


def main(argv: list[str]) -> int:
    lib = _librdkafka()
    err = ctypes.create_string_buffer(512)
    rk = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), err, len(err))  # 0: RD_KAFKA_PRODUCER
    if not rk:
        print(f"rd_kafka_new: {err.value.decode()}", file=sys.stderr)
        return 1
    mc = lib.rd_kafka_mock_cluster_new(rk, 1)
    if not mc:
        print("rd_kafka_mock_cluster_new failed", file=sys.stderr)
        return 1
    for spec in argv:
        name, _, parts = spec.partition(":")
        rc = lib.rd_kafka_mock_topic_create(mc, name.encode(), int(parts or 1), 1)
        if rc:
            print(f"rd_kafka_mock_topic_create {name}: error {rc}", file=sys.stderr)
            return 1
    print(lib.rd_kafka_mock_cluster_bootstraps(mc).decode(), flush=True)
    sys.stdin.read()  # until the parent closes our stdin (or kills us)
    return 0


class MockCluster:
    """The mock cluster process; ``bootstrap`` is its address.  A context manager."""

    def __init__(self, *topics: str) -> None:
        from .processes import subprocess_env

        self.p = subprocess.Popen([sys.executable, "-m", "support.kafka_mock", *topics], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=subprocess_env(), text=True)
        line = self.p.stdout.readline().strip()
        if not line:
            self.p.kill()
            raise RuntimeError("the mock Kafka cluster did not start")
        self.bootstrap = line

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)

    def __enter__(self) -> "MockCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
