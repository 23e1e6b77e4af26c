"""How the S3-compatible backend talks to its endpoint: :class:`S3Options` and its defaults.

They live apart from the backend so that parsing options and URIs never imports boto3.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024

DEFAULT_MAX_WORKERS = 8
DEFAULT_MAX_ATTEMPTS = 5  # botocore "standard" retry mode: total attempts per request
DEFAULT_CONNECT_TIMEOUT = 5.0  # seconds
DEFAULT_READ_TIMEOUT = 60.0  # seconds without a byte from the server
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
DEFAULT_MULTIPART_CHUNKSIZE = 16 * MiB

@dataclass(frozen=True, slots=True)
class S3Options:
    """How to reach and talk to an S3-compatible endpoint (ignored for ``file://``).

    :param endpoint_url: S3-compatible endpoint; ``None`` uses ``AWS_ENDPOINT_URL`` /
        ``AWS_ENDPOINT_URL_S3`` / the AWS config, else AWS S3. Path-style addressing is
        used for every endpoint that is not AWS.
    :param region_name, aws_access_key_id, aws_secret_access_key, aws_session_token:
        ``None`` falls back to boto3's standard environment/config/instance resolution
    :param max_workers: threads per transfer (multipart parts, downloads) and the size
        of the HTTP connection pool (twice this)
    :param max_attempts: attempts per request, first included (botocore ``standard``
        retry mode: exponential backoff with jitter, retries throttling, 5xx and
        connection errors)
    :param connect_timeout, read_timeout: seconds (per attempt)
    :param multipart_threshold, multipart_chunksize: files at or above the threshold are
        uploaded, downloaded and (when too large for one CopyObject) copied in parts of
        this size (S3 requires at least 5 MiB per part)
    :param verify_conditional_writes: check once per endpoint and bucket, before the
        first create-only write, that the endpoint honours ``If-None-Match: *``
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    max_workers: int = DEFAULT_MAX_WORKERS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE
    verify_conditional_writes: bool = True
