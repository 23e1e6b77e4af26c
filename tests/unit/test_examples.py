"""``airflow-ckpt examples``: copying the shipped examples, the settings, the command line.

The S3 side (a missing bucket, ``--create-bucket``) is in
tests/integration/test_examples_storage.py, and from the wheel in
tests/e2e/test_examples_from_wheel.py.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_ckpt.cli import main
from airflow_ckpt.examples import (
    DAGS_DIR,
    JOBS_DIR,
    MAIN_DAG,
    ExamplesError,
    copy_examples,
    default_jobs_dir,
    settings,
)
from airflow_ckpt.examples.spark_jobs.rate_counts import expected_row
from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

SHIPPED = sorted([*DAGS_DIR.glob("*.py"), *JOBS_DIR.glob("*.py")])


def targets(dags: Path, jobs: Path) -> list[Path]:
    return sorted([dags / p.name for p in DAGS_DIR.glob("*.py")]
                  + [jobs / p.name for p in JOBS_DIR.glob("*.py")])


def test_the_package_ships_the_main_example() -> None:
    names = {p.name for p in SHIPPED}
    assert {"streaming_rate_counts.py", "savepoint_examples.py", "rate_counts.py",
            "odd_even_sums.py", "checkpointed_streaming_job.py", "kafka_counts.py"} <= names


def test_copies_then_leaves_identical_files_alone(tmp_path: Path) -> None:
    dags, jobs = tmp_path / "dags", tmp_path / "spark_jobs"
    first = copy_examples(dags, jobs)
    assert {c.action for c in first} == {"copied"}
    assert sorted(c.target for c in first) == targets(dags, jobs)
    for c in first:
        assert c.target.read_bytes() == c.source.read_bytes()
    assert not list(tmp_path.rglob(".*.tmp"))
    second = copy_examples(dags, jobs)
    assert {c.action for c in second} == {"unchanged"}


def test_refuses_to_replace_a_changed_file_and_copies_nothing(tmp_path: Path) -> None:
    dags, jobs = tmp_path / "dags", tmp_path / "spark_jobs"
    copy_examples(dags, jobs)
    edited = dags / "streaming_rate_counts.py"
    edited.write_text("# my changes\n")
    missing = jobs / "rate_counts.py"
    missing.unlink()
    with pytest.raises(ExamplesError, match="--force") as refused:
        copy_examples(dags, jobs)
    assert str(edited) in str(refused.value)
    assert edited.read_text() == "# my changes\n"
    assert not missing.exists()  # a refusal writes nothing at all
    forced = {c.target: c.action for c in copy_examples(dags, jobs, force=True)}
    assert forced[edited] == "replaced" and forced[missing] == "copied"
    assert edited.read_bytes() == (DAGS_DIR / edited.name).read_bytes()


def test_a_directory_in_the_way_is_refused_even_with_force(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    (dags / "savepoint_examples.py").mkdir(parents=True)
    with pytest.raises(ExamplesError, match="not a file"):
        copy_examples(dags, tmp_path / "jobs", force=True)


def test_settings_per_storage(tmp_path: Path) -> None:
    jobs = default_jobs_dir(tmp_path / "dags")
    assert jobs == tmp_path / "spark_jobs"
    local = settings("file:///data/ckpt", jobs, endpoint_url="http://ignored")
    assert [(s.name, s.value) for s in local] == [
        ("AIRFLOW_CKPT_STORAGE", "file:///data/ckpt"), ("AIRFLOW_CKPT_JOBS_DIR", str(jobs))]
    s3 = {s.name: s.value for s in settings("s3://b/p", jobs, endpoint_url="http://h:9000",
                                            region_name="eu-west-1")}
    assert json.loads(s3["AIRFLOW_CONN_AWS_DEFAULT"]) == {
        "conn_type": "aws", "extra": {"endpoint_url": "http://h:9000",
                                      "region_name": "eu-west-1"}}
    named = {s.name: s.value for s in settings("s3://b/p", jobs, conn_id="my_s3",
                                               endpoint_url="http://h:9000")}
    assert named["AIRFLOW_CKPT_CONN_ID"] == "my_s3" and "AIRFLOW_CONN_AWS_DEFAULT" not in named
    aws = {s.name for s in settings("s3://b/p", jobs)}
    assert aws == {"AIRFLOW_CKPT_STORAGE", "AIRFLOW_CKPT_JOBS_DIR"}


def test_export_lines_survive_the_shell(tmp_path: Path) -> None:
    [*_, conn] = settings("s3://b/p", tmp_path / "it's here",
                          endpoint_url="http://h:9000/x y")
    jobs = settings("s3://b/p", tmp_path / "it's here")[1]
    for setting in (conn, jobs):
        shell = subprocess.run(["sh", "-c", f"{setting.export_line()}; printf %s "
                                            f"\"${setting.name}\""],
                               capture_output=True, text=True, check=True)
        assert shell.stdout == setting.value


def test_command_needs_no_storage_and_prints_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CKPT_STORAGE", raising=False)
    out = io.StringIO()
    assert main(["examples", str(tmp_path / "dags")], out=out) == 0
    text = out.getvalue()
    assert "export AIRFLOW_CKPT_STORAGE=file:///tmp/airflow-ckpt/checkpoints" in text
    assert f"export AIRFLOW_CKPT_JOBS_DIR={tmp_path / 'spark_jobs'}" in text
    assert f"airflow dags test {MAIN_DAG} -c '{{\"rows_per_second\": 10}}'" in text
    assert "keep rows_per_second when you restore" in text
    assert (tmp_path / "spark_jobs" / "rate_counts.py").is_file()


def test_storage_options_also_after_the_command(tmp_path: Path) -> None:
    out = io.StringIO()
    root = tmp_path / "ckpt"
    assert main(["examples", str(tmp_path / "dags"), "--storage", root.as_uri(),
                 "--jobs-dir", str(tmp_path / "jobs")], out=out) == 0
    assert f"export AIRFLOW_CKPT_STORAGE={root.as_uri()}" in out.getvalue()
    assert (tmp_path / "jobs" / "rate_counts.py").is_file()


def test_bad_storage_uri_and_refusal_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--storage", "s3:/x", "examples", str(tmp_path / "dags")]) == 1
    assert "s3://<bucket>" in capsys.readouterr().err
    assert not (tmp_path / "dags").exists()
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "savepoint_examples.py").write_text("# mine\n")
    assert main(["examples", str(tmp_path / "dags")], out=io.StringIO()) == 1
    assert "refusing to replace" in capsys.readouterr().err


def test_the_main_dag_runs_the_rate_job_with_its_params() -> None:
    bag = DagBag(dag_folder=str(DAGS_DIR / "streaming_rate_counts.py"))
    assert bag.import_errors == {}
    dag = bag.dags[MAIN_DAG]
    op = dag.task_dict["run_job"]
    assert isinstance(op, CheckpointedSparkSubmitOperator)
    assert op.application == str(JOBS_DIR / "rate_counts.py")
    assert op.conf["spark.airflow_ckpt.demo.rows_per_second"] == "{{ params.rows_per_second }}"
    assert op.restore == "{{ params.restore }}"
    assert dag.params["rows_per_second"] == 10 and dag.params["job_name"] == "rate-counts"


def test_every_example_dag_that_runs_a_job_allows_one_run_at_a_time() -> None:
    """Two runs of one streaming job fight over its lease (issue 27): the DAGs that
    start a job queue a second trigger instead."""
    bag = DagBag(dag_folder=str(DAGS_DIR))
    assert bag.import_errors == {}
    running = [dag for dag in bag.dags.values()
               if any(isinstance(t, CheckpointedSparkSubmitOperator) for t in dag.tasks)]
    assert {dag.dag_id for dag in running} == {
        MAIN_DAG, "checkpointed_streaming_job", "savepoint_restore", "kafka_counts"}
    assert {dag.dag_id: dag.max_active_runs for dag in running} == {
        dag.dag_id: 1 for dag in running}


def test_expected_row_is_the_sum_of_every_value_of_the_key() -> None:
    for key in range(10):
        for last in range(key, 200, 10):
            values = [v for v in range(last + 1) if v % 10 == key]
            assert expected_row(key, last) == {"key": key, "count": len(values),
                                               "sum": sum(values), "max": last}


def test_the_kafka_dag_hands_the_connector_to_spark_submit() -> None:
    """The connector goes to spark-submit as users hand it: ``packages`` at the Spark
    version the extra pins; the job gets the broker, topic and table from confs."""
    from pyspark import __version__ as spark_version

    bag = DagBag(dag_folder=str(DAGS_DIR / "kafka_counts.py"))
    assert bag.import_errors == {}
    op = bag.dags["kafka_counts"].task_dict["run_job"]
    assert isinstance(op, CheckpointedSparkSubmitOperator)
    assert op.application == str(JOBS_DIR / "kafka_counts.py")
    assert op.packages == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"
    assert op.conf["spark.airflow_ckpt.demo.topic"] == "{{ params.topic }}"
