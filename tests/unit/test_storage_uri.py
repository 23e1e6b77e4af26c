"""Storage URIs: accepted forms, canonical form, and errors that say what to fix."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ckpt.errors import InvalidStorageUriError, StorageError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.savepoints import resolve_snapshot
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.factory import (
    ACCEPTED_FORMS,
    key_in_storage,
    parse_storage_uri,
)
from airflow_ckpt.runtime.storage.local import LocalStorage
from airflow_ckpt.runtime.storage.naming import bucket_name_problem, check_key, check_prefix


@pytest.mark.parametrize(
    ("uri", "canonical", "bucket", "prefix"),
    [
        ("s3://bucket", "s3://bucket", "bucket", ""),
        ("s3://bucket/", "s3://bucket", "bucket", ""),
        ("s3://my.bucket-1/ckpt", "s3://my.bucket-1/ckpt", "my.bucket-1", "ckpt"),
        ("s3://bucket/a/b/", "s3://bucket/a/b", "bucket", "a/b"),
        ("s3a://bucket/a", "s3://bucket/a", "bucket", "a"),
        ("S3://bucket/a", "s3://bucket/a", "bucket", "a"),
        ("  s3://bucket/a  ", "s3://bucket/a", "bucket", "a"),
    ],
)
def test_s3_uris(uri: str, canonical: str, bucket: str, prefix: str) -> None:
    parsed = parse_storage_uri(uri)
    assert (parsed.scheme, parsed.uri, parsed.bucket, parsed.prefix) == (
        "s3", canonical, bucket, prefix
    )


@pytest.mark.parametrize(
    ("uri", "path", "canonical"),
    [
        ("file:///tmp/ckpt", "/tmp/ckpt", "file:///tmp/ckpt"),
        ("file:///tmp/ckpt/", "/tmp/ckpt", "file:///tmp/ckpt"),
        ("file://localhost/tmp/ckpt", "/tmp/ckpt", "file:///tmp/ckpt"),
        ("file:/tmp/ckpt", "/tmp/ckpt", "file:///tmp/ckpt"),
        ("file:///tmp/a%20b", "/tmp/a b", "file:///tmp/a%20b"),
    ],
)
def test_file_uris(uri: str, path: str, canonical: str) -> None:
    parsed = parse_storage_uri(uri)
    assert (parsed.scheme, parsed.path, parsed.uri) == ("file", path, canonical)
    assert parse_storage_uri(parsed.uri) == parsed


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("", "it is empty"),
        ("gs://bucket/x", "unsupported scheme 'gs://'"),
        ("hdfs://namenode/ckpt", "unsupported scheme 'hdfs://'"),
        ("http://127.0.0.1:9000/bucket", "unsupported scheme 'http://'"),
        ("/tmp/ckpt", "did you mean file:///tmp/ckpt?"),
        ("bucket/prefix", "it has no scheme"),
        ("s3:bucket/x", "write s3://<bucket>[/<prefix>]"),
        ("s3://", "the bucket name is missing"),
        ("s3:///prefix", "the bucket name is missing"),
        ("s3://AKIA:secret@bucket/x", "credentials must not be embedded"),
        ("s3://localhost:9000/bucket", "pass the server as endpoint_url"),
        ("s3://bucket/a?versionId=1", "query strings"),
        ("s3://bucket/a//b", "empty segment"),
        ("s3://bucket/a/../b", "'..'"),
        ("file://relative/path", "did you mean file:///relative/path?"),
        ("file:relative/path", "relative path 'relative/path'"),
        ("file:///", "the filesystem root"),
        ("file:///tmp/../etc", "'..'"),
        ("file:///tmp/x#frag", "fragments"),
    ],
)
def test_bad_uris_name_the_problem_and_the_accepted_forms(uri: str, fragment: str) -> None:
    with pytest.raises(InvalidStorageUriError) as err:
        parse_storage_uri(uri)
    message = str(err.value)
    assert fragment in message
    assert ACCEPTED_FORMS in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, StorageError)
    with pytest.raises(InvalidStorageUriError):
        open_storage(uri)


@pytest.mark.parametrize(
    ("bucket", "fragment"),
    [
        ("ab", "3 to 63 characters"),
        ("a" * 64, "3 to 63 characters"),
        ("MyBucket", "lowercase letters"),
        ("my_bucket", "found '_'"),
        ("bucket\n", "found '\\n'"),
        ("-bucket", "begin and end"),
        ("bucket-", "begin and end"),
        (".bucket", "begin and end"),
        ("my..bucket", "two adjacent periods"),
        ("192.168.1.10", "IP address"),
        ("xn--bucket", "'xn--'"),
        ("sthree-bucket", "'sthree-'"),
        ("amzn-s3-demo-bucket", "'amzn-s3-demo-'"),
        ("bucket-s3alias", "'-s3alias'"),
        ("bucket--ol-s3", "'--ol-s3'"),
        ("bucket.mrap", "'.mrap'"),
        ("bucket--x-s3", "'--x-s3'"),
        ("bucket--table-s3", "'--table-s3'"),
    ],
)
def test_bad_bucket_names(bucket: str, fragment: str) -> None:
    with pytest.raises(InvalidStorageUriError) as err:
        parse_storage_uri(f"s3://{bucket}/ckpt")
    assert f"bucket name {bucket!r}" in str(err.value)
    assert fragment in str(err.value)


@pytest.mark.parametrize("bucket", ["abc", "a" * 63, "my-bucket.v2", "1bucket", "b-1.2-c"])
def test_good_bucket_names(bucket: str) -> None:
    assert bucket_name_problem(bucket) is None
    assert parse_storage_uri(f"s3://{bucket}").bucket == bucket


@given(st.text(max_size=80))
def test_parsing_arbitrary_text_only_ever_raises_invalid_uri(text: str) -> None:
    try:
        parsed = parse_storage_uri(text)
    except InvalidStorageUriError:
        return
    assert parse_storage_uri(parsed.uri) == parsed  # the canonical form is stable


_BUCKET_ALPHABET = string.ascii_lowercase + string.digits + ".-"


@given(st.text(alphabet=_BUCKET_ALPHABET, min_size=1, max_size=70))
def test_bucket_rule_matches_the_s3_definition(name: str) -> None:
    # an independent statement of https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html
    expected = bool(
        re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name)
        and ".." not in name
        and not re.fullmatch(r"[0-9]+(\.[0-9]+){3}", name)
        and not name.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
        and not name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))
    )
    assert (bucket_name_problem(name) is None) == expected, name


def test_open_storage_is_lazy_and_canonical(tmp_path: object) -> None:
    s3 = open_storage(
        "s3a://bucket/ckpt/", endpoint_url="http://127.0.0.1:1", region_name="us-east-1"
    )
    assert s3.uri == "s3://bucket/ckpt"  # nothing was contacted: port 1 is closed
    s3.close()
    local = open_storage("file:///nonexistent-root-for-test/ckpt")
    assert isinstance(local, LocalStorage)
    assert local.uri == "file:///nonexistent-root-for-test/ckpt"
    assert local.list() == [] and local.list_dirs() == []


@pytest.mark.parametrize("key", ["a", "a/b", ".hidden", "job/chk-1/_metadata", "a b/c"])
def test_valid_keys(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", ".", "a/..", "../a", "a\x00"])
def test_invalid_keys(key: str) -> None:
    with pytest.raises(ValueError, match="invalid storage key"):
        check_key(key)


@pytest.mark.parametrize("prefix", ["", "a", "a/", "a/b/"])
def test_valid_prefixes(prefix: str) -> None:
    assert check_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["/", "/a", "a//", "../", "a/../b/"])
def test_invalid_prefixes(prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid storage prefix"):
        check_prefix(prefix)


@pytest.mark.parametrize(("root", "path", "key"), [
    ("s3://bkt/pre", "s3a://bkt/pre/job/chk-7", "job/chk-7"),
    ("s3://bkt/pre", "S3://bkt/pre/job/chk-7/", "job/chk-7"),
    ("s3://bkt", "s3://bkt/job/savepoints/sp-x", "job/savepoints/sp-x"),
    ("file:///tmp/my%20st%C3%A9", "file:///tmp/my st\u00e9/job/chk-7", "job/chk-7"),
    ("file:///tmp/my%20st%C3%A9", "file://localhost/tmp/my%20st%C3%A9/job/chk-7", "job/chk-7"),
    ("file:///tmp/my%20st%C3%A9", "FILE:///tmp/my st\u00e9/job", "job"),
    ("s3://bkt/pre", "job/chk-7", None),
])
def test_a_path_in_another_spelling_of_the_storage_names_the_same_key(
    root: str, path: str, key: str | None,
) -> None:
    """Issue 25 item 7: compared as text, each of these was "not in this job's storage"
    and a restore to it a final job_failed."""
    assert key_in_storage(root, path) == key


@pytest.mark.parametrize(("root", "path"), [
    ("s3://bkt/pre", "s3://bkt/prefix/job/chk-7"),  # a sibling prefix, not below the root
    ("s3://bkt/pre", "s3://other/pre/job/chk-7"),
    ("s3://bkt/pre", "file:///bkt/pre/job/chk-7"),
    ("file:///tmp/a", "file:///tmp/ab/job/chk-7"),
])
def test_a_path_outside_the_storage_is_refused(root: str, path: str) -> None:
    with pytest.raises(InvalidStorageUriError, match="is not in this storage"):
        key_in_storage(root, path)


def test_restore_resolves_a_checkpoint_uri_in_another_spelling(tmp_path: Path) -> None:
    root = tmp_path / "my stö"
    storage = open_storage(root.as_uri())
    catalog = CheckpointCatalog(storage, "job")
    raw = f"file://localhost{root}/job/chk-7/_metadata"
    assert catalog.resolve(raw).dir_key == "job/chk-7/"
    assert resolve_snapshot(storage, f"file://{root}/job/savepoints/sp-a").dir_key == (
        "job/savepoints/sp-a/")
