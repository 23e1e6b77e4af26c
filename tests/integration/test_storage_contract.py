"""The CheckpointStorage contract, run identically on S3 and files.

The S3 cases run on the tests' S3 server (moto by default; ``AIRFLOW_CKPT_TEST_S3=seaweedfs``
or ``external`` for another, see tests/fixtures/s3.py): what differs between real servers
(an emptied "directory" that stays listed, 403 for a missing bucket) is pinned here.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import (
    BucketNotFoundError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.local import LocalStorage
from airflow_ckpt.runtime.storage.s3 import S3Storage
from airflow_ckpt.testing import S3Endpoint

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Let threads interleave every microsecond, to make races likely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _keys(storage: CheckpointStorage, prefix: str = "") -> list[str]:
    return [info.key for info in storage.list(prefix)]


def _seed(storage: CheckpointStorage, keys: list[str], request: Any) -> None:
    """Store ``b"s"`` at every key, quickly: what is under test is what follows."""
    if isinstance(storage, S3Storage):
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        if endpoint.is_moto:
            # moto needs ~5 ms of CPU per PutObject (7 s for 1500): its in-process
            # backend directly
            from moto.core import DEFAULT_ACCOUNT_ID
            from moto.s3.models import s3_backends

            backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
            for key in keys:
                backend.put_object(storage.bucket, f"{storage.prefix}/{key}", b"s")
            return
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: storage.put_bytes(key, b"s"), keys))
        return
    # skip the two fsyncs per file of put_bytes
    assert isinstance(storage, LocalStorage)
    for key in keys:
        path = storage.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"s")


# ---------------------------------------------------------------- put / get / exists


def test_put_get_roundtrip_and_replace(storage: CheckpointStorage) -> None:
    payload = bytes(range(256)) * 10
    storage.put_bytes("job/chk-1/_metadata", payload)
    assert storage.get_bytes("job/chk-1/_metadata") == payload

    storage.put_bytes("job/chk-1/_metadata", b"second")
    assert storage.get_bytes("job/chk-1/_metadata") == b"second"

    storage.put_bytes("empty", b"")
    assert storage.get_bytes("empty") == b""
    assert [(i.key, i.size) for i in storage.list()] == [
        ("empty", 0), ("job/chk-1/_metadata", 6)
    ]


def test_create_only_conflict_leaves_original(storage: CheckpointStorage) -> None:
    storage.put_bytes("job/chk-7/_metadata", b"original", create_only=True)
    with pytest.raises(ObjectAlreadyExistsError) as err:
        storage.put_bytes("job/chk-7/_metadata", b"intruder", create_only=True)
    assert "job/chk-7/_metadata" in str(err.value)
    assert storage.uri in str(err.value)
    assert storage.get_bytes("job/chk-7/_metadata") == b"original"
    # a failed create-only write leaves nothing else behind
    assert _keys(storage) == ["job/chk-7/_metadata"]


def test_a_create_only_write_that_finds_its_own_bytes_succeeds(
    storage: CheckpointStorage,
) -> None:
    # what a retry meets when the first request landed and its answer was lost
    etag = storage.put_bytes("job/control/r.result.json", b"answer", create_only=True)
    assert storage.put_bytes("job/control/r.result.json", b"answer", create_only=True) == etag
    assert storage.get_versioned("job/control/r.result.json").etag == etag


def test_compare_and_swap_replaces_only_the_version_it_read(storage: CheckpointStorage) -> None:
    first = storage.put_bytes("job/lease/1.json", b"seq 0", create_only=True)
    read = storage.get_versioned("job/lease/1.json")
    assert (read.data, read.etag) == (b"seq 0", first)

    second = storage.put_bytes("job/lease/1.json", b"seq 1", if_match=first)
    assert second != first
    assert storage.get_versioned("job/lease/1.json").etag == second

    # a writer still holding the first version loses, and changes nothing
    with pytest.raises(PreconditionFailedError) as err:
        storage.put_bytes("job/lease/1.json", b"stale", if_match=first)
    assert "job/lease/1.json" in str(err.value)
    assert storage.get_bytes("job/lease/1.json") == b"seq 1"
    # a deleted object matches no version
    storage.delete_many(["job/lease/1.json"])
    with pytest.raises(PreconditionFailedError):
        storage.put_bytes("job/lease/1.json", b"seq 2", if_match=second)
    assert not storage.exists("job/lease/1.json")


def test_a_swap_whose_answer_was_lost_is_ours_on_retry(storage: CheckpointStorage) -> None:
    old = storage.put_bytes("job/lease/2.json", b"seq 4")
    storage.put_bytes("job/lease/2.json", b"seq 5", if_match=old)  # landed, answer lost
    # the retry meets 412; the stored bytes are ours, so the write is done
    assert storage.put_bytes("job/lease/2.json", b"seq 5", if_match=old) == \
        storage.get_versioned("job/lease/2.json").etag


def test_compare_and_swap_race_has_exactly_one_winner(
    storage: CheckpointStorage, tiny_switch_interval: None
) -> None:
    base = storage.put_bytes("job/swap", b"base")
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            storage.put_bytes("job/swap", f"writer {i}".encode(), if_match=base)
            outcomes.append(f"won {i}")
        except PreconditionFailedError:
            outcomes.append("lost")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and len(outcomes) == 8
    assert storage.get_bytes("job/swap") == f"writer {winners[0][4:]}".encode()


def _race(storage: CheckpointStorage, key: str, threads: int) -> tuple[list[int], list[int]]:
    """``threads`` writers create ``key`` at once; return (winners, losers)."""
    barrier = threading.Barrier(threads)
    winners: list[int] = []
    losers: list[int] = []
    unexpected: list[BaseException] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            storage.put_bytes(key, f"writer-{i}".encode(), create_only=True)
        except ObjectAlreadyExistsError:
            losers.append(i)
        except BaseException as exc:  # reported below
            unexpected.append(exc)
        else:
            winners.append(i)

    workers = [threading.Thread(target=attempt, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not unexpected, unexpected
    return winners, losers


@pytest.mark.usefixtures("tiny_switch_interval")
def test_create_only_race_has_exactly_one_winner(storage: CheckpointStorage) -> None:
    threads = 12
    for round_no in range(8):
        key = f"race/{round_no}/_metadata"
        winners, losers = _race(storage, key, threads)
        assert len(winners) == 1, f"round {round_no}: winners {winners}"
        assert len(losers) == threads - 1
        assert storage.get_bytes(key) == f"writer-{winners[0]}".encode()


def test_exists(storage: CheckpointStorage) -> None:
    assert not storage.exists("a/b")
    storage.put_bytes("a/b", b"x")
    assert storage.exists("a/b")
    assert not storage.exists("a")  # a "directory" is not an object
    assert not storage.exists("a/b/c")
    assert not storage.exists("a/bc")


def test_open_stream_reads_a_range_from_where_it_starts(storage: CheckpointStorage) -> None:
    """Restore's read of a merged file: the stream starts at ``start`` and holds the
    range's bytes; a range past the end reads as nothing (the caller's size check)."""
    data = bytes(range(256)) * 8
    storage.put_bytes("job/shared/ab/merged", data)
    with storage.open_stream("job/shared/ab/merged") as whole:
        assert whole.read() == data
    with storage.open_stream("job/shared/ab/merged", 300, 200) as part:
        assert part.read(200) == data[300:500]
    with storage.open_stream("job/shared/ab/merged", 2000, 500) as tail:
        assert tail.read(500) == data[2000:]
    with storage.open_stream("job/shared/ab/merged", 5000, 10) as past:
        assert past.read(10) == b""
    with pytest.raises(ObjectNotFoundError), storage.open_stream("job/missing", 0, 10):
        pass


def test_missing_key_raises_object_not_found(storage: CheckpointStorage, tmp_path: Path) -> None:
    storage.put_bytes("present", b"x")  # the root/bucket exists; only the key is missing
    with pytest.raises(ObjectNotFoundError) as err:
        storage.get_bytes("job/chk-3/_metadata")
    assert "job/chk-3/_metadata" in str(err.value)
    target = tmp_path / "out" / "file"
    with pytest.raises(ObjectNotFoundError):
        storage.download_file("job/missing", target)
    assert not target.exists()
    assert list(tmp_path.rglob("*file*")) == []  # no temp file left
    with pytest.raises(ObjectNotFoundError):
        storage.copy("job/missing", "job/copy")
    assert not storage.exists("job/copy")


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "../escape", "a/./b", "a/", "a\x00b"])
def test_invalid_keys_are_rejected_before_any_io(storage: CheckpointStorage, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid storage key"):
        storage.put_bytes(bad, b"x")
    with pytest.raises(ValueError, match="invalid storage key"):
        storage.get_bytes(bad)
    assert storage.list() == []


# ---------------------------------------------------------------- listing


def test_list_is_recursive_sorted_and_prefix_filtered(storage: CheckpointStorage) -> None:
    keys = ["b", "a/b/d", "a-b", "a/b2", "a/b/c", "a/x/y/z", "ab/c"]
    random.Random(7).shuffle(keys)
    for i, key in enumerate(keys):
        storage.put_bytes(key, b"x" * i)
    before = time.time()

    infos = storage.list()
    assert [i.key for i in infos] == sorted(keys)
    assert {i.key: i.size for i in infos} == {k: i for i, k in enumerate(keys)}
    assert all(before - 120 < i.last_modified <= before + 5 for i in infos)

    assert _keys(storage, "a/") == ["a/b/c", "a/b/d", "a/b2", "a/x/y/z"]
    # a prefix is a plain key prefix, not a directory
    assert _keys(storage, "a/b") == ["a/b/c", "a/b/d", "a/b2"]
    assert _keys(storage, "a/b/") == ["a/b/c", "a/b/d"]
    assert _keys(storage, "a") == ["a-b", "a/b/c", "a/b/d", "a/b2", "a/x/y/z", "ab/c"]
    assert _keys(storage, "nothing/") == []
    assert _keys(storage, "a/x/y/z") == ["a/x/y/z"]


def test_list_after_continues_where_a_reader_stopped(storage: CheckpointStorage) -> None:
    for key in ["h/001.json", "h/002.json", "h/003.json", "h/segments/s/x.gz", "i/001"]:
        storage.put_bytes(key, b"x")
    assert [i.key for i in storage.list_after("h/", "h/002.json")] == [
        "h/003.json", "h/segments/s/x.gz"]
    assert [i.key for i in storage.list_after("h/", "h/000")] == [
        "h/001.json", "h/002.json", "h/003.json", "h/segments/s/x.gz"]
    assert storage.list_after("h/", "h/zzz") == []


def test_list_dirs(storage: CheckpointStorage) -> None:
    assert storage.list_dirs() == []
    for key in ["job2/chk-1/_metadata", "job1/chk-2/x", "job1/chk-10/x", "job1/shared/s/1",
                "job1/file", "top"]:
        storage.put_bytes(key, b"x")
    assert storage.list_dirs() == ["job1", "job2"]
    assert storage.list_dirs("job1/") == ["chk-10", "chk-2", "shared"]
    assert storage.list_dirs("job1") == ["chk-10", "chk-2", "shared"]
    assert storage.list_dirs("job1/shared/") == ["s"]
    assert storage.list_dirs("job1/chk-2/") == []
    assert storage.list_dirs("nope/") == []


def test_storages_are_isolated_by_root(storage: CheckpointStorage, request: Any) -> None:
    storage.put_bytes("inner/x", b"1")
    storage.put_bytes("innerish", b"2")
    if isinstance(storage, S3Storage):
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        child = endpoint.storage(storage.uri + "/inner")
    else:
        from airflow_ckpt.runtime.storage import open_storage

        child = open_storage(storage.uri + "/inner")
    assert child.uri == storage.uri + "/inner"
    assert _keys(child) == ["x"]
    assert child.get_bytes("x") == b"1"
    child.put_bytes("y", b"3")
    assert _keys(storage) == ["inner/x", "inner/y", "innerish"]
    child.delete_prefix("")
    assert _keys(storage) == ["innerish"]


# ---------------------------------------------------------------- files, copy


def test_upload_download_multipart_sized_file(
    storage: CheckpointStorage, tmp_path: Path, request: Any
) -> None:
    data = os.urandom(6 * MiB + 123)
    src = tmp_path / "state.bin"
    src.write_bytes(data)
    storage.upload_file(src, "job/shared/op-0/part-3/5.delta")
    assert storage.list("job/shared/")[0].size == len(data)

    if isinstance(storage, S3Storage):  # really multipart: 5 MiB parts -> 2 parts
        client = request.getfixturevalue("s3_endpoint").client()
        head = client.head_object(
            Bucket=storage.bucket, Key=f"{storage.prefix}/job/shared/op-0/part-3/5.delta"
        )
        assert head["ETag"].strip('"').endswith("-2")

    target = tmp_path / "restore" / "nested" / "5.delta"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"stale")  # replaced atomically
    storage.download_file("job/shared/op-0/part-3/5.delta", target)
    assert target.read_bytes() == data
    assert sorted(p.name for p in target.parent.iterdir()) == ["5.delta"]  # no temp left

    fresh = tmp_path / "new-dir" / "a" / "b.bin"  # parents are created
    storage.download_file("job/shared/op-0/part-3/5.delta", fresh)
    assert fresh.read_bytes() == data


def test_upload_missing_local_file_is_an_os_error(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError):
        storage.upload_file(tmp_path / "nope", "k")
    assert storage.list() == []


def test_copy(storage: CheckpointStorage) -> None:
    storage.put_bytes("job/shared/a", b"state")
    storage.put_bytes("job/savepoints/sp-1/a", b"old")
    storage.copy("job/shared/a", "job/savepoints/sp-1/a")
    storage.copy("job/shared/a", "job/savepoints/sp-2/a")
    assert storage.get_bytes("job/savepoints/sp-1/a") == b"state"
    assert storage.get_bytes("job/savepoints/sp-2/a") == b"state"
    assert storage.get_bytes("job/shared/a") == b"state"


# ---------------------------------------------------------------- deletes


def test_delete_many_batches_1500_keys(storage: CheckpointStorage, request: Any) -> None:
    keys = [f"job/shared/op-{i % 3}/{i:05d}" for i in range(1500)]
    _seed(storage, keys, request)
    storage.put_bytes("job/keep", b"k")
    assert len(storage.list("job/shared/")) == 1500

    calls: list[int] = []
    if isinstance(storage, S3Storage):
        def count(params: dict[str, Any], **_: Any) -> None:
            calls.append(len(params["Delete"]["Objects"]))

        storage._client.meta.events.register("provide-client-params.s3.DeleteObjects", count)

    storage.delete_many([*keys, "job/never-existed", keys[0]])  # absent/duplicate ignored
    assert _keys(storage) == ["job/keep"]
    assert storage.list_dirs("job/") == []
    if isinstance(storage, S3Storage):
        assert calls == [1000, 501]


def test_delete_many_ignores_missing(storage: CheckpointStorage) -> None:
    storage.delete_many(["a", "b/c"])
    storage.delete_many([])
    storage.put_bytes("a", b"1")
    storage.delete_many(["a", "a"])
    assert not storage.exists("a")


def test_delete_many_with_an_invalid_key_deletes_nothing(storage: CheckpointStorage) -> None:
    """The keys are checked before the first request: a bad key among them (here after
    a full DeleteObjects request's worth) raises with every object still stored."""
    keys = [f"job/k{i:04d}" for i in range(3)]
    for key in keys:
        storage.put_bytes(key, b"x")
    with pytest.raises(ValueError, match="invalid storage key"):
        storage.delete_many([*keys, *(f"job/absent{i:04d}" for i in range(1000)), "a//b"])
    assert _keys(storage) == keys


def test_delete_prefix(storage: CheckpointStorage) -> None:
    for key in ["job/chk-1/a", "job/chk-1/b/c", "job/chk-10/a", "job/chk-1x", "other"]:
        storage.put_bytes(key, b"x")
    storage.delete_prefix("job/chk-1/")
    assert _keys(storage) == ["job/chk-10/a", "job/chk-1x", "other"]
    assert storage.list_dirs("job/") == ["chk-10"]
    storage.delete_prefix("")
    assert storage.list() == []


# ---------------------------------------------------------------- what real servers differ in


def test_a_directory_whose_objects_were_deleted_is_not_listed(
    storage: CheckpointStorage,
) -> None:
    """SeaweedFS keeps listing a common prefix after every object under it was deleted;
    a directory is listed only while it holds an object (every consumer -- checkpoint,
    savepoint and job listings, the sinks' pending and staging scans -- relies on it)."""
    for key in ["job/chk-1/_metadata", "job/chk-1/op/0.zip", "job/chk-2/_metadata",
                "job/savepoints/sp-a/_metadata", "job/savepoints/sp-b/_metadata"]:
        storage.put_bytes(key, b"x")
    storage.delete_prefix("job/chk-1/")
    storage.delete_many(["job/savepoints/sp-a/_metadata"])
    assert storage.list_dirs("job/") == ["chk-2", "savepoints"]
    assert storage.list_dirs("job/savepoints/") == ["sp-b"]
    storage.delete_prefix("job/")
    assert storage.list_dirs("") == []
    assert storage.list_dirs("job/") == []


def test_emptied_directories_are_not_listed_beyond_one_page_of_keys(
    storage: CheckpointStorage, request: Any
) -> None:
    """The same with more keys under the prefix than a listing page holds (S3's 1000,
    and list_dirs' first listing): emptied directories before, among and after them."""
    keys = [f"job/history/{i:05d}.json" for i in range(1100)]
    _seed(storage, keys, request)
    for key in ["job/a-gone/x", "job/a-kept/x", "job/history-gone/x", "job/z-gone/x",
                "job/z-kept/x"]:
        storage.put_bytes(key, b"x")
    storage.delete_many(["job/a-gone/x", "job/history-gone/x", "job/z-gone/x"])
    assert storage.list_dirs("job/") == ["a-kept", "history", "z-kept"]


def test_a_write_into_a_missing_bucket_says_the_bucket_is_missing(
    s3_endpoint: S3Endpoint,
) -> None:
    """SeaweedFS answers a write into a missing bucket 403 AccessDenied; HeadBucket tells
    that apart from refused credentials, so the error says what to fix."""
    missing = s3_endpoint.storage(f"s3://nope-{uuid.uuid4().hex[:12]}/p")
    try:
        with pytest.raises(BucketNotFoundError, match="does not exist"):
            missing.put_bytes("k", b"x")
        with pytest.raises(BucketNotFoundError, match="does not exist"):
            missing.put_bytes("k", b"x", create_only=True)
        with pytest.raises(BucketNotFoundError, match="does not exist"):
            missing.get_bytes("k")
        with pytest.raises(BucketNotFoundError, match="does not exist"):
            missing.list_dirs("")
    finally:
        missing.close()
