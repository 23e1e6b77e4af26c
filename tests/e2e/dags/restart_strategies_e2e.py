"""E2E: the supervisor under each restart strategy, driving a tiny real PySpark job.

Each task submits ``tests/e2e/jobs/flaky_job.py`` (fails on attempts <= N) with one
restart strategy; the job names get the run's ``prefix`` so runs never share history.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "flaky_job.py")
FAST = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"}

with DAG(
    dag_id="restart_strategies_e2e",
    schedule=None,
    render_template_as_native_obj=True,
    params={"storage": "file:///tmp/unset", "prefix": "e2e", "master": "local[1]"},
):
    common = {
        "application": JOB,
        "checkpoint_storage": "{{ params.storage }}",
        "master": "{{ params.master }}",
        "restore": "none",
    }
    # fails every time: 1 + 1 restart, then the strategy says no
    CheckpointedSparkSubmitOperator(
        task_id="fixed_delay",
        job_name="{{ params.prefix }}-fixed",
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 1,
                          "fixed-delay.delay": "100 ms"},
        conf={**FAST, "spark.test.fail_attempts": "99"},
        **common,
    )
    # at most 2 failures per 30 minutes: the third failure exceeds the rate (a 1 min
    # interval made the test depend on the machine's speed: at load ~10 three failing
    # submissions once spread over more than a minute and a fourth attempt was granted)
    CheckpointedSparkSubmitOperator(
        task_id="failure_rate",
        job_name="{{ params.prefix }}-rate",
        restart_strategy={"type": "failure-rate",
                          "failure-rate.max-failures-per-interval": 2,
                          "failure-rate.failure-rate-interval": "30 min",
                          "failure-rate.delay": "100 ms"},
        conf={**FAST, "spark.test.fail_attempts": "99"},
        **common,
    )
    # fails 3 times with growing delays, then succeeds
    CheckpointedSparkSubmitOperator(
        task_id="exponential_delay",
        job_name="{{ params.prefix }}-expo",
        restart_strategy={"type": "exponential-delay",
                          "exponential-delay.initial-backoff": "100 ms",
                          "exponential-delay.max-backoff": "300 ms",
                          "exponential-delay.backoff-multiplier": 2.0,
                          "exponential-delay.jitter-factor": 0.0,
                          "exponential-delay.attempts-before-reset-backoff": 10},
        conf={**FAST, "spark.test.fail_attempts": "3"},
        **common,
    )
