"""E2E: deferred supervision under a real scheduler and triggerer (test_real_supervision.py).

The example job ``spark_jobs/odd_even_sums.py`` in continuous mode (a processing-time
trigger: it runs until stopped) over the files in ``params.input_dir``, exactly-once
output in ``<storage>/_output/<job>``. The test kills its driver with SIGKILL and the
triggerer in the middle, then stops the job through the control channel
(stop-with-savepoint), which ends the task successfully. The driver's wall clock runs an
hour ahead of the Airflow processes' (``tests/e2e/clock_ahead/sitecustomize.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

JOB = str(Path(__file__).resolve().parents[3] / "spark_jobs" / "odd_even_sums.py")
#: the driver's wall clock runs an hour ahead of the Airflow processes' (issue 19 B)
CLOCK_AHEAD = str(Path(__file__).resolve().parents[1] / "clock_ahead")
DEMO = "spark.airflow_ckpt.demo."

with DAG(
    dag_id="real_supervision_e2e",
    schedule=None,
    render_template_as_native_obj=True,
    params={"storage": "file:///tmp/unset", "job": "e2e", "input_dir": "/tmp/unset"},
):
    CheckpointedSparkSubmitOperator(
        task_id="supervised",
        application=JOB,
        application_args=["--continuous"],
        job_name="{{ params.job }}",
        checkpoint_storage="{{ params.storage }}",
        checkpoint_config={"execution.checkpointing.interval": "1 s",
                           "execution.checkpointing.num-retained": 3},
        master="local[1]",
        restore="latest",
        # no restart delay: the resumed task resubmits at once and defers on the next
        # driver. A short deferred delay trips apache/airflow#72716 (Airflow 3.3: the
        # scheduler drains the stale "success" of the deferring workload after the resumed
        # one is RUNNING and fails the task); the deferred delay is covered by
        # tests/e2e/test_supervisor.py and the unit tests
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 2,
                          "fixed-delay.delay": "0 s"},
        conf={DEMO + "input": "{{ params.input_dir }}", "spark.ui.enabled": "false",
              "spark.sql.shuffle.partitions": "1"},
        env_vars={"PYTHONPATH": os.pathsep.join(filter(None, [
                      CLOCK_AHEAD, os.environ.get("PYTHONPATH")])),
                  "AIRFLOW_CKPT_E2E_CLOCK_OFFSET_S": "3600"},
        deferrable=True,
        poll_interval=0.5,
        retries=0,
    )
