"""Retention, subsumption and shared-file GC on the file backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest, Timings
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore, SharedFileRegistry
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.triggers.matching import CheckpointCondition, new_snapshots, take_baseline

L = JobLayout("j")


def put_checkpoint(storage: CheckpointStorage, n: int, shared: list[str],
                   retention_floor: int | None = None) -> Manifest:
    files = []
    for digest in shared:
        storage.put_bytes(L.shared_file(digest), b"x")
        files.append(FileEntry(f"state/{digest}", L.shared_file(digest)[len(L.root):], 1,
                               digest, True))
    files.append(FileEntry("offsets/0", L.checkpoint_file(n, "offsets/0")[len(L.root):], 3,
                           "00", False))
    m = Manifest(job="j", checkpoint_id=n, kind="checkpoint", trigger="periodic", batch_id=n,
                 spark_version="4.2.0", query_id="q", mode="EXACTLY_ONCE", source_offsets=[],
                 operators=(), files=tuple(files), state_size=len(files),
                 checkpointed_size=len(files), num_subtasks=1, num_acknowledged_subtasks=1,
                 timings=Timings(0, 0, 0, 0, 0, 0, 0), retention_floor=retention_floor)
    storage.put_bytes(L.checkpoint_file(n, "offsets/0"), b"log")
    storage.put_bytes(L.checkpoint_metadata(n), m.to_json())
    return m


def add(store: CompletedCheckpointStore, m: Manifest) -> list[int]:
    """Register ``m`` as the coordinator completes it (its shared files uploaded by this
    driver), then let a lease confirmation pass and the next collection run: what the
    next checkpoint's marker does. Returns the ids ``m`` subsumed."""
    for f in m.files:
        if f.shared:
            store.shared.uploaded(L.root + f.key)
    subsumed = store.add(m)
    settle(store)
    return subsumed


def settle(store: CompletedCheckpointStore) -> None:
    """A lease confirmation, then a collection: the stashed deletes are done."""
    store.confirmed(store.stashed())
    store.subsume_and_collect()


def test_keeps_newest_n_and_only_referenced_shared_files(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    assert store.recover() == 1
    for n, shared in enumerate([["aa1", "bb1"], ["aa1", "cc1"], ["cc1", "dd1"]], start=1):
        subsumed = add(store, put_checkpoint(storage, n, shared))
    assert subsumed == [1]
    assert [m.checkpoint_id for m in store.retained] == [2, 3]
    assert not storage.list(L.checkpoint_dir(1))
    stored = {i.key for i in storage.list(L.shared_prefix)}
    assert stored == {L.shared_file(d) for d in ("aa1", "cc1", "dd1")}  # bb1 collected


def test_pending_reservations_are_never_collected(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover()
    add(store, put_checkpoint(storage, 1, ["aa1"]))
    # Checkpoint 3 is uploading and decided to reuse aa1 (already stored).
    assert store.shared.reserve(3, L.shared_file("aa1")) is False
    add(store, put_checkpoint(storage, 2, ["bb1"]))  # subsumes 1, which referenced aa1
    assert storage.exists(L.shared_file("aa1")), "a file a pending checkpoint uses was deleted"
    store.shared.release(3)
    store.subsume_and_collect()  # stashes aa1 again
    settle(store)
    assert not storage.exists(L.shared_file("aa1"))


def test_recover_sweeps_marker_less_directories_and_never_reuses_ids(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    put_checkpoint(storage, 4, ["aa1"])
    storage.put_bytes(L.checkpoint_file(7, "offsets/0"), b"half-written")  # crashed upload
    store = CompletedCheckpointStore(storage, "j", num_retained=3)
    assert store.recover() == 8
    assert not storage.list(L.checkpoint_dir(7))
    assert [m.checkpoint_id for m in store.retained] == [4]


def test_registry_forgets_collected_keys() -> None:
    registry = SharedFileRegistry(["k1", "k2"])
    assert registry.reserve(1, "k1") is False and registry.reserve(1, "k3") is True
    registry.release(1)
    assert registry.collectable(["k1", "k2"], referenced={"k2"}) == ["k1"]
    registry.deleted(["k1"])  # the collector's delete returned
    assert registry.reserve(2, "k1") is True  # must be uploaded again


def test_the_restored_checkpoint_is_pinned_until_the_run_has_its_own(tmp_path: Path) -> None:
    """Issue 8 defect 2: after falling back past a damaged chk-5 to chk-4, retention 1
    must not delete chk-4 (the only good one) in favour of the damaged newest."""
    storage = open_storage((tmp_path / "s").as_uri())
    restored = put_checkpoint(storage, 4, ["aa1"])
    put_checkpoint(storage, 5, ["bb1"])
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover(pinned=restored)
    assert [m.checkpoint_id for m in store.retained] == [4, 5]
    assert storage.exists(L.shared_file("aa1"))
    add(store, put_checkpoint(storage, 6, ["cc1"]))  # the run's own: the pin is released
    assert [m.checkpoint_id for m in store.retained] == [6]
    assert not storage.exists(L.shared_file("aa1"))


def restored_below_the_floor(tmp_path: Path) -> tuple[CheckpointStorage, CompletedCheckpointStore]:
    """chk-4, chk-6 and chk-8 (floor 6) stored; a store that restored chk-4 (below the
    floor) and recovered, ``num-retained`` 2."""
    storage = open_storage((tmp_path / "s").as_uri())
    restored = put_checkpoint(storage, 4, ["aa1"])
    put_checkpoint(storage, 6, ["bb1"])
    put_checkpoint(storage, 8, ["cc1"], retention_floor=6)
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    assert store.recover(pinned=restored) == 9
    return storage, store


def test_the_restored_checkpoint_is_never_swept_when_it_no_longer_counts(
    tmp_path: Path,
) -> None:
    """Found by the job world (seed 108, session 14): an operator restored chk-4, which
    counted when chosen; the takeover then adopted chk-8, whose retention floor (6)
    leaves chk-4 below it, so the run's own ``recover`` swept chk-4 as never completed:
    the run's base gone before it had a checkpoint of its own (``job-retention``)."""
    storage, store = restored_below_the_floor(tmp_path)
    assert storage.exists(L.checkpoint_metadata(4)), "the run's restored base was swept"
    assert [m.checkpoint_id for m in store.retained] == [6, 8]


def test_a_base_below_the_floor_keeps_its_files_while_its_marker_is_stored(
    tmp_path: Path,
) -> None:
    """Found by the job world (seed 413159, session 18's scan): the run's base below the
    retention floor (an operator's explicit target) was pinned against the sweep, but
    its shared files, named by no retained checkpoint, were stashed at ``recover`` and
    collected once the run's first checkpoint was confirmed, its marker left in place: a
    completed checkpoint whose files were gone. Its files now stay while its marker is
    stored; the run's own checkpoint subsumes it, marker first, files after the next
    confirmation."""
    storage, store = restored_below_the_floor(tmp_path)
    assert [m.checkpoint_id for m in store.retained] == [6, 8]  # adds nothing to a floor
    settle(store)  # a confirmation and a collection before the run's first checkpoint
    assert storage.exists(L.shared_file("aa1"))
    for f in (m9 := put_checkpoint(storage, 9, ["dd1"], retention_floor=8)).files:
        if f.shared:
            store.shared.uploaded(L.root + f.key)
    assert store.add(m9) == [4, 6]  # the run's own: its base is subsumed, marker first
    assert not storage.exists(L.checkpoint_metadata(4))
    assert storage.exists(L.shared_file("aa1")), "a file deleted with its marker"
    settle(store)
    assert not storage.exists(L.shared_file("aa1"))
    assert not storage.list(L.checkpoint_dir(4))
    assert [m.checkpoint_id for m in store.retained] == [8, 9]


def test_a_damaged_marker_is_not_retained_and_fails_no_driver(tmp_path: Path) -> None:
    """Found by the job world of the simulation (seed 6): a vandalised ``_metadata``
    made ``recover`` raise ``MetadataError`` in every later driver (the job wedged for
    good) although ``restore`` had fallen back past it to an intact checkpoint."""
    storage = open_storage((tmp_path / "s").as_uri())
    put_checkpoint(storage, 1, ["aa1"])
    put_checkpoint(storage, 2, ["aa1", "bb1"])
    storage.put_bytes(L.checkpoint_metadata(1), b"\x00garbage")
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    assert store.recover() == 3  # ids still never repeat
    assert [m.checkpoint_id for m in store.retained] == [2]
    assert storage.exists(L.shared_file("bb1"))  # the intact one's files stay pinned


def test_a_late_copy_of_a_subsumed_marker_never_counts_again(tmp_path: Path) -> None:
    """Found by the job world (seed 129): a marker PUT whose answer was lost is repeated
    (create-only, equal bytes: success); retention later deletes the checkpoint, and
    the first PUT lands after that, creating the marker again over deleted files. The
    newer marker's retention floor makes every reader ignore it: the catalog (restore,
    adoption) and ``recover``, which sweeps it as never completed."""
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover()
    first = put_checkpoint(storage, 1, ["aa1"], retention_floor=store.retention_floor(1))
    add(store, first)
    assert store.retention_floor(2) == 2  # chk-1 is subsumed once chk-2 completes
    add(store, put_checkpoint(storage, 2, ["bb1"], retention_floor=store.retention_floor(2)))
    assert not storage.exists(L.checkpoint_metadata(1))
    storage.put_bytes(L.checkpoint_metadata(1), first.to_json())  # the first PUT lands
    assert CheckpointCatalog(storage, "j").checkpoint_ids() == [2]
    later = CompletedCheckpointStore(storage, "j", num_retained=2)
    assert later.recover() == 3
    assert [m.checkpoint_id for m in later.retained] == [2]
    assert not storage.list(L.checkpoint_dir(1))  # swept: it never counts again
    assert storage.exists(L.shared_file("bb1"))


def test_no_sensor_or_trigger_matches_a_late_copy_of_a_subsumed_marker(
        tmp_path: Path) -> None:
    """The sensors' and triggers' matching (a minimum id, a baseline, the health check)
    counts markers by the catalog's one rule: a late copy below the retention floor is
    no new checkpoint (it once checked only the lease, one HEAD per candidate)."""
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover()
    first = put_checkpoint(storage, 1, ["aa1"], retention_floor=store.retention_floor(1))
    add(store, first)
    add(store, put_checkpoint(storage, 2, ["bb1"], retention_floor=store.retention_floor(2)))
    storage.put_bytes(L.checkpoint_metadata(1), first.to_json())  # the first PUT lands
    catalog = CheckpointCatalog(storage, "j")
    wanted = CheckpointCondition(job="j", kind="checkpoint", min_checkpoint_id=1)
    assert [m.checkpoint_id for m in new_snapshots(catalog, wanted)] == [2]
    baseline = take_baseline(catalog, CheckpointCondition(job="j", kind="checkpoint"))
    assert baseline.after_checkpoint_id == 2
    assert new_snapshots(catalog, baseline) == []


def test_the_retention_floor_keeps_the_newest_num_retained(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    store.recover()
    assert store.retention_floor(1) == 1  # nothing retained yet: itself
    add(store, put_checkpoint(storage, 1, ["aa1"]))
    assert store.retention_floor(2) == 1
    add(store, put_checkpoint(storage, 2, ["aa1"]))
    assert store.retention_floor(3) == 2


def test_files_are_deleted_only_after_a_confirmation_that_followed_their_markers(
        tmp_path: Path) -> None:
    """A subsumed checkpoint's marker goes at once; its files (own and shared) wait for a
    lease confirmation that started after the marker was deleted (no LIST of ``lease/``
    per collection: the next marker's confirmation serves), then go in one batch."""
    storage = open_storage((tmp_path / "s").as_uri())
    store = CompletedCheckpointStore(storage, "j", num_retained=1)
    store.recover()
    add(store, put_checkpoint(storage, 1, ["aa1"]))
    before = store.stashed()  # a confirmation that started before the collection below
    store.shared.uploaded(L.shared_file("bb1"))
    store.add(put_checkpoint(storage, 2, ["bb1"]))
    assert not storage.exists(L.checkpoint_metadata(1))
    store.confirmed(before)
    store.subsume_and_collect()
    assert storage.exists(L.shared_file("aa1")) and storage.exists(
        L.checkpoint_file(1, "offsets/0")), "deleted without a confirmation after the marker"
    settle(store)
    assert not storage.exists(L.shared_file("aa1"))
    assert not storage.list(L.checkpoint_dir(1))
    assert storage.exists(L.shared_file("bb1"))


def test_a_marker_gone_since_the_listing_is_not_retained_and_fails_no_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the job world (seed 57 once issue 26 inlined small files): a marker
    deleted between ``recover``'s listing and its read (a deposed driver's late
    retention) raised ``RestoreError`` out of ``recover``: the driver died although it
    had restored an intact newer checkpoint."""
    storage = open_storage((tmp_path / "s").as_uri())
    put_checkpoint(storage, 1, ["aa1"])
    put_checkpoint(storage, 2, ["aa1", "bb1"])
    store = CompletedCheckpointStore(storage, "j", num_retained=2)
    listed = store.catalog.checkpoint_ids

    def listed_then_deleted(*args: Any, **kwargs: Any) -> list[int]:
        ids = listed(*args, **kwargs)
        storage.delete_many([L.checkpoint_metadata(1)])
        return ids

    monkeypatch.setattr(store.catalog, "checkpoint_ids", listed_then_deleted)
    assert store.recover() == 3
    assert [m.checkpoint_id for m in store.retained] == [2]


def test_a_deposed_driver_never_sweeps_a_successors_checkpoint_as_abandoned(
    tmp_path: Path,
) -> None:
    """Job-world seed 560 (session 11): a deposed driver's ``recover`` listed the
    completed checkpoints, the successor's marker of chk-9 landed, then the listing of
    every directory found chk-9 with no marker seen: it was swept as abandoned (the
    deposed driver's gate passed: its clock drifted), deleting the only checkpoint that
    counted. The sweep confirms the lease first."""
    from airflow_ckpt.errors import ConcurrentDriverError
    from airflow_ckpt.runtime.storage.delegating import DelegatingStorage

    storage = open_storage((tmp_path / "s").as_uri())

    class SuccessorLandsBetweenListings(DelegatingStorage):
        listed = 0

        def list(self, prefix: str = "") -> list[ObjectInfo]:
            if prefix == L.checkpoints_prefix:
                self.listed += 1
                if self.listed == 2:  # between the completed and the every-id listing
                    put_checkpoint(storage, 9, [])  # the successor's checkpoint completes
            return self.inner.list(prefix)

    def confirm() -> None:
        raise ConcurrentDriverError("another driver took over the lease")

    store = CompletedCheckpointStore(SuccessorLandsBetweenListings(storage), "j",
                                     num_retained=1, confirm=confirm)
    with pytest.raises(ConcurrentDriverError):
        store.recover()
    assert storage.exists(L.checkpoint_metadata(9)), "a successor's checkpoint was swept"
