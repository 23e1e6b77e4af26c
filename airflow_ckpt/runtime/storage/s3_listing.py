"""Listings of an :class:`~airflow_ckpt.runtime.storage.s3.S3Storage`: objects
(ListObjectsV2, paginated), "directories" that hold objects, common prefixes, and the
multipart uploads under a prefix."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.runtime.storage.naming import check_prefix, dir_prefix
from airflow_ckpt.runtime.storage.s3_errors import S3Errors

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

#: keys of the first listing of ``list_dirs``: a prefix with at most this many keys costs
#: one request with a light answer (a listing page of 1000 keys is ~250 KB to render,
#: send and parse)
LIST_DIRS_FIRST_KEYS = 200
#: probe objects written by the conditional-write check start with this
PROBE_PREFIX = ".airflow-ckpt-probe-"


class S3Listing:
    """The listings under ``root`` (the storage's key prefix, ``""`` or ending in ``/``)
    of ``bucket``; keys are returned relative to ``root``. ``max_workers`` bounds the
    parallel confirmations of :meth:`dirs`."""

    def __init__(self, client: S3Client, bucket: str, root: str, errors: S3Errors,
                 max_workers: int) -> None:
        self._client = client
        self.bucket = bucket
        self._root = root
        self._errors = errors
        self._max_workers = max_workers

    def common_prefixes(self, prefix: str) -> list[str]:
        """The names the server lists as common prefixes under ``prefix``
        (``Delimiter='/'``) as it lists them, an emptied one included (for
        ``check-storage``; :meth:`dirs` is what the runtime uses)."""
        base = dir_prefix(prefix)
        cut = len(self._root) + len(base)
        return sorted({common["Prefix"][cut:].rstrip("/")
                       for page in self.pages(base, delimiter="/")
                       for common in page.get("CommonPrefixes", [])} - {""})

    def pages(
        self, prefix: str, delimiter: str | None = None, start_after: str | None = None
    ) -> Iterator[dict[str, Any]]:
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._root + prefix}
        if delimiter:
            params["Delimiter"] = delimiter
        if start_after:
            params["StartAfter"] = self._root + start_after
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors.translate("list", prefix):
            for page in paginator.paginate(**params):
                yield dict(page)
        self._errors.bucket_known = True

    def abort_incomplete_uploads(self, prefix: str) -> int:
        """Abort the multipart uploads under ``prefix`` (ListMultipartUploads)."""
        check_prefix(prefix)
        aborted = 0
        paginator = self._client.get_paginator("list_multipart_uploads")
        with self._errors.translate("abort multipart uploads under", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._root + prefix):
                for upload in page.get("Uploads", []):
                    with contextlib.suppress(ClientError):  # completed or aborted meanwhile
                        self._client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                        aborted += 1
        return aborted

    def objects(self, prefix: str, start_after: str | None) -> list[ObjectInfo]:
        """The objects under ``prefix`` (after ``start_after``), sorted by key; probe
        objects of the conditional-write check are not listed."""
        check_prefix(prefix)
        cut = len(self._root)
        out = [
            ObjectInfo(item["Key"][cut:], int(item["Size"]), item["LastModified"].timestamp())
            for page in self.pages(prefix, start_after=start_after)
            for item in page.get("Contents", [])
            if not item["Key"][cut:].startswith(PROBE_PREFIX)
        ]
        out.sort(key=lambda info: info.key)
        return out

    def dirs(self, prefix: str) -> list[str]:
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
        with self._errors.translate("list", base):
            first = self._client.list_objects_v2(Bucket=self.bucket, Prefix=full_base,
                                                 MaxKeys=LIST_DIRS_FIRST_KEYS)
        self._errors.bucket_known = True
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
            held = list(pool.map(lambda n: self.holds_objects(base + n + "/"), unknown))
        return sorted(seen | {n for n, h in zip(unknown, held, strict=True) if h})

    def holds_objects(self, prefix: str) -> bool:
        """Whether at least one object's key starts with ``prefix`` (one request)."""
        with self._errors.translate("list", prefix):
            page = self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._root + prefix, MaxKeys=1)
        return bool(page.get("Contents"))
