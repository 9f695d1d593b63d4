"""The checkpoint file format: one ASCII header line, then the payload.

    nodeagent-checkpoint 1 sha256=<64 lowercase hex> length=<decimal>\\n<payload>
    nodeagent-checkpoint 2 node=<node name> sha256=<64 lowercase hex> length=<decimal>\\n<payload>

Version 2 records the node that wrote the checkpoint (a state directory reused under another node
name must not hand one node's state to another); its digest covers the node name too (sha256 of
``<node>\\n<payload>``). Version 1 (an older agent, or a store without a node) is still read.

The header is parsed strictly (one exact spelling per value: no leading zeros, no upper-case hex,
no spaces), so every change of a single byte and every truncation of a file makes it fail: a byte
of the header no longer matches the grammar or the version, the length or the digest no longer
agrees with the payload (and node), and a byte of the payload changes its sha256.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["FORMAT_VERSION", "CorruptCheckpoint", "decode", "decode_with_node", "encode"]

FORMAT_VERSION = 2
_MAGIC = b"nodeagent-checkpoint"
_HEADER = re.compile(
    rb"nodeagent-checkpoint (0|[1-9][0-9]{0,8})(?: node=([a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?))?"
    rb" sha256=([0-9a-f]{64}) length=(0|[1-9][0-9]{0,18})"
)
_NODE = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")


class CorruptCheckpoint(ValueError):
    """The bytes are not a valid version-1 checkpoint; the message says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def encode(payload: bytes, node: str | None = None) -> bytes:
    """Version 2 with the node that writes it; version 1 without (ValueError: not a node
    name)."""
    if node is None:
        digest = hashlib.sha256(payload).hexdigest()
        header = f"nodeagent-checkpoint 1 sha256={digest} length={len(payload)}\n"
        return header.encode("ascii") + payload
    if _NODE.fullmatch(node) is None:
        raise ValueError(f"{node!r} is not a node name (a DNS subdomain)")
    digest = hashlib.sha256(node.encode("ascii") + b"\n" + payload).hexdigest()
    header = f"nodeagent-checkpoint 2 node={node} sha256={digest} length={len(payload)}\n"
    return header.encode("ascii") + payload


def decode(blob: bytes) -> bytes:
    """The payload of `blob`; raises CorruptCheckpoint naming the first rule it breaks."""
    return decode_with_node(blob)[0]


def decode_with_node(blob: bytes) -> tuple[bytes, str | None]:
    """The payload of `blob` and the node that wrote it (None: version 1, not recorded);
    raises CorruptCheckpoint naming the first rule it breaks."""
    header, newline, payload = blob.partition(b"\n")
    if not header.startswith(_MAGIC):
        raise CorruptCheckpoint(_foreign(blob))
    if not newline:
        raise CorruptCheckpoint("no complete header line (truncated)")
    match = _HEADER.fullmatch(header)
    if match is None:
        raise CorruptCheckpoint("malformed header line")
    version, node, digest, length = match.groups()
    if int(version) not in (1, 2):
        raise CorruptCheckpoint(f"unsupported format version {int(version)}")
    if (node is None) != (int(version) == 1):
        raise CorruptCheckpoint(
            f"format version {int(version)} with{'out' if node is None else ''} a node"
        )
    if len(payload) != int(length):
        raise CorruptCheckpoint(f"payload is {len(payload)} bytes, the header says {int(length)}")
    covered = payload if node is None else node + b"\n" + payload
    if hashlib.sha256(covered).hexdigest().encode("ascii") != digest:
        raise CorruptCheckpoint("sha256 of the payload does not match the header")
    return payload, None if node is None else node.decode("ascii")


def _foreign(blob: bytes) -> str:
    if not blob:
        return "empty file"
    if _MAGIC.startswith(blob):
        return "no complete header line (truncated)"
    if blob.lstrip().startswith(b"{"):
        # The kubelet checkpointmanager's JSON ({"Data": ..., "Checksum": N}), as Katalyst writes.
        return "not a nodeagent checkpoint (JSON, as kubelet or Katalyst checkpoints are)"
    return "not a nodeagent checkpoint (unknown header)"
