"""Validation of storage keys, key prefixes and S3 bucket names (shared by the backends).

Keys are ``/``-separated, relative to the storage root: no leading ``/``, no empty,
``.`` or ``..`` segments, no NUL byte, no trailing ``/``. A bad key is a programming
error and raises ``ValueError`` (it never reaches the server or the filesystem, so a
key can never escape the storage root).
"""

from __future__ import annotations

import re

_BUCKET_CHARS = re.compile(r"[a-z0-9.-]+")
_IP_LIKE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")  # what S3 and MinIO refuse
_BUCKET_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as an S3 bucket name, or None if it is valid.

    The rules are S3's for general purpose buckets (which MinIO also enforces):
    3-63 characters of lowercase letters, digits, ``.`` and ``-``; starts and ends with
    a letter or digit; no ``..``; not an IP address; no reserved prefix or suffix.
    """
    if not 3 <= len(name) <= 63:
        return f"must be 3 to 63 characters long (it has {len(name)})"
    if not _BUCKET_CHARS.fullmatch(name):
        bad = sorted({c for c in name if not re.match(r"[a-z0-9.-]", c)})
        return (
            "may contain only lowercase letters, digits, '.' and '-' "
            f"(found {', '.join(repr(c) for c in bad)})"
        )
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "must begin and end with a lowercase letter or a digit"
    if ".." in name:
        return "must not contain two adjacent periods"
    if _IP_LIKE.fullmatch(name):
        return "must not be formatted as an IP address"
    for prefix in _BUCKET_BAD_PREFIXES:
        if name.startswith(prefix):
            return f"must not start with the reserved prefix {prefix!r}"
    for suffix in _BUCKET_BAD_SUFFIXES:
        if name.endswith(suffix):
            return f"must not end with the reserved suffix {suffix!r}"
    return None


def _segments_problem(path: str) -> str | None:
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "must be relative to the storage root (no leading '/')"
    for part in path.split("/"):
        if part == "":
            return "has an empty path segment ('//')"
        if part in (".", ".."):
            return f"has a {part!r} path segment"
    return None


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``ValueError``."""
    problem = "is empty" if not key else None
    if problem is None and key.endswith("/"):
        problem = "ends with '/' (that is a prefix, not an object key)"
    if problem is None:
        problem = _segments_problem(key)
    if problem is not None:
        raise ValueError(f"invalid storage key {key!r}: {problem}")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix (may be empty or end in ``/``)."""
    body = prefix[:-1] if prefix.endswith("/") else prefix
    problem = _segments_problem(body) if body else None
    if problem is None and prefix == "/":
        problem = "must be relative to the storage root (no leading '/')"
    if problem is not None:
        raise ValueError(f"invalid storage prefix {prefix!r}: {problem}")
    return prefix


def dir_prefix(prefix: str) -> str:
    """``prefix`` as a directory prefix: empty, or ending in exactly one ``/``."""
    check_prefix(prefix)
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"
