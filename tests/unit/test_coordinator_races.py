"""The real CheckpointCoordinator on a file backend and a Spark-shaped working
directory, with forced interleavings (named pause points, a fake lease clock):
timeout vs completion, post-completion failures, savepoint ids re-used, and a deposed
driver paused or delayed past its lease."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConcurrentDriverError, LeaseExpiredError, OutcomeUnknownError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.completion import CompletionListener
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import NO_LEASE, CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.executors import BACKGROUND_NICENESS
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.checkpoint.pending import PendingCheckpoint, PendingState
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.interleave import Pause
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from tests.unit.test_lease import FakeClock
from tests.unit.test_snapshot_capture import make_workdir

JOB = "job"
L = JobLayout(JOB)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "s").as_uri())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return make_workdir(tmp_path, batches=4, running=False)


def start(storage: CheckpointStorage, workdir: Path, *, timeout: str = "10 min",
          lease: LeaseView = NO_LEASE, listeners: Sequence[CompletionListener] = (),
          first_id: int = 1) -> CheckpointCoordinator:
    config = CheckpointConfig.from_dict({
        "execution.checkpointing.interval": "1 h",  # nothing periodic: tests trigger
        "execution.checkpointing.timeout": timeout,
        "execution.checkpointing.num-retained": 2,
        "execution.checkpointing.incremental": True,
    })
    store = CompletedCheckpointStore(storage, JOB, config.num_retained)
    next_id = max(store.recover(), first_id)
    coordinator = CheckpointCoordinator(
        storage=storage, job=JOB, workdir=workdir, config=config, store=store,
        history=JobHistory(storage, JOB), next_checkpoint_id=next_id,
        spark_version="4.2.0", poll_interval_s=0.005, lease=lease, listeners=listeners,
    )
    coordinator.start()
    return coordinator


@pytest.fixture
def running(storage: CheckpointStorage, workdir: Path) -> Iterator[CheckpointCoordinator]:
    coordinator = start(storage, workdir)
    yield coordinator
    coordinator.shutdown()


def test_the_timeout_tick_never_fails_a_checkpoint_writing_its_marker(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """Issue 8 defect 9: before, the tick failed a checkpoint whose async phase had passed
    its deadline check, which then completed anyway: counted failed (fatal at tolerance
    0) and completed at once."""
    # the default timeout: a short one could fail the checkpoint on a loaded machine
    # before it reaches the pause; the test moves its deadline itself
    coordinator = start(storage, workdir)
    pause = Pause()
    try:
        with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, pause):
            p = coordinator.trigger("manual")
            pause.wait_reached()
            p.deadline = 0  # the deadline passes while the marker is being written
            ticked = threading.Event()
            # let several ticks run past the deadline
            threading.Timer(0.1, ticked.set).start()
            ticked.wait(5)
            pause.resume()
            assert p.done.wait(10)
        assert p.manifest is not None and p.failure is None
        assert coordinator.fatal is None and coordinator.failures.consecutive == 0
        assert CheckpointCatalog(storage, JOB).checkpoint_ids() == [p.checkpoint_id]
    finally:
        coordinator.shutdown()


def test_a_failing_store_add_or_history_append_never_skips_the_sink_commit(
    storage: CheckpointStorage, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 defect 8."""
    committed: list[int] = []
    running = start(storage, workdir, listeners=[lambda m: committed.append(m.batch_id)])

    def boom(*_a: object, **_k: object) -> None:
        raise OSError("storage hiccup")

    monkeypatch.setattr(running.store, "add", boom)
    monkeypatch.setattr(running.history, "append", boom)
    try:
        p = running.trigger("manual")
        assert p.done.wait(10) and p.manifest is not None
        assert committed == [3]
    finally:
        running.shutdown()


def test_a_savepoint_id_is_never_written_twice_and_the_job_goes_on(
    storage: CheckpointStorage, running: CheckpointCoordinator
) -> None:
    """Issue 8 defect 5: re-using a savepoint id overwrote its files, then the
    create-only marker failed and was taken for another driver (final)."""
    first = running.trigger("manual", savepoint_id="v1", request_id="req-1")
    assert first.done.wait(10) and first.manifest is not None
    before = {i.key: storage.get_bytes(i.key) for i in storage.list(L.savepoint_dir("v1"))}

    again = running.trigger("manual", savepoint_id="v1", request_id="req-2")  # task retry
    assert again.done.wait(10)
    assert again.manifest is None and "already exists" in (again.failure or "")
    assert running.fatal is None

    # The driver crashed between the marker and the answer: the same request, picked up
    # again, is answered with the savepoint that exists.
    replay = running.trigger("manual", savepoint_id="v1", request_id="req-1")
    assert replay.done.wait(10)
    assert replay.manifest is not None and replay.manifest.checkpoint_id == \
        first.manifest.checkpoint_id
    after = {i.key: storage.get_bytes(i.key) for i in storage.list(L.savepoint_dir("v1"))}
    assert after == before, "an existing savepoint was written to"
    checkpoint = running.trigger("manual")  # and the job keeps checkpointing
    assert checkpoint.done.wait(10) and checkpoint.manifest is not None


def test_two_requests_for_one_savepoint_id_in_flight(
    storage: CheckpointStorage, running: CheckpointCoordinator
) -> None:
    pause = Pause()
    with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, pause):
        first = running.trigger("manual", savepoint_id="v2", request_id="a")
        pause.wait_reached()
        second = running.trigger("manual", savepoint_id="v2", request_id="b")
        assert second.done.wait(10) and "already being taken" in (second.failure or "")
        pause.resume()
    assert first.done.wait(10) and first.manifest is not None and running.fatal is None


TTL, MAX_WRITE, BEAT = 100.0, 10.0, 50.0


def lease_for(storage: CheckpointStorage, clock: FakeClock, owner: str) -> JobLease:
    return JobLease(storage, JOB, owner, ttl_s=TTL, heartbeat_s=BEAT, max_write_s=MAX_WRITE,
                    clock=clock, sleep=clock.sleep)


def adopt(storage: CheckpointStorage,
          previous: LeaseRecord | None) -> tuple[tuple[int, ...], int]:
    """What CheckpointedJob._adopt does: completed ids (judged by the previous holder's
    record), first id past every reserved one."""
    catalog = CheckpointCatalog(storage, JOB)
    used = catalog.checkpoint_ids(completed_only=False)
    floor = previous.id_limit or 1 if previous else 1
    return tuple(catalog.checkpoint_ids(lease=previous)), max([floor - 1, *used]) + 1


def start_fenced(storage: CheckpointStorage, workdir: Path, lease: JobLease,
                 fenced: CheckpointStorage) -> CheckpointCoordinator:
    record = lease.record
    assert record is not None and record.first_id is not None
    return start(fenced, workdir, first_id=record.first_id,
                 lease=LeaseView(record.epoch, lease.confirm, lease.reserve_ids))


def test_a_paused_deposed_driver_cannot_complete_delete_or_commit(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """Issue 8 defect 6: the old driver is paused right before its marker until its
    lease expired and a new driver took over (and swept the in-flight directory). On
    resume its marker, its GC and its sink commits are refused."""
    clock = FakeClock()
    old_lease = lease_for(storage, clock, "old")
    old_lease.acquire(adopt=lambda prev: adopt(storage, prev))
    old = start_fenced(storage, workdir, old_lease, FencedStorage(storage, old_lease.gate))
    done = old.trigger("manual")
    assert done.done.wait(10) and done.manifest is not None  # chk-1 completes normally
    pause = Pause()
    try:
        with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, pause):
            p = old.trigger("manual")
            pause.wait_reached()
            # The old driver is frozen (GC pause, SIGSTOP): its heartbeat stops moving.
            new_lease = lease_for(storage, clock, "new")
            new_lease.acquire(adopt=lambda prev: adopt(storage, prev))  # waits out ttl + max write
            new_store = CompletedCheckpointStore(storage, JOB, 2)
            new_store.recover()  # sweeps the old driver's in-flight chk-2
            pause.resume()
            assert p.done.wait(10)
        assert p.manifest is None and "stopped writing" in (p.failure or "")
        assert isinstance(old.fatal, LeaseExpiredError)
        assert not storage.exists(L.checkpoint_metadata(p.checkpoint_id))
        with pytest.raises(LeaseExpiredError):
            old.store.subsume_and_collect() if old.store.retained else None
            FencedStorage(storage, old_lease.gate).delete_many([L.shared_prefix + "x"])
        assert CheckpointCatalog(storage, JOB).checkpoint_ids() == [done.checkpoint_id]
        new_lease.release()
    finally:
        old.shutdown()


class DelayedMarkerStorage(FencedStorage):
    """Holds a ``_metadata`` put *after* the gate passed (a request stuck in the network)
    until released: the one write a time bound cannot fence."""

    def __init__(self, inner: CheckpointStorage, gate: object) -> None:
        super().__init__(inner, gate)  # type: ignore[arg-type]
        self.held = Pause()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.gate()
        if key.endswith("/_metadata") and "/chk-" in "/" + key:
            self.held()
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)


def test_a_late_marker_of_a_deposed_driver_never_counts(
    storage: CheckpointStorage, workdir: Path
) -> None:
    clock = FakeClock()
    old_lease = lease_for(storage, clock, "old")
    old_lease.acquire(adopt=lambda prev: adopt(storage, prev))
    delayed = DelayedMarkerStorage(storage, old_lease.gate)
    old = start_fenced(storage, workdir, old_lease, delayed)
    try:
        p = old.trigger("manual")
        delayed.held.wait_reached()  # gate passed, the request is in flight
        new_lease = lease_for(storage, clock, "new")
        record = new_lease.acquire(adopt=lambda prev: adopt(storage, prev))
        assert record.adopted == () and record.first_id is not None
        assert record.first_id > p.checkpoint_id  # past every id the old driver reserved
        CompletedCheckpointStore(storage, JOB, 2).recover()
        delayed.held.resume()  # ... and lands long after the takeover
        assert p.done.wait(10)
        assert storage.exists(L.checkpoint_metadata(p.checkpoint_id))  # it did land
        catalog = CheckpointCatalog(storage, JOB)
        assert catalog.checkpoint_ids() == [], "a deposed driver's marker counted"
        new_store = CompletedCheckpointStore(storage, JOB, 2)
        assert new_store.recover() == p.checkpoint_id + 1  # the in-flight dir, swept
        assert not storage.list(L.checkpoint_dir(p.checkpoint_id))  # swept as abandoned
        new_lease.release()
    finally:
        old.shutdown()


def test_a_manifest_records_its_writers_lease_epoch(
    storage: CheckpointStorage, workdir: Path
) -> None:
    coordinator = start(storage, workdir, lease=LeaseView(epoch=7))
    try:
        p = coordinator.trigger("manual")
        assert p.done.wait(10) and isinstance(p.manifest, Manifest)
        assert CheckpointCatalog(storage, JOB).checkpoint(p.checkpoint_id).lease_epoch == 7
    finally:
        coordinator.shutdown()


def test_heartbeat_loss_while_a_checkpoint_is_in_flight(
    storage: CheckpointStorage, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease object cannot be renewed (storage for it unreachable) while a
    checkpoint is between its uploads and its marker: when the validity runs out the
    marker is refused, and the job learns why."""
    from airflow_ckpt.errors import StorageError

    clock = FakeClock()
    lease = lease_for(storage, clock, "a")
    lease.acquire(adopt=lambda prev: adopt(storage, prev))
    coordinator = start_fenced(storage, workdir, lease, FencedStorage(storage, lease.gate))
    pause = Pause()
    beat_reached = Pause()
    try:
        with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, pause):
            p = coordinator.trigger("manual")
            pause.wait_reached()
            real_put = storage.put_bytes

            def lease_unreachable(key: str, data: bytes, *, create_only: bool = False,
                                  if_match: str | None = None) -> str:
                if "/lease/" in key:
                    raise StorageError("the endpoint does not answer")
                return real_put(key, data, create_only=create_only, if_match=if_match)

            monkeypatch.setattr(storage, "put_bytes", lease_unreachable)
            with interleave.installed(interleave.LEASE_BEFORE_BEAT, beat_reached):
                beat_reached.resume()  # let each beat through the point
                for _ in range(3):
                    clock.now += BEAT
                    with pytest.raises((StorageError, LeaseExpiredError)):
                        lease.beat()
            assert lease.lost.is_set() and isinstance(lease.failure, LeaseExpiredError)
            pause.resume()
            assert p.done.wait(10)
        assert p.manifest is None and isinstance(coordinator.fatal, LeaseExpiredError)
        assert not storage.exists(L.checkpoint_metadata(p.checkpoint_id))
    finally:
        coordinator.shutdown()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread priority is Linux's")
def test_uploads_and_async_phases_run_below_the_batches_priority(
    storage: CheckpointStorage, workdir: Path,
) -> None:
    """The checkpoint's background work yields CPU to the batches (background_priority);
    the calling thread (in the driver: the job's main thread) keeps its priority."""
    seen: list[int] = []
    running = start(storage, workdir, listeners=[
        lambda _m: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))])
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        pending = running.trigger("manual")
        running.wait(pending)
        assert pending.manifest is not None, pending.failure
        assert seen == [min(mine + BACKGROUND_NICENESS, 19)]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        running.shutdown()


class DelayedSavepointMarkerStorage(FencedStorage):
    """Holds the first savepoint ``_metadata`` put after the gate passed."""

    def __init__(self, inner: CheckpointStorage, gate: object) -> None:
        super().__init__(inner, gate)  # type: ignore[arg-type]
        self.held = Pause()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.gate()
        if key.endswith("/_metadata") and "/savepoints/" in key:
            self.held()
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)


def test_a_deposed_drivers_late_savepoint_marker_names_only_its_own_files(
    storage: CheckpointStorage, workdir: Path, tmp_path: Path
) -> None:
    """Issue 19 item 6: the old driver takes savepoint ``sp-v`` for request ``r``, its
    marker is held in the network; the successor picks up the same request and uploads
    its own savepoint; the old marker lands first. Before, both wrote the same keys
    (the successor's bytes under the old manifest: it did not verify) and the successor
    failed the request while the old driver answered it. Now each writes under its own
    checkpoint id, the old driver does not act on its marker (it cannot confirm its
    epoch), and the successor answers the request with the savepoint that landed, which
    verifies."""
    from airflow_ckpt.runtime.restore.materialize import materialize

    clock = FakeClock()
    old_lease = lease_for(storage, clock, "old")
    old_lease.acquire(adopt=lambda prev: adopt(storage, prev))
    delayed = DelayedSavepointMarkerStorage(storage, old_lease.gate)
    old = start_fenced(storage, workdir, old_lease, delayed)
    try:
        p_old = old.trigger("manual", savepoint_id="v", request_id="r")
        delayed.held.wait_reached()  # files uploaded, marker in flight
        new_lease = lease_for(storage, clock, "new")
        new_lease.acquire(adopt=lambda prev: adopt(storage, prev))
        (workdir / "offsets" / "0").write_text("v1\n{}\n{\"changed\": true}\n")
        new = start_fenced(storage, workdir, new_lease, FencedStorage(storage, new_lease.gate))
        pause = Pause()
        try:
            with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, pause):
                p_new = new.trigger("manual", savepoint_id="v", request_id="r")
                pause.wait_reached()  # the successor's files are uploaded too
                delayed.held.resume()  # the old marker lands first
                assert p_old.done.wait(10)
                pause.resume()
            assert p_new.done.wait(10)
        finally:
            new.shutdown()
        # the old driver does not act on its marker: no answer, no completion
        assert p_old.manifest is None and isinstance(old.fatal, ConcurrentDriverError)
        # the successor answers the request with the savepoint that landed
        assert p_new.manifest is not None and new.fatal is None
        assert p_new.manifest.checkpoint_id == p_old.checkpoint_id
        # ... which verifies: every file it names has the bytes it records
        catalog = CheckpointCatalog(storage, JOB)
        manifest = catalog.savepoint("v")
        materialize(storage, manifest, JOB + "/", tmp_path / "restored")
        new_lease.release()
    finally:
        old.shutdown()


def test_a_checkpoint_completing_while_the_next_one_writes_its_marker_stays_counted(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """Job seeds 12 and 30 (session 15, the completion overlap): ``_complete`` drops
    chk-N from the pending list before the store is told, so the next checkpoint may
    run its whole async phase in between. Before, its manifest's retention floor was
    computed from a store without chk-N: floor N+1, so every reader ignored chk-N
    (never adopted by a successor, swept by ``recover``) although it completed and
    ``num-retained`` is 2."""
    coordinator = start(storage, workdir)
    completing = Pause()  # chk-N: marker durable and confirmed, store not told yet
    try:
        with interleave.installed(interleave.COMPLETE_BEFORE_ADD, completing):
            first = coordinator.trigger("manual")
            completing.wait_reached()
            second = coordinator.trigger("manual")  # its phase runs on the pool's 2nd thread
            assert second.done.wait(10) and second.manifest is not None
            completing.resume()
            assert first.done.wait(10) and first.manifest is not None
        assert second.manifest.retention_floor == first.checkpoint_id
        assert CheckpointCatalog(storage, JOB).checkpoint_ids() == [
            first.checkpoint_id, second.checkpoint_id]
    finally:
        coordinator.shutdown()


def start_concurrent(storage: CheckpointStorage, workdir: Path) -> CheckpointCoordinator:
    """Two checkpoints in flight at once, every file uploaded (none inline)."""
    config = CheckpointConfig.from_dict({
        "execution.checkpointing.interval": "1 h",
        "execution.checkpointing.timeout": "10 min",
        "execution.checkpointing.num-retained": 2,
        "execution.checkpointing.max-concurrent-checkpoints": 2,
        "state.storage.fs.memory-threshold": "0",
    })
    coordinator = CheckpointCoordinator(
        storage=storage, job=JOB, workdir=workdir, config=config,
        store=CompletedCheckpointStore(storage, JOB, config.num_retained),
        history=JobHistory(storage, JOB), next_checkpoint_id=1, spark_version="4.2.0",
        poll_interval_s=0.005)
    coordinator.start()
    return coordinator


def test_with_two_checkpoints_in_flight_the_later_floor_counts_the_earlier_marker(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """``max-concurrent-checkpoints`` 2 (session 16, the case session 15 left open):
    chk-2 builds its manifest while chk-1 is about to write its marker. Before, chk-2's
    retention floor was computed then, from a store without chk-1 (floor 2), and chk-2's
    marker, written after chk-1's, made every reader ignore chk-1 although it completed
    and ``num-retained`` is 2. The floor is now computed with the marker, in id order."""
    coordinator = start_concurrent(storage, workdir)
    writing = Pause()  # chk-1: files durable, marker not written
    try:
        with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, writing):
            first = coordinator.trigger("manual")
            writing.wait_reached()
            second = coordinator.trigger("manual")
            assert not second.done.wait(0.5)  # its marker waits for chk-1's
            writing.resume()
            assert first.done.wait(10) and first.manifest is not None
            assert second.done.wait(10) and second.manifest is not None
        assert (first.checkpoint_id, second.checkpoint_id) == (1, 2)
        assert second.manifest.retention_floor == 1
        assert CheckpointCatalog(storage, JOB).checkpoint_ids() == [1, 2]
    finally:
        coordinator.shutdown()


def _overtaken(coordinator: CheckpointCoordinator
               ) -> tuple[PendingCheckpoint, PendingCheckpoint]:
    """chk-1 held at its first file's upload while chk-2 runs to its end; then chk-1
    goes on to its end. Returns both, settled."""
    uploading = Pause()
    with interleave.installed(interleave.UPLOAD_BEFORE_FILE, uploading):
        first = coordinator.trigger("manual")
        uploading.wait_reached()
        second = coordinator.trigger("manual")
        assert second.done.wait(10)
        uploading.resume()
        assert first.done.wait(10)
    return first, second


def test_a_checkpoint_that_reaches_its_marker_after_a_later_one_is_subsumed(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """Flink's ``CHECKPOINT_SUBSUMED``: chk-1 is held in its upload while chk-2
    completes. chk-1 then never writes its marker (it would lie below chk-2's floor,
    counted by this driver and ignored by every reader); it fails as subsumed, which
    does not count toward ``tolerable-failed-checkpoints``."""
    coordinator = start_concurrent(storage, workdir)
    try:
        first, second = _overtaken(coordinator)
        assert second.manifest is not None
        assert first.manifest is None and first.failure == "checkpoint 2 reached its marker first"
        assert not storage.exists(L.checkpoint_metadata(1))
        assert CheckpointCatalog(storage, JOB).checkpoint_ids() == [2]
        assert coordinator.failures.consecutive == 0
    finally:
        coordinator.shutdown()


class LostMarkerAnswer(FencedStorage):
    """``inner`` whose put of ``key`` lands but its answer is lost
    (``OutcomeUnknownError``, as when a connection resets after the request was sent)."""

    def __init__(self, inner: CheckpointStorage, key: str) -> None:
        super().__init__(inner, lambda: None)
        self.key = key

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        etag = self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)
        if key == self.key:
            raise OutcomeUnknownError(f"answer of PUT {key} lost")
        return etag


def test_a_checkpoint_overtaken_by_an_abandoned_marker_is_subsumed(
    storage: CheckpointStorage, workdir: Path
) -> None:
    """Job world seed 383105 (session 17): chk-1 is held in its upload while chk-2's
    marker PUT lands but its answer is lost: chk-2 is abandoned (its marker may count
    for a successor, with a retention floor of 2: chk-1 was not marked). Before, only a
    marker written and confirmed made a lower id subsumed, so chk-1 then wrote its marker
    below chk-2's floor, counted by this driver and ignored by every successor that
    restores chk-2. An abandoned marker now subsumes a lower id as a written one does."""
    coordinator = start_concurrent(LostMarkerAnswer(storage, L.checkpoint_metadata(2)),
                                   workdir)
    try:
        first, second = _overtaken(coordinator)
        assert second.state is PendingState.ABANDONED
        assert storage.exists(L.checkpoint_metadata(2))  # it landed after all
        assert first.manifest is None and first.state is PendingState.FAILED
        assert first.failure == "checkpoint 2 reached its marker first"
        assert not storage.exists(L.checkpoint_metadata(1))
    finally:
        coordinator.shutdown()
