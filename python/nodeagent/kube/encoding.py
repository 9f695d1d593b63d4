"""Response bodies as the server sent them, decoded here rather than by httpx.

Kubernetes 1.37 gzips a streaming list (a watch with ``sendInitialEvents=true``, the
WatchListCompression gate, beta and on) as one gzip member per flush: the initial events, then
every later event or bookmark, each a member of its own. httpx 0.28's gzip decoder reads the first
member and silently drops the rest, so a watch went deaf after its list. This decoder reads any
number of members, and never ends a body with bytes it did not consume: whatever it cannot
decode (an encoding the client did not ask for, bytes that are not gzip, a member cut short at
the end of the body) raises `DecodeError`.
"""

from __future__ import annotations

import zlib

from nodeagent.kube import errors

# What the client accepts; the apiserver compresses only with gzip.
ACCEPT_ENCODING = "gzip"
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class BodyDecoder:
    """Decodes one body, chunk by chunk, for its ``Content-Encoding`` (identity or gzip)."""

    def __init__(self, content_encoding: str | None) -> None:
        codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if codings not in ([], ["gzip"]):
            raise errors.DecodeError(
                f"Content-Encoding {content_encoding!r}: the client accepts only gzip"
            )
        self.gzip = bool(codings)
        self._z = zlib.decompressobj(_GZIP_WBITS) if self.gzip else None
        # Input went into the current member and its end has not come yet.
        self._open = False
        self.members = 0  # gzip members completed
        self.raw_bytes = 0  # bytes received (as on the wire, after de-chunking)

    def decode(self, data: bytes) -> bytes:
        """The decoded bytes of ``data``, the next piece of the body (may be b"" while a gzip
        member's header or deflate block is still incomplete)."""
        self.raw_bytes += len(data)
        if self._z is None:
            return data
        out: list[bytes] = []
        while data:
            try:
                out.append(self._z.decompress(data))
            except zlib.error as exc:
                raise errors.DecodeError(
                    f"gzip body: {exc} (after {self.members} complete members)"
                ) from None
            if not self._z.eof:
                self._open = True  # every byte of data went in (no max_length)
                break
            # A member ended; what follows is the next member (or its first bytes).
            self.members += 1
            self._open = False
            data = self._z.unused_data
            self._z = zlib.decompressobj(_GZIP_WBITS)
        return b"".join(out)

    def finish(self) -> None:
        """The body ended: raises `DecodeError` if a gzip member was cut short."""
        if self._open:
            raise errors.DecodeError(
                f"gzip body ended inside member {self.members + 1} "
                f"({self.members} complete, {self.raw_bytes} bytes received)"
            )


def decode_body(content_encoding: str | None, raw: bytes) -> bytes:
    """A whole body's decoded bytes (`DecodeError` on anything left undecoded)."""
    decoder = BodyDecoder(content_encoding)
    data = decoder.decode(raw)
    decoder.finish()
    return data
