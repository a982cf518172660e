"""What the Ingest contract says in a status's details that both sides read (docs/grpc-contract.md).

A DIS that holds a location in error ends its stream (or refuses to open it) with
``RESOURCE_EXHAUSTED`` or ``UNAVAILABLE`` and these details.  ``UNAVAILABLE`` alone also means a
DIS that is restarting or unreachable, which a tailer reconnects to within seconds; a location in
error may stay so until an operator acts, so a tailer backs off further for it and says it once
(docs/tailer.md).  One home for the wording, so that the tailer's test of it cannot drift from
the DIS's.
"""

from __future__ import annotations

from disd.names import LocationKey

_IN_ERROR = " is in error: "


def location_in_error(key: LocationKey, error: object) -> str:
    """The details of a status for a location the DIS holds in error."""
    return f"location {key}{_IN_ERROR}{error}"


def says_location_in_error(details: str) -> bool:
    """Whether a status's details say the DIS holds the stream's location in error."""
    return details.startswith("location ") and _IN_ERROR in details
