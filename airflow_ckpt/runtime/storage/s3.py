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
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast
from urllib.parse import urlsplit

import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ResponseStreamingError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import ProtocolError as URLLib3ProtocolError

from airflow_ckpt.errors import (
    BucketNotFoundError,
    EndpointUnreachableError,
    InvalidStorageUriError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    OutcomeUnknownError,
    PreconditionFailedError,
    StorageAccessDeniedError,
    StorageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned
from airflow_ckpt.runtime.storage.local import fsync_dir, write_temp
from airflow_ckpt.runtime.storage.naming import (
    bucket_name_problem,
    check_key,
    check_prefix,
    dir_prefix,
)
from airflow_ckpt.runtime.storage.options import S3Options

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import CopySourceTypeDef, ObjectIdentifierTypeDef

log = logging.getLogger(__name__)

#: S3's limit on keys per DeleteObjects request
DELETE_BATCH = 1000
#: keys of the first listing of ``list_dirs``: a prefix with at most this many keys costs
#: one request with a light answer (a listing page of 1000 keys is ~250 KB to render,
#: send and parse)
LIST_DIRS_FIRST_KEYS = 200
#: probe objects written by the conditional-write check start with this
PROBE_PREFIX = ".airflow-ckpt-probe-"

_ACCESS_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
    "InvalidToken", "ExpiredToken", "TokenRefreshRequired", "AccountProblem",
    "InvalidSecurity", "RequestTimeTooSkewed", "403", "Forbidden", "UnauthorizedAccess",
})
#: 403 codes about the credentials themselves: no HeadBucket can say more about them
_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
    "TokenRefreshRequired", "RequestTimeTooSkewed",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
_CONFLICT_CODE = "ConditionalRequestConflict"  # 409: a concurrent conditional write
_TOO_LARGE_CODES = frozenset({"InvalidRequest", "EntityTooLarge"})
_CODE_HINTS = {
    "RequestTimeTooSkewed": "the local clock is off; synchronise it (NTP)",
    "ExpiredToken": "the session token expired; refresh the credentials",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id",
    "InvalidAccessKeyId": "the access key id is unknown to this endpoint",
    "PermanentRedirect": "the bucket is in another region; set region_name or "
    "AWS_DEFAULT_REGION to the bucket's region",
    "AuthorizationHeaderMalformed": "the region is wrong; set region_name or "
    "AWS_DEFAULT_REGION to the bucket's region",
    "NotImplemented": "the endpoint does not implement this S3 feature",
}
# Attempts for a create-only write that meets a concurrent conditional write (409).
_CONFLICT_ATTEMPTS = 4
# Rounds of reading an object back to settle a write whose answer was lost (each round
# is one get with botocore's own retries inside).
_READBACK_ROUNDS = 4
# botocore retries a request whose answer broke off only while it parses the answer: a
# GetObject body is read after its retries, so a body cut short is retried here. The
# error body of a GetObject (404, 412...) is read by botocore outside its retries and
# its break surfaces as urllib3's own ProtocolError.
_BODY_ERRORS = (ResponseStreamingError, IncompleteReadError, URLLib3ProtocolError)

# (endpoint, bucket) pairs whose If-None-Match support has been verified.
_VERIFIED_CONDITIONAL: set[tuple[str, str]] = set()
_VERIFIED_LOCK = threading.Lock()


_LOADER_LOCK = threading.Lock()
_LOADER: botocore.loaders.Loader | None = None


def _botocore_session() -> botocore.session.Session:
    """A fresh botocore session (own credential/region resolution) whose service-model
    loader is shared process-wide: loading the S3 model costs ~0.1 s per session."""
    global _LOADER
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = botocore.loaders.create_loader()
        loader = _LOADER
    session = botocore.session.get_session()
    session.register_component("data_loader", loader)
    return session


def _is_aws_endpoint(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn")) or host == "amazonaws.com"


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_missing(exc: ClientError) -> bool:
    """A 404 of any kind (NoSuchKey, NoSuchBucket, or a body-less HEAD 404)."""
    return _error_code(exc) in _NOT_FOUND_CODES | {"NoSuchBucket"} or _status(exc) == 404


def _root_cause(exc: BaseException) -> BaseException:
    """The botocore error behind wrappers (boto3/s3transfer re-raise with context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ClientError | BotoCoreError):
            return current
        last = getattr(current, "last_exception", None)
        current = last if isinstance(last, BaseException) else (
            current.__cause__ or current.__context__
        )
    return exc


class _ResumingBody:
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
            except _BODY_ERRORS:
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


def _refused_as_existing(exc: ClientError) -> bool:
    """A create-only PutObject refused because the object exists (412) or is being
    written concurrently (409)."""
    code = _error_code(exc)
    return code in _PRECONDITION_CODES or code == _CONFLICT_CODE or _status(exc) in (409, 412)


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
        self._verify_conditional = o.verify_conditional_writes
        self._attempts = o.max_attempts
        self._max_workers = o.max_workers
        self._bucket_known = False

        session = _botocore_session()
        config = Config(
            # total_max_attempts counts the first attempt; botocore's "max_attempts"
            # would count retries only
            retries={"mode": "standard", "total_max_attempts": o.max_attempts},
            connect_timeout=o.connect_timeout,
            read_timeout=o.read_timeout,
            max_pool_connections=max(10, 2 * o.max_workers),
            user_agent_extra="airflow-ckpt",
            # Responses are checked where it adds something: get_bytes and download_file
            # ask for the stored CRC (ChecksumMode) explicitly; open_stream does not,
            # because its caller (restore) verifies each file's SHA-256 from the manifest,
            # a stronger check than the CRC32, which would cost a second pass of CPU.
            response_checksum_validation="when_required",
        )
        path_style = config.merge(Config(s3={"addressing_style": "path"}))

        def make_client(endpoint: str | None, client_config: Config) -> S3Client:
            return cast(
                "S3Client",
                session.create_client(
                    "s3",
                    endpoint_url=endpoint,
                    region_name=o.region_name,
                    aws_access_key_id=o.aws_access_key_id,
                    aws_secret_access_key=o.aws_secret_access_key,
                    aws_session_token=o.aws_session_token,
                    config=client_config,
                ),
            )

        client = make_client(o.endpoint_url, path_style if o.endpoint_url else config)
        if o.endpoint_url is None and not _is_aws_endpoint(client.meta.endpoint_url):
            # The endpoint came from AWS_ENDPOINT_URL or the AWS config: a non-AWS
            # server, where virtual-host addressing (bucket.host) rarely resolves.
            client.close()
            client = make_client(None, path_style)
        self._client = client
        self.endpoint_url: str = client.meta.endpoint_url
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

    # ------------------------------------------------------------------ errors

    def _full(self, key: str) -> str:
        return self._root + check_key(key)

    def _where(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def _raise(self, exc: BaseException, action: str, key: str) -> NoReturn:
        """Re-raise a boto3/botocore/s3transfer error as a ``StorageError`` subclass."""
        cause = _root_cause(exc)
        where = self._where(key)
        at = f"at endpoint {self.endpoint_url}"
        if isinstance(cause, ClientError):
            code, status = _error_code(cause), _status(cause)
            message = cause.response.get("Error", {}).get("Message", "") or code
            hint = _CODE_HINTS.get(code)
            detail = f"{code}: {message}" + (f"; {hint}" if hint else "")
            if code == "NoSuchBucket":
                raise BucketNotFoundError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist {at}; "
                    "create it or fix the URI"
                ) from exc
            if (code in _ACCESS_CODES or status == 403) and code not in _CREDENTIAL_CODES \
                    and not self._bucket_exists():
                # Some servers (SeaweedFS) answer a write into a missing bucket with
                # 403 AccessDenied; HeadBucket's 404 tells the two apart.
                raise BucketNotFoundError(
                    f"cannot {action} {where}: bucket {self.bucket!r} does not exist {at} "
                    f"(the endpoint answered {detail}; HeadBucket answers 404); create it "
                    "or fix the URI"
                ) from exc
            if code in _ACCESS_CODES or status == 403:
                raise StorageAccessDeniedError(
                    f"cannot {action} {where}: access denied {at} ({detail}); check the "
                    "credentials (connection login/password or AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY) and that they may access this bucket and prefix"
                ) from exc
            if code in _NOT_FOUND_CODES or status == 404:
                if not self._bucket_exists():
                    raise BucketNotFoundError(
                        f"cannot {action} {where}: bucket {self.bucket!r} does not exist "
                        f"{at}; create it or fix the URI (if it does exist, check that "
                        "the endpoint is the S3 server that holds it)"
                    ) from exc
                raise ObjectNotFoundError(f"cannot {action} {where}: no such object") from exc
            raise StorageError(f"cannot {action} {where} {at}: {detail}") from exc
        if isinstance(cause, NoCredentialsError | PartialCredentialsError):
            raise StorageAccessDeniedError(
                f"cannot {action} {where}: no usable AWS credentials ({cause}); set them on "
                "the connection or in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            ) from exc
        if isinstance(cause, CredentialRetrievalError):
            raise StorageAccessDeniedError(
                f"cannot {action} {where}: fetching credentials failed ({cause})"
            ) from exc
        if isinstance(cause, SSLError):
            raise EndpointUnreachableError(
                f"cannot {action} {where}: TLS handshake with {self.endpoint_url} failed "
                f"({cause}); check the endpoint's scheme (http/https) and certificate"
            ) from exc
        if isinstance(cause, ResponseStreamingError | IncompleteReadError
                      | URLLib3ProtocolError):
            # transient like an unreachable endpoint: sensors and triggers poll again
            raise EndpointUnreachableError(
                f"cannot {action} {where}: the response from {self.endpoint_url} broke off "
                f"while it was read ({cause}): a network fault, or the endpoint failed "
                "mid-transfer"
            ) from exc
        if isinstance(cause, BotoConnectionError | HTTPClientError):
            raise EndpointUnreachableError(
                f"cannot {action} {where}: endpoint {self.endpoint_url} unreachable after "
                f"retries ({cause}); check endpoint_url / AWS_ENDPOINT_URL and that the "
                "server is running and reachable from this host"
            ) from exc
        if isinstance(cause, BotoCoreError):
            raise StorageError(f"cannot {action} {where} {at}: {cause}") from exc
        raise exc

    @contextlib.contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        try:
            yield
        except StorageError:
            raise
        except (ClientError, BotoCoreError, URLLib3ProtocolError) as exc:
            self._raise(exc, action, key)

    def _bucket_exists(self) -> bool:
        """Whether the bucket exists (cached once known). Only used on error paths."""
        if self._bucket_known:
            return True
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            # 403 etc.: it exists as far as we can tell; let the original error speak
            return not _is_missing(exc)
        except BotoCoreError:
            return True  # let the original error speak
        self._bucket_known = True
        return True

    def check(self) -> None:
        """Verify that the bucket exists and the credentials are accepted (HeadBucket).

        Raises ``BucketNotFoundError``, ``StorageAccessDeniedError`` or
        ``EndpointUnreachableError``; useful for a connection test.
        """
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _is_missing(exc):
                raise BucketNotFoundError(
                    f"bucket {self.bucket!r} does not exist at endpoint {self.endpoint_url}; "
                    f"create it or fix the URI ({self.uri})"
                ) from exc
            self._raise(exc, "access", "")
        except BotoCoreError as exc:
            self._raise(exc, "access", "")
        self._bucket_known = True

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
            if _error_code(exc) != "BucketAlreadyOwnedByYou":
                self._raise(exc, "create bucket", "")
        except BotoCoreError as exc:
            self._raise(exc, "create bucket", "")
        self._bucket_known = True

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
            self._ensure_conditional_writes(key)
            params["IfNoneMatch"] = "*"
        elif if_match is not None:
            params["IfMatch"] = f'"{if_match.strip(chr(34))}"'
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                response = self._client.put_object(**params)
            except ClientError as exc:
                code, status = _error_code(exc), _status(exc)
                failed = code in _PRECONDITION_CODES or status == 412 or (
                    if_match is not None and (code in _NOT_FOUND_CODES or status == 404))
                if (create_only or if_match is not None) and failed:
                    return self._settle(key, data, create_only, if_match, exc)
                if (create_only or if_match is not None) and code == _CONFLICT_CODE:
                    if attempt < _CONFLICT_ATTEMPTS:
                        time.sleep(0.05 * 2**attempt)
                        continue
                    raise OutcomeUnknownError(
                        f"{self._where(key)} is being written concurrently (409 "
                        "ConditionalRequestConflict after retries); whether this write "
                        "was applied is not known yet: repeat it or read the object"
                    ) from exc
                if status >= 500:
                    return self._settle(key, data, create_only, if_match, exc)
                self._raise(exc, "write", key)
            except (BotoConnectionError, HTTPClientError, IncompleteReadError) as exc:
                return self._settle(key, data, create_only, if_match, exc)
            except BotoCoreError as exc:
                self._raise(exc, "write", key)
            self._bucket_known = True
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
                     self._where(key), exc)
            return stored.etag
        refused = isinstance(exc, ClientError) and _status(exc) < 500
        if create_only and (refused or stored is not None):
            raise ObjectAlreadyExistsError(
                f"{self._where(key)} already exists; a create-only write never "
                "replaces an object"
            ) from exc
        if if_match is not None and (
                refused or stored is None or stored.etag != if_match.strip('"')):
            raise PreconditionFailedError(
                f"{self._where(key)} is not the version this write was conditioned on "
                "(another writer replaced or deleted it); nothing was written"
            ) from exc
        self._raise(exc, "write", key)

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
            f"cannot tell whether the write of {self._where(key)} was applied: its "
            f"answer was lost ({exc}) and reading the object back failed ({last})"
        ) from exc

    def _ensure_conditional_writes(self, key: str) -> None:
        """Check once per (endpoint, bucket) that ``If-None-Match: *`` is honoured.

        Writes a probe object twice with the header and deletes it. If the second
        write succeeds the endpoint ignores conditional writes, and a create-only write
        could silently replace an object (a completion marker, a control request), so
        this raises ``StorageError`` instead.
        """
        ident = (self.endpoint_url, self.bucket)
        if not self._verify_conditional or ident in _VERIFIED_CONDITIONAL:
            return
        with _VERIFIED_LOCK:
            if ident in _VERIFIED_CONDITIONAL:
                return
            probe = self._root + PROBE_PREFIX + uuid.uuid4().hex
            try:
                # The probe key is new and ours alone: a 412 on the first PUT answers a
                # retry of that PUT, applied but its answer lost. Either refusal means
                # the endpoint refused to create an existing object: it honours the
                # header. Both PUTs are sent either way.
                first = self._probe_refused(probe, key)
                honoured = self._probe_refused(probe, key) or first
            finally:
                with contextlib.suppress(ClientError, BotoCoreError):
                    self._client.delete_object(Bucket=self.bucket, Key=probe)
            if not honoured:
                raise StorageError(
                    f"endpoint {self.endpoint_url} ignores 'If-None-Match: *' on PutObject "
                    f"(bucket {self.bucket!r}): create-only writes such as completion "
                    "markers could silently overwrite each other. Use a server with S3 "
                    "conditional writes (AWS S3, recent MinIO or Ceph RGW), or open the "
                    "storage with verify_conditional_writes=False to accept the risk."
                )
            _VERIFIED_CONDITIONAL.add(ident)
            self._bucket_known = True

    def _probe_refused(self, probe: str, key: str) -> bool:
        """One create-only PUT of the probe object: True if the endpoint refused it as
        existing (412, or 409 for a concurrent conditional write), False if it wrote
        it. Any other error raises the ``StorageError`` of a write of ``key``."""
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=probe, Body=b"probe", IfNoneMatch="*"
            )
        except ClientError as exc:
            if not _refused_as_existing(exc):
                self._raise(exc, "write", key)
            return True
        except BotoCoreError as exc:
            self._raise(exc, "write", key)
        return False

    def probe_create_only_multipart(self, key: str) -> bool:
        """Create ``key`` twice with a one-part multipart upload completed with
        ``If-None-Match: *``; True if the second completion was refused as existing
        (412 or 409), False if it replaced the object. For ``check-storage``: the
        runtime itself writes create-only objects in one PutObject. An upload left
        behind by an error is aborted."""
        full = self._full(key)
        for attempt in (1, 2):
            with self._errors("write", key):
                upload_id = self._client.create_multipart_upload(
                    Bucket=self.bucket, Key=full)["UploadId"]
            try:
                part = self._client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=1,
                    Body=f"multipart probe {attempt}".encode())
                self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, IfNoneMatch="*",
                    MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
            except ClientError as exc:
                with contextlib.suppress(ClientError, BotoCoreError):
                    self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=full, UploadId=upload_id)
                if attempt == 2 and _refused_as_existing(exc):
                    return True
                self._raise(exc, "write", key)
            except BotoCoreError as exc:
                self._raise(exc, "write", key)
        return False

    def common_prefixes(self, prefix: str) -> builtins.list[str]:
        """The names the server lists as common prefixes under ``prefix``
        (``Delimiter='/'``) as it lists them, an emptied one included (for
        ``check-storage``; :meth:`list_dirs` is what the runtime uses)."""
        base = dir_prefix(prefix)
        cut = len(self._root) + len(base)
        return sorted({common["Prefix"][cut:].rstrip("/")
                       for page in self._pages(base, delimiter="/")
                       for common in page.get("CommonPrefixes", [])} - {""})

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
                with self._errors("upload to", key):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=body)
                return
        with self._errors("upload to", key):
            self._transfer.upload(str(path), self.bucket, full).result()

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
            if _error_code(exc) in _TOO_LARGE_CODES and (
                "size" in message or "large" in message
            ):
                self._managed_copy(src_key, dst_key)
                return
            self._raise(exc, "copy", src_key)
        except BotoCoreError as exc:
            self._raise(exc, "copy", src_key)

    def _managed_copy(self, src_key: str, dst_key: str) -> None:
        """Copy with s3transfer: HeadObject, then CopyObject or multipart UploadPartCopy."""
        source: CopySourceTypeDef = {"Bucket": self.bucket, "Key": self._full(src_key)}
        with self._errors("copy", src_key):
            self._transfer.copy(source, self.bucket, self._full(dst_key)).result()

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` in DeleteObjects batches of 1000; absent keys are ignored.

        Durable on return. A key S3 refuses to delete raises (the first error names it).
        """
        batch: list[str] = []
        for key in dict.fromkeys(keys):
            batch.append(check_key(key))
            if len(batch) == DELETE_BATCH:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, keys: list[str]) -> None:
        objects: builtins.list[ObjectIdentifierTypeDef] = [
            {"Key": self._full(key)} for key in keys
        ]
        with self._errors("delete", keys[0]):
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
                self._raise(fake, "delete", key)
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
            except _BODY_ERRORS as exc:
                if attempt == self._attempts:
                    self._raise(exc, "read", key)
                time.sleep(0.05 * 2**attempt)
                continue
            except (ClientError, BotoCoreError) as exc:
                self._raise(exc, "read", key)
            self._bucket_known = True
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
            if _is_missing(exc) and self._bucket_exists():
                return False
            self._raise(exc, "check", key)
        except BotoCoreError as exc:
            self._raise(exc, "check", key)
        self._bucket_known = True
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
            except Exception as exc:  # mapped (or re-raised as is) by _raise below
                result.append(exc)

        tmp = write_temp(target.parent, target.name, fill)
        try:
            if result:
                self._raise(result[0], "download", key)
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

        with self._errors("download", key):
            body: Any
            try:
                body = _ResumingBody(open_at, self._attempts - 1)
            except ClientError as exc:
                if _status(exc) != 416 and _error_code(exc) != "InvalidRange":
                    raise
                body = io.BytesIO()
            try:
                yield body
            finally:
                body.close()

    def _pages(
        self, prefix: str, delimiter: str | None = None, start_after: str | None = None
    ) -> Iterator[dict[str, Any]]:
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._root + prefix}
        if delimiter:
            params["Delimiter"] = delimiter
        if start_after:
            params["StartAfter"] = self._root + start_after
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors("list", prefix):
            for page in paginator.paginate(**params):
                yield dict(page)
        self._bucket_known = True

    def abort_incomplete_uploads(self, prefix: str) -> int:
        """Abort the multipart uploads under ``prefix`` (ListMultipartUploads)."""
        check_prefix(prefix)
        aborted = 0
        paginator = self._client.get_paginator("list_multipart_uploads")
        with self._errors("abort multipart uploads under", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._root + prefix):
                for upload in page.get("Uploads", []):
                    with contextlib.suppress(ClientError):  # completed or aborted meanwhile
                        self._client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                        aborted += 1
        return aborted

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (ListObjectsV2), sorted by key.

        Probe objects of the conditional-write check are not listed.
        """
        return self._list(prefix, None)

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        """Keys under ``prefix`` after ``start_after``: ListObjectsV2 ``StartAfter``."""
        return self._list(prefix, start_after)

    def _list(self, prefix: str, start_after: str | None) -> builtins.list[ObjectInfo]:
        check_prefix(prefix)
        cut = len(self._root)
        out = [
            ObjectInfo(item["Key"][cut:], int(item["Size"]), item["LastModified"].timestamp())
            for page in self._pages(prefix, start_after=start_after)
            for item in page.get("Contents", [])
            if not item["Key"][cut:].startswith(PROBE_PREFIX)
        ]
        out.sort(key=lambda info: info.key)
        return out

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Immediate "sub-directories" of ``prefix`` that hold at least one object, sorted.

        ``prefix`` is treated as a directory (``"a"`` means ``"a/"``). A common prefix
        with no object under it is not a directory: servers built on a file system
        (SeaweedFS) keep listing a prefix after every object under it was deleted.

        Requests: one ListObjectsV2 of up to ``LIST_DIRS_FIRST_KEYS`` keys; when it
        holds every key under ``prefix``, the directories are read off the keys.
        Otherwise a ``Delimiter='/'`` listing names the candidates, and each candidate
        that sorts after the first page's last key is confirmed with one ``MaxKeys=1``
        listing (in parallel); the others were confirmed or refuted by the first page.
        """
        base = dir_prefix(prefix)
        full_base = self._root + base
        cut = len(full_base)
        with self._errors("list", base):
            first = self._client.list_objects_v2(Bucket=self.bucket, Prefix=full_base,
                                                 MaxKeys=LIST_DIRS_FIRST_KEYS)
        self._bucket_known = True
        keys = [item["Key"] for item in first.get("Contents", [])]
        seen = {key[cut:].split("/", 1)[0] for key in keys if "/" in key[cut:]}
        if not first.get("IsTruncated"):
            return sorted(seen)
        last = keys[-1]
        candidates = set(self.common_prefixes(base))
        # A candidate whose prefix sorts at or before ``last`` (and is not ``last``'s
        # own) would have had its keys in the first page: it is empty.
        unknown = sorted(n for n in candidates - seen if full_base + n + "/" > last)
        with ThreadPoolExecutor(max_workers=self._max_workers) as pool:
            held = list(pool.map(lambda n: self._holds_objects(base + n + "/"), unknown))
        return sorted(seen | {n for n, h in zip(unknown, held, strict=True) if h})

    def _holds_objects(self, prefix: str) -> bool:
        """Whether at least one object's key starts with ``prefix`` (one request)."""
        with self._errors("list", prefix):
            page = self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._root + prefix, MaxKeys=1)
        return bool(page.get("Contents"))
