"""The checkpoint file format (version 1): one ASCII header line, then the payload.

    nodeagent-checkpoint 1 sha256=<64 lowercase hex digits> length=<decimal>\\n<payload>

The header is parsed strictly (one exact spelling per value: no leading zeros, no upper-case hex,
no spaces), so every change of a single byte and every truncation of a file makes it fail: a byte
of the header no longer matches the grammar or the version, the length or the digest no longer
agrees with the payload, and a byte of the payload changes its sha256.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["FORMAT_VERSION", "CorruptCheckpoint", "decode", "encode"]

FORMAT_VERSION = 1
_MAGIC = b"nodeagent-checkpoint"
_HEADER = re.compile(
    rb"nodeagent-checkpoint (0|[1-9][0-9]{0,8}) sha256=([0-9a-f]{64}) length=(0|[1-9][0-9]{0,18})"
)


class CorruptCheckpoint(ValueError):
    """The bytes are not a valid version-1 checkpoint; the message says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def encode(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest()
    header = f"nodeagent-checkpoint {FORMAT_VERSION} sha256={digest} length={len(payload)}\n"
    return header.encode("ascii") + payload


def decode(blob: bytes) -> bytes:
    """The payload of `blob`; raises CorruptCheckpoint naming the first rule it breaks."""
    header, newline, payload = blob.partition(b"\n")
    if not header.startswith(_MAGIC):
        raise CorruptCheckpoint(_foreign(blob))
    if not newline:
        raise CorruptCheckpoint("no complete header line (truncated)")
    match = _HEADER.fullmatch(header)
    if match is None:
        raise CorruptCheckpoint("malformed header line")
    version, digest, length = match.groups()
    if int(version) != FORMAT_VERSION:
        raise CorruptCheckpoint(f"unsupported format version {int(version)}")
    if len(payload) != int(length):
        raise CorruptCheckpoint(f"payload is {len(payload)} bytes, the header says {int(length)}")
    if hashlib.sha256(payload).hexdigest().encode("ascii") != digest:
        raise CorruptCheckpoint("sha256 of the payload does not match the header")
    return payload


def _foreign(blob: bytes) -> str:
    if not blob:
        return "empty file"
    if _MAGIC.startswith(blob):
        return "no complete header line (truncated)"
    if blob.lstrip().startswith(b"{"):
        # The kubelet checkpointmanager's JSON ({"Data": ..., "Checksum": N}), as Katalyst writes.
        return "not a nodeagent checkpoint (JSON, as kubelet or Katalyst checkpoints are)"
    return "not a nodeagent checkpoint (unknown header)"
