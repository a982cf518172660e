"""How a client authenticates to a DIS: defined here once, read from a command line in one place.

``ClientSecurity`` is what every client channel takes (``disd.rpc.channel.open_channel``): a CA to
trust (TLS), optionally a client certificate and key (mutual TLS), a bearer token, and a host name
override for the TLS check.  Where it comes from:

* command lines (``dis ls``, ``dis status``, ``dis health``, ``dis merge``):
  ``add_security_arguments`` declares ``--ca``, ``--cert``, ``--key``, ``--token-file`` and
  ``security_from_args`` builds the value from the parsed arguments;
* the Spark source: its options ``ca``, ``cert``, ``key``, ``token``, ``tokenFile``, ``serverName``
  (``disd.spark.options``), kept as a ``ClientSecurity`` that pickles into every task;
* the tailer: the ``tls`` and ``token_file`` keys of its YAML (``disd.tailer.config``).

Certificates are paths, read when a channel opens (so they must be readable where it opens); the
token is the token itself, read from its file when the security is built.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from disd.config import read_token


@dataclass(frozen=True)
class ClientSecurity:
    """How a client authenticates: CA to trust, optional client certificate, optional token."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None
    server_name: str | None = None  # override the TLS host name check (tests, IP addresses)

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def client_security(self) -> ClientSecurity | None:
        """This security, or None when it sets nothing (a plaintext channel without a token);
        ``open_channel`` and ``connect`` treat both alike."""
        if not any((self.ca, self.cert, self.key, self.token, self.server_name)):
            return None
        return self


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """The client security flags of every command that talks to a DIS."""
    p.add_argument("--ca", default=None, help="CA certificate: connect with TLS")
    p.add_argument("--cert", default=None, help="client certificate (mutual TLS)")
    p.add_argument("--key", default=None, help="client key (mutual TLS)")
    p.add_argument("--token-file", default=None, help="file holding the bearer token")


def security_from_args(args: argparse.Namespace) -> ClientSecurity:
    """The security the flags of ``add_security_arguments`` ask for; the token file is read now
    (``disd.config.ConfigError`` when it cannot be read or is empty)."""
    token = read_token(args.token_file, "--token-file") if args.token_file else None
    return ClientSecurity(ca=args.ca, cert=args.cert, key=args.key, token=token)
