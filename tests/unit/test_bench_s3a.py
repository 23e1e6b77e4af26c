"""bench.s3a's pure parts without Spark or a server: which S3 operation a request is,
the endpoint's request log, the S3A settings of an endpoint, the hadoop-aws pin.

No timings or request counts of S3A here: those are measured by ``python -m bench.s3a``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from airflow_ckpt.testing.jars import hadoop_aws, pyspark_hadoop
from airflow_ckpt.testing.request_count import kind_of, operation_of
from airflow_ckpt.testing.s3_server import REQUEST_LOG_PATH, S3Endpoint, _RequestLog
from bench.s3a import area_of


@pytest.mark.parametrize(("method", "path", "query", "copy", "operation", "kind"), [
    ("GET", "/", "", False, "ListBuckets", "OTHER"),
    ("GET", "/b", "list-type=2&prefix=q%2Fstate%2F", False, "ListObjectsV2", "LIST"),
    ("GET", "/b", "prefix=q", False, "ListObjects", "LIST"),
    ("GET", "/b", "uploads", False, "ListMultipartUploads", "LIST"),
    ("GET", "/b/q/offsets/3", "", False, "GetObject", "GET"),
    ("GET", "/b/q/x", "uploadId=7", False, "ListParts", "LIST"),
    ("HEAD", "/b/q/offsets/3", "", False, "HeadObject", "HEAD"),
    ("HEAD", "/b", "", False, "HeadBucket", "HEAD"),
    ("PUT", "/b/q/offsets/.3.tmp", "", False, "PutObject", "PUT"),
    ("PUT", "/b/q/offsets/3", "", True, "CopyObject", "PUT"),
    ("PUT", "/b/q/x", "partNumber=2&uploadId=7", False, "UploadPart", "PUT"),
    ("PUT", "/b/q/x", "partNumber=2&uploadId=7", True, "UploadPartCopy", "PUT"),
    ("PUT", "/b", "", False, "CreateBucket", "OTHER"),
    ("POST", "/b", "delete", False, "DeleteObjects", "DELETE"),
    ("POST", "/b/q/x", "uploads", False, "CreateMultipartUpload", "PUT"),
    ("POST", "/b/q/x", "uploadId=7", False, "CompleteMultipartUpload", "PUT"),
    ("DELETE", "/b/q/x", "uploadId=7", False, "AbortMultipartUpload", "DELETE"),
    ("DELETE", "/b/q/offsets/.3.tmp", "", False, "DeleteObject", "DELETE"),
    ("DELETE", "/b", "", False, "DeleteBucket", "OTHER"),
])
def test_operation_of_a_path_style_request(method: str, path: str, query: str, copy: bool,
                                           operation: str, kind: str) -> None:
    assert operation_of(method, path, query, copy_source=copy) == operation
    assert kind_of(operation) == kind


def _call(app: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> bytes:
    status: list[str] = []
    body = b"".join(app(environ, lambda s, _headers: status.append(s)))
    assert status and status[0].startswith("200")
    return body


def test_the_request_log_notes_each_request_and_forgets_what_it_answered() -> None:
    seen: list[str] = []

    def backend(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        seen.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"ok"]

    log = _RequestLog(backend)
    _call(log, {"REQUEST_METHOD": "PUT", "PATH_INFO": "/b/q/commits/3",
                "HTTP_X_AMZ_COPY_SOURCE": "b/q/commits/.3.tmp", "CONTENT_LENGTH": "0"})
    _call(log, {"REQUEST_METHOD": "PUT", "PATH_INFO": "/b/q/state/0/0/1.changelog",
                "HTTP_X_AMZ_DECODED_CONTENT_LENGTH": "1234", "CONTENT_LENGTH": "1300"})
    _call(log, {"REQUEST_METHOD": "GET", "PATH_INFO": "/b",
                "QUERY_STRING": "list-type=2&prefix=q%2Fstate%2F"})
    drain = {"REQUEST_METHOD": "GET", "PATH_INFO": REQUEST_LOG_PATH}
    assert json.loads(_call(log, drain)) == [
        ["CopyObject", "/b/q/commits/3", 0],
        ["PutObject", "/b/q/state/0/0/1.changelog", 1234],  # the payload, not its framing
        ["ListObjectsV2", "/b/q/state/", 0],  # a listing is about its prefix
    ]
    assert json.loads(_call(log, drain)) == []  # answered once
    assert REQUEST_LOG_PATH not in seen  # the backend never sees the log's own path


def test_s3a_settings_point_at_the_endpoint_path_style_with_its_keys() -> None:
    conf = S3Endpoint(url="http://127.0.0.1:5000", access_key_id="k",
                      secret_access_key="s").s3a_conf()
    assert all(key.startswith("spark.hadoop.fs.s3a.") for key in conf)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:5000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert (conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]
            ) == ("k", "s")
    tls = S3Endpoint(url="https://s3.example.test").s3a_conf()
    assert tls["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_hadoop_aws_follows_the_hadoop_pyspark_ships() -> None:
    pytest.importorskip("pyspark")
    closure = hadoop_aws()
    assert closure.version == pyspark_hadoop()
    assert closure.coordinate == f"org.apache.hadoop:hadoop-aws:{pyspark_hadoop()}"
    assert closure.beside_pyspark  # pyspark's own hadoop-client jars are not copied again
    assert hadoop_aws("3.4.2").version == "3.4.2"


@pytest.mark.parametrize(("path", "area"), [
    ("/bkt/q-1/offsets/3", "offsets"),
    ("/bkt/q-1/state/0/1/SSTs/a.sst", "state"),
    ("/bkt/q-1/sources/0/3", "sources"),
    ("/bkt/q-1/metadata", "metadata"),
    ("/bkt/q-1/", "other"),
    ("/bkt/_capture/x", "other"),
])
def test_area_of_a_request_in_the_checkpoint_location(path: str, area: str) -> None:
    assert area_of(path, "bkt/q-1") == area
