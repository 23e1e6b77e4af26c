"""Whether an S3 endpoint honours conditional writes: create-only writes send
``If-None-Match: *``, and an endpoint that ignores the header would silently turn them
into overwrites, so the first create-only write of a storage checks once per (endpoint,
bucket), with a probe object, that the endpoint refuses to create an existing object."""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from airflow_ckpt.errors import StorageError
from airflow_ckpt.runtime.storage.s3_errors import S3Errors, refused_as_existing
from airflow_ckpt.runtime.storage.s3_listing import PROBE_PREFIX

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

# (endpoint, bucket) pairs whose If-None-Match support has been verified.
_VERIFIED_CONDITIONAL: set[tuple[str, str]] = set()
_VERIFIED_LOCK = threading.Lock()


class ConditionalWrites:
    """The conditional-write check of one storage (``root``: its key prefix); ``verify``
    False skips it (the storage was opened with ``verify_conditional_writes=False``)."""

    def __init__(self, client: S3Client, bucket: str, root: str, endpoint_url: str,
                 errors: S3Errors, verify: bool) -> None:
        self._client = client
        self.bucket = bucket
        self._root = root
        self.endpoint_url = endpoint_url
        self._errors = errors
        self._verify = verify

    def ensure(self, key: str) -> None:
        """Check once per (endpoint, bucket) that ``If-None-Match: *`` is honoured.

        Writes a probe object twice with the header and deletes it. If the second
        write succeeds the endpoint ignores conditional writes, and a create-only write
        could silently replace an object (a completion marker, a control request), so
        this raises ``StorageError`` instead.
        """
        ident = (self.endpoint_url, self.bucket)
        if not self._verify or ident in _VERIFIED_CONDITIONAL:
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
            self._errors.bucket_known = True

    def _probe_refused(self, probe: str, key: str) -> bool:
        """One create-only PUT of the probe object: True if the endpoint refused it as
        existing (412, or 409 for a concurrent conditional write), False if it wrote
        it. Any other error raises the ``StorageError`` of a write of ``key``."""
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=probe, Body=b"probe", IfNoneMatch="*"
            )
        except ClientError as exc:
            if not refused_as_existing(exc):
                self._errors.raise_(exc, "write", key)
            return True
        except BotoCoreError as exc:
            self._errors.raise_(exc, "write", key)
        return False

    def probe_create_only_multipart(self, full: str, key: str) -> bool:
        """Create ``key`` twice with a one-part multipart upload completed with
        ``If-None-Match: *``; True if the second completion was refused as existing
        (412 or 409), False if it replaced the object. For ``check-storage``: the
        runtime itself writes create-only objects in one PutObject. An upload left
        behind by an error is aborted. ``full`` is ``key`` with the storage's prefix."""
        for attempt in (1, 2):
            with self._errors.translate("write", key):
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
                if attempt == 2 and refused_as_existing(exc):
                    return True
                self._errors.raise_(exc, "write", key)
            except BotoCoreError as exc:
                self._errors.raise_(exc, "write", key)
        return False
