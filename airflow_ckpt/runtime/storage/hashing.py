"""A file body that computes its SHA-256 while it is sent: each byte of an upload read
once, for the request and for the manifest's hash together.

An S3 client may read a body more than once: a retry seeks back to the start and sends
again, and over plain HTTP botocore reads it once to sign the payload before it sends
it. :class:`HashingReader` starts its digest afresh whenever it is moved back to the
start, so what it reports is the hash of the last pass that read the whole file from
its first byte to its last; a pass that skipped or stopped short leaves no digest
(:meth:`HashingReader.hexdigest` raises), never a wrong one.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import BinaryIO


class HashingReader(io.RawIOBase):
    """``source`` (a binary file open at its start), read-only, hashing what is read."""

    def __init__(self, source: BinaryIO) -> None:
        super().__init__()
        self._source = source
        self._size = os.fstat(source.fileno()).st_size
        self._digest = hashlib.sha256()
        self._position = 0  # of the source; the digest covers [0, _position) when valid
        self._valid = True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        """Bytes from the current position to the end (what a request sends from here)."""
        return self._size - self._position

    def read(self, size: int | None = -1) -> bytes:
        data = self._source.read(-1 if size is None else size)
        if self._valid:
            self._digest.update(data)
        self._position += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._source.seek(offset, whence)
        if position == 0:  # a new pass from the start: hash it afresh
            self._digest, self._valid = hashlib.sha256(), True
        elif position != self._position:  # a pass that skips has no digest
            self._valid = False
        self._position = position
        return position

    def hexdigest(self) -> str:
        """The SHA-256 of the whole file, as the last pass from its start read it.

        :raises ValueError: the last pass did not read the file from start to end
        """
        if not self._valid or self._position != self._size:
            raise ValueError(f"the body was not read from start to end ({self._position} "
                             f"of {self._size} bytes in the last pass)")
        return self._digest.hexdigest()
