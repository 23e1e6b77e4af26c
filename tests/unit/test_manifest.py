"""The _metadata manifest reader is strict: never a half-read object."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_ckpt.errors import MetadataError, UnsupportedSchemaVersionError
from airflow_ckpt.runtime.checkpoint.metadata import (
    FileEntry,
    Manifest,
    OperatorInfo,
    SourceSettings,
    Timings,
    parse_manifest,
)


def manifest(**overrides: Any) -> Manifest:
    base: dict[str, Any] = dict(
        job="j", checkpoint_id=3, kind="checkpoint", trigger="periodic", batch_id=7,
        spark_version="4.2.0", query_id="q", mode="EXACTLY_ONCE", source_offsets=[{"o": 1}],
        operators=(OperatorInfo(0, 4),),
        files=(FileEntry("offsets/7", "shared/ab/abc", 10, "abc", True),),
        state_size=10, checkpointed_size=10, num_subtasks=2, num_acknowledged_subtasks=2,
        timings=Timings(1.0, 1.5, 2.0, 500, 3, 40, 1000), pending_transactions=(7,),
    )
    base.update(overrides)
    return Manifest(**base)


def test_round_trip_and_flink_history_entry() -> None:
    m = manifest()
    assert parse_manifest(m.to_json()) == m
    entry = m.history_entry()
    assert entry["id"] == 3 and entry["status"] == "COMPLETED" and not entry["is_savepoint"]
    assert entry["trigger_timestamp"] == 1000 and entry["latest_ack_timestamp"] == 2000
    assert entry["end_to_end_duration"] == 1000 and entry["num_acknowledged_subtasks"] == 2


def test_sources_round_trip_and_are_optional() -> None:
    m = manifest(sources=(SourceSettings("rate", {"rowsPerSecond": "20"}),
                          SourceSettings("text", {})))
    assert parse_manifest(m.to_json()) == m
    older = json.loads(manifest().to_json())
    older.pop("sources")  # written before sources were recorded: not known
    assert parse_manifest(json.dumps(older).encode()).sources is None


def _mutate(change: Any) -> bytes:
    obj = json.loads(manifest().to_json())
    change(obj)
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (_mutate(lambda o: o.pop("batch_id")), "missing field 'batch_id'"),
        (_mutate(lambda o: o.update(batch_id="7")), "'batch_id' has the wrong type"),
        (_mutate(lambda o: o.update(state_size=True)), "wrong type"),
        (_mutate(lambda o: o.update(kind="snapshot")), "kind 'snapshot'"),
        (_mutate(lambda o: o["files"][0].pop("sha256")), "missing field 'sha256'"),
        (_mutate(lambda o: o.update(pending_transactions=["7"])), "pending_transactions"),
        (_mutate(lambda o: o["timings"].pop("sync_duration_ms")), "sync_duration_ms"),
        (_mutate(lambda o: o.update(sources={"name": "rate"})), "'sources' must be a list"),
        (_mutate(lambda o: o.update(sources=[{"name": "rate", "options": {"n": 1}}])),
         "map strings to strings"),
    ],
)
def test_damaged_manifests_raise_typed_errors(data: bytes, message: str) -> None:
    with pytest.raises(MetadataError, match=message):
        parse_manifest(data, where="job/chk-3/_metadata")


def test_version_1_manifests_are_still_read() -> None:
    old = _mutate(lambda o: (o.update(schema_version=1), o["files"][0].pop("offset")))
    m = parse_manifest(old)
    assert m.schema_version == 1 and not m.files[0].merged


def test_a_merged_file_entry_round_trips_and_a_bad_offset_is_refused() -> None:
    entry = FileEntry("commits/7", "shared/ab/abc", 10, "abc", True, offset=120)
    assert parse_manifest(manifest(files=(entry,)).to_json()).files == (entry,)
    with pytest.raises(MetadataError, match="'offset'"):
        parse_manifest(_mutate(lambda o: o["files"][0].update(offset=-1)))


def test_unknown_schema_version_says_upgrade() -> None:
    with pytest.raises(UnsupportedSchemaVersionError, match="upgrade airflow-ckpt"):
        parse_manifest(_mutate(lambda o: o.update(schema_version=4)))
