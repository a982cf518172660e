"""The three read calls of the TableData service, as a reader asks one DIS for byte ranges.

``ReadRanges`` takes a location's ranges in one stream: what a reader uses.  Older DISes lack it,
or also ``ReadBlocks``; they answer ``UNIMPLEMENTED``, and are then read a ``ReadBlocks`` stream
per range, or with ``ReadBlock`` calls (``READ_AHEAD`` of them in flight).  ``BlockCalls``
remembers which DIS lacks which call, so each is asked at most once for it.  Which DIS to ask,
and what to do when it fails, is ``GrpcBlocks``'s concern.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

from disd.blocks.protocol import DisClientError, LocationSnapshot, Range
from disd.errors import DisError
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc

#: ReadBlock requests kept in flight per read: enough to hide the round trip on loopback.
READ_AHEAD = 32


class NotYetPublished(DisError):
    """A DIS served fewer bytes than a snapshot pins: it restarted and has not yet re-ingested
    rows it had published (a crash loses what was not checkpointed until the tailer resends it).
    The reader waits for it, or reads from another replica (``GrpcBlocks``)."""


class BlockCalls:
    """Byte ranges of a location's column files from the DIS at an address, over whichever of
    the three read calls it serves; ``stub(address)`` is the TableData stub of a DIS."""

    def __init__(self, stub: Callable[[str], dis_pb2_grpc.TableDataStub], timeout_s: float) -> None:
        self.stub = stub
        self.timeout_s = timeout_s
        self.no_ranges: set[str] = set()  # DIS addresses without ReadRanges
        self.unary_only: set[str] = set()  # DIS addresses without ReadBlocks either

    def read(self, address: str, snap: LocationSnapshot, ranges: list[Range]) -> list[bytes]:
        """The bytes of ``ranges`` from the DIS at ``address``, which must have published at
        least the bytes of each; NotYetPublished when it serves fewer, grpc.RpcError when a
        call fails."""
        bs = snap.block_size
        blocks = [(f, a // bs, (b - 1) // bs) for f, a, b in ranges]
        if address in self.no_ranges:
            parts = [self._blocks(address, snap, f, first, last) for f, first, last in blocks]
        else:
            try:
                parts = self._ranges_stream(address, snap, blocks)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.no_ranges.add(address)
                parts = [self._blocks(address, snap, f, first, last) for f, first, last in blocks]
        out = []
        for (file, start, stop), (_, first, _), got in zip(ranges, blocks, parts):
            data = got[0] if len(got) == 1 else b"".join(got)
            off = start - first * bs
            cut = data[off : off + (stop - start)]
            if len(cut) != stop - start:
                raise NotYetPublished(f"{snap.key}: {file} returned {len(cut)} bytes, expected {stop - start} "
                                      f"(the DIS at {address} publishes less than the snapshot read)")
            out.append(cut)
        return out

    def _blocks(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        """Blocks first..last of one file: a ReadBlocks stream, or ReadBlock calls against a DIS
        without it."""
        if address not in self.unary_only:
            try:
                return self._blocks_stream(address, snap, file, first, last)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.unary_only.add(address)
        return self._blocks_unary(address, snap, file, first, last)

    def _ranges_stream(self, address: str, snap: LocationSnapshot,
                       blocks: list[tuple[str, int, int]]) -> list[list[bytes]]:
        """Blocks first..last of each (file, first, last), in one ReadRanges stream."""
        req = dis_pb2.ReadRangesRequest(location=key_to_proto(snap.key), ranges=[
            dis_pb2.BlockRange(file=f, first_block=first, block_count=last - first + 1) for f, first, last in blocks])
        out: list[list[bytes]] = [[] for _ in blocks]
        for m in self.stub(address).ReadRanges(req, timeout=self.timeout_s):
            for p in m.parts:
                if p.range >= len(out):
                    raise DisClientError(f"{snap.key}: the DIS at {address} answered range {p.range} of "
                                         f"{len(out)} asked")
                out[p.range].extend(p.blocks)
        return out

    def _blocks_stream(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        req = dis_pb2.ReadBlocksRequest(location=key_to_proto(snap.key), file=file, first_block=first,
                                        block_count=last - first + 1)
        return [b for m in self.stub(address).ReadBlocks(req, timeout=self.timeout_s) for b in m.blocks]

    def _blocks_unary(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        stub = self.stub(address)
        key = key_to_proto(snap.key)
        parts: list[bytes] = []
        pending: list[Any] = []
        idx = first
        try:
            while idx <= last or pending:
                while idx <= last and len(pending) < READ_AHEAD:
                    req = dis_pb2.ReadBlockRequest(location=key, file=file, block_index=idx)
                    pending.append(stub.ReadBlock.future(req, timeout=self.timeout_s))
                    idx += 1
                parts.append(pending.pop(0).result().data)
        except grpc.RpcError:
            for f in pending:
                f.cancel()
            raise
        return parts
