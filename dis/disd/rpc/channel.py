"""Client channels to a DIS: plaintext on loopback, TLS/mTLS, and the bearer token (as
``disd.security.ClientSecurity`` says)."""

from __future__ import annotations

import pathlib
import socket
import ssl
from typing import Any

import grpc

from disd.security import ClientSecurity

#: Frames are at most 32 MiB; leave room for the message envelope.
MAX_MESSAGE_BYTES = 48 << 20

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]

#: The shortest keepalive interval a client of the product's servers may use: a DIS and a proxy
#: accept pings this often (``disd.server.daemon.grpc_server``), more often is refused as abuse
#: (GOAWAY ``too_many_pings``).
MIN_KEEPALIVE_MS = 1_000


def keepalive_options(interval_ms: int, timeout_ms: int) -> tuple[tuple[str, object], ...]:
    """HTTP/2 keepalive pings every ``interval_ms`` of silence, the connection given up when one is
    not answered within ``timeout_ms``: how a client notices a peer that stopped without closing
    its connections (a process stopped, frozen, or a host gone), whose kernel may go on
    acknowledging TCP while nothing answers a call.  Pings go whether or not calls are open and
    however long the server has sent no data.

    ``grpc.http2.ping_timeout_ms`` too: gRPC's core sends no ping while one is unanswered (its
    flow-control probes are pings as well) and gives that one ``ping_timeout_ms``, 60 s by
    default, whatever ``keepalive_timeout_ms`` says; without it a frozen peer was noticed after a
    minute, or not at all within a 45 s freeze."""
    timeout_ms = max(MIN_KEEPALIVE_MS, timeout_ms)
    return (("grpc.keepalive_time_ms", max(MIN_KEEPALIVE_MS, interval_ms)),
            ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.ping_timeout_ms", timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0))


def channel_options(extra_options: tuple[tuple[str, object], ...] = ()) -> list[tuple[str, object]]:
    """``CHANNEL_OPTIONS`` with ``extra_options``, an extra option replacing the one of the same
    name (never both given: which of two gRPC keeps is not its documented behaviour)."""
    merged: dict[str, object] = dict(CHANNEL_OPTIONS)
    merged.update(extra_options)
    return list(merged.items())


class _TokenAuth(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:  # noqa: ANN001, ARG002 - grpc.AuthMetadataPlugin's signature
        callback(self._md, None)


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the token on a plaintext channel (gRPC refuses call credentials without TLS)."""

    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, d) -> grpc.ClientCallDetails:  # noqa: ANN001
        md = list(d.metadata or []) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, cont, d, req) -> Any:  # noqa: ANN001 - grpc's call objects; the continuation's own
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont, d, req) -> Any:  # noqa: ANN001 - grpc's call objects; the continuation's own
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont, d, it) -> Any:  # noqa: ANN001 - grpc's call objects; the continuation's own
        return cont(self._details(d), it)

    def intercept_stream_stream(self, cont, d, it) -> Any:  # noqa: ANN001 - grpc's call objects; the continuation's own
        return cont(self._details(d), it)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata) -> None:  # noqa: ANN001
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def open_channel(address: str, security: ClientSecurity | None = None,
                 extra_options: tuple[tuple[str, object], ...] = ()) -> grpc.Channel:
    """A channel to ``address``; ``extra_options`` are more gRPC channel arguments (a long-lived
    channel's reconnect backoff, for one)."""
    security = security or ClientSecurity()
    options = channel_options(extra_options)
    if security.ca is not None:  # ``security.tls``
        root = pathlib.Path(security.ca).read_bytes()
        cert = pathlib.Path(security.cert).read_bytes() if security.cert else None
        key = pathlib.Path(security.key).read_bytes() if security.key else None
        creds = grpc.ssl_channel_credentials(root, key, cert)
        if security.token:
            creds = grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(_TokenAuth(security.token)))
        if security.server_name:
            options.append(("grpc.ssl_target_name_override", security.server_name))
        return grpc.secure_channel(address, creds, options=options)
    channel = grpc.insecure_channel(address, options=options)
    if security.token:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(security.token))
    return channel


def tls_refusal(address: str, security: ClientSecurity | None, timeout_s: float = 3.0) -> str | None:
    """Why the server at ``address`` refuses this client's TLS set-up (a client certificate it
    does not trust, or none where it requires one), or None.

    gRPC reports such a refusal as ``UNAVAILABLE: Socket closed``, which reads like a server
    going away: with TLS 1.3 the server checks the client's certificate after the client's side
    of the handshake is done, and then closes the connection (gRPC's server sends no alert).  One
    handshake of our own, with the same CA, certificate and host name, tells: a server that
    alerts, or closes before its first HTTP/2 frame (an HTTP/2 server speaks first, with its
    SETTINGS), refused us.  So a reader refused for its certificate is told at once instead of
    waiting out a restart that is not happening.  None where the server speaks, where
    ``security`` is not TLS, or where the address cannot be reached or parsed (then the
    caller's own error stands)."""
    if security is None or security.ca is None:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return None
    host = host.strip("[]")
    try:
        ctx = ssl.create_default_context(cafile=security.ca)
        if security.cert:
            ctx.load_cert_chain(security.cert, security.key)
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection((host, int(port)), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=security.server_name or host) as tls:
            first = tls.recv(1)  # a refusal comes with the first read, not with the handshake
    except ssl.SSLError as e:
        return e.reason or str(e)
    except OSError:
        return None
    if first:
        return None  # the server spoke (HTTP/2 begins with the server's SETTINGS): no refusal
    return "it closed the connection once TLS was set up, before a word of HTTP/2, as a DIS does " \
           "to a client certificate its client CA did not sign, or to none"
