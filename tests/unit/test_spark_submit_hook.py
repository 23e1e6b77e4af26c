"""CheckpointedSparkSubmitHook: an attempt's conf, py-files and environment."""

from __future__ import annotations

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_ckpt.hooks.spark_submit import CheckpointedSparkSubmitHook, master_given


def hook(**kwargs: object) -> CheckpointedSparkSubmitHook:
    with master_given():
        built = SparkSubmitHook(conn_id="spark_default", **kwargs)  # type: ignore[arg-type]
    return CheckpointedSparkSubmitHook.adopt(built, master="local[1]")


def test_an_attempt_submits_its_own_conf_and_masks_its_credentials() -> None:
    h = hook(conf={"spark.user": "1"}, env_vars={"USER_VAR": "x"})
    h.use_attempt({"spark.user": "1", "spark.airflow_ckpt.attempt": "2"}, "runtime.zip",
                  {"AWS_SECRET_ACCESS_KEY": "s3cr3t-of-the-store", "USER_VAR": "x"})
    command = h._build_spark_submit_command("job.py")
    assert "spark.airflow_ckpt.attempt=2" in command
    assert command[command.index("--py-files") + 1] == "runtime.zip"
    assert h._env == {"AWS_SECRET_ACCESS_KEY": "s3cr3t-of-the-store", "USER_VAR": "x"}
    assert h.mask("key s3cr3t-of-the-store printed") == "key ****** printed"
