"""JobSettings: the spark.airflow_ckpt.* contract, written by the operator, read by the driver."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_ckpt.errors import JobSettingsError
from airflow_ckpt.runtime import sparkconf as keys
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sparkconf import JobSettings
from airflow_ckpt.runtime.storage import open_storage


def test_what_the_operator_writes_the_driver_reads_back() -> None:
    written = JobSettings(
        job="orders", storage_uri="s3://b/p", endpoint_url="http://127.0.0.1:9",
        region_name="eu-west-1",
        checkpoint_config=CheckpointConfig.from_dict({"interval": "5 s", "num-retained": 3}),
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 2},
        restore="chk-7", workdir="/w", state_partitions=4, allow_source_changes=True,
        attempt=3, run_id="run-1")
    conf = written.to_conf()
    assert all(key.startswith(keys.CONF_PREFIX) for key in conf)
    assert JobSettings.from_conf(conf.get) == written


def test_arguments_win_over_the_confs_and_unset_values_take_defaults() -> None:
    conf = {keys.JOB: "from-conf", keys.STORAGE: "file:///s", keys.RESTORE: "none"}
    settings = JobSettings.from_conf(conf.get, job="given", restore=None)
    assert (settings.job, settings.restore, settings.attempt) == ("given", "none", 1)
    assert settings.checkpoint_config == CheckpointConfig()
    assert settings.restart_strategy == {}


def test_every_bad_key_is_named_with_where_to_record_it() -> None:
    conf = {
        keys.JOB: "orders", keys.STORAGE: "file:///s", keys.RUN_ID: "run-1",
        keys.CHECKPOINT_CONFIG: '{"interval": "soon"}',
        keys.RESTART_STRATEGY: "[1]",
        keys.RESCALE_PARTITIONS: "0",
        keys.ATTEMPT: "two",
        keys.ALLOW_SOURCE_CHANGES: "yes",
    }
    with pytest.raises(JobSettingsError) as err:
        JobSettings.from_conf(conf.get)
    assert set(err.value.problems) == {
        "checkpoint_config.interval", "restart_strategy.<json>",
        keys.RESCALE_PARTITIONS, keys.ATTEMPT, keys.ALLOW_SOURCE_CHANGES}
    where = err.value.settings
    assert where is not None
    assert (where.job, where.storage_uri, where.run_id) == ("orders", "file:///s", "run-1")


@pytest.mark.parametrize("partitions", ["100000", str(keys.MAX_STATE_PARTITIONS + 1)])
def test_a_rescale_past_the_upper_bound_is_refused_before_anything_runs(
        partitions: str) -> None:
    # 100000 was accepted and repartitioned for hours holding the lease (issue 29)
    conf = {keys.JOB: "orders", keys.STORAGE: "file:///s", keys.RESCALE_PARTITIONS: partitions}
    with pytest.raises(JobSettingsError) as err:
        JobSettings.from_conf(conf.get)
    assert str(keys.MAX_STATE_PARTITIONS) in err.value.problems[keys.RESCALE_PARTITIONS]
    conf[keys.RESCALE_PARTITIONS] = str(keys.MAX_STATE_PARTITIONS)
    assert JobSettings.from_conf(conf.get).state_partitions == keys.MAX_STATE_PARTITIONS


def test_without_a_valid_job_or_storage_there_is_nowhere_to_record() -> None:
    with pytest.raises(JobSettingsError) as err:
        JobSettings.from_conf({keys.JOB: "bad name!"}.get)
    assert keys.STORAGE in err.value.problems
    assert err.value.settings is None


def test_the_driver_records_invalid_settings_as_its_final_failure(tmp_path: Path) -> None:
    """The supervisor reads a job_failed of its run and does not resubmit a driver whose
    settings can never work; the record goes to the storage the settings name."""
    conf = {keys.JOB: "orders", keys.STORAGE: tmp_path.as_uri(), keys.RUN_ID: "run-1",
            keys.CHECKPOINT_CONFIG: '{"interval": "soon"}'}
    spark = SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: conf.get(key)))
    with pytest.raises(JobSettingsError):
        CheckpointedJob(spark)  # type: ignore[arg-type]
    [failed] = JobHistory(open_storage(tmp_path.as_uri()), "orders").events()
    assert (failed.type, failed.data["run_id"]) == (ev.JOB_FAILED, "run-1")
    assert "checkpoint_config.interval" in failed.data["cause"]
