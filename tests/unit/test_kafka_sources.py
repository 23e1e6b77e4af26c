"""The Kafka retention check's decisions (runtime/sources/kafka.py) and the jar cache's
naming (testing/jars.py), without a broker: the broker's answers are given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airflow_ckpt.errors import FinalError, SourceDataLostError
from airflow_ckpt.runtime.sources.kafka import (
    KafkaSource,
    MissingRange,
    kafka_positions,
    missing_ranges,
    position_lines,
)
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.jars import BROKER, JarFetchError, artifact_id, connector, fetch
from tests.fixtures.snapshots import write_snapshot


def test_only_offsets_of_kafkas_shape_are_positions() -> None:
    offsets = [{"logOffset": 3}, None, "-", {"t": {"0": 5, "1": 7}}, {"t": {}}]
    assert kafka_positions(offsets) == [{"t": {"0": 5, "1": 7}}]


def test_missing_ranges_are_between_the_position_and_the_earliest_offset() -> None:
    needed = {"t": {"0": 100, "1": 100, "2": 40, "3": -2}}
    earliest = {("t", 0): 150, ("t", 1): 100, ("t", 2): 0, ("t", 3): 9}
    assert missing_ranges(needed, earliest) == [MissingRange("t", 0, 100, 150)]
    assert MissingRange("t", 0, 100, 150).describe() == "t-0: offsets 100..149 (50 records)"


def test_a_partition_the_broker_does_not_answer_for_is_not_judged_here() -> None:
    assert missing_ranges({"t": {"0": 10}}, {}) == []


@pytest.mark.parametrize(("options", "topics", "fail"), [
    ({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b"}, {"a", "b"}, True),
    ({"kafka.bootstrap.servers": "h:1", "assign": '{"a": [0, 1]}',
      "failOnDataLoss": "false"}, {"a"}, False),
    ({"kafka.bootstrap.servers": "h:1", "subscribePattern": "a.*",
      "FAILONDATALOSS": "False"}, None, False),
])
def test_source_options(options: dict[str, str], topics: set[str] | None, fail: bool) -> None:
    source = KafkaSource.from_options(options)
    assert source.client == {"bootstrap.servers": "h:1"}
    assert source.topics == (frozenset(topics) if topics is not None else None)
    assert source.fail_on_data_loss is fail
    assert source.reads(["a"]) and not source.reads(["c"])


def test_the_refusal_is_final_and_names_every_range() -> None:
    error = SourceDataLostError("file:///c/chk-3", ["t-0: offsets 1..2 (2 records)",
                                                     "t-1: offsets 5..5 (1 records)"])
    assert isinstance(error, FinalError)
    assert "chk-3" in str(error) and "t-0: offsets 1..2" in str(error)
    assert "t-1: offsets 5..5" in str(error) and "failOnDataLoss=false" in str(error)


def test_jar_names_and_the_connector_follows_spark() -> None:
    assert artifact_id("zstd-jni-1.5.7-7.jar") == "zstd-jni"
    assert artifact_id("spark-tags_2.13-4.2.0.jar") == "spark-tags_2.13"
    assert artifact_id("commons-pool2-2.13.1.jar") == "commons-pool2"
    assert connector("4.1.1").coordinate == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"


def test_positions_per_topic_partition_for_a_person() -> None:
    assert position_lines({"t": {"10": 3, "2": 7}, "a": {"0": 1}}) == [
        "a-0  next offset 1", "t-2  next offset 7", "t-10  next offset 3"]
    assert position_lines({"logOffset": 4}) is None


def test_without_maven_an_uncached_closure_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn on it
    with pytest.raises(JarFetchError,
                       match=r"kafka_2\.13:4\.4\.0 is not in .* Maven \('mvn'\) is not"):
        fetch(BROKER, tmp_path / "jars")
    assert not (tmp_path / "jars").exists() or not any((tmp_path / "jars").iterdir())


def test_a_failing_maven_leaves_nothing_half_made(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Maven that cannot reach the repository: the error carries its last lines, the
    cache holds no directory for the version (the next run fetches again)."""
    mvn = tmp_path / "bin" / "mvn"
    mvn.parent.mkdir()
    mvn.write_text("#!/bin/sh\necho 'Could not transfer artifact: Network is unreachable'\n"
                   "exit 1\n")
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", str(mvn.parent))
    with pytest.raises(JarFetchError, match="Network is unreachable"):
        fetch(BROKER, tmp_path / "jars")
    assert not BROKER.directory(tmp_path / "jars").exists()


def test_the_history_page_entry_shows_kafka_positions(file_storage: CheckpointStorage) -> None:
    from airflow_ckpt.plugins.overview import _from_manifest

    manifest = write_snapshot(file_storage, "clicks", 1)
    kafka = dataclasses.replace(manifest, source_offsets=[{"t": {"1": 9, "0": 5}}])
    assert _from_manifest(kafka, "p")["source_positions"] == [
        "t-0  next offset 5", "t-1  next offset 9"]
    files = dataclasses.replace(manifest, source_offsets=[{"logOffset": 2}])
    assert _from_manifest(files, "p")["source_positions"] == []
