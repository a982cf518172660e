"""What the last-by tests of tests/proxy share: a reader's ``SubscribeLastBy`` stream that keeps
the state it was given, as a consumer of the stream would."""

from __future__ import annotations

import threading

import grpc
import pyarrow as pa

from disd.names import LocationKey
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.storage.lastby import from_ipc, last_by


class LastBySubscriber:
    """One reader's ``SubscribeLastBy`` stream at ``address`` (on its own thread): per location the
    state it holds (a full message replaces it, a delta is upserted by key) and every message it
    was given as ``(location, rows, full, seq)``."""

    def __init__(self, address: str, namespace: str = "Market", table: str = "Trade") -> None:
        self.channel = open_channel(address)
        self.states: dict[LocationKey, pa.Table] = {}
        self.messages: list[tuple[LocationKey, int, bool, int]] = []
        self.error: grpc.RpcError | None = None
        self.lock = threading.Lock()
        self.call = dis_pb2_grpc.TableDataStub(self.channel).SubscribeLastBy(
            dis_pb2.LastByRequest(namespace=namespace, table=table))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for m in self.call:
                key, t = key_from_proto(m.key), from_ipc(m.arrow_ipc)
                with self.lock:
                    if m.full:
                        self.states[key] = t
                    else:
                        assert key in self.states, f"a delta for {key} before its full state"
                        self.states[key] = last_by(pa.concat_tables([self.states[key], t]), list(m.keys))
                    self.messages.append((key, m.rows, m.full, m.seq))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e

    def rows(self, key: LocationKey) -> int:
        """The rows the last message for ``key`` covered (-1: none yet); raises the stream's
        error, if it ended with one (a wait on it says why)."""
        if self.error is not None:
            raise AssertionError(f"the subscription failed: {self.error.code()}: {self.error.details()}")
        with self.lock:
            return max((r for k, r, _, _ in self.messages if k == key), default=-1)

    def sizes(self, key: LocationKey) -> list[int]:
        with self.lock:
            return [r for k, r, _, _ in self.messages if k == key]

    def state(self, key: LocationKey) -> pa.Table | None:
        with self.lock:
            return self.states.get(key)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(10)
        self.channel.close()
