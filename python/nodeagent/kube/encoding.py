"""Response bodies as the server sent them, decoded here rather than by httpx.

Kubernetes 1.37 gzips a streaming list (a watch with ``sendInitialEvents=true``, the
WatchListCompression gate, beta and on) as one gzip member per flush: the initial events, then
every later event or bookmark, each a member of its own. httpx 0.28's gzip decoder reads the first
member and silently drops the rest, so a watch went deaf after its list. This decoder reads any
number of members, and never ends a body with bytes it did not consume: whatever it cannot
decode (an encoding the client did not ask for, bytes that are not gzip, a member cut short at
the end of the body) raises `DecodeError`.

Decoding is bounded: gzip turns 127 KiB into 128 MiB, so the decoder hands its output on in
pieces of at most `PIECE` bytes and raises `BodyTooLarge` as soon as a body decodes past
``max_bytes`` (``kube.max_response_bytes``, for whole responses) or a line of it (a watch event)
past ``max_line`` (``kube.max_event_bytes``): what is held at once never grows with the ratio.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from nodeagent.kube import errors

# What the client accepts; the apiserver compresses only with gzip.
ACCEPT_ENCODING = "gzip"
_GZIP_WBITS = 16 + zlib.MAX_WBITS
# The most one decompress call yields: a watch feeds every piece on at once, so this (not the
# compression ratio) bounds what a chunk from the wire can become in memory.
PIECE = 1 << 20


class BodyDecoder:
    """Decodes one body, chunk by chunk, for its ``Content-Encoding`` (identity or gzip).
    ``max_bytes``: the most the whole body may decode to; ``max_line``: the most one line of it
    (a watch event) may (None: unbounded)."""

    def __init__(
        self,
        content_encoding: str | None,
        *,
        max_bytes: int | None = None,
        max_line: int | None = None,
    ) -> None:
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
        self.decoded_bytes = 0
        self.max_bytes = max_bytes
        self.max_line = max_line
        self._line = 0  # decoded bytes since the last newline

    def decode(self, data: bytes) -> bytes:
        """The decoded bytes of ``data``, the next piece of the body (may be b"" while a gzip
        member's header or deflate block is still incomplete)."""
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """`decode`, in pieces of at most `PIECE` bytes, each checked against the limits
        before it is yielded."""
        self.raw_bytes += len(data)
        if self._z is None:
            if data:
                self._count(data)
                yield data
            return
        while True:
            try:
                out = self._z.decompress(data, PIECE)
            except zlib.error as exc:
                raise errors.DecodeError(
                    f"gzip body: {exc} (after {self.members} complete members)"
                ) from None
            if self._z.eof:
                # A member ended; what follows is the next member (or its first bytes).
                self.members += 1
                self._open = False
                data = self._z.unused_data
                self._z = zlib.decompressobj(_GZIP_WBITS)
            else:
                self._open = self._open or bool(data)
                data = self._z.unconsumed_tail
            if out:
                self._count(out)
                yield out
            # Done once every byte went in and the output was not cut at PIECE (a member cut
            # there may hold more, asked for with no input).
            if not data and len(out) < PIECE:
                return

    def _count(self, out: bytes) -> None:
        self.decoded_bytes += len(out)
        if self.max_bytes is not None and self.decoded_bytes > self.max_bytes:
            raise errors.BodyTooLarge(
                f"body decoded past kube.max_response_bytes ({self.max_bytes} bytes) from "
                f"{self.raw_bytes} bytes received",
                limit="response",
            )
        if self.max_line is None:
            return
        if self._line + len(out) <= self.max_line:
            last = out.rfind(b"\n")
            self._line = self._line + len(out) if last < 0 else len(out) - last - 1
            return
        start = 0
        while (i := out.find(b"\n", start)) >= 0:
            self._check_line(self._line + i - start)
            self._line, start = 0, i + 1
        self._line += len(out) - start
        self._check_line(self._line)

    def _check_line(self, length: int) -> None:
        if self.max_line is not None and length > self.max_line:
            raise errors.BodyTooLarge(
                f"watch event over kube.max_event_bytes ({self.max_line} bytes; "
                f"{self.raw_bytes} bytes received)",
                limit="event",
            )

    def finish(self) -> None:
        """The body ended: raises `DecodeError` if a gzip member was cut short."""
        if self._open:
            raise errors.DecodeError(
                f"gzip body ended inside member {self.members + 1} "
                f"({self.members} complete, {self.raw_bytes} bytes received)"
            )


def decode_body(content_encoding: str | None, raw: bytes, *, max_bytes: int | None = None) -> bytes:
    """A whole body's decoded bytes (`DecodeError` on anything left undecoded)."""
    decoder = BodyDecoder(content_encoding, max_bytes=max_bytes)
    data = decoder.decode(raw)
    decoder.finish()
    return data
