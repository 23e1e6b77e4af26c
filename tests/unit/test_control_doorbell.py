"""The control channel's doorbell: when the driver lists its requests, and what it hears.

File backend (real), no clocks: ``due`` is given the time.
"""

from __future__ import annotations

from airflow_ckpt.errors import EndpointUnreachableError
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlResult, Doorbell
from airflow_ckpt.runtime.lease.record import lease_epochs
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

JOB = "bell"
LAYOUT = JobLayout(JOB)


def driver(storage: CheckpointStorage) -> tuple[Doorbell, ControlChannel, CheckpointStorage]:
    """A driver's doorbell and channel, and the view its lease lists ``lease/`` through."""
    bell = Doorbell(JOB)
    return bell, ControlChannel(storage, JOB, doorbell=bell), bell.listen(storage)


def heartbeat(lease_view: CheckpointStorage) -> None:
    """What the lease heartbeat does to ``lease/`` after its write: list it."""
    lease_epochs(lease_view, JOB)


def test_a_request_is_stored_before_its_doorbell_rings(file_storage: CheckpointStorage) -> None:
    order: list[str] = []

    class Recording(FencedStorage):
        def put_bytes(self, key: str, data: bytes, **kw: object) -> str:
            order.append(key)
            return super().put_bytes(key, data, **kw)  # type: ignore[arg-type]

    request = ControlChannel(Recording(file_storage, lambda: None), JOB).request_savepoint()
    assert order == [LAYOUT.control_request(request.request_id),
                     LAYOUT.doorbell(request.request_id)]


def test_a_doorbell_that_cannot_ring_leaves_the_request_standing(
        file_storage: CheckpointStorage) -> None:
    class NoBells(FencedStorage):
        def put_bytes(self, key: str, data: bytes, **kw: object) -> str:
            if key.startswith(LAYOUT.doorbell_prefix):
                raise EndpointUnreachableError("no route")
            return super().put_bytes(key, data, **kw)  # type: ignore[arg-type]

    request = ControlChannel(NoBells(file_storage, lambda: None), JOB).request_savepoint()
    bell, channel, lease_view = driver(file_storage)
    channel.look(0.0)
    heartbeat(lease_view)
    assert bell.rung == frozenset() and not channel.due(59.0, 60.0)
    # the periodic listing finds it: the doorbell is a hint, never the guarantee
    assert channel.due(60.0, 60.0)
    assert [r.request_id for r in channel.look(60.0)] == [request.request_id]


def test_a_ring_is_heard_in_the_next_listing_of_lease_and_makes_the_driver_look(
        file_storage: CheckpointStorage) -> None:
    bell, channel, lease_view = driver(file_storage)
    assert channel.due(0.0, 60.0)  # never looked
    assert channel.look(0.0) == []
    heartbeat(lease_view)
    assert not channel.due(1.0, 60.0)
    request = ControlChannel(file_storage, JOB).request_savepoint()
    assert not channel.due(2.0, 60.0)  # not heard yet: no request was made to hear it
    heartbeat(lease_view)
    assert bell.rung == {request.request_id}
    assert channel.due(3.0, 60.0)
    assert [r.request_id for r in channel.look(3.0)] == [request.request_id]
    # heard before that look began, so that look covered it: no second look for it
    heartbeat(lease_view)
    assert not channel.due(4.0, 60.0)


def test_a_listing_that_does_not_cover_the_doorbells_changes_nothing(
        file_storage: CheckpointStorage) -> None:
    bell, _, lease_view = driver(file_storage)
    request = ControlChannel(file_storage, JOB).request_savepoint()
    heartbeat(lease_view)
    assert bell.rung == {request.request_id}
    lease_view.list(f"{JOB}/control/")
    lease_view.list_after(LAYOUT.lease_prefix, LAYOUT.doorbell(request.request_id))
    assert bell.rung == {request.request_id}
    lease_view.list(f"{JOB}/")  # covers lease/: heard
    file_storage.delete_many([LAYOUT.doorbell(request.request_id)])
    lease_view.list_after(f"{JOB}/", "")
    assert bell.rung == frozenset()


def test_a_doorbell_without_a_request_costs_one_look_not_one_a_second(
        file_storage: CheckpointStorage) -> None:
    _, channel, lease_view = driver(file_storage)
    channel.look(0.0)
    file_storage.put_bytes(LAYOUT.doorbell("0000000000000-stray"), b"")
    heartbeat(lease_view)
    assert channel.due(1.0, 60.0)
    assert channel.look(1.0) == []
    looks = [t for t in range(2, 60) if channel.due(float(t), 60.0)]
    assert looks == []


def test_the_driver_hangs_up_the_doorbells_of_answered_requests_only(
        file_storage: CheckpointStorage) -> None:
    _, channel, lease_view = driver(file_storage)
    requester = ControlChannel(file_storage, JOB)
    answered, waiting = requester.request_savepoint(), requester.request_savepoint()
    heartbeat(lease_view)
    assert len(channel.look(0.0)) == 2
    channel.answer(ControlResult(answered.request_id, "failed", 1.0, failure_message="x"))
    channel.look(1.0)
    bells = {i.key for i in file_storage.list(LAYOUT.doorbell_prefix)}
    assert bells == {LAYOUT.doorbell(waiting.request_id)}


def test_an_idle_driver_looks_once_a_minute(file_storage: CheckpointStorage) -> None:
    """The schedule alone (the S3 test counts the requests): 60 looks an hour."""
    listings: list[str] = []

    class Counting(FencedStorage):
        def list(self, prefix: str = "") -> list:  # type: ignore[type-arg]
            listings.append(prefix)
            return super().list(prefix)

    bell = Doorbell(JOB)
    channel = ControlChannel(Counting(file_storage, lambda: None), JOB, doorbell=bell)
    lease_view = bell.listen(file_storage)
    for t in range(3600):
        if t % 5 == 0:
            heartbeat(lease_view)
        if channel.due(float(t), 60.0):
            channel.look(float(t))
    assert listings == [LAYOUT.control_prefix] * 60

