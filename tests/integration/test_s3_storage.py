"""S3-specific behaviour against a real HTTP S3 endpoint (moto's server on 127.0.0.1).

Error mapping (missing bucket, refused credentials, unreachable endpoint), endpoint
resolution from the AWS environment, and the conditional-write safeguards.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_ckpt.errors import (
    BucketNotFoundError,
    EndpointUnreachableError,
    ObjectAlreadyExistsError,
    StorageAccessDeniedError,
    StorageError,
)
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.s3 import S3Storage
from airflow_ckpt.testing import S3Endpoint, local_s3_server
from tests.fixtures.net import free_port

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _s3(storage: Any) -> S3Storage:
    assert isinstance(storage, S3Storage)
    return storage


# ---------------------------------------------------------------- missing bucket


def test_missing_bucket_is_named_with_the_endpoint(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    storage = s3_endpoint.storage(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/ckpt")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    operations = {
        "put": lambda: storage.put_bytes("k", b"x"),
        "create_only": lambda: storage.put_bytes("k", b"x", create_only=True),
        "get": lambda: storage.get_bytes("k"),
        "exists": lambda: storage.exists("k"),  # not a silent False
        "list": lambda: storage.list(),
        "list_dirs": lambda: storage.list_dirs(),
        "upload": lambda: storage.upload_file(src, "k"),
        "download": lambda: storage.download_file("k", tmp_path / "out"),
        "copy": lambda: storage.copy("a", "b"),
        "delete_many": lambda: storage.delete_many(["k"]),
        "check": lambda: _s3(storage).check(),
    }
    for name, operation in operations.items():
        with pytest.raises(BucketNotFoundError) as err:
            operation()
        message = str(err.value)
        assert "no-such-bucket-" in message and "does not exist" in message, name
        assert s3_endpoint.url in message, name
        assert "create it or fix the URI" in message, name
    assert not (tmp_path / "out").exists()


def test_check_passes_on_an_existing_bucket(s3_storage: Any) -> None:
    _s3(s3_storage).check()


# ---------------------------------------------------------------- credentials


@pytest.mark.moto_only("creates IAM users and switches on moto's IAM checks")
def test_refused_credentials_raise_access_denied(s3_endpoint: S3Endpoint, s3_bucket: str) -> None:
    """moto's server checks signatures and IAM policies once IAM auth is switched on."""
    good_id, good_secret = s3_endpoint.create_iam_user(f"ok-{uuid.uuid4().hex[:6]}")
    bare_id, bare_secret = s3_endpoint.create_iam_user(
        f"bare-{uuid.uuid4().hex[:6]}", allow_s3=False
    )
    uri = f"s3://{s3_bucket}/auth"

    def open_as(key_id: str, secret: str) -> Any:
        return s3_endpoint.storage(
            uri, aws_access_key_id=key_id, aws_secret_access_key=secret, max_attempts=1
        )

    with s3_endpoint.iam_auth():
        # the server really checks: a permitted user can work...
        allowed = open_as(good_id, good_secret)
        allowed.put_bytes("k", b"v")
        assert allowed.get_bytes("k") == b"v"
        # ...and every kind of refusal maps to StorageAccessDeniedError
        cases = {
            "InvalidAccessKeyId": open_as("AKIAUNKNOWNKEY000000", "whatever"),
            "SignatureDoesNotMatch": open_as(good_id, "wrong-secret"),
            "AccessDenied": open_as(bare_id, bare_secret),
        }
        for code, storage in cases.items():
            with pytest.raises(StorageAccessDeniedError) as err:
                storage.put_bytes("k", b"x")
            assert code in str(err.value)
            assert f"{uri}/k" in str(err.value)
            assert "AWS_ACCESS_KEY_ID" in str(err.value)
            with pytest.raises(StorageAccessDeniedError):
                storage.list()
            with pytest.raises(StorageAccessDeniedError):  # HEAD: a bare 403, no code
                storage.exists("k")
        assert allowed.get_bytes("k") == b"v"
    # back to moto's default: any credentials are accepted again
    assert s3_endpoint.storage(uri).get_bytes("k") == b"v"


# ---------------------------------------------------------------- unreachable endpoint


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_unreachable_endpoint_fails_fast(max_attempts: int) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    storage = open_storage(
        "s3://bucket/ckpt",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        max_attempts=max_attempts,
        connect_timeout=1.0,
    )
    sends: list[str] = []
    _s3(storage)._client.meta.events.register(
        "before-send.s3.GetObject", lambda **_: sends.append("GetObject")
    )
    with pytest.raises(EndpointUnreachableError) as err:
        storage.get_bytes("k")
    # max_attempts counts the first attempt (how long the backoff took is not asserted:
    # speed is for benchmarks, and a loaded machine stretches any bound)
    assert len(sends) == max_attempts
    assert url in str(err.value) and "s3://bucket/ckpt/k" in str(err.value)
    assert "AWS_ENDPOINT_URL" in str(err.value)
    with pytest.raises(EndpointUnreachableError):
        storage.put_bytes("k", b"x", create_only=True)
    with pytest.raises(EndpointUnreachableError):
        storage.list()


# ---------------------------------------------------------------- endpoint resolution


def test_endpoint_and_credentials_come_from_the_aws_environment(
    s3_endpoint: S3Endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    storage = open_storage(f"s3://{s3_bucket}/from-env")
    assert _s3(storage).endpoint_url == s3_endpoint.url
    # a non-AWS endpoint from the environment gets path-style addressing (virtual-host
    # style would send the request to <bucket>.127.0.0.1, which does not resolve)
    storage.put_bytes("k", b"v")
    stored = s3_endpoint.client().get_object(Bucket=s3_bucket, Key="from-env/k")
    assert stored["Body"].read() == b"v"


def test_no_credentials_anywhere_is_access_denied(
    s3_endpoint: S3Endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    storage = open_storage(
        f"s3://{s3_bucket}/x", endpoint_url=s3_endpoint.url, region_name="us-east-1"
    )
    with pytest.raises(StorageAccessDeniedError, match="no usable AWS credentials"):
        storage.get_bytes("k")


# ---------------------------------------------------------------- conditional writes


def test_moto_rejects_a_second_create_only_put_with_412(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    """What the backend relies on, checked on the raw API: moto honours If-None-Match."""
    client = s3_endpoint.client()
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"2", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"1"


@pytest.mark.moto_only("a second, lax moto server shares the first one's state")
def test_endpoint_ignoring_if_none_match_is_detected(s3_bucket: str) -> None:
    # A second server on the same (process-wide) moto state that drops the header,
    # like S3-compatible servers without conditional writes.
    with local_s3_server(honour_if_none_match=False) as lax:
        storage = lax.storage(f"s3://{s3_bucket}/lax")
        storage.put_bytes("k", b"first")  # plain writes are unaffected
        with pytest.raises(StorageError, match="ignores 'If-None-Match: \\*'") as err:
            storage.put_bytes("marker", b"x", create_only=True)
        assert not isinstance(err.value, ObjectAlreadyExistsError)
        assert not storage.exists("marker")
        assert [i.key for i in storage.list()] == ["k"]  # the probe was cleaned up
        assert lax.client().list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 1

        # What really happens without the check: the "exclusive" write overwrites.
        unsafe = lax.storage(f"s3://{s3_bucket}/lax", verify_conditional_writes=False)
        unsafe.put_bytes("k", b"second", create_only=True)
        assert unsafe.get_bytes("k") == b"second"


def test_create_only_retry_after_a_lost_response_counts_as_success(s3_storage: Any) -> None:
    """botocore retries a PUT whose response was lost; the retry then meets a 412."""
    storage = _s3(s3_storage)
    storage.put_bytes("warm-up", b"x", create_only=True)  # runs the one-time probe
    forced: list[int] = []

    def force_one_retry(attempts: int, request_dict: dict[str, Any], **_: Any) -> float | None:
        if attempts == 1 and "/lost" in request_dict["url_path"]:
            forced.append(attempts)
            return 0.0  # "retry now", whatever the first attempt's outcome was
        return None

    storage._client.meta.events.register("needs-retry.s3.PutObject", force_one_retry)

    storage.put_bytes("lost-1", b"mine", create_only=True)  # landed, then retried -> 412
    assert storage.get_bytes("lost-1") == b"mine"

    storage.put_bytes("lost-2", b"theirs")
    with pytest.raises(ObjectAlreadyExistsError):
        storage.put_bytes("lost-2", b"mine", create_only=True)
    assert storage.get_bytes("lost-2") == b"theirs"
    assert len(forced) == 3


def test_copy_falls_back_to_multipart_copy_for_huge_objects(
    s3_storage: Any, s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _s3(s3_storage)
    data = os.urandom(6 * MiB)
    storage.put_bytes("big", data)

    def too_large(**_: Any) -> None:
        raise ClientError(
            {"Error": {"Code": "InvalidRequest", "Message": "The specified copy source is "
                       "larger than the maximum allowable size for a copy source: 5368709120"}},
            "CopyObject",
        )

    monkeypatch.setattr(storage._client, "copy_object", too_large)
    storage.copy("big", "copied")
    assert storage.get_bytes("copied") == data
    head = s3_endpoint.client().head_object(Bucket=storage.bucket, Key=f"{storage.prefix}/copied")
    assert head["ETag"].strip('"').endswith("-2")  # copied in two 5 MiB parts


def test_a_409_then_a_412_on_our_own_create_only_write_is_ours(
    s3_storage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 defect 10: our first request landed but its answer was a 409 (a
    conditional write of the key in flight: our own); the retry meets a 412. That is
    our write, not another driver's."""
    storage = _s3(s3_storage)
    storage.put_bytes("warm-up", b"x", create_only=True)  # runs the one-time probe
    real_put = storage._client.put_object
    calls: list[str] = []

    def landed_but_answered_409(**params: Any) -> Any:
        calls.append(params["Key"])
        if len(calls) == 1:
            real_put(**params)
            raise ClientError({"Error": {"Code": "ConditionalRequestConflict"},
                               "ResponseMetadata": {"HTTPStatusCode": 409}}, "PutObject")
        return real_put(**params)

    monkeypatch.setattr(storage._client, "put_object", landed_but_answered_409)
    storage.put_bytes("marker", b"mine", create_only=True)
    assert storage.get_bytes("marker") == b"mine" and len(calls) == 2
    # Someone else's object is still someone else's, after a 409 as well.
    monkeypatch.undo()
    storage.put_bytes("theirs", b"theirs")
    calls.clear()

    def conflict_then_412(**params: Any) -> Any:
        calls.append(params["Key"])
        if len(calls) == 1:
            raise ClientError({"Error": {"Code": "ConditionalRequestConflict"},
                               "ResponseMetadata": {"HTTPStatusCode": 409}}, "PutObject")
        return real_put(**params)

    monkeypatch.setattr(storage._client, "put_object", conflict_then_412)
    with pytest.raises(ObjectAlreadyExistsError):
        storage.put_bytes("theirs", b"mine", create_only=True)
    assert storage.get_bytes("theirs") == b"theirs"


def test_incomplete_multipart_uploads_of_a_dead_driver_are_aborted_on_recover(
    s3_storage: Any,
) -> None:
    from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore

    storage = _s3(s3_storage)
    client = storage._client
    full = f"{storage.prefix}/job/shared/ab/abcdef" if storage.prefix else "job/shared/ab/abcdef"
    upload = client.create_multipart_upload(Bucket=storage.bucket, Key=full)
    client.upload_part(Bucket=storage.bucket, Key=full, UploadId=upload["UploadId"],
                       PartNumber=1, Body=b"x" * 1024)
    other = client.create_multipart_upload(Bucket=storage.bucket,
                                           Key=full.replace("job/", "other/"))

    CompletedCheckpointStore(storage, "job", num_retained=1).recover()
    left = client.list_multipart_uploads(Bucket=storage.bucket).get("Uploads", [])
    assert [u["UploadId"] for u in left] == [other["UploadId"]]  # another job's: untouched


# ---------------------------------------------------------------- transport checksums


def test_restore_reads_skip_the_crc_but_still_detect_damage(s3_storage: Any,
                                                            tmp_path: Path) -> None:
    """open_stream (restore) does not ask for the stored CRC32, get_bytes and
    download_file do; a same-size damaged object is still caught by materialize's
    SHA-256."""
    from airflow_ckpt.errors import CorruptCheckpointError
    from airflow_ckpt.runtime.restore.materialize import materialize
    from tests.fixtures.snapshots import write_snapshot

    storage = _s3(s3_storage)
    modes: list[bytes | str | None] = []

    def record(request: Any, **_: Any) -> None:
        modes.append(request.headers.get("x-amz-checksum-mode"))

    storage._client.meta.events.register("before-send.s3.GetObject", record)
    manifest = write_snapshot(storage, "job", 4, contents={"state/0/0/4.delta": b"a" * 4096})
    with storage.open_stream("job/chk-4/state/0/0/4.delta") as body:
        assert body.read() == b"a" * 4096
    storage.get_bytes("job/chk-4/state/0/0/4.delta")
    assert modes == [None, b"ENABLED"]

    storage.put_bytes("job/chk-4/state/0/0/4.delta", b"b" * 4096)  # same size, other bytes
    with pytest.raises(CorruptCheckpointError, match="SHA-256"):
        materialize(storage, manifest, "job/", tmp_path / "wd")


# ---------------------------------------------------------------- ranged reads (merged files)


def test_ranged_reads_return_the_range_and_nothing_past_the_end(s3_storage: Any) -> None:
    """Restore reads merged files' segments with ranged GETs: one request per range, the
    exact bytes; a range past the object's end (S3 answers 416) reads as empty."""
    storage = _s3(s3_storage)
    ranges: list[str | None] = []

    def record(request: Any, **_: Any) -> None:
        ranges.append(request.headers.get("Range"))

    storage._client.meta.events.register("before-send.s3.GetObject", record)
    data = bytes(range(256)) * 64
    storage.put_bytes("job/shared/ab/merged", data)
    with storage.open_stream("job/shared/ab/merged", 1000, 300) as body:
        assert body.read() == data[1000:1300]
    with storage.open_stream("job/shared/ab/merged", 16000) as body:
        assert body.read() == data[16000:]
    with storage.open_stream("job/shared/ab/merged", 99_999, 10) as body:
        assert body.read() == b""
    with storage.open_stream("job/shared/ab/merged", 5, 0) as body:  # no request at all
        assert body.read() == b""
    assert ranges == [b"bytes=1000-1299", b"bytes=16000-", b"bytes=99999-100008"]


def test_merged_checkpoint_files_restore_through_s3(s3_storage: Any, tmp_path: Path) -> None:
    """The upload path merges small files into one object; materialize reads the needed
    segments back with one ranged GET and verifies each file."""
    import threading

    from airflow_ckpt.runtime.checkpoint.digests import DigestCache
    from airflow_ckpt.runtime.checkpoint.executors import InlineExecutor
    from airflow_ckpt.runtime.checkpoint.snapshot import CapturedFile, CapturedSnapshot
    from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
    from airflow_ckpt.runtime.checkpoint.upload import UploadTarget, upload_snapshot
    from airflow_ckpt.runtime.restore.materialize import materialize
    from airflow_ckpt.runtime.storage.layout import JobLayout
    from tests.fixtures.snapshots import make_manifest

    storage = _s3(s3_storage)
    files = {f"offsets/{i}": os.urandom(100 + i) for i in range(20)}
    files["state/0/0/SSTs/big.sst"] = os.urandom(2 * MiB)
    captured = []
    for rel, content in sorted(files.items()):
        path = tmp_path / "staging" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        captured.append(CapturedFile(rel, path, len(content), "logs", False))
    snap = CapturedSnapshot(19, tuple(captured), (), [], ("logs",), tmp_path / "staging")
    store = CompletedCheckpointStore(storage, "job", 1)
    store.recover()
    result = upload_snapshot(
        storage, JobLayout("job"), snap, UploadTarget(1, "chk-1/", True, 32 * MiB),
        executor=InlineExecutor(), digests=DigestCache(), shared=store.shared,
        deadline=time.monotonic() + 60, on_ack=lambda _s: None, cancelled=threading.Event())
    assert len({e.key for e in result.files}) == 2
    gets: list[Any] = []
    storage._client.meta.events.register("before-send.s3.GetObject",
                                         lambda request, **_: gets.append(request))
    out = materialize(storage, make_manifest("job", 1, files=result.files, batch_id=19),
                      "job/", tmp_path / "restored")
    assert len(gets) == 2
    assert {p.relative_to(out).as_posix(): p.read_bytes()
            for p in out.rglob("*") if p.is_file()} == files


# ---------------------------------------------------------------- a response cut short


def test_a_body_cut_short_is_transient_and_says_so(tmp_path: Path) -> None:
    """An endpoint that promises 1000 bytes and closes after 100: the read raises
    EndpointUnreachableError (transient: sensors and triggers poll again) naming the
    object and what happened, not a raw botocore error and not short bytes taken as the
    object."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n"
                                 b"Content-Type: application/octet-stream\r\n\r\n" + b"x" * 100)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    storage = S3Endpoint(url=f"http://127.0.0.1:{port}").storage("s3://cut-short/p")
    try:
        cut_short = r"chk-1/state/0/0/1\.delta: the response .* broke off"
        with pytest.raises(EndpointUnreachableError, match=cut_short), \
                storage.open_stream("chk-1/state/0/0/1.delta") as body:
            while body.read(64):
                pass
        with pytest.raises(EndpointUnreachableError, match=cut_short):
            storage.get_bytes("chk-1/state/0/0/1.delta")
    finally:
        storage.close()
        listener.close()


def test_a_key_delete_objects_refuses_raises_naming_it_and_the_keys_left(
        s3_storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteObjects answers 200 with per-key ``Errors``: one refused key raises (never
    a silent success), naming it, how many of its request's keys failed and how many
    keys were not sent; the keys before it are deleted, the rest left."""
    storage = _s3(s3_storage)
    monkeypatch.setattr("airflow_ckpt.runtime.storage.s3.DELETE_BATCH", 2)
    keys = [f"del/k{i}" for i in range(5)]
    for key in keys:
        storage.put_bytes(key, b"x")
    refused = storage._full("del/k1")
    sent: list[list[str]] = []
    refusing = [True]

    def refuse_in_request(params: dict[str, Any], **_: Any) -> None:
        names = [o["Key"] for o in params["Delete"]["Objects"]]
        sent.append(names)
        if refusing[0]:
            params["Delete"]["Objects"] = [o for o in params["Delete"]["Objects"]
                                           if o["Key"] != refused]  # the server keeps it

    def answer_refused(parsed: dict[str, Any], **_: Any) -> None:
        if refusing[0] and refused in sent[-1]:
            parsed["Errors"] = [{"Key": refused, "Code": "AccessDenied",
                                 "Message": "Access Denied"}]

    events = storage._client.meta.events
    events.register("provide-client-params.s3.DeleteObjects", refuse_in_request)
    events.register("after-call.s3.DeleteObjects", answer_refused)

    with pytest.raises(StorageAccessDeniedError) as err:
        storage.delete_many(keys)
    message = str(err.value)
    assert "del/k1" in message and "1 of 2 keys failed" in message, message
    assert "3 more keys not sent" in message, message
    assert len(sent) == 1
    assert [info.key for info in storage.list("del/")] == ["del/k1", "del/k2", "del/k3",
                                                           "del/k4"]

    refusing[0] = False
    storage.delete_many(keys[1:])  # refused no more: every key gone, two requests
    assert storage.list("del/") == [] and len(sent) == 3
