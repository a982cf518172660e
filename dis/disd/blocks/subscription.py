"""A subscription at one DIS: the snapshots of its locations as they are published."""

from __future__ import annotations

from typing import Iterator, Sequence

import grpc

from disd.rpc.v1 import dis_pb2, dis_pb2_grpc


class Subscription:
    """A subscription at one DIS (``stub``): iterated, sequences of ``LocationInfo``, one a
    message.  It asks for ``SubscribeBatches``, and a DIS without it (UNIMPLEMENTED) for
    ``Subscribe``, whose snapshots come one a message.  ``cancel()`` ends it, from any thread."""

    def __init__(self, stub: dis_pb2_grpc.TableDataStub, request: dis_pb2.SubscribeRequest) -> None:
        self._stub, self._request = stub, request
        self._cancelled = False
        self._call = stub.SubscribeBatches(request)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __iter__(self) -> Iterator[Sequence[dis_pb2.LocationInfo]]:
        try:
            first = next(self._call)
        except StopIteration:
            return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._call = self._stub.Subscribe(self._request)
            if self._cancelled:  # cancelled while the first call was answered
                self._call.cancel()
            for m in self._call:
                yield (m,)
            return
        yield first.locations
        for m in self._call:
            yield m.locations

