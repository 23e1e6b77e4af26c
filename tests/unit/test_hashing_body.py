"""The upload body that hashes as it is sent: its digest is the content's, a retry's pass
from the start is hashed afresh, and a pass that skipped bytes gives no digest."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.hashing import HashingReader

DATA = os.urandom(3 << 20) + b"tail"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "state.sst"
    path.write_bytes(DATA)
    return path


def test_the_digest_is_the_contents_as_a_client_reads_it(source: Path) -> None:
    with source.open("rb") as fh:
        body = HashingReader(fh)
        assert len(body) == len(DATA)
        # what botocore does: size by seeking to the end and back, then read in blocks
        end = body.seek(0, io.SEEK_END)
        body.seek(0)
        assert end == len(DATA)
        sent = b"".join(iter(lambda: body.read(8192), b""))
    assert sent == DATA
    assert body.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_retry_from_the_start_is_hashed_afresh(source: Path) -> None:
    with source.open("rb") as fh:
        body = HashingReader(fh)
        body.read(1 << 20)  # the first attempt breaks off
        body.read(5)
        body.seek(0)  # botocore rewinds the body for its retry
        while body.read(1 << 16):
            pass
        assert body.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_pass_that_skips_or_stops_short_has_no_digest(source: Path) -> None:
    with source.open("rb") as fh:
        body = HashingReader(fh)
        body.read(100)
        with pytest.raises(ValueError, match="start to end"):
            body.hexdigest()  # stopped short
        body.seek(1000)
        body.read()
        with pytest.raises(ValueError, match="start to end"):
            body.hexdigest()  # skipped bytes 100..999


def test_the_file_backend_uploads_and_hashes_in_one_read(source: Path, tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    assert storage.upload_file_hashed(source, "j/chk-1/state.sst") == hashlib.sha256(
        DATA).hexdigest()
    assert storage.get_bytes("j/chk-1/state.sst") == DATA
