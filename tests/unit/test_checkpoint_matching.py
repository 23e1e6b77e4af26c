"""The shared wait logic: conditions, baselines, matches, freshness, error policy."""

from __future__ import annotations

import time

import pytest

from airflow_ckpt.errors import ConfigError, EndpointUnreachableError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog, CountedCheckpoints
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlResult
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.triggers.matching import (
    NO_CHECKPOINT,
    CheckpointCondition,
    MatchResult,
    advance,
    describe,
    find_match,
    new_snapshots,
    poll_once,
    take_baseline,
    wait_for_match,
)
from tests.fixtures.snapshots import write_snapshot

JOB = "orders"


@pytest.fixture
def catalog(file_storage: CheckpointStorage) -> CheckpointCatalog:
    return CheckpointCatalog(file_storage, JOB)


def check(catalog: CheckpointCatalog, condition: CheckpointCondition, **kw: float) -> MatchResult:
    now = kw.pop("now", time.time())
    return find_match(catalog, condition, now=now, wait_started_ts=kw.pop("started", now), **kw)


# ------------------------------------------------------------------ condition values


def test_condition_round_trips_through_dict() -> None:
    c = CheckpointCondition(job=JOB, kind="savepoint", after_checkpoint_id=4,
                            known_savepoints=("a", "b"), min_checkpoint_id=2,
                            max_checkpoint_age_s=30.0)
    data = c.to_dict()
    assert data["known_savepoints"] == ["a", "b"]
    assert CheckpointCondition.from_dict(data) == c


def test_condition_names_every_bad_field() -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointCondition(job=JOB, kind="bogus", min_checkpoint_id=-3,  # type: ignore[arg-type]
                            max_checkpoint_age_s=0)
    assert set(err.value.problems) == {"kind", "min_checkpoint_id", "max_checkpoint_age_s"}


def test_request_needs_a_savepoint_kind() -> None:
    with pytest.raises(ConfigError, match="answered by a savepoint"):
        CheckpointCondition(job=JOB, kind="checkpoint", request_id="r1")


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        CheckpointCondition.from_dict({"job": JOB, "kinds": "any"})


def test_match_result_payload_round_trip() -> None:
    r = MatchResult("matched", summary={"path": "s3://b/j/chk-1"}, checked_ts=12.5)
    assert MatchResult.from_payload(r.to_payload()) == r
    with pytest.raises(ValueError):
        MatchResult.from_payload({"status": "weird"})


# ------------------------------------------------------------------ baselines, matching


def test_baseline_of_an_empty_job(catalog: CheckpointCatalog) -> None:
    base = take_baseline(catalog, CheckpointCondition(job=JOB))
    assert base.after_checkpoint_id == NO_CHECKPOINT
    assert base.known_savepoints == ()
    assert check(catalog, base).status == "waiting"
    write_snapshot(catalog.storage, JOB, 1)
    got = check(catalog, base)
    assert got.status == "matched"
    assert got.summary is not None and got.summary["id"] == 1


def test_only_snapshots_completed_after_the_baseline_match(catalog: CheckpointCatalog) -> None:
    storage = catalog.storage
    write_snapshot(storage, JOB, 1)
    write_snapshot(storage, JOB, 2)
    write_snapshot(storage, JOB, 2, savepoint_id="old")
    in_flight = write_snapshot(storage, JOB, 3, completed=False)  # no _metadata yet
    base = take_baseline(catalog, CheckpointCondition(job=JOB))
    assert base.after_checkpoint_id == 2
    assert base.known_savepoints == ("old",)
    assert check(catalog, base).status == "waiting"

    # chk-3 completes: it was in flight at the baseline, so it is new
    storage.put_bytes("orders/chk-3/_metadata", in_flight.to_json(), create_only=True)
    got = check(catalog, base)
    assert got.status == "matched" and got.summary is not None
    assert got.summary["path"] == storage.uri + "/orders/chk-3"
    assert got.summary["kind"] == "checkpoint"


def test_newest_of_several_matches_is_returned(catalog: CheckpointCatalog) -> None:
    base = take_baseline(catalog, CheckpointCondition(job=JOB))
    t = time.time()
    write_snapshot(catalog.storage, JOB, 1, completed_ts=t)
    write_snapshot(catalog.storage, JOB, 1, savepoint_id="sp1", completed_ts=t + 1)
    write_snapshot(catalog.storage, JOB, 2, completed_ts=t + 2)
    got = check(catalog, base)
    assert got.summary is not None and got.summary["id"] == 2
    ordered = new_snapshots(catalog, base)
    assert [(m.kind, m.checkpoint_id) for m in ordered] == [
        ("checkpoint", 1), ("savepoint", 1), ("checkpoint", 2)]


def test_kind_filters(catalog: CheckpointCatalog) -> None:
    sp_base = take_baseline(catalog, CheckpointCondition(job=JOB, kind="savepoint"))
    assert sp_base.after_checkpoint_id is None  # checkpoints are not looked at
    write_snapshot(catalog.storage, JOB, 1)
    assert check(catalog, sp_base).status == "waiting"
    write_snapshot(catalog.storage, JOB, 1, savepoint_id="s-1")
    got = check(catalog, sp_base)
    assert got.summary is not None
    assert (got.summary["kind"], got.summary["savepoint_id"]) == ("savepoint", "s-1")
    assert got.summary["path"].endswith("/orders/savepoints/sp-s-1")


def test_min_checkpoint_id_without_baseline(catalog: CheckpointCatalog) -> None:
    cond = CheckpointCondition(job=JOB, kind="checkpoint", min_checkpoint_id=3)
    write_snapshot(catalog.storage, JOB, 2)
    assert check(catalog, cond).status == "waiting"
    write_snapshot(catalog.storage, JOB, 3)
    got = check(catalog, cond)
    assert got.summary is not None and got.summary["id"] == 3


def test_advance_moves_past_what_was_seen(catalog: CheckpointCatalog) -> None:
    base = take_baseline(catalog, CheckpointCondition(job=JOB))
    write_snapshot(catalog.storage, JOB, 1)
    write_snapshot(catalog.storage, JOB, 1, savepoint_id="a")
    seen = new_snapshots(catalog, base)
    assert len(seen) == 2
    moved = advance(base, seen)
    assert (moved.after_checkpoint_id, moved.known_savepoints) == (1, ("a",))
    assert new_snapshots(catalog, moved) == []
    write_snapshot(catalog.storage, JOB, 2)
    assert [m.checkpoint_id for m in new_snapshots(catalog, moved)] == [2]


# ------------------------------------------------------------------ savepoint requests


def test_request_pending_then_completed(catalog: CheckpointCatalog) -> None:
    channel = ControlChannel(catalog.storage, JOB)
    request = channel.request_savepoint(timeout_s=60)
    cond = CheckpointCondition(job=JOB, kind="savepoint", request_id=request.request_id)
    write_snapshot(catalog.storage, JOB, 5, savepoint_id="unrelated")
    assert check(catalog, cond).status == "waiting"  # only the job's answer decides
    write_snapshot(catalog.storage, JOB, 6, savepoint_id="mine")
    channel.answer(ControlResult(request.request_id, "completed", time.time(),
                                 savepoint_id="mine", checkpoint_id=6, batch_id=12,
                                 savepoint_path=catalog.storage.uri +
                                 "/orders/savepoints/sp-mine"))
    got = check(catalog, cond)
    assert got.status == "matched" and got.summary is not None
    assert got.summary["savepoint_id"] == "mine"
    assert got.summary["batch_id"] == 12


def test_failed_request_carries_the_jobs_reason(catalog: CheckpointCatalog) -> None:
    channel = ControlChannel(catalog.storage, JOB)
    request = channel.request_savepoint(timeout_s=60)
    channel.answer(ControlResult(request.request_id, "failed", time.time(),
                                 failure_message="upload of state/0/1.delta failed"))
    got = check(catalog, CheckpointCondition(job=JOB, kind="savepoint",
                                             request_id=request.request_id))
    assert got.status == "failed"
    assert "upload of state/0/1.delta failed" in got.message


def test_unknown_request_fails(catalog: CheckpointCatalog) -> None:
    got = check(catalog, CheckpointCondition(job=JOB, kind="savepoint", request_id="nope"))
    assert got.status == "failed" and "no savepoint request 'nope'" in got.message


def test_answer_pointing_at_a_missing_savepoint_fails(catalog: CheckpointCatalog) -> None:
    channel = ControlChannel(catalog.storage, JOB)
    request = channel.request_savepoint(timeout_s=60)
    channel.answer(ControlResult(request.request_id, "completed", time.time(),
                                 savepoint_id="ghost",
                                 savepoint_path=catalog.storage.uri +
                                 "/orders/savepoints/sp-ghost"))
    got = check(catalog, CheckpointCondition(job=JOB, kind="savepoint",
                                             request_id=request.request_id))
    assert got.status == "failed" and "cannot be read" in got.message


# ------------------------------------------------------------------ freshness, deadline


def test_freshness_fails_on_a_stale_job(catalog: CheckpointCatalog) -> None:
    now = time.time()
    write_snapshot(catalog.storage, JOB, 1, completed_ts=now - 120)
    cond = take_baseline(catalog, CheckpointCondition(job=JOB, max_checkpoint_age_s=60))
    got = check(catalog, cond, now=now)
    assert got.status == "failed"
    assert "no checkpoint within 60 s" in got.message and "chk-1" in got.message
    fresh = CheckpointCondition(job=JOB, max_checkpoint_age_s=300)
    assert check(catalog, take_baseline(catalog, fresh), now=now).status == "waiting"


def test_freshness_of_a_job_without_checkpoints_counts_from_the_wait(
        catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB, max_checkpoint_age_s=60))
    now = time.time()
    assert check(catalog, cond, now=now, started=now - 30).status == "waiting"
    got = check(catalog, cond, now=now, started=now - 61)
    assert got.status == "failed" and "has none at all" in got.message


def test_a_match_beats_staleness(catalog: CheckpointCatalog) -> None:
    now = time.time()
    cond = take_baseline(catalog, CheckpointCondition(job=JOB, max_checkpoint_age_s=10))
    write_snapshot(catalog.storage, JOB, 1, completed_ts=now - 100)
    assert check(catalog, cond, now=now).status == "matched"


def test_deadline(catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    now = time.time()
    assert check(catalog, cond, now=now, started=now - 5, deadline_ts=now + 1).status == "waiting"
    got = check(catalog, cond, now=now, started=now - 5, deadline_ts=now)
    assert got.status == "timeout" and "within 5 s" in got.message


# ------------------------------------------------------------------ error policy


class Unreachable(CheckpointCatalog):
    def __init__(self, inner: CheckpointCatalog) -> None:
        super().__init__(inner.storage, inner.layout.job)

    def counted(self, lease: object = "current") -> CountedCheckpoints:
        raise EndpointUnreachableError("connect timeout to http://127.0.0.1:1")


def test_unreachable_storage_is_transient(catalog: CheckpointCatalog) -> None:
    cond = CheckpointCondition(job=JOB, kind="checkpoint")
    flaky = Unreachable(catalog)
    got = poll_once(flaky, cond, wait_started_ts=time.time())
    assert got.status == "waiting" and "unreachable" in got.message
    got = poll_once(flaky, cond, wait_started_ts=0, deadline_ts=1, clock=lambda: 2.0)
    assert got.status == "timeout"


def test_corrupt_manifest_is_permanent(catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    catalog.storage.put_bytes("orders/chk-1/_metadata", b"{not json")
    got = poll_once(catalog, cond, wait_started_ts=time.time())
    assert got.status == "failed"
    assert "MetadataError" in got.message and "orders/chk-1/_metadata" in got.message


def test_wait_for_match_polls_until_done(catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            write_snapshot(catalog.storage, JOB, 7)

    got = wait_for_match(catalog, cond, poll_interval=0.5, wait_started_ts=time.time(),
                         sleep=sleep)
    assert got.status == "matched" and sleeps == [0.5, 0.5, 0.5]


class FakeClock:
    """A clock that only moves when the waiter sleeps."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_brief_wait_returns_waiting_after_a_last_check_at_until_ts(
        catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    clock = FakeClock(1000.0)
    got = wait_for_match(catalog, cond, poll_interval=0.4, wait_started_ts=1000.0,
                         deadline_ts=1600.0, until_ts=1001.0, clock=clock, sleep=clock.sleep)
    assert got.status == "waiting" and got.checked_ts == 1001.0
    # checks at 1000, 1000.4, 1000.8 and (the last pause cut short) at 1001 exactly
    assert clock.sleeps == pytest.approx([0.4, 0.4, 0.2])


def test_brief_wait_finds_an_answer_that_lands_at_its_last_check(
        catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    clock = FakeClock(1000.0)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1001.0:
            write_snapshot(catalog.storage, JOB, 7)

    got = wait_for_match(catalog, cond, poll_interval=0.4, wait_started_ts=1000.0,
                         until_ts=1001.0, clock=clock, sleep=sleep)
    assert got.status == "matched" and got.summary is not None and got.summary["id"] == 7


def test_brief_wait_past_the_deadline_times_out(catalog: CheckpointCatalog) -> None:
    cond = take_baseline(catalog, CheckpointCondition(job=JOB))
    clock = FakeClock(1000.0)
    got = wait_for_match(catalog, cond, poll_interval=0.4, wait_started_ts=1000.0,
                         deadline_ts=1000.5, until_ts=1030.0, clock=clock, sleep=clock.sleep)
    assert got.status == "timeout" and got.checked_ts == 1000.5


def test_wait_for_healthy_matches_only_while_checkpoints_progress(
        catalog: CheckpointCatalog) -> None:
    """Issue 10 part 2: the sensor's "healthy" wait uses the supervisor's stale rule."""
    now = time.time()
    write_snapshot(catalog.storage, JOB, 1, completed_ts=now - 100)
    healthy = CheckpointCondition(job=JOB, kind="checkpoint", healthy_interval_s=10)
    assert "while healthy" in describe(healthy)
    assert check(catalog, healthy, now=now).status == "waiting"  # 100 s > 3 x 10 s: stale
    write_snapshot(catalog.storage, JOB, 2, completed_ts=now - 5)
    assert check(catalog, healthy, now=now).status == "matched"
    lenient = CheckpointCondition(job=JOB, healthy_interval_s=1, healthy_multiple=2)
    assert check(catalog, lenient, now=now).status == "waiting"
    assert CheckpointCondition.from_dict(healthy.to_dict()) == healthy
    with pytest.raises(ConfigError):
        CheckpointCondition(job=JOB, healthy_interval_s=0)


def test_a_deposed_drivers_late_marker_never_matches(catalog: CheckpointCatalog) -> None:
    """Sensors and triggers count completed checkpoints by the catalog's rule: a marker a
    deposed driver wrote after the takeover (not adopted, below the holder's first id)
    is never a new checkpoint (issue 19 A; the old directory walk matched it)."""
    storage = catalog.storage
    write_snapshot(storage, JOB, 1)
    record = LeaseRecord(epoch=2, owner="successor", host="h", pid=1, acquired_ts=0.0,
                         heartbeat_ts=0.0, adopted=(1,), first_id=200, id_limit=300)
    storage.put_bytes(f"{JOB}/lease/{2:010d}.json", record.to_json())
    condition = take_baseline(catalog, CheckpointCondition(job=JOB, kind="checkpoint"))
    assert condition.after_checkpoint_id == 1
    write_snapshot(storage, JOB, 5)  # the deposed driver's marker, landing late
    assert new_snapshots(catalog, condition) == []
    write_snapshot(storage, JOB, 200)  # the holder's own
    assert [m.checkpoint_id for m in new_snapshots(catalog, condition)] == [200]
