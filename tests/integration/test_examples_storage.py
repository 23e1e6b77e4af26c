"""``airflow-ckpt examples --storage s3://...`` against a real S3 endpoint (moto server).

A missing bucket is an error that says how to create it, and nothing is copied;
``--create-bucket`` creates it (``S3Storage.create_bucket``: an existing bucket of ours is
fine); the settings printed carry the endpoint as the ``aws_default`` connection.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from airflow_ckpt.cli import main
from airflow_ckpt.errors import BucketNotFoundError
from airflow_ckpt.examples import ExamplesError, prepare_storage
from airflow_ckpt.runtime.storage.s3 import S3Storage
from airflow_ckpt.testing import S3Endpoint

pytestmark = pytest.mark.integration


def test_create_bucket_once_then_found(s3_endpoint: S3Endpoint) -> None:
    name = f"cb-{uuid.uuid4().hex[:10]}"
    storage = s3_endpoint.storage(f"s3://{name}/p")
    assert isinstance(storage, S3Storage)
    try:
        with pytest.raises(BucketNotFoundError):
            storage.check()
        with pytest.raises(ExamplesError, match="pass --create-bucket"):
            prepare_storage(storage, create_bucket=False)
        storage.create_bucket()
        storage.check()
        storage.create_bucket()  # ours already: fine
        assert prepare_storage(storage, create_bucket=False).startswith(
            f"bucket {name!r} exists")
    finally:
        storage.close()
        s3_endpoint.delete_bucket(name)


def test_command_refuses_a_missing_bucket_then_creates_it(
    s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"ex-{uuid.uuid4().hex[:10]}"
    argv = ["--storage", f"s3://{name}/ckpt", "--endpoint-url", s3_endpoint.url,
            "examples", str(tmp_path / "dags")]
    try:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"bucket {name!r} does not exist" in err and "--create-bucket" in err
        assert not (tmp_path / "dags").exists()
        out = io.StringIO()
        assert main([*argv, "--create-bucket"], out=out) == 0
        text = out.getvalue()
        assert f"created bucket {name!r}" in text
        [conn] = [line.split("=", 1)[1] for line in text.splitlines()
                  if line.startswith("export AIRFLOW_CONN_AWS_DEFAULT=")]
        assert json.loads(conn.strip("'")) == {
            "conn_type": "aws",
            "extra": {"endpoint_url": s3_endpoint.url, "region_name": "us-east-1"}}
        assert (tmp_path / "dags" / "streaming_rate_counts.py").is_file()
    finally:
        s3_endpoint.delete_bucket(name)
