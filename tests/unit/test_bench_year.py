"""bench.year builds what the runtime reads: savepoint manifests and control requests
and answers that parse, ids below the lease record's reserved range."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt.runtime.checkpoint.metadata import parse_manifest
from airflow_ckpt.runtime.control.channel import ControlRequest, parse_request
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.history.segments import Segment
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.testing.request_count import RequestCounter
from bench.history import put_compacted, story
from bench.year import JOB, RequestTimer, interleaved, parse_args, year_objects, year_server


def test_the_year_objects_are_what_the_runtime_writes() -> None:
    objects = dict(year_objects(JOB, savepoints=3, requests=2, first_id=5000, now=1e9))
    manifests = [parse_manifest(v, where=k) for k, v in objects.items() if k.endswith("_metadata")]
    assert len(manifests) == 3 and all(m.is_savepoint and m.checkpoint_id < 5000
                                       for m in manifests)
    requests = [k for k in objects if k.endswith(".json") and not k.endswith(".result.json")]
    assert len(requests) == 2 and len(objects) == 3 + 4
    for key in requests:
        request_id = key.rsplit("/", 1)[1][:-len(".json")]
        assert isinstance(parse_request(objects[key], key, request_id, 1e9), ControlRequest)


def test_the_server_is_moto_unless_seaweedfs_is_chosen() -> None:
    assert parse_args([]).server == "moto"
    assert parse_args(["--quick", "--server", "seaweedfs"]).server == "seaweedfs"
    with pytest.raises(SystemExit):
        parse_args(["--server", "minio"])
    with pytest.raises(ValueError, match="minio"), year_server("minio"):
        pass


def test_repeats_default_to_three_and_are_validated() -> None:
    assert parse_args([]).repeats == 3
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])


def test_history_retention_is_the_default_and_can_be_turned_off() -> None:
    assert parse_args([]).retention is True
    assert parse_args(["--no-history-retention"]).retention is False


def test_the_year_old_history_keeps_what_the_default_compaction_keeps(tmp_path: Path) -> None:
    """put_compacted with a retention drops the oldest checkpoint segments as compaction
    does: the kept ones hold at least the retained count, one fewer would not; the other
    stream and the raw tail are whole, and the newest page reads the same events."""
    events = story(JOB, 5_020, 0)
    kept: dict[int | None, list[Segment]] = {}
    for retain in (None, 2_000):
        storage = open_storage(f"file://{tmp_path}/{retain}")
        put_compacted(JobHistory(storage, JOB, compaction=None), events, 20, 2, retain)
        listing = HistoryReader(storage, JOB).listing()
        kept[retain] = [s for s in listing.segments if s.stream == "checkpoints"]
        assert len(listing.raw) == 20
        newest, _ = HistoryReader(storage, JOB).newest(50)
        assert [e.key for e in newest] == [e.key for e in events[-50:]]
    held = [s.count for s in kept[2_000]]
    assert len(kept[2_000]) < len(kept[None])
    assert sum(held) >= 2_000 > sum(held[1:])
    assert kept[2_000] == kept[None][-len(kept[2_000]):]  # the newest ones


def test_the_roots_alternate_and_swap_their_order_every_round() -> None:
    calls: list[str] = []
    counter = RequestCounter()
    steps = {name: (counter, lambda n=name: calls.append(n), RequestTimer())
             for name in ("fresh", "year")}
    results = interleaved(steps, 3)
    assert calls == ["fresh", "year", "year", "fresh", "fresh", "year"]
    assert all(len(r["seconds_each"]) == 3 and r["requests"] == 0 for r in results.values())


def test_the_listing_probe_lists_the_surviving_keys_after_the_deleted_ones() -> None:
    from bench.listing import keys
    from bench.listing import parse_args as listing_args

    assert listing_args([]).deleted == 40_000 and listing_args([]).server == "seaweedfs"
    with pytest.raises(SystemExit):
        listing_args(["--deleted", "0"])
    old = keys("old", 10)
    assert old == sorted(old) and old[0].startswith("old/control/")
