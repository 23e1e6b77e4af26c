"""E2E: ``airflow dags test`` refuses a run whose restart strategy has initial-backoff >
max-backoff when the run is created (real Airflow, SQLite): no DAG run, no task ran,
and the message is the restart-strategy parser's. (Issue 18 item 6: it used to pass
the trigger and fail only in ``run_job``, after ``prepare_input`` had run.)"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart import parse_restart_params
from tests.fixtures.airflow_env import VENV_BIN, AirflowEnv

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "dags" / "checkpointed_streaming_job.py"
DAG_ID = "checkpointed_streaming_job"
INVERTED = {"type": "exponential-delay", "exponential-delay.initial-backoff": "2 min",
            "exponential-delay.max-backoff": "1 min"}


def test_an_inverted_backoff_is_refused_before_any_task_runs(
    airflow_env: AirflowEnv, tmp_path: Path
) -> None:
    input_dir = tmp_path / "input"  # prepare_input, the first task, would create it
    conf = {"restart_strategy": INVERTED, "input_dir": str(input_dir),
            "storage": (tmp_path / "ckpt").as_uri()}
    env = {**airflow_env.env, "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLE.parent)}
    proc = subprocess.run(
        [str(VENV_BIN / "airflow"), "dags", "test", DAG_ID, "-f", str(EXAMPLE),
         "-c", json.dumps(conf)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    with pytest.raises(ConfigError) as parsed:
        parse_restart_params(INVERTED)
    for line in str(parsed.value).splitlines():  # the parser's message, line by line
        assert line in output, output[-3000:]
    assert "Invalid input for param restart_strategy" in output
    with sqlite3.connect(airflow_env.db) as db:
        runs = db.execute("SELECT count(*) FROM dag_run WHERE dag_id = ?", (DAG_ID,)).fetchone()
        tasks = db.execute("SELECT count(*) FROM task_instance WHERE dag_id = ?",
                           (DAG_ID,)).fetchone()
    assert runs == (0,) and tasks == (0,)
    assert not input_dir.exists()
