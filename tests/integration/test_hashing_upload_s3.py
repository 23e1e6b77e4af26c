"""``upload_file_hashed`` on S3 (moto, real HTTP): the SHA-256 computed while botocore
sends the body equals the stored object's, for a single PutObject and a multipart upload
(the test storages' threshold is 5 MiB)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from airflow_ckpt.runtime.storage import CheckpointStorage

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("size", [1000, 12 << 20])
def test_the_hash_sent_is_the_stored_objects(s3_storage: CheckpointStorage, tmp_path: Path,
                                             size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    sha = s3_storage.upload_file_hashed(path, "j/chk-1/f")
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert hashlib.sha256(s3_storage.get_bytes("j/chk-1/f")).hexdigest() == sha
