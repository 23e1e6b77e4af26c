"""File-backend specifics: temp files, missing root, emptied directories, permissions."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from airflow_ckpt.errors import (
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    StorageAccessDeniedError,
    StorageError,
)
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.local import LocalStorage, is_temp_name


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "missing" / "root"


@pytest.fixture
def store(root: Path) -> LocalStorage:
    storage = open_storage(root.as_uri())
    assert isinstance(storage, LocalStorage)
    return storage


def _all_files(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def test_missing_root_reads_as_empty_and_first_write_creates_it(
    store: LocalStorage, root: Path
) -> None:
    assert store.list() == [] and store.list("a/") == [] and store.list_dirs() == []
    assert not store.exists("a")
    with pytest.raises(ObjectNotFoundError, match=r"file://.*/root/a: no such object"):
        store.get_bytes("a")
    store.delete_many(["a"])
    assert not root.exists()  # reads and no-op deletes create nothing
    store.put_bytes("job/chk-1/_metadata", b"m", create_only=True)
    assert (root / "job" / "chk-1" / "_metadata").read_bytes() == b"m"


def test_writes_leave_no_temp_files(store: LocalStorage, root: Path, tmp_path: Path) -> None:
    store.put_bytes("a/b", b"1")
    store.put_bytes("a/b", b"2")
    store.put_bytes("a/c", b"3", create_only=True)
    with pytest.raises(ObjectAlreadyExistsError):
        store.put_bytes("a/c", b"4", create_only=True)
    src = tmp_path / "src"
    src.write_bytes(b"5")
    store.upload_file(src, "a/d")
    store.copy("a/d", "a/e")
    assert _all_files(root) == ["a/b", "a/c", "a/d", "a/e"]
    assert (root / "a" / "c").read_bytes() == b"3"
    assert os.stat(root / "a" / "c").st_nlink == 1  # the temp link was removed


def test_stale_temp_files_are_invisible(store: LocalStorage, root: Path) -> None:
    store.put_bytes("job/chk-1/x", b"1")
    stale = root / "job" / "chk-1" / f"._metadata.tmp-{uuid.uuid4().hex}"
    stale.write_bytes(b"half a manifest")  # what a crash mid-write leaves
    only_temp = root / "job" / "chk-2"
    only_temp.mkdir()
    (only_temp / f".x.tmp-{uuid.uuid4().hex}").write_bytes(b"")
    assert [i.key for i in store.list()] == ["job/chk-1/x"]
    assert store.list_dirs("job") == ["chk-1"]  # chk-2 holds no object
    assert not store.exists("job/chk-1/_metadata")
    with pytest.raises(ValueError, match="looks like a temporary file"):
        store.get_bytes(f"job/chk-1/{stale.name}")


def test_temp_name_pattern() -> None:
    assert is_temp_name(f".a.tmp-{uuid.uuid4().hex}")
    assert not is_temp_name(".a.tmp-123")
    assert not is_temp_name("a.tmp-" + "0" * 32)
    assert not is_temp_name(".hidden")


def test_delete_removes_emptied_directories_but_not_the_root(
    store: LocalStorage, root: Path
) -> None:
    store.put_bytes("job/chk-1/a/b/c", b"1")
    store.put_bytes("job/chk-2/x", b"2")
    store.delete_many(["job/chk-1/a/b/c"])
    assert sorted(p.name for p in (root / "job").iterdir()) == ["chk-2"]
    store.delete_prefix("")
    assert root.is_dir() and list(root.iterdir()) == []
    store.put_bytes("job/chk-1/a/b/c", b"again")  # directories are recreated
    assert store.get_bytes("job/chk-1/a/b/c") == b"again"


def test_file_and_directory_at_the_same_key_conflict(store: LocalStorage) -> None:
    store.put_bytes("a/b", b"1")
    with pytest.raises(StorageError, match="is a directory"):
        store.put_bytes("a", b"x")
    with pytest.raises(StorageError, match="parent of it is an object"):
        store.put_bytes("a/b/c", b"x")
    assert store.get_bytes("a/b") == b"1"


def test_permission_denied(store: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    store.put_bytes("a/b", b"1")

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    # tests run as root here, which ignores file modes: refuse at the syscall instead
    monkeypatch.setattr("airflow_ckpt.runtime.storage.local.os.open", refuse)
    with pytest.raises(StorageAccessDeniedError, match=r"cannot write file://.*/a/c: permiss"):
        store.put_bytes("a/c", b"x")


def test_relative_root_is_rejected() -> None:
    with pytest.raises(ValueError, match="absolute"):
        LocalStorage("relative/dir")


def test_a_listing_never_misses_an_object_moved_into_a_new_directory_meanwhile(
    store: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI (Python 3.10, loaded): a history compaction wrote the first segment (creating
    ``segments/``) and deleted the raw event it holds between the walk's read of
    ``history/`` and its ``stat`` of the event: the walk skipped the vanished file and
    never entered the new directory, so the job looked as if it had no event at all."""
    store.put_bytes("j/history/0001.json", b"started")
    real_stat = os.stat

    def compaction_meanwhile(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("0001.json") and not store.exists("j/history/segments/s1"):
            store.put_bytes("j/history/segments/s1", b"started")  # the segment first
            store.delete_many(["j/history/0001.json"])  # then the raw event
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("airflow_ckpt.runtime.storage.local.os.stat", compaction_meanwhile)
    assert [i.key for i in store.list("j/history/")] == ["j/history/segments/s1"]
