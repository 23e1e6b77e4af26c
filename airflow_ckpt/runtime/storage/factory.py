"""Storage URIs -> :class:`CheckpointStorage` backends.

Accepted URIs:

* ``s3://<bucket>[/<prefix>]`` (``s3a://`` is accepted as a synonym and normalised to
  ``s3://``): any S3-compatible endpoint, via boto3;
* ``file:///<absolute/path>`` (also ``file://localhost/<path>`` and ``file:/<path>``):
  a local or mounted filesystem.

Parsing never touches the network or the filesystem; :func:`parse_storage_uri` can be
used to validate configuration early.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote

from airflow_ckpt.errors import InvalidStorageUriError
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.naming import bucket_name_problem
from airflow_ckpt.runtime.storage.options import S3Options

ACCEPTED_FORMS = "s3://<bucket>[/<prefix>] (or s3a://...) or file:///<absolute/path>"

_URI_SAFE = "/:@!$&'()*+,;=-._~"


@dataclass(frozen=True, slots=True)
class StorageUri:
    """A parsed, validated storage URI.

    ``uri`` is the canonical form (``s3://`` scheme, no trailing ``/``); it is what
    ``CheckpointStorage.uri`` reports. For S3, ``prefix`` is the key prefix of the
    root without leading or trailing ``/`` (``""`` for the bucket root); for files,
    ``path`` is the absolute root directory.
    """

    scheme: Literal["s3", "file"]
    uri: str
    bucket: str | None = None
    prefix: str = ""
    path: str | None = None


def _bad(uri: str, problem: str) -> InvalidStorageUriError:
    return InvalidStorageUriError(
        f"invalid storage URI {uri!r}: {problem}; accepted forms: {ACCEPTED_FORMS}"
    )


def _check_segments(uri: str, path: str, what: str) -> None:
    for part in path.split("/"):
        if part in (".", ".."):
            raise _bad(uri, f"the {what} must not contain {part!r} segments")
        if part == "":
            raise _bad(uri, f"the {what} has an empty segment ('//')")


def _parse_s3(uri: str, rest: str) -> StorageUri:
    bucket, _, prefix = rest.partition("/")
    if "?" in rest or "#" in rest:
        raise _bad(uri, "query strings and fragments are not allowed")
    if "@" in bucket:
        raise _bad(
            uri,
            "credentials must not be embedded in the URI; use the connection or the "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables",
        )
    if ":" in bucket:
        raise _bad(
            uri,
            "a host:port is not a bucket; put the bucket in the URI and pass the "
            "server as endpoint_url (or AWS_ENDPOINT_URL)",
        )
    if not bucket:
        raise _bad(uri, "the bucket name is missing")
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise _bad(uri, f"bucket name {bucket!r} {problem}")
    prefix = prefix.rstrip("/")
    if prefix:
        _check_segments(uri, prefix, "key prefix")
    canonical = f"s3://{bucket}" + (f"/{prefix}" if prefix else "")
    return StorageUri("s3", canonical, bucket=bucket, prefix=prefix)


def _parse_file(uri: str, rest: str) -> StorageUri:
    # rest is what follows "file:"
    if "?" in rest or "#" in rest:
        raise _bad(uri, "query strings and fragments are not allowed")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise _bad(
                uri,
                f"file URIs need an absolute path after three slashes; {authority!r} "
                f"was read as a host name (did you mean file:///{authority}/{path}?)",
            )
        path = slash + path
    else:
        path = rest
    path = unquote(path)
    if not path.startswith("/"):
        raise _bad(
            uri,
            f"file URIs need an absolute path (got the relative path {path!r}); "
            "write file:///absolute/path",
        )
    body = path.strip("/")
    if not body:
        raise _bad(uri, "the filesystem root '/' cannot be a storage root; name a directory")
    _check_segments(uri, body, "path")
    path = posixpath.join("/", body)
    return StorageUri("file", "file://" + quote(path, safe=_URI_SAFE), path=path)


def parse_storage_uri(uri: str) -> StorageUri:
    """Parse and validate ``uri`` without touching the network or the filesystem.

    Raises :class:`InvalidStorageUriError` naming what is wrong and the accepted forms.
    """
    if not isinstance(uri, str):
        raise InvalidStorageUriError(
            f"storage URI must be a string, got {type(uri).__name__}; "
            f"accepted forms: {ACCEPTED_FORMS}"
        )
    text = uri.strip()
    if not text:
        raise _bad(uri, "it is empty")
    scheme, sep, rest = text.partition(":")
    if not sep or "/" in scheme:
        hint = f" (did you mean file://{text}?)" if text.startswith("/") else ""
        raise _bad(uri, f"it has no scheme{hint}")
    scheme = scheme.lower()
    if scheme in ("s3", "s3a"):
        if not rest.startswith("//"):
            raise _bad(uri, f"write {scheme}://<bucket>[/<prefix>]")
        return _parse_s3(uri, rest[2:])
    if scheme == "file":
        return _parse_file(uri, rest)
    raise _bad(uri, f"unsupported scheme {scheme + '://'!r}")


def key_in_storage(storage_uri: str, path: str) -> str | None:
    """The key that ``path`` names under the storage root ``storage_uri``, or None when
    ``path`` is not a URI (a relative path such as ``<job>/chk-7``).

    Both are compared in their canonical spelling, so ``s3a://``, ``S3://``,
    ``file://localhost/``, a percent-encoded or a raw space or non-ASCII letter name
    the same objects as the storage's own URI. Raises :class:`InvalidStorageUriError`
    for a URI that is invalid or outside the storage root.
    """
    text = path.strip()
    if "://" not in text:
        return None
    canonical = parse_storage_uri(text)
    root = parse_storage_uri(storage_uri)
    inner, outer = (
        (canonical.path or "", root.path or "") if canonical.scheme == "file"
        else (f"{canonical.bucket}/{canonical.prefix}".rstrip("/"),
              f"{root.bucket}/{root.prefix}".rstrip("/")))
    if canonical.scheme != root.scheme or not (inner + "/").startswith(outer + "/"):
        raise InvalidStorageUriError(
            f"{path!r} is not in this storage ({storage_uri}); copy it there or point the "
            "job at that storage")
    return inner[len(outer):].strip("/")


def open_storage(uri: str, **s3_options: Any) -> CheckpointStorage:
    """Open the storage at ``uri`` (see the module docstring for the accepted forms).

    Opening is lazy: nothing is contacted or created until the first operation, so a
    missing bucket or bad credentials surface as errors of that operation.

    S3 options left as ``None`` fall back to boto3's standard resolution: the
    ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``,
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` and
    ``AWS_PROFILE`` environment variables, ``~/.aws/config`` and ``~/.aws/credentials``,
    then instance/container credentials. The S3-only options are ignored for
    ``file://`` URIs. ``max_attempts`` counts every attempt of one request (1 = no
    retry); ``verify_conditional_writes`` makes the first create-only write check once
    that the endpoint really honours ``If-None-Match`` (see ``docs/storage.md``).

    ``s3_options`` are the fields of :class:`S3Options` (an unknown name is a
    ``TypeError``). Raises :class:`InvalidStorageUriError` for a malformed URI.
    """
    parsed = parse_storage_uri(uri)
    if parsed.scheme == "file":
        from airflow_ckpt.runtime.storage.local import LocalStorage

        assert parsed.path is not None
        return LocalStorage(parsed.path)
    from airflow_ckpt.runtime.storage.s3 import S3Storage

    assert parsed.bucket is not None
    return S3Storage(parsed.bucket, parsed.prefix, S3Options(**s3_options))
