"""Shared-file GC against concurrent completions and uploads: forced interleavings.

Each test drives the real :class:`CompletedCheckpointStore` and
:class:`SharedFileRegistry` and forces one interleaving through a storage wrapper that
runs a step of "the other thread" at an exact call (the collector's decision, its
delete of shared keys). Invariant checked: every file a completed
checkpoint references exists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest, Timings
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

L = JobLayout("j")


class HookedStorage(FencedStorage):
    """Runs ``on_delete`` once, at the collector's next delete of shared keys."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner, lambda: None)
        self.on_delete: Callable[[], None] | None = None

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if any(k.startswith(L.shared_prefix) for k in batch) and self.on_delete is not None:
            hook, self.on_delete = self.on_delete, None
            hook()
        self.inner.delete_many(batch)


def manifest(n: int, digests: list[str]) -> Manifest:
    files = tuple(FileEntry(f"state/{d}", L.shared_file(d)[len(L.root):], 1, d, True)
                  for d in digests)
    return Manifest(job="j", checkpoint_id=n, kind="checkpoint", trigger="periodic",
                    batch_id=n, spark_version="4.2.0", query_id="q", mode="EXACTLY_ONCE",
                    source_offsets=[], operators=(), files=files, state_size=len(files),
                    checkpointed_size=len(files), num_subtasks=1, num_acknowledged_subtasks=1,
                    timings=Timings(0, 0, 0, 0, 0, 0, 0))


def complete(storage: CheckpointStorage, store: CompletedCheckpointStore, n: int,
             digests: list[str]) -> None:
    """What a checkpoint does: reserve, upload if needed, write _metadata, confirm the
    lease (which clears what the store stashed before), add."""
    for d in digests:
        key = L.shared_file(d)
        if store.shared.reserve(n, key):
            store.shared.attempted(key)
            storage.put_bytes(key, b"x")
            store.shared.uploaded(key)
    m = manifest(n, digests)
    stashed = store.stashed()
    storage.put_bytes(L.checkpoint_metadata(n), m.to_json(), create_only=True)
    store.confirmed(stashed)
    store.add(m)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition never became true")
        time.sleep(0.001)


def assert_complete(storage: CheckpointStorage, store: CompletedCheckpointStore) -> None:
    for m in store.retained:
        for f in m.files:
            assert storage.exists(L.root + f.key), (
                f"chk-{m.checkpoint_id} references {f.key}, which no longer exists")


@pytest.fixture
def storage(tmp_path: Path) -> HookedStorage:
    return HookedStorage(open_storage((tmp_path / "s").as_uri()))


def test_a_collection_on_a_stale_view_never_deletes_a_newer_checkpoints_files(
    storage: HookedStorage,
) -> None:
    """Issue 8 defect 1a: completion of chk-3 overlaps the collection started by chk-2."""
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    store.recover()
    complete(storage, store, 1, ["a1"])
    other: list[threading.Thread] = []

    def chk3_completes_meanwhile() -> None:
        t = threading.Thread(target=complete, args=(storage, store, 3, ["c3"]))
        t.start()
        other.append(t)
        wait_until(lambda: 3 in [m.checkpoint_id for m in store.retained])

    once = [chk3_completes_meanwhile]
    with interleave.installed(interleave.GC_BEFORE_DELETE, lambda: once and once.pop()()):
        complete(storage, store, 2, ["b2"])  # its collection runs while chk-3 completes
    other[0].join(10)
    assert [m.checkpoint_id for m in store.retained] == [2, 3]
    assert_complete(storage, store)


def test_a_key_judged_garbage_and_reuploaded_before_the_delete_survives(
    storage: HookedStorage,
) -> None:
    """Issue 8 defect 1b: chk-4 reserves and uploads a file between decision and delete."""
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover()
    complete(storage, store, 1, ["a1"])
    complete(storage, store, 2, ["b2"])  # subsumes chk-1: a1 waits for a confirmation
    other: list[threading.Thread] = []

    def chk4_reuses_a1_meanwhile() -> None:
        t = threading.Thread(target=complete, args=(storage, store, 4, ["a1"]))
        t.start()
        other.append(t)
        # Either chk-4 finished its upload (the old, broken registry) or it waits for
        # this delete (the fixed one): both are states the reservation shows.
        def waiting() -> bool:
            deleting = getattr(store.shared, "_deleting", ())
            return 4 in store.shared._reserved and L.shared_file("a1") in deleting

        wait_until(lambda: not t.is_alive() or waiting())

    storage.on_delete = chk4_reuses_a1_meanwhile
    complete(storage, store, 3, ["b3"])  # confirmed after chk-1 went: a1 is garbage
    other[0].join(10)
    assert not other[0].is_alive()
    assert [m.checkpoint_id for m in store.retained] == [4]
    assert_complete(storage, store)
