"""A GetObject body that resumes where it broke off (``S3Storage.open_stream``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow_ckpt.runtime.storage.s3_errors import BODY_ERRORS


class ResumingBody:
    """A GetObject body read through ``read`` that, when the body breaks off, reopens
    it at the first byte not yet returned (``open_at(offset)``, None when the endpoint
    does not answer with exactly that range), at most ``resumes`` times per stream;
    the bytes returned are those of one object version."""

    def __init__(self, open_at: Callable[[int], Any], resumes: int) -> None:
        self._open_at = open_at
        self._resumes = resumes
        self._offset = 0
        self._body = open_at(0)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when negative); b"" at the end."""
        while True:
            try:
                chunk: bytes = self._body.read() if size < 0 else self._body.read(size)
            except BODY_ERRORS:
                if self._resumes <= 0:
                    raise
                self._resumes -= 1
                self._body.close()
                time.sleep(0.05)
                body = self._open_at(self._offset)
                if body is None:
                    raise
                self._body = body
                continue
            self._offset += len(chunk)
            return chunk

    def close(self) -> None:
        """Close the current body's connection."""
        self._body.close()
