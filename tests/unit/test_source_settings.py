"""The sources' settings recorded with a checkpoint and compared on restore
(airflow_ckpt/runtime/sources/settings.py); the plan reading itself runs against real Spark in
tests/integration/test_source_settings_restore.py."""

from __future__ import annotations

import logging

import pytest

from airflow_ckpt.errors import FinalError, SourceSettingsChangedError
from airflow_ckpt.runtime.checkpoint.metadata import SourceSettings
from airflow_ckpt.runtime.sources.settings import (
    check_sources,
    read_sources,
    recorded_settings,
    source_changes,
)

RATE_20 = (SourceSettings("rate", {"rowsPerSecond": "20"}),)
RATE_10 = (SourceSettings("rate", {"rowsPerSecond": "10"}),)


def test_only_the_options_that_decide_what_a_batch_reads_are_recorded() -> None:
    kafka = recorded_settings("kafka", {
        "SUBSCRIBE": "orders", "maxOffsetsPerTrigger": "100", "startingOffsets": "earliest",
        "kafka.bootstrap.servers": "b:9092",
        "kafka.sasl.jaas.config": "PlainLoginModule password=hunter2"})
    # Spark's spelling whatever the job's; startingOffsets applies to a first start only
    assert kafka == SourceSettings("kafka", {"maxOffsetsPerTrigger": "100",
                                             "subscribe": "orders"})
    files = recorded_settings("json", {"path": "/in", "maxFilesPerTrigger": "1",
                                       "multiLine": "true"}, file_source=True)
    assert files == SourceSettings("json", {"maxFilesPerTrigger": "1", "path": "/in"})
    assert recorded_settings("my.Source", {"token": "secret"}) == SourceSettings("my.Source")


def test_each_change_is_named_with_its_old_and_new_value() -> None:
    old = (SourceSettings("kafka", {"subscribe": "a", "maxOffsetsPerTrigger": "5"}),
           SourceSettings("rate", {}))
    new = (SourceSettings("kafka", {"subscribe": "b"}),)
    assert source_changes(old, new) == (
        ("source 0 (kafka)", "maxOffsetsPerTrigger", "5", None),
        ("source 0 (kafka)", "subscribe", "a", "b"),
        ("source 1 (rate)", "source", "rate", None),
    )
    assert source_changes(RATE_20, (SourceSettings("text", {}),)) == (
        ("source 0 (text)", "source", "rate", "text"),)
    assert source_changes(RATE_20, RATE_20) == ()


def test_a_change_is_refused_as_final_unless_allowed(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(SourceSettingsChangedError) as err:
        check_sources(RATE_20, RATE_10, restored_from="file:///s/j/chk-3", allow_changes=False)
    assert isinstance(err.value, FinalError)  # no restart: the next one meets it too
    assert "source 0 (rate): rowsPerSecond was '20', now '10'" in str(err.value)
    assert "file:///s/j/chk-3" in str(err.value)
    assert "spark.airflow_ckpt.restore.allow-source-changes=true" in str(err.value)
    assert err.value.changes == (("source 0 (rate)", "rowsPerSecond", "20", "10"),)
    with caplog.at_level(logging.WARNING, logger="airflow_ckpt.job"):
        check_sources(RATE_20, RATE_10, restored_from="chk-3", allow_changes=True)
    assert "rowsPerSecond was '20', now '10'" in caplog.text


@pytest.mark.parametrize(("restored", "current"), [
    (None, RATE_10),   # a fresh start, or a checkpoint written before sources were recorded
    (RATE_20, None),   # the plan could not be read (no JVM behind the writer)
    (RATE_10, RATE_10),
])
def test_nothing_to_compare_or_no_change_passes(
    restored: tuple[SourceSettings, ...] | None, current: tuple[SourceSettings, ...] | None
) -> None:
    check_sources(restored, current, restored_from="chk-3", allow_changes=False)


def test_a_writer_without_a_jvm_plan_records_nothing_quietly(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Spark Connect's writer (or the simulation's) has no JVM DataFrame: nothing is
    recorded, and no warning with a traceback is logged for an expected case."""

    class ConnectWriter:  # what pyspark.sql.connect's DataStreamWriter lacks: _df._jdf
        _df = object()

    with caplog.at_level(logging.INFO, logger="airflow_ckpt"):
        assert read_sources(ConnectWriter()) is None  # type: ignore[arg-type]
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "no JVM" in caplog.records[0].getMessage()
