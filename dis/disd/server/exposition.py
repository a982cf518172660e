"""A server's Prometheus endpoint, with its per-location gauges rendered as text in one pass.

Why: prometheus_client makes a ``Sample`` per series and formats each on its own (labels sorted,
names validated and escaped, the value through ``floatToGoString``).  A DIS has a dozen gauges per
location: at 10,000 locations that was 0.9 s of CPU per scrape on an idle machine, and several
seconds while threads ingesting competed for the interpreter's lock, against Prometheus's 10 s
``scrape_timeout``.  Here each location's label text is made once and kept, and a family is
its ``# HELP``/``# TYPE`` header and one ``%`` formatting per series, run by ``map`` over the
columns of values (no Python frame per sample).  The text is what prometheus_client would write:
the text format 0.0.4 and OpenMetrics 1.0 write a gauge's samples alike (a value may be written
as an integer in both), and only the escaping of the help text differs.

``serve_metrics_http`` serves a registry (prometheus_client's encoders, content negotiation and
``name[]`` filter, as ``prometheus_client.start_http_server`` does) followed by the families of
the ``RenderedFamilies`` collectors given, before OpenMetrics' ``# EOF``; gzip when asked, at
level 1: on a page this repetitive, about a seventh bigger than at level 9 (the ``gzip``
module's default) for a fifth of the time.
"""

from __future__ import annotations

import gzip
import socket
import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Protocol, Sequence, runtime_checkable
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

OPENMETRICS_EOF = b"# EOF\n"
GZIP_LEVEL = 1

#: a value of one series; None: the location has no sample in that family
Value = int | float | None


@dataclass(frozen=True)
class GaugeColumn:
    """One gauge family with a sample per location: ``values[i]`` is the value of the location
    whose label text is ``labels[i]`` in ``render_gauges`` (None: no sample for it)."""

    name: str
    help: str
    values: Sequence[Value]


def label_text(labels: dict[str, str]) -> str:
    """``{k="v",...}``: the labels in name order with their values escaped, as both exposition
    formats write them."""
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape_label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text


def render_gauges(labels: Sequence[str], columns: Iterable[GaugeColumn], openmetrics: bool = False,
                  names: frozenset[str] | None = None) -> str:
    """The exposition text of ``columns`` over the series ``labels`` (label texts from
    ``label_text``), the families ``names`` holds only when given.  A value must be an int or a
    float (a bool would be written ``True``): ``%s`` writes an int as its digits and a float as
    its shortest round-trip form, both of which Prometheus reads back to the same float."""
    out: list[str] = []
    for col in columns:
        if names is not None and col.name not in names:
            continue
        values = col.values
        assert len(values) == len(labels), f"{col.name}: {len(values)} values for {len(labels)} series"
        out.append(f"# HELP {col.name} {_help(col.help, openmetrics)}\n# TYPE {col.name} gauge\n")
        pairs: Iterable[tuple[str, Value]] = zip(labels, values)
        if None in values:
            pairs = [p for p in pairs if p[1] is not None]
        out.append("".join(map(f"{col.name}%s %s\n".__mod__, pairs)))
    return "".join(out)


@runtime_checkable
class RenderedFamilies(Protocol):
    """A collector whose families (besides those its ``collect`` yields, if any) come as text:
    ``exposition`` returns them in the text format, or OpenMetrics' with ``openmetrics``; only
    those ``names`` holds when given (a scrape's ``name[]`` filter)."""

    def exposition(self, openmetrics: bool, names: frozenset[str] | None) -> str: ...


def metrics_page(registry: CollectorRegistry, rendered: Sequence[RenderedFamilies], accept: str | None,
                 accept_encoding: str | None, query: str) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and body of one scrape: the encoder ``accept`` asks for (prometheus_client's
    choice) over ``registry``, then the ``rendered`` families; gzipped when accepted."""
    encoder, content_type = choose_encoder(accept or "")
    wanted = parse_qs(query).get("name[]")
    names = frozenset(wanted) if wanted else None
    body = encoder(registry.restricted_registry(wanted) if wanted else registry)
    openmetrics = content_type.startswith("application/openmetrics-text")
    extra = "".join(r.exposition(openmetrics, names) for r in rendered).encode()
    if openmetrics and body.endswith(OPENMETRICS_EOF):
        body = body[: -len(OPENMETRICS_EOF)] + extra + OPENMETRICS_EOF
    else:
        body += extra
    headers = [("Content-Type", content_type)]
    if gzip_accepted(accept_encoding or ""):
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    return headers, body


def metrics_app(registry: CollectorRegistry, rendered: Sequence[RenderedFamilies]) -> Callable[..., Any]:
    """A WSGI application answering as prometheus_client's ``make_wsgi_app`` does (GET on any
    path, OPTIONS, 405 otherwise, an empty favicon), its page from ``metrics_page``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        headers: list[tuple[str, str]]
        if method == "OPTIONS":
            status, headers, body = "200 OK", [("Allow", "OPTIONS,GET")], b""
        elif method != "GET":
            status, headers = "405 Method Not Allowed", [("Allow", "OPTIONS,GET")]
            body = f"# HTTP {status}: {method}; use OPTIONS or GET\n".encode()
        elif environ.get("PATH_INFO") == "/favicon.ico":
            status, headers, body = "200 OK", [], b""
        else:
            status = "200 OK"
            headers, body = metrics_page(registry, rendered, environ.get("HTTP_ACCEPT"),
                                         environ.get("HTTP_ACCEPT_ENCODING"), environ.get("QUERY_STRING", ""))
        start_response(status, headers)
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """A scrape every few seconds is not worth a line of the log."""


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request's thread never holds up the process's exit


def serve_metrics_http(host: str, port: int, registry: CollectorRegistry,
                       rendered: Sequence[RenderedFamilies] = ()) -> WSGIServer:
    """Serve ``metrics_app`` on ``host``:``port`` (IPv4 or IPv6, as the address says), a thread
    per request, from a daemon thread; returns the server (``server_address``, ``shutdown``)."""
    family, _type, _proto, _name, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family})
    httpd: WSGIServer = make_server(str(sockaddr[0]), port, metrics_app(registry, rendered), server_class,
                        handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="dis-metrics", daemon=True).start()
    return httpd
