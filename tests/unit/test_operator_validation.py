"""CheckpointedSparkSubmitOperator: arguments are validated before anything is submitted."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt.driver_output import summarize_driver_output
from airflow_ckpt.operators import CheckpointedJobConfigError, CheckpointedSparkSubmitOperator
from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.shipping import runtime_py_files


@pytest.fixture(autouse=True)
def _spark_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "yarn"}))


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records spark-submit invocations instead of running them."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    calls: list[Any] = []
    monkeypatch.setattr(SparkSubmitHook, "submit",
                        lambda self, application="", **kw: calls.append(application))
    return calls


def context() -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="d", run_id="manual__1", task_id="t", map_index=-1,
                         try_number=1)
    return {"ti": ti}


def make(tmp_path: Path, **kwargs: Any) -> CheckpointedSparkSubmitOperator:
    args: dict[str, Any] = {
        "task_id": "job",
        "application": "job.py",
        "job_name": "job-a",
        "checkpoint_storage": (tmp_path / "ckpt").as_uri(),
        **kwargs,
    }
    return CheckpointedSparkSubmitOperator(**args)


def test_bad_params_fail_before_submit_naming_every_key(
    tmp_path: Path, submitted: list[Any]
) -> None:
    op = make(
        tmp_path,
        checkpoint_config={"execution.checkpointing.interval": "soon", "num-retained": 0,
                           "bogus": 1},
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": -1,
                          "fixed-delay.nope": "1 s"},
    )
    with pytest.raises(CheckpointedJobConfigError) as err:
        op.execute(context())  # type: ignore[arg-type]
    message = str(err.value)
    for key in ("checkpoint_config.execution.checkpointing.interval",
                "checkpoint_config.num-retained", "checkpoint_config.bogus",
                "restart_strategy.fixed-delay.attempts", "restart_strategy.fixed-delay.nope"):
        assert key in message
    assert submitted == []
    assert not (tmp_path / "ckpt").exists()  # nothing written either


def test_bad_job_storage_and_restore(tmp_path: Path, submitted: list[Any]) -> None:
    op = make(tmp_path, job_name="bad name!", checkpoint_storage="ftp://x/y")
    with pytest.raises(CheckpointedJobConfigError) as err:
        op.execute(context())  # type: ignore[arg-type]
    assert set(err.value.problems) == {"job_name", "checkpoint_storage"}
    assert submitted == []


def test_restore_path_must_exist(tmp_path: Path, submitted: list[Any]) -> None:
    op = make(tmp_path, restore="savepoints/sp-missing")
    with pytest.raises(CheckpointedJobConfigError) as err:
        op.execute(context())  # type: ignore[arg-type]
    assert "restore" in err.value.problems
    assert submitted == []


def test_config_error_is_not_retried_by_airflow(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException):
        make(tmp_path, restart_strategy={"type": "nope"}).validate_arguments()


@pytest.mark.parametrize(
    "value",
    [
        {"type": "fixed-delay", "fixed-delay.attempts": 2},
        '{"type": "fixed-delay", "fixed-delay.attempts": 2}',
        "{'type': 'fixed-delay', 'fixed-delay.attempts': 2}",  # non-native rendering
    ],
)
def test_restart_strategy_forms(tmp_path: Path, value: Any) -> None:
    args = make(tmp_path, restart_strategy=value).validate_arguments()
    assert args.strategy.name == "fixed-delay"
    assert args.restart_params["fixed-delay.attempts"] == 2


def test_not_a_dict(tmp_path: Path) -> None:
    with pytest.raises(CheckpointedJobConfigError) as err:
        make(tmp_path, restart_strategy="[1, 2]").validate_arguments()
    assert "restart_strategy" in err.value.problems


def test_native_template_rendering(tmp_path: Path) -> None:
    from airflow.sdk import DAG, Param

    strategy = {"type": "failure-rate", "failure-rate.max-failures-per-interval": 3}
    with DAG("native", render_template_as_native_obj=True, schedule=None,
             params={"restart_strategy": Param(strategy, type="object")}) as dag:
        op = make(tmp_path, restart_strategy="{{ params.restart_strategy }}",
                  checkpoint_config={"num-retained": "{{ 1 + 2 }}"})
    op.render_template_fields({"params": dag.params.dump()},  # type: ignore[arg-type]
                              jinja_env=dag.get_template_env())
    assert op.restart_strategy == strategy
    assert op.validate_arguments().checkpoint_config.num_retained == 3


def test_confs_env_and_master_override(
    tmp_path: Path, submitted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    # the operator leaves a Python the task's environment already names alone
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    op = make(tmp_path, master="local[2]", conf={"spark.user.key": "kept"},
              env_vars={"USER_VAR": "1"}, restore="none",
              checkpoint_config={"interval": "1 s"})
    result = op.execute(context())  # type: ignore[arg-type]
    assert submitted == ["job.py"]
    assert result["checkpoint_id"] is None and result["job"] == "job-a"
    # the hook of the last submission
    hook = op._hook
    assert hook is not None
    cmd = hook._build_spark_submit_command("job.py")
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert not hook._is_yarn
    confs = dict(c.split("=", 1) for c in cmd[1:] if "=" in c and c.startswith("spark."))
    assert confs["spark.user.key"] == "kept"
    assert confs[sparkconf.JOB] == "job-a"
    assert confs[sparkconf.RESTORE] == "none"
    assert confs[sparkconf.ATTEMPT] == "1"
    assert confs[sparkconf.RUN_ID] == "d/manual__1/t"
    assert json.loads(confs[sparkconf.CHECKPOINT_CONFIG])[
        "execution.checkpointing.interval"] == "1 s"
    assert json.loads(confs[sparkconf.RESTART_STRATEGY])["type"] == "exponential-delay"
    py_files = cmd[cmd.index("--py-files") + 1]
    assert py_files.endswith(".zip")
    env = hook._env or {}
    assert env["USER_VAR"] == "1"
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    # the user's arguments are restored after execute (re-runs start from them)
    assert op.conf == {"spark.user.key": "kept"}
    assert op.env_vars == {"USER_VAR": "1"}


def test_aws_connection_becomes_env_not_conf(
    tmp_path: Path, submitted: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_S3", json.dumps({
        "conn_type": "aws", "login": "AKIDEXAMPLE", "password": "s3cr3t",
        "extra": {"endpoint_url": "http://127.0.0.1:1", "region_name": "eu-west-1"},
    }))
    from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook

    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_s3")
    assert hook.job_env() == {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                              "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    assert hook.job_conf() == {sparkconf.ENDPOINT_URL: "http://127.0.0.1:1",
                               sparkconf.REGION_NAME: "eu-west-1"}
    assert hook.storage_options()["endpoint_url"] == "http://127.0.0.1:1"
    assert CheckpointStoreHook(tmp_path.as_uri(), conn_id="ckpt_s3").job_env() == {}


def test_summarize_python_traceback() -> None:
    lines = [
        "25/01/01 10:00:00 INFO SparkContext: Running Spark version 4.2.0",
        "Traceback (most recent call last):",
        '  File "job.py", line 3, in <module>',
        "    boom()",
        "ValueError: first",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "job.py", line 5, in <module>',
        "RuntimeError: the real cause",
        "25/01/01 10:00:01 INFO ShutdownHookManager: Shutdown hook called",
    ]
    cause, block = summarize_driver_output(lines, 1)
    assert cause == "RuntimeError: the real cause (exit code 1)"
    assert block[0].startswith("Traceback") and block[-1] == "RuntimeError: the real cause"


def test_summarize_hard_exit() -> None:
    lines = [f"25/01/01 10:00:0{i} INFO Executor: batch {i}" for i in range(5)]
    cause, block = summarize_driver_output([*lines, "exiting: input gone"], 17)
    assert cause == "driver exited with code 17"
    assert block == ["exiting: input gone"]  # INFO lines are not error lines


def test_runtime_zip_is_cached_and_complete(tmp_path: Path) -> None:
    first = runtime_py_files(tmp_path)
    assert runtime_py_files(tmp_path) == first
    names = zipfile.ZipFile(first).namelist()
    assert "airflow_ckpt/__init__.py" in names
    assert "airflow_ckpt/runtime/history/restart_log.py" in names
    assert "airflow_ckpt/restart/__init__.py" in names
    assert not any("__pycache__" in n for n in names)
