"""Checkpoint storage on any S3-compatible endpoint (AWS S3, MinIO, Ceph RGW, moto...).

Every method is one or a few S3 requests through a boto3 client (thread-safe, shared by
the threads of one storage), retried by botocore's ``standard`` retry mode. S3 is
strongly read-after-write consistent, so an object is durable and visible to every
reader once the request that wrote it has returned.

Create-only writes send ``If-None-Match: *`` (S3 conditional writes): the server, not
this client, decides atomically which of several concurrent writers wins. Because an
endpoint that ignores the header would silently turn create-only writes into
overwrites, the first create-only write of a storage checks once, with a probe object,
that the endpoint honours it (``verify_conditional_writes``).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from airflow_ckpt.errors import (
    BucketNotFoundError,
    InvalidStorageUriError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    OutcomeUnknownError,
    PreconditionFailedError,
    StorageAccessDeniedError,
    StorageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned
from airflow_ckpt.runtime.storage.hashing import HashingReader
from airflow_ckpt.runtime.storage.local import fsync_dir, write_temp
from airflow_ckpt.runtime.storage.naming import bucket_name_problem, check_key, check_prefix
from airflow_ckpt.runtime.storage.options import S3Options
from airflow_ckpt.runtime.storage.s3_body import ResumingBody
from airflow_ckpt.runtime.storage.s3_client import make_s3_client
from airflow_ckpt.runtime.storage.s3_conditional import ConditionalWrites
from airflow_ckpt.runtime.storage.s3_errors import (
    BODY_ERRORS,
    CONFLICT_CODE,
    NOT_FOUND_CODES,
    PRECONDITION_CODES,
    TOO_LARGE_CODES,
    S3Errors,
    error_code,
    http_status,
    is_missing,
)
from airflow_ckpt.runtime.storage.s3_listing import S3Listing

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CopySourceTypeDef, ObjectIdentifierTypeDef

log = logging.getLogger(__name__)

#: S3's limit on keys per DeleteObjects request
DELETE_BATCH = 1000

# Attempts for a create-only write that meets a concurrent conditional write (409).
_CONFLICT_ATTEMPTS = 4
# Rounds of reading an object back to settle a write whose answer was lost (each round
# is one get with botocore's own retries inside).
_READBACK_ROUNDS = 4


class S3Storage(CheckpointStorage):
    """Checkpoint storage under ``s3://<bucket>/<prefix>``.

    :param bucket: bucket name (validated with S3's naming rules)
    :param prefix: key prefix of the root, without leading or trailing ``/``
    :param options: endpoint, credentials, retries, timeouts, multipart sizes
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        options: S3Options | None = None,
    ) -> None:
        o = options or S3Options()
        problem = bucket_name_problem(bucket)
        if problem is not None:
            raise InvalidStorageUriError(f"invalid S3 bucket name {bucket!r}: {problem}")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_prefix(prefix)
            except ValueError as exc:
                raise InvalidStorageUriError(str(exc)) from exc
        if o.max_workers < 1 or o.max_attempts < 1:
            raise ValueError("max_workers and max_attempts must be at least 1")
        self.bucket = bucket
        self.prefix = prefix
        self.uri = f"s3://{bucket}" + (f"/{prefix}" if prefix else "")
        self._root = prefix + "/" if prefix else ""
        self._attempts = o.max_attempts

        client = make_s3_client(o)
        self._client = client
        self.endpoint_url: str = client.meta.endpoint_url
        #: this bucket's errors as ours (runtime/storage/s3_errors.py)
        self._errors = S3Errors(client, bucket, self.uri, self.endpoint_url)
        self._conditional = ConditionalWrites(client, bucket, self._root, self.endpoint_url,
                                              self._errors, o.verify_conditional_writes)
        self._listing = S3Listing(client, bucket, self._root, self._errors, o.max_workers)
        self._transfer_config = TransferConfig(
            multipart_threshold=o.multipart_threshold,
            multipart_chunksize=o.multipart_chunksize,
            max_concurrency=o.max_workers,
            use_threads=True,
            preferred_transfer_client="classic",
        )
        self._transfer = create_transfer_manager(client, self._transfer_config)

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r}, endpoint_url={self.endpoint_url!r})"

    def close(self) -> None:
        """Shut the transfer threads down and close the HTTP connections."""
        self._transfer.shutdown()
        self._client.close()

    def _full(self, key: str) -> str:
        return self._root + check_key(key)

    def check(self) -> None:
        """Verify that the bucket exists and the credentials are accepted (HeadBucket).

        Raises ``BucketNotFoundError``, ``StorageAccessDeniedError`` or
        ``EndpointUnreachableError``; useful for a connection test.
        """
        self._errors.check_bucket()

    def create_bucket(self) -> None:
        """Create the bucket in the client's region; one that is already ours is fine
        (S3 answers ``BucketAlreadyOwnedByYou``, or in us-east-1 plain success).

        Raises ``StorageError`` when the name is taken by another account
        (``BucketAlreadyExists``), and the usual ``StorageError`` subclasses otherwise.
        """
        params: dict[str, Any] = {"Bucket": self.bucket}
        region = self._client.meta.region_name
        if region and region != "us-east-1":  # us-east-1 refuses its own constraint
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**params)
        except ClientError as exc:
            if error_code(exc) != "BucketAlreadyOwnedByYou":
                self._errors.raise_(exc, "create bucket", "")
        except BotoCoreError as exc:
            self._errors.raise_(exc, "create bucket", "")
        self._errors.bucket_known = True

    # ------------------------------------------------------------------ writes

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        """Write ``data`` at ``key`` in one PutObject; durable and visible on return.

        ``create_only`` sends ``If-None-Match: *``, ``if_match`` sends ``If-Match``;
        a 412 (or, for ``If-Match``, a 404) means the condition failed. A 409 means a
        concurrent conditional write of the same key is in flight, and is retried until
        one of the two has won. A write that ends without an answer that settles it --
        a 412, which may answer our own earlier attempt whose response was lost, or a
        transient error (5xx, reset, cut answer) after botocore's retries, any of
        whose attempts may have been applied -- is reconciled by reading the object
        back (:meth:`_settle`): a lost answer is never reported as another writer, nor
        as a failure while the object holds our bytes.
        """
        if create_only and if_match is not None:
            raise ValueError("create_only and if_match exclude each other")
        full = self._full(key)
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": data}
        if create_only:
            self._conditional.ensure(key)
            params["IfNoneMatch"] = "*"
        elif if_match is not None:
            params["IfMatch"] = f'"{if_match.strip(chr(34))}"'
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                response = self._client.put_object(**params)
            except ClientError as exc:
                code, status = error_code(exc), http_status(exc)
                failed = code in PRECONDITION_CODES or status == 412 or (
                    if_match is not None and (code in NOT_FOUND_CODES or status == 404))
                if (create_only or if_match is not None) and failed:
                    return self._settle(key, data, create_only, if_match, exc)
                if (create_only or if_match is not None) and code == CONFLICT_CODE:
                    if attempt < _CONFLICT_ATTEMPTS:
                        time.sleep(0.05 * 2**attempt)
                        continue
                    raise OutcomeUnknownError(
                        f"{self._errors.where(key)} is being written concurrently (409 "
                        "ConditionalRequestConflict after retries); whether this write "
                        "was applied is not known yet: repeat it or read the object"
                    ) from exc
                if status >= 500:
                    return self._settle(key, data, create_only, if_match, exc)
                self._errors.raise_(exc, "write", key)
            except (BotoConnectionError, HTTPClientError, IncompleteReadError) as exc:
                return self._settle(key, data, create_only, if_match, exc)
            except BotoCoreError as exc:
                self._errors.raise_(exc, "write", key)
            self._errors.bucket_known = True
            return str(response.get("ETag", "")).strip('"')
        raise AssertionError("unreachable")  # pragma: no cover

    def _settle(self, key: str, data: bytes, create_only: bool, if_match: str | None,
                exc: ClientError | BotoCoreError) -> str:
        """Decide a write of ``data`` whose last answer did not: done, not done, or
        (only when the object cannot be read back) unknown.

        ``exc`` is a 412 (the condition failed, possibly against our own earlier
        attempt) or a transient error after retries (any attempt may have landed). The
        object is read back: our bytes there mean done (return their ETag). Otherwise
        not done, and the error says why, on evidence only: a create-only write that
        met 412 or finds other bytes raises ``ObjectAlreadyExistsError``; an
        ``if_match`` write that met 412 or finds another version (or none) raises
        ``PreconditionFailedError``; else the transient error is raised as it was
        (nothing of ours landed). A read-back that keeps failing is
        ``OutcomeUnknownError``, never a guess."""
        stored = self._read_back(key, exc)
        if stored is not None and stored.data == data:
            log.info("write of %s settled by reading it back: applied (%s)",
                     self._errors.where(key), exc)
            return stored.etag
        refused = isinstance(exc, ClientError) and http_status(exc) < 500
        if create_only and (refused or stored is not None):
            raise ObjectAlreadyExistsError(
                f"{self._errors.where(key)} already exists; a create-only write never "
                "replaces an object"
            ) from exc
        if if_match is not None and (
                refused or stored is None or stored.etag != if_match.strip('"')):
            raise PreconditionFailedError(
                f"{self._errors.where(key)} is not the version this write was conditioned on "
                "(another writer replaced or deleted it); nothing was written"
            ) from exc
        self._errors.raise_(exc, "write", key)

    def _read_back(self, key: str, exc: BaseException) -> Versioned | None:
        """The stored object (None if absent), read in up to ``_READBACK_ROUNDS``
        rounds; ``OutcomeUnknownError`` (from ``exc``) if every round fails."""
        last: StorageError | None = None
        for round_ in range(_READBACK_ROUNDS):
            try:
                return self.get_versioned(key)
            except ObjectNotFoundError:
                return None
            except StorageError as read_exc:
                if isinstance(read_exc, StorageAccessDeniedError | BucketNotFoundError):
                    raise
                last = read_exc
                time.sleep(0.05 * 2**round_)
        raise OutcomeUnknownError(
            f"cannot tell whether the write of {self._errors.where(key)} was applied: its "
            f"answer was lost ({exc}) and reading the object back failed ({last})"
        ) from exc

    def probe_create_only_multipart(self, key: str) -> bool:
        """Create ``key`` twice with a one-part multipart upload completed with
        ``If-None-Match: *``; True if the second completion was refused as existing
        (412 or 409), False if it replaced the object. For ``check-storage``: the
        runtime itself writes create-only objects in one PutObject. An upload left
        behind by an error is aborted."""
        return self._conditional.probe_create_only_multipart(self._full(key), key)

    def upload_file(self, path: Path, key: str) -> None:
        """Upload a local file, multipart at or above ``multipart_threshold``.

        Replaces an existing object; durable on return (a multipart upload becomes
        visible atomically when it completes). A missing local file raises ``OSError``.
        """
        full = self._full(key)
        # a missing/unreadable local file is an OSError, not S3's
        with open(path, "rb") as body:
            if os.fstat(body.fileno()).st_size < self._transfer_config.multipart_threshold:
                # One PutObject straight from the file: s3transfer would send the same
                # request through its futures and a callback per 8 KiB read (measured:
                # ~25 % more client CPU per file, bench.scale's upload benchmark).
                with self._errors.translate("upload to", key):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=body)
                return
        with self._errors.translate("upload to", key):
            self._transfer.upload(str(path), self.bucket, full).result()

    def upload_file_hashed(self, path: Path, key: str) -> str:
        """:meth:`upload_file`, hashing the bytes as botocore reads them to send them
        (:class:`~airflow_ckpt.runtime.storage.hashing.HashingReader`: one read of the
        file; a retry's pass from the start is hashed afresh). Multipart uploads read
        the parts in order from the same body."""
        full = self._full(key)
        with open(path, "rb") as fh:
            body = HashingReader(fh)
            sent: Any = body  # a binary file object (typeshed's IO is a protocol it lacks)
            with self._errors.translate("upload to", key):
                if len(body) < self._transfer_config.multipart_threshold:
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=sent)
                else:
                    self._transfer.upload(sent, self.bucket, full).result()
            try:
                return body.hexdigest()
            except ValueError as exc:  # the client skipped bytes: never a wrong hash
                raise StorageError(f"upload to {self._errors.where(key)}: {exc}") from exc

    def copy(self, src_key: str, dst_key: str) -> None:
        """Server-side copy with CopyObject; durable on return.

        Objects too large for one CopyObject (over 5 GiB) are copied part by part
        (UploadPartCopy). A missing source raises ``ObjectNotFoundError``.
        """
        src, dst = self._full(src_key), self._full(dst_key)
        source: CopySourceTypeDef = {"Bucket": self.bucket, "Key": src}
        try:
            self._client.copy_object(CopySource=source, Bucket=self.bucket, Key=dst)
        except ClientError as exc:
            message = str(exc.response.get("Error", {}).get("Message", "")).lower()
            if error_code(exc) in TOO_LARGE_CODES and (
                "size" in message or "large" in message
            ):
                self._managed_copy(src_key, dst_key)
                return
            self._errors.raise_(exc, "copy", src_key)
        except BotoCoreError as exc:
            self._errors.raise_(exc, "copy", src_key)

    def _managed_copy(self, src_key: str, dst_key: str) -> None:
        """Copy with s3transfer: HeadObject, then CopyObject or multipart UploadPartCopy."""
        source: CopySourceTypeDef = {"Bucket": self.bucket, "Key": self._full(src_key)}
        with self._errors.translate("copy", src_key):
            self._transfer.copy(source, self.bucket, self._full(dst_key)).result()

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` in DeleteObjects requests of at most 1000, in the order given;
        absent keys are ignored.

        Durable on return. A key S3 refuses to delete (an entry of the answer's
        ``Errors``) raises: the first error names it, the message says how many of the
        request's keys failed and how many keys were not sent (the requests after it).
        """
        unique = [check_key(key) for key in dict.fromkeys(keys)]
        for start in range(0, len(unique), DELETE_BATCH):
            try:
                self._delete_batch(unique[start:start + DELETE_BATCH])
            except StorageError as exc:
                unsent = len(unique) - start - DELETE_BATCH
                if unsent <= 0:
                    raise
                raise type(exc)(f"{exc}; {unsent} more keys not sent") from exc

    def _delete_batch(self, keys: list[str]) -> None:
        objects: builtins.list[ObjectIdentifierTypeDef] = [
            {"Key": self._full(key)} for key in keys
        ]
        with self._errors.translate("delete", keys[0]):
            response = self._client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
            )
        errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            key = str(first.get("Key", ""))[len(self._root):]
            fake = ClientError(
                {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                "DeleteObjects",
            )
            try:
                self._errors.raise_(fake, "delete", key)
            except StorageError as exc:
                raise type(exc)(f"{exc} ({len(errors)} of {len(keys)} keys failed)") from None

    # ------------------------------------------------------------------ reads

    def get_bytes(self, key: str) -> bytes:
        """Read the whole object (GetObject); ``ObjectNotFoundError`` if absent."""
        return self.get_versioned(key).data

    def get_versioned(self, key: str) -> Versioned:
        """The object's bytes and ETag from one GetObject; a body that breaks off while
        it is read is read again, up to ``max_attempts`` times (botocore's retries end
        before the body of a GetObject is read)."""
        full = self._full(key)
        for attempt in range(1, self._attempts + 1):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=full,
                                                   ChecksumMode="ENABLED")
                data = response["Body"].read()
            except BODY_ERRORS as exc:
                if attempt == self._attempts:
                    self._errors.raise_(exc, "read", key)
                time.sleep(0.05 * 2**attempt)
                continue
            except (ClientError, BotoCoreError) as exc:
                self._errors.raise_(exc, "read", key)
            self._errors.bucket_known = True
            return Versioned(data, str(response.get("ETag", "")).strip('"'))
        raise AssertionError("unreachable")  # pragma: no cover

    def exists(self, key: str) -> bool:
        """Whether an object is stored at exactly ``key`` (HeadObject).

        A missing bucket raises ``BucketNotFoundError`` rather than answering False.
        """
        full = self._full(key)
        try:
            self._client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if is_missing(exc) and self._errors.bucket_exists():
                return False
            self._errors.raise_(exc, "check", key)
        except BotoCoreError as exc:
            self._errors.raise_(exc, "check", key)
        self._errors.bucket_known = True
        return True

    def download_file(self, key: str, path: Path) -> None:
        """Download ``key`` to ``path`` (parents created), in parallel ranges if large.

        The bytes go to a temporary file beside ``path`` that is fsynced and renamed
        over it, so ``path`` is complete or untouched, and durable on return.
        """
        full = self._full(key)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        result: list[BaseException] = []

        def fill(fh: Any) -> None:
            try:
                self._transfer.download(self.bucket, full, fh,
                                        extra_args={"ChecksumMode": "ENABLED"}).result()
            except Exception as exc:  # mapped (or re-raised as is) by S3Errors.raise_ below
                result.append(exc)

        tmp = write_temp(target.parent, target.name, fill)
        try:
            if result:
                self._errors.raise_(result[0], "download", key)
            os.replace(tmp, target)
            fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def open_stream(self, key: str, start: int = 0,
                    length: int | None = None) -> Iterator[Any]:
        """One GetObject, its body streamed (no HeadObject, unlike ``download_file``);
        with ``start`` / ``length`` a ranged GetObject (``Range: bytes=...``).

        The transport's CRC32 is not validated here (``get_bytes`` and ``download_file``
        do): the caller verifies what it reads, as restore does with each file's size
        and SHA-256 from the manifest. One hash pass instead of two: restore is
        CPU-bound on small machines (see the README's benchmarks). A range past the
        object's end (416) yields an empty stream: the caller's size check reports it.

        A body that breaks off while it is read (connection reset, cut short) is
        resumed where it broke with a ranged GetObject conditioned on the first
        answer's ETag, at most ``max_attempts - 1`` times per stream; errors beyond
        that map like request errors.
        """
        if length == 0:
            yield io.BytesIO()
            return
        last = "" if length is None else str(start + length - 1)
        etag: list[str] = []

        def open_at(offset: int) -> Any:
            """The body from byte ``start + offset`` on, of the version first read; None
            if a resumed answer is not exactly that range of that version."""
            params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
            if start + offset or length is not None:
                params["Range"] = f"bytes={start + offset}-{last}"
            if offset:
                if not etag:
                    return None
                params["IfMatch"] = etag[0]
            response = self._client.get_object(**params)
            if offset and not str(response.get("ContentRange", "")).startswith(
                    f"bytes {start + offset}-"):
                response["Body"].close()
                return None
            etag[:] = [e for e in [str(response.get("ETag", ""))] if e]
            return response["Body"]

        with self._errors.translate("download", key):
            body: Any
            try:
                body = ResumingBody(open_at, self._attempts - 1)
            except ClientError as exc:
                if http_status(exc) != 416 and error_code(exc) != "InvalidRange":
                    raise
                body = io.BytesIO()
            try:
                yield body
            finally:
                body.close()

    def common_prefixes(self, prefix: str) -> builtins.list[str]:
        """The names the server lists as common prefixes under ``prefix``
        (``Delimiter='/'``) as it lists them, an emptied one included (for
        ``check-storage``; :meth:`list_dirs` is what the runtime uses)."""
        return self._listing.common_prefixes(prefix)

    def abort_incomplete_uploads(self, prefix: str) -> int:
        """Abort the multipart uploads under ``prefix`` (ListMultipartUploads)."""
        return self._listing.abort_incomplete_uploads(prefix)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (ListObjectsV2), sorted by key.

        Probe objects of the conditional-write check are not listed.
        """
        return self._listing.objects(prefix, None)

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        """Keys under ``prefix`` after ``start_after``: ListObjectsV2 ``StartAfter``."""
        return self._listing.objects(prefix, start_after)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Immediate "sub-directories" of ``prefix`` that hold at least one object, sorted
        (see :meth:`S3Listing.dirs <airflow_ckpt.runtime.storage.s3_listing.S3Listing.dirs>`
        for the requests it makes)."""
        return self._listing.dirs(prefix)
