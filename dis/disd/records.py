"""Small checksummed records: the framing shared by ``table.size`` and the ``.tlmi`` index.

A record is three lines::

    <MAGIC_WORD> <version>
    <the body: one line of compact JSON>
    crc32c <8 hex digits of CRC32C(body)>

so a person can read it with ``cat``, a torn or hand-edited record is told apart from a good one,
and a newer version is refused by name instead of misread.  The bodies are the owners' business
(``disd.storage.checkpoint``, ``disd.historical.index``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from disd.binlog.format import crc32c


@dataclass(frozen=True)
class RecordFormat:
    """One kind of record and the words its errors use."""

    magic_word: str
    version: int
    noun: str  # "checkpoint record": "not a checkpoint record", "checkpoint record truncated ..."
    version_noun: str  # "checkpoint format": "unsupported checkpoint format version '7' ..."
    error: type[Exception]

    @property
    def magic(self) -> str:
        return f"{self.magic_word} {self.version}"

    def encode(self, body: dict[str, Any]) -> bytes:
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return self.magic.encode() + b"\n" + data + b"\n" + f"crc32c {crc32c(data):08x}\n".encode()

    def decode(self, data: bytes, where: str) -> Any:
        """The body of a record, or ``self.error`` saying what is wrong with it."""
        lines = data.split(b"\n")
        first = lines[0].decode("ascii", errors="replace")
        if not first.startswith(self.magic_word + " "):
            raise self.error(f"{where}: not a {self.noun} (first line is not '{self.magic}')")
        if first != self.magic:
            raise self.error(f"{where}: unsupported {self.version_noun} version {first[len(self.magic_word) + 1:]!r} "
                             f"(this version of dis reads version {self.version})")
        if len(lines) != 4 or lines[3] != b"":
            raise self.error(f"{where}: {self.noun} truncated or with extra lines")
        body, crc_line = lines[1], lines[2]
        if crc_line != f"crc32c {crc32c(body):08x}".encode():
            raise self.error(f"{where}: {self.noun} checksum mismatch")
        try:
            return json.loads(body)
        except ValueError as e:
            raise self.error(f"{where}: {self.noun} unreadable: {e}") from None
