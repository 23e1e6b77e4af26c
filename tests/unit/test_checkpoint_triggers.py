"""CheckpointTrigger and CheckpointEventTrigger: serialisation and their async polling."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.sdk import Asset, AssetWatcher
from airflow.sdk._shared.module_loading import import_string
from airflow.serialization.decoders import smart_decode_trigger_kwargs
from airflow.serialization.encoders import encode_trigger
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.triggers.checkpoint import CheckpointEventTrigger, CheckpointTrigger
from airflow_ckpt.triggers.matching import CheckpointCondition, take_baseline
from tests.fixtures.snapshots import write_snapshot

JOB = "orders"


def through_airflow(trigger: BaseTrigger) -> BaseTrigger:
    """Serialise as Airflow stores a trigger, then rebuild it as the triggerer does."""
    encoded = encode_trigger(trigger)  # type: ignore[arg-type]
    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in encoded["kwargs"].items()}
    rebuilt: BaseTrigger = import_string(encoded["classpath"])(**kwargs)
    return rebuilt


def test_checkpoint_trigger_round_trip() -> None:
    trigger = CheckpointTrigger(
        storage_uri="s3://bucket/ckpt",
        condition=CheckpointCondition(job=JOB, after_checkpoint_id=4,
                                      known_savepoints=("a",), max_checkpoint_age_s=60).to_dict(),
        conn_id="minio", poll_interval=0.5, wait_started_ts=100.0, deadline_ts=200.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_ckpt.triggers.checkpoint.CheckpointTrigger"
    again = through_airflow(trigger)
    assert isinstance(again, CheckpointTrigger)
    assert again.serialize() == (classpath, kwargs)
    assert again.condition == trigger.condition


def test_event_trigger_round_trip_and_stable_identity() -> None:
    def make() -> CheckpointEventTrigger:
        return CheckpointEventTrigger(storage_uri="s3://bucket/ckpt", job=JOB, kind="savepoint",
                                      poll_interval=10)

    first, second = make(), make()
    assert first.serialize() == second.serialize()
    # Airflow identifies watcher triggers by this hash across DAG parses: it must not
    # depend on when the trigger object was built
    assert BaseEventTrigger.hash(*first.serialize()) == BaseEventTrigger.hash(*second.serialize())
    again = through_airflow(first)
    assert isinstance(again, CheckpointEventTrigger)
    assert again.serialize() == first.serialize()


def test_event_trigger_is_accepted_by_asset_watcher() -> None:
    trigger = CheckpointEventTrigger(storage_uri="s3://bucket/ckpt", job=JOB)
    asset = Asset("ckpt-orders", uri="s3://bucket/ckpt/orders",
                  watchers=[AssetWatcher(name="orders_snapshots", trigger=trigger)])
    assert asset.watchers[0].trigger is trigger
    with pytest.raises(ValueError, match="BaseEventTrigger"):
        AssetWatcher(name="x", trigger=CheckpointTrigger(  # type: ignore[arg-type]
            storage_uri="s3://b/c", condition={"job": JOB}))


@pytest.mark.parametrize("bad", [{"job": JOB, "kind": "nope"}, {"kind": "any"}])
def test_bad_conditions_fail_at_construction(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CheckpointTrigger(storage_uri="s3://b/c", condition=bad)


def test_poll_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        CheckpointEventTrigger(storage_uri="s3://b/c", job=JOB, poll_interval=0)


# ------------------------------------------------------------------ running


async def first_event(gen: AsyncIterator[TriggerEvent], timeout: float) -> TriggerEvent:
    return await asyncio.wait_for(anext(gen), timeout)


def later(delay: float, action: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), action()), daemon=True)
    thread.start()
    return thread


def test_trigger_fires_when_the_marker_appears(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 1)
    condition = take_baseline(CheckpointCatalog(file_storage, JOB), CheckpointCondition(job=JOB))
    trigger = CheckpointTrigger(storage_uri=file_storage.uri, condition=condition.to_dict(),
                                conn_id=None, poll_interval=0.05)
    written: list[float] = []

    def complete() -> None:
        written.append(time.time())
        write_snapshot(file_storage, JOB, 2)

    async def scenario() -> TriggerEvent:
        later(0.3, complete)
        # the event loop stays responsive while the trigger polls in threads
        ticks = 0
        task = asyncio.ensure_future(first_event(trigger.run(), 10))
        while not task.done():
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks > 10
        return task.result()

    event = asyncio.run(scenario())
    assert event.payload["status"] == "matched"
    assert event.payload["summary"]["id"] == 2
    assert event.payload["summary"]["path"] == file_storage.uri + "/orders/chk-2"
    # found by the first poll after the marker was written (polls are 50 ms apart)
    assert 0 <= event.payload["checked_ts"] - written[0] < 1.0


def test_trigger_times_out_at_its_deadline(file_storage: CheckpointStorage) -> None:
    now = time.time()
    trigger = CheckpointTrigger(storage_uri=file_storage.uri,
                                condition={"job": JOB, "kind": "savepoint",
                                           "known_savepoints": []},
                                conn_id=None, poll_interval=5, wait_started_ts=now,
                                deadline_ts=now + 0.3)
    started = time.monotonic()
    event = asyncio.run(first_event(trigger.run(), 5))
    assert event.payload["status"] == "timeout"
    assert time.monotonic() - started < 2  # the deadline cuts the 5 s poll interval short


def test_trigger_reports_a_bad_storage_as_failed() -> None:
    trigger = CheckpointTrigger(storage_uri="ftp://nowhere", condition={"job": JOB},
                                conn_id=None)
    event = asyncio.run(first_event(trigger.run(), 5))
    assert event.payload["status"] == "failed"
    assert "InvalidStorageUriError" in event.payload["message"]


class MemoryStateStore:
    """Stands in for the asset state store Airflow injects into watcher triggers."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


def test_event_trigger_fires_once_per_new_snapshot_across_restarts(
        file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 1)  # exists before the watcher: never fires
    store = MemoryStateStore()

    def watcher() -> CheckpointEventTrigger:
        t = CheckpointEventTrigger(storage_uri=file_storage.uri, job=JOB, conn_id=None,
                                   poll_interval=0.05)
        t.asset_state_store = store  # type: ignore[assignment]
        return t

    async def collect(trigger: CheckpointEventTrigger, actions: list[Any], n: int
                      ) -> list[dict[str, Any]]:
        gen = trigger.run()
        first = asyncio.ensure_future(anext(gen))
        await asyncio.sleep(0.2)  # baseline taken
        for action in actions:
            action()
        events = [(await asyncio.wait_for(first, 5)).payload]
        while len(events) < n:
            events.append((await first_event(gen, 5)).payload)
        with pytest.raises(asyncio.TimeoutError):  # nothing more
            await first_event(gen, 0.4)
        await gen.aclose()
        return events

    got = asyncio.run(collect(watcher(), [
        lambda: write_snapshot(file_storage, JOB, 2),
        lambda: write_snapshot(file_storage, JOB, 2, savepoint_id="s1"),
    ], 2))
    assert [(e["kind"], e["id"]) for e in got] == [("checkpoint", 2), ("savepoint", 2)]
    assert store.values["airflow_ckpt.watermark.orders.any"] == {
        "after_checkpoint_id": 2, "known_savepoints": ["s1"]}

    # "triggerer restart": chk-3 completes while nothing watches; the new instance
    # fires it (from the stored watermark) and nothing that already fired
    write_snapshot(file_storage, JOB, 3)
    got = asyncio.run(collect(watcher(), [lambda: write_snapshot(file_storage, JOB, 4)], 2))
    assert [e["id"] for e in got] == [3, 4]


def test_event_trigger_without_state_store_rebaselines(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 1)
    trigger = CheckpointEventTrigger(storage_uri=file_storage.uri, job=JOB, kind="checkpoint",
                                     conn_id=None, poll_interval=0.05)

    async def scenario() -> list[Any]:
        gen = trigger.run()
        pending = asyncio.ensure_future(anext(gen))
        await asyncio.sleep(0.2)
        write_snapshot(file_storage, JOB, 1, savepoint_id="ignored")  # kind=checkpoint
        write_snapshot(file_storage, JOB, 2)
        event = await asyncio.wait_for(pending, 5)
        with pytest.raises(asyncio.TimeoutError):
            await first_event(gen, 0.3)
        await gen.aclose()
        return [event.payload]

    [payload] = asyncio.run(scenario())
    assert (payload["kind"], payload["id"], payload["job"]) == ("checkpoint", 2, JOB)
