"""DISes over gRPC as a block source: ``GrpcBlocks``.

Locations as the owning DIS lists them (published sizes; ``routing`` says which DIS, or which set
of hot replicas, owns a table) and their byte ranges read over the TableData calls
(``disd.blocks.blockcalls``), over channels with ``ClientSecurity``.  A read whose replica goes
down continues on another replica that has published the bytes it reads, and a DIS that
restarts is waited for (``disd.blocks.failover``; docs/replicas.md).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Self, Sequence, TypeVar

import grpc
from google.protobuf.message import Message

from disd.blocks.blockcalls import BlockCalls, NotYetPublished
from disd.blocks.failover import DEFAULT_RETRY_S, DOWN_S, Backoff, explain, replica_order, restarting
from disd.blocks.protocol import BlockSourceError, DisClientError, LocationSnapshot, Range, Wanted
from disd.names import LocationKey
from disd.routing import Instance, Routing
from disd.rpc.channel import open_channel, tls_refusal
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.security import ClientSecurity

T = TypeVar("T")


class GrpcBlocks:
    """Blocks from DIS instances over gRPC: one channel per address, opened on first use.

    Which DIS: ``routing`` says which entry owns a table, and an entry is a set of replicas
    (one for a plain entry) holding byte-identical column files (docs/replicas.md).  An entry
    that lists proxies is read through them instead (``Routing.read_replicas``): a proxy serves
    the read side of a DIS, so its proxies are read as a replica set with all the rules below;
    a proxy itself reads with ``routing.upstream()``, the DISes.  A table is
    listed at every replica of its entry that answers, in parallel; each location is taken from
    the most advanced of them (the most rows), ties going to the first in the location's
    ``replica_order``, so in-sync replicas share the reads of a table's locations.  A snapshot's
    bytes are read from the replica that listed it (``snap.address``).

    A replica that goes down is a detour, not an error: a read that fails because its replica is
    unreachable (``UNAVAILABLE``, or ``DEADLINE_EXCEEDED`` when there is another replica to ask)
    continues on another replica of the set, but only on one whose ListLocations says it has
    published at least the end of the range read (bytes below a published size are the same on
    every replica; bytes above it a replica never said it has).  Listing, catalogue calls and
    subscriptions move to another replica the same way.

    A DIS restart is a pause, not an error: when no replica can serve a call (a set of one whose
    DIS restarts), it is tried again on fresh channels, with backoff, for up to ``retry_s``
    seconds, and so is a read of bytes no replica serves yet (after a crash a DIS republishes the
    rows a snapshot pinned once its tailer has resent them: the same rows, the same bytes).  Only
    then does the caller get an error, which says how long it waited.  ``retry_s=0`` asks each
    replica once (interactive commands)."""

    def __init__(self, routing: Routing, security: ClientSecurity | None = None, timeout_s: float = 30.0,
                 retry_s: float = DEFAULT_RETRY_S) -> None:
        self.routing = routing
        self.security = security
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, dis_pb2_grpc.TableDataStub] = {}
        self.block_calls = BlockCalls(self.stub, timeout_s)  # ReadRanges, or the older calls
        self._down: dict[str, float] = {}  # address -> when a call to it last failed (monotonic)
        # What each replica said it published, per location (ListLocations answers): the sizes a
        # read may take from it when it fails over there.  Sizes only grow, so an old answer
        # only understates (re-asked then); a replica that lost rows in a crash serves short,
        # which a read detects (NotYetPublished) and moves on.
        self._published: dict[tuple[str, LocationKey], dict[str, int]] = {}
        # Where reads of a snapshot went after its own replica failed: (key, snap.address) -> address.
        self._moved: dict[tuple[LocationKey, str], str] = {}

    # -- plumbing ------------------------------------------------------------------------------
    def stub(self, address: str) -> dis_pb2_grpc.TableDataStub:
        s = self._stubs.get(address)
        if s is None:
            ch = self._channels[address] = open_channel(address, self.security)
            s = self._stubs[address] = dis_pb2_grpc.TableDataStub(ch)
        return s

    def _call(self, address: str, method: str, request: Message) -> Any:
        """``method(request)`` at ``address``, retried (``_retrying``): the reply, of the type
        the method named returns."""
        return self._retrying(address, lambda: getattr(self.stub(address), method)(request, timeout=self.timeout_s))

    def _forget(self, address: str) -> None:
        """Drop the channel of ``address``: the next call opens a new one (a channel that saw
        its DIS go away may sit in gRPC's own reconnect backoff for much longer than a restart)."""
        ch = self._channels.pop(address, None)
        self._stubs.pop(address, None)
        if ch is not None:
            # Closed off the caller's thread: grpcio's Channel.close() was seen to block for good
            # after a refused TLS handshake on a loaded machine, which would hang the reader
            # instead of letting it retry or fail with its message.
            threading.Thread(target=ch.close, name="dis-channel-close", daemon=True).start()

    def _mark_down(self, address: str) -> None:
        self._down[address] = time.monotonic()
        self._forget(address)

    def _is_down(self, address: str) -> bool:
        t = self._down.get(address)
        return t is not None and time.monotonic() - t < DOWN_S

    def _healthy_first(self, addresses: Sequence[str]) -> list[str]:
        """``addresses`` in their order, those that failed lately last."""
        return sorted(addresses, key=self._is_down)

    def _refusal(self, e: grpc.RpcError, address: str, others: bool = False) -> DisClientError | None:
        """None where a failed call says its replica is down (ask another, or again later); else
        the error to answer at once, for a reason that stays.  A call that timed out counts as
        down when ``others`` (another replica can answer); a DIS of its own keeps answering
        DEADLINE_EXCEEDED at once."""
        if restarting(e):
            return self._refused_tls(e, address)
        if others and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return None
        return explain(e, address)

    def _refused_tls(self, e: grpc.RpcError, address: str) -> DisClientError | None:
        """The error of a DIS that refuses this client's TLS set-up (a certificate its client
        CA did not sign, or none), which gRPC reports as a closed socket, like a DIS going away;
        None where the failure is what it looks like.  Asked only of TLS channels whose call
        failed that way, so a restart's retries cost no extra handshakes."""
        if self.security is None or self.security.ca is None:
            return None
        details = (e.details() if hasattr(e, "details") else str(e)) or ""
        if "socket closed" not in details.lower():
            return None
        why = tls_refusal(address, self.security, min(self.timeout_s, 3.0))
        if why is None:
            return None
        return DisClientError(f"DIS at {address} refused this client's TLS set-up: {why} "
                              "(is the client certificate one its client CA signed?)")

    def _retrying(self, address: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, again while its DIS is unreachable or has not yet republished what it
        reads, for up to ``retry_s`` seconds; then the error, as a ``DisClientError``."""
        backoff = Backoff(self.retry_s)
        while True:
            try:
                return attempt()
            except grpc.RpcError as e:
                refusal = self._refusal(e, address)
                if refusal is not None:
                    raise refusal from None
                failure: BlockSourceError = explain(e, address)
            except NotYetPublished as e:
                failure = DisClientError(str(e))
            if backoff.expired():
                waited = f" (tried for {self.retry_s:g} s)" if self.retry_s > 0 else ""
                raise type(failure)(f"{failure}{waited}") from None
            self._forget(address)
            backoff.sleep()

    def _any_replica(self, addresses: Sequence[str], attempt: Callable[[str], T]) -> tuple[str, T]:
        """``(address, attempt(address))`` from the first replica of ``addresses`` (healthy ones
        first) that answers; rounds over them, with backoff, for up to ``retry_s`` seconds while
        none does.  Each round tries every replica once, so ``retry_s=0`` still fails over."""
        others = len(addresses) > 1
        backoff = Backoff(self.retry_s)
        while True:
            failures: list[str] = []
            for address in self._healthy_first(addresses):
                try:
                    return address, attempt(address)
                except grpc.RpcError as e:
                    refusal = self._refusal(e, address, others)
                    if refusal is not None:
                        raise refusal from None
                    failures.append(str(explain(e, address)))
                    self._mark_down(address)
            if backoff.expired():
                raise DisClientError(_failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _call_any(self, addresses: Sequence[str], method: str, request: Message) -> tuple[str, Any]:
        """``method(request)`` at the first replica of ``addresses`` that answers: (address, reply)."""
        return self._any_replica(
            addresses, lambda a: getattr(self.stub(a), method)(request, timeout=self.timeout_s))

    def _list_replicas(self, addresses: Sequence[str],
                       request: dis_pb2.ListLocationsRequest) -> dict[str, dis_pb2.ListLocationsResponse]:
        """ListLocations at every replica of ``addresses`` that answers, asked in parallel: replicas
        that failed lately are asked only when no other answers.  At least one answer, or (after
        ``retry_s``) the error."""
        others = len(addresses) > 1
        backoff = Backoff(self.retry_s)
        while True:
            healthy = [a for a in addresses if not self._is_down(a)]
            answers: dict[str, dis_pb2.ListLocationsResponse] = {}
            failures: list[str] = []
            refused: BlockSourceError | None = None
            for ask in ([healthy, [a for a in addresses if a not in healthy]] if healthy else [list(addresses)]):
                pending = {a: self.stub(a).ListLocations.future(request, timeout=self.timeout_s) for a in ask}
                for a, fut in pending.items():
                    try:
                        answers[a] = fut.result()
                    except grpc.RpcError as e:
                        refusal = self._refusal(e, a, others)
                        if refusal is not None:
                            refused = refused or refusal
                            continue
                        failures.append(str(explain(e, a)))
                        self._mark_down(a)
                if answers:
                    return answers
            if refused is not None:
                raise refused
            if backoff.expired():
                raise DisClientError(_failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _owner(self, namespace: str, table: str) -> str:
        return self._entry(namespace, table).address

    def _entry(self, namespace: str, table: str) -> Instance:
        inst = self.routing.owner(namespace, table)
        if inst is None:
            raise DisClientError(f"no DIS instance in the routing takes {namespace}.{table}")
        return inst

    def replicas(self, namespace: str, table: str) -> list[str]:
        """The addresses a table is read from, in the routing file's order: its entry's proxies
        when it lists any, else its replicas (``Routing.read_replicas``)."""
        return [r.address for r in self._entry(namespace, table).read_replicas]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- BlockSource ---------------------------------------------------------------------------
    def locations(self, namespace: str | None = None, table: str | None = None,
                  wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """Published locations of a table (of every table when none is named), each listed by
        a replica of the entry that owns its table: the most advanced one that answered (see
        the class docstring)."""
        entries = [self._entry(namespace, table)] if namespace and table else list(self.routing.instances)
        request = dis_pb2.ListLocationsRequest(namespace=namespace or "", table=table or "")
        out = []
        for inst in entries:
            addresses = [r.address for r in inst.read_replicas]
            found: dict[LocationKey, list[LocationSnapshot]] = {}
            for address, resp in self._list_replicas(addresses, request).items():
                for m in resp.locations:
                    snap = LocationSnapshot.from_msg(m, address)
                    self._published[(address, snap.key)] = snap.files
                    if self.routing.owner(snap.key.namespace, snap.key.table) != inst:
                        continue
                    if wanted is None or wanted(snap.key.column_partition):
                        found.setdefault(snap.key, []).append(snap)
            for key, snaps in found.items():
                most = max(s.rows for s in snaps)
                order = replica_order(str(key), addresses)
                out.append(min((s for s in snaps if s.rows == most), key=lambda s: order.index(s.address)))
        return sorted(out, key=lambda s: (s.key.namespace, s.key.table, s.key.column_partition,
                                          s.key.internal_partition))

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file (``read_ranges`` of one range)."""
        return self.read_ranges(snap, [(file, start, stop)])[0]

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """Byte ranges of column files of ``snap``: all in one ReadRanges stream (a DIS without
        ReadRanges is read a range at a time, with ReadBlocks or ReadBlock), from
        ``snap.address`` or, when that replica is down, from another replica of its set that has
        published at least the bytes read (see the class docstring)."""
        wanted = [(f, a, min(b, snap.files.get(f, 0))) for f, a, b in ranges]
        todo = [(f, a, b) for f, a, b in wanted if b > a]
        if not todo:
            return [b"" for _ in wanted]
        got = iter(self._read_replicas(snap, todo))
        return [next(got) if b > a else b"" for f, a, b in wanted]

    def _read_replicas(self, snap: LocationSnapshot, ranges: list[Range]) -> list[bytes]:
        candidates = self._read_candidates(snap)
        if len(candidates) == 1:
            return self._retrying(snap.address, lambda: self.block_calls.read(snap.address, snap, ranges))
        others = True
        backoff = Backoff(self.retry_s)
        while True:
            failures: list[str] = []
            moved = self._moved.get((snap.key, snap.address))
            for address in sorted(candidates, key=lambda a: (a != moved, self._is_down(a))):
                try:
                    if address != snap.address:
                        short = self._unpublished(address, snap.key, ranges)
                        if short is not None:
                            file, stop = short
                            have = self._published.get((address, snap.key), {}).get(file, 0)
                            failures.append(f"the DIS at {address} has published {have} bytes of {file} "
                                            f"of {snap.key}, fewer than {stop}")
                            continue
                    data = self.block_calls.read(address, snap, ranges)
                except grpc.RpcError as e:
                    refusal = self._refusal(e, address, others)
                    if refusal is not None:
                        raise refusal from None
                    failures.append(str(explain(e, address)))
                    self._mark_down(address)
                    continue
                except NotYetPublished as e:
                    failures.append(str(e))
                    continue
                if address != snap.address:
                    self._moved[(snap.key, snap.address)] = address
                return data
            if backoff.expired():
                what = ", ".join(f"[{a}, {b}) of {f}" for f, a, b in ranges)
                raise DisClientError(f"{snap.key}: no replica serves bytes {what}: "
                                     + _failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _unpublished(self, address: str, key: LocationKey, ranges: list[Range]) -> tuple[str, int] | None:
        """The first (file, stop) of ``ranges`` the replica at ``address`` has not said it
        published, or None when it serves them all."""
        for file, _, stop in ranges:
            if not self._has_published(address, key, file, stop):
                return file, stop
        return None

    def _read_candidates(self, snap: LocationSnapshot) -> list[str]:
        """``snap.address`` and, when it is a replica of a set, the set's other replicas in the
        location's ``replica_order``."""
        inst = self.routing.owner(snap.key.namespace, snap.key.table)
        addresses = [r.address for r in inst.read_replicas] if inst is not None else []
        if snap.address not in addresses:
            return [snap.address]
        return [snap.address] + [a for a in replica_order(str(snap.key), addresses) if a != snap.address]

    def _has_published(self, address: str, key: LocationKey, file: str, size: int) -> bool:
        """Whether the replica at ``address`` said it published at least ``size`` bytes of
        ``file`` of location ``key`` (asking its ListLocations when what it said last is less).
        RpcError when it cannot be asked."""
        if self._published.get((address, key), {}).get(file, 0) >= size:
            return True
        resp = self.stub(address).ListLocations(
            dis_pb2.ListLocationsRequest(namespace=key.namespace, table=key.table), timeout=self.timeout_s)
        for m in resp.locations:
            self._published[(address, key_from_proto(m.key))] = {f.name: int(f.size) for f in m.files}
        return self._published.get((address, key), {}).get(file, 0) >= size



def _failed(failures: Sequence[str], retry_s: float) -> str:
    """What a call that no replica answered says: each replica's failure, and how long it tried."""
    waited = f" (tried for {retry_s:g} s)" if retry_s > 0 else ""
    return "; ".join(dict.fromkeys(failures)) + waited

