"""The boto3 S3 client of an :class:`~airflow_ckpt.runtime.storage.s3.S3Storage`: botocore's
``standard`` retries, the timeouts and pool size of its options, path-style addressing
for any endpoint that is not AWS's, and one service-model loader for the process."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import botocore.loaders
import botocore.session
from botocore.config import Config

from airflow_ckpt.runtime.storage.options import S3Options

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


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


def make_s3_client(o: S3Options) -> S3Client:
    """A client for ``o``'s endpoint (AWS S3 when none is given or configured)."""
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
    return client
