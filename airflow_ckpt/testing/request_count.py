"""Counting the S3 requests a storage sends, by kind and by what they touch.

:class:`RequestCounter` hooks the boto3 client of an S3 storage (botocore's
``before-send`` event: once per HTTP request actually sent, retries and pages
included), so what it counts is what the endpoint receives and what AWS bills. Each
request is filed under a billing *kind* (:data:`KINDS`) and an *area* of the job's
layout (:data:`AREAS`), read from the request's key or listing prefix, and under its
*caller*: the innermost function of the runtime above the storage layer that sent it
(``module.function``), so a bill says which step of a checkpoint pays for what.
"""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.runtime.storage.base import CheckpointStorage

#: billing kinds, as AWS prices S3 requests: PUT holds every PUT-priced request (PUT,
#: COPY, POST, multipart parts); DELETE holds DeleteObject(s) and multipart aborts
KINDS = ("LIST", "GET", "PUT", "DELETE", "HEAD", "OTHER")
#: areas of a job's layout: control requests and doorbells, lease records, history
#: events, and everything else (checkpoints, shared files, savepoints, sink output)
AREAS = ("control", "lease", "history", "data")

_KIND_OF = {
    "ListObjectsV2": "LIST", "ListObjects": "LIST", "ListMultipartUploads": "LIST",
    "ListParts": "LIST",
    "GetObject": "GET",
    "HeadObject": "HEAD", "HeadBucket": "HEAD",
    "PutObject": "PUT", "CopyObject": "PUT", "UploadPart": "PUT", "UploadPartCopy": "PUT",
    "CreateMultipartUpload": "PUT", "CompleteMultipartUpload": "PUT",
    "DeleteObject": "DELETE", "DeleteObjects": "DELETE", "AbortMultipartUpload": "DELETE",
}
_FIRST_KEY = re.compile(rb"<Key>([^<]*)</Key>")
#: modules a caller is never attributed to: the storage layer and this counter
_NOT_CALLERS = ("airflow_ckpt.runtime.storage.", "airflow_ckpt.runtime.lease.record",
                "airflow_ckpt.testing.request_count")


def operation_of(method: str, path: str, query: str, copy_source: bool = False) -> str:
    """The S3 API operation of a path-style request as an endpoint receives it: its
    ``method``, ``path`` (``/bucket[/key]``), query string and whether it carries an
    ``x-amz-copy-source`` header. Names are botocore's (``PutObject``, ``CopyObject``,
    ...); :func:`kind_of` bills them. A request of no operation named here is its
    method (billed ``OTHER``)."""
    params = parse_qs(query, keep_blank_values=True)
    bucket, _, key = path.lstrip("/").partition("/")
    has_key = bool(key)
    if method in ("GET", "HEAD") and not bucket:
        return "ListBuckets" if method == "GET" else method
    if method == "GET":
        if "uploads" in params:
            return "ListMultipartUploads"
        if "uploadId" in params:
            return "ListParts"
        if not has_key:
            return "ListObjectsV2" if params.get("list-type") == ["2"] else "ListObjects"
        return "GetObject"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "PUT":
        if not has_key:
            return "CreateBucket"
        if copy_source:
            return "UploadPartCopy" if "partNumber" in params else "CopyObject"
        return "UploadPart" if "partNumber" in params else "PutObject"
    if method == "POST":
        if "delete" in params:
            return "DeleteObjects"
        if "uploads" in params:
            return "CreateMultipartUpload"
        if "uploadId" in params:
            return "CompleteMultipartUpload"
    if method == "DELETE":
        if "uploadId" in params:
            return "AbortMultipartUpload"
        return "DeleteObject" if has_key else "DeleteBucket"
    return method


def kind_of(operation: str) -> str:
    """The billing kind (:data:`KINDS`) of an S3 operation (botocore's name)."""
    return _KIND_OF.get(operation, "OTHER")


def caller_of(depth: int = 2) -> str:
    """Who sent the request being sent on this thread: the two innermost ``airflow_ckpt``
    (or ``bench``) functions on its stack outside the storage layer, of different
    modules, as ``module.function < module.function`` (``"?"`` if none: a thread of the
    transfer manager, say)."""
    names: list[str] = []
    modules: list[str] = []
    frame = sys._getframe(depth)
    while frame is not None and len(names) < 2:
        module = str(frame.f_globals.get("__name__", ""))
        if (module.startswith(("airflow_ckpt.", "bench.")) and not module.startswith(
                _NOT_CALLERS) and module not in modules):
            modules.append(module)
            names.append(f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return " < ".join(names) or "?"


def area_of(key: str) -> str:
    """The layout area of a bucket key or listing prefix (see :data:`AREAS`)."""
    path = f"/{key}"
    if "/control/" in path or "/lease/doorbell-" in path:
        return "control"
    if "/lease/" in path:
        return "lease"
    if "/history/" in path:
        return "history"
    return "data"


def _key_of(request: Any) -> str:
    """The key (or listing prefix) a path-style S3 request is about."""
    url = urlsplit(request.url)
    query = parse_qs(url.query)
    if "prefix" in query:
        return query["prefix"][0]
    body = request.body
    if "delete" in query and isinstance(body, bytes):
        found = _FIRST_KEY.search(body)
        return unquote(found.group(1).decode()) if found else ""
    parts = url.path.split("/", 2)  # "", bucket, key
    return unquote(parts[2]) if len(parts) > 2 else ""


class RequestCounter:
    """Counts every request the attached storages send, by ``(area, kind)``.

    Thread-safe: a driver sends from its heartbeat, coordinator and upload threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._callers: Counter[tuple[str, str]] = Counter()

    def attach(self, storage: CheckpointStorage) -> None:
        """Count the requests of ``storage`` (an S3 storage, or a view of one).

        :raises ConfigError: ``storage`` does not send S3 requests
        """
        client = getattr(storage, "_client", None)  # S3Storage's boto3 client
        if client is None:
            raise ConfigError("request counter", {"storage": f"{storage!r} is not on S3"})
        client.meta.events.register("before-send.s3", self._sent)

    def _sent(self, request: Any, event_name: str, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        kind = kind_of(operation)
        caller = caller_of()
        with self._lock:
            self._counts[(area_of(_key_of(request)), kind)] += 1
            self._callers[(caller, kind)] += 1

    def counts(self) -> Counter[tuple[str, str]]:
        """A copy of the counts so far."""
        with self._lock:
            return Counter(self._counts)

    def callers(self) -> Counter[tuple[str, str]]:
        """A copy of the counts so far by ``(caller, kind)`` (see :func:`caller_of`)."""
        with self._lock:
            return Counter(self._callers)

    def total(self, area: str | None = None) -> int:
        """Requests so far, of one area or of all."""
        return sum(n for (a, _), n in self.counts().items() if area is None or a == area)
