"""Server-side security: TLS / mutual TLS credentials and the bearer-token check.

The token is compared in constant time on every call of the Ingest and TableData services.
Health checking and reflection stay open so that probes and ``grpcurl list`` work without
secrets; they expose no table data.
"""

from __future__ import annotations

import hmac
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeAlias

import grpc

from disd.config import TlsConfig

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

# A method's handler, of whichever service is called: its request and reply types are that
# method's.  grpc's interceptor is generic in its stubs alone (not at run time).
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    cert = pathlib.Path(tls.cert).read_bytes()
    key = pathlib.Path(tls.key).read_bytes()
    ca = pathlib.Path(tls.client_ca).read_bytes() if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _deny(code: grpc.StatusCode, details: str, streaming_response: bool, streaming_request: bool) -> _Handler:
    def unary(request: object, context: grpc.ServicerContext) -> None:
        context.abort(code, details)

    def stream(request_or_iterator: object, context: grpc.ServicerContext) -> Iterator[None]:
        context.abort(code, details)
        yield  # pragma: no cover

    if streaming_request and streaming_response:
        return grpc.stream_stream_rpc_method_handler(stream)
    if streaming_request:
        return grpc.stream_unary_rpc_method_handler(unary)
    if streaming_response:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


class TokenInterceptor(_ServerInterceptor):
    """Refuses calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> _Handler | None:
        method = handler_call_details.method or ""
        if method.startswith(OPEN_SERVICES):
            return continuation(handler_call_details)
        got = None
        for k, v in handler_call_details.invocation_metadata or ():
            if k == "authorization":
                got = v.encode() if isinstance(v, str) else v
                break
        if got is not None and hmac.compare_digest(got, self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        detail = "missing bearer token" if got is None else "invalid bearer token"
        return _deny(grpc.StatusCode.UNAUTHENTICATED, detail, handler.response_streaming, handler.request_streaming)
