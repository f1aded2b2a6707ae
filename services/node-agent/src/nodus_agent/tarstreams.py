"""A decompressed tar stream read forward only, its members' bytes written from the decompression buffer
straight into files.

tarfile's stream mode (``r|``) reads through a buffer that it joins and slices on every read, and its
member files copy once more on the way out: three copies of every byte of a restore, the largest share of
its CPU after decompression (py-spy; zstd + tar + files took 0.23 CPU-s of a 210 MB restore, 0.13 without
them: docs/benchmarks.md, "checkpoint"). Here tarfile only parses the headers (pax and GNU ones included)
over :class:`Inflated`, a file that can only move forward, as in its stream mode; a regular member's bytes
go from the buffer zstd decompresses into (one, reused) to the member's file with ``os.write``. zstd and
``os.write`` both release the GIL, so the event loop that downloads the next chunks keeps running beside
them.
"""

from __future__ import annotations

import os
import tarfile
from typing import Protocol

from nodus_agent.archiving import MiB

BUFFER_SIZE = 4 * MiB
"""Decompressed bytes held at once: the size of most writes into a restored file."""


class Decompressing(Protocol):
    """What :class:`Inflated` reads from: zstd's stream reader (``ZstdDecompressor.stream_reader``)."""

    def readinto(self, b: bytearray | memoryview) -> int: ...


class Inflated:
    """The decompressed stream as the forward-only file tarfile reads headers from, counting where it is
    (``tell``) so a member's data starts where tarfile says (``offset_data``)."""

    def __init__(self, source: Decompressing, buffer_size: int = BUFFER_SIZE) -> None:
        self.source = source
        self.buf = bytearray(buffer_size)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.pos = 0

    def _fill(self) -> bool:
        """The next decompressed bytes into the buffer (everything before them was used); False at the end."""
        self.start, self.end = 0, self.source.readinto(self.buf)
        return self.end > 0

    def _take(self, n: int) -> memoryview | None:
        """Up to ``n`` bytes (n > 0) as a view of the buffer, valid until the next call; None at the end."""
        if self.start == self.end and not self._fill():
            return None
        k = min(n, self.end - self.start)
        piece = self.view[self.start : self.start + k]
        self.start += k
        self.pos += k
        return piece

    def read(self, n: int = -1) -> bytes:
        """Header blocks for tarfile: small reads, copied out of the buffer."""
        parts: list[bytes] = []
        left = n if n >= 0 else 1 << 62
        while left and (piece := self._take(left)) is not None:
            parts.append(piece.tobytes())
            left -= len(piece)
        return b"".join(parts)

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Forward only (tarfile skips a member's padding, or a member not extracted, this way)."""
        if whence != os.SEEK_SET or offset < self.pos:
            raise tarfile.StreamError("seeking backwards is not allowed")
        left = offset - self.pos
        while left and (piece := self._take(left)) is not None:
            left -= len(piece)
        return self.pos

    def write_to(self, fd: int, size: int) -> None:
        """The next ``size`` bytes into the file ``fd``, straight from the buffer; raises
        :class:`tarfile.ReadError` if the stream ends first (a cut archive), as tarfile's own reads do."""
        left = size
        while left:
            piece = self._take(left)
            if piece is None:
                raise tarfile.ReadError("unexpected end of data")
            left -= len(piece)
            while piece:
                piece = piece[os.write(fd, piece) :]

    def drain(self) -> None:
        """Read to the end of the decompressed stream (zstd checks each frame's checksum on the way)."""
        self.start = self.end
        while self._fill():
            self.pos += self.end
