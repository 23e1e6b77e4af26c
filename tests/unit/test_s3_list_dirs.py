"""S3Storage.list_dirs on a server that keeps emptied common prefixes (as SeaweedFS does),
request by request (botocore's Stubber: what is sent, in order, and nothing more)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.stub import Stubber

from airflow_ckpt.runtime.storage.options import S3Options
from airflow_ckpt.runtime.storage.s3 import S3Storage


@pytest.fixture
def stubbed() -> Iterator[tuple[S3Storage, Stubber]]:
    storage = S3Storage("bucket", "root", S3Options(
        endpoint_url="http://127.0.0.1:9", region_name="us-east-1", aws_access_key_id="k",
        aws_secret_access_key="s", max_workers=1))  # one worker: requests in order
    with Stubber(storage._client) as stub:
        yield storage, stub
        stub.assert_no_pending_responses()
    storage.close()


def _keys(*keys: str, truncated: bool = False) -> dict[str, Any]:
    page: dict[str, Any] = {"IsTruncated": truncated, "KeyCount": len(keys)}
    if keys:
        page["Contents"] = [{"Key": k, "Size": 1} for k in keys]
    return page


def test_one_page_of_keys_is_one_request_and_lists_only_what_holds_objects(
    stubbed: tuple[S3Storage, Stubber],
) -> None:
    storage, stub = stubbed
    stub.add_response("list_objects_v2", _keys("root/job/chk-2/_metadata",
                                                "root/job/chk-2/op/0", "root/job/file"),
                      {"Bucket": "bucket", "Prefix": "root/job/", "MaxKeys": 200})
    assert storage.list_dirs("job") == ["chk-2"]


def test_past_one_page_only_prefixes_after_its_last_key_are_confirmed(
    stubbed: tuple[S3Storage, Stubber],
) -> None:
    """Keys past the first page: the server's common prefixes name the candidates. One
    that sorts before the page's last key and has no key in it is empty (no request);
    each one after it costs one MaxKeys=1 listing."""
    storage, stub = stubbed
    stub.add_response("list_objects_v2",
                      _keys("root/job/chk-5/_metadata", "root/job/history/001",
                            truncated=True),
                      {"Bucket": "bucket", "Prefix": "root/job/", "MaxKeys": 200})
    stub.add_response("list_objects_v2", {"IsTruncated": False, "CommonPrefixes": [
        {"Prefix": f"root/job/{name}/"}
        for name in ("chk-1", "chk-5", "history", "savepoints", "shared")]},
        {"Bucket": "bucket", "Prefix": "root/job/", "Delimiter": "/"})
    # chk-1 sorts before the last key and had no key in the first page: empty, no request
    stub.add_response("list_objects_v2", _keys(),  # savepoints: emptied
                      {"Bucket": "bucket", "Prefix": "root/job/savepoints/", "MaxKeys": 1})
    stub.add_response("list_objects_v2", _keys("root/job/shared/a"),
                      {"Bucket": "bucket", "Prefix": "root/job/shared/", "MaxKeys": 1})
    assert storage.list_dirs("job/") == ["chk-5", "history", "shared"]
