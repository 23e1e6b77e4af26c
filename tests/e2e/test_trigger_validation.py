"""E2E: a run whose restart strategy has initial-backoff > max-backoff is refused when it
is triggered, before any task runs, with the restart-strategy parser's message (real
Airflow, SQLite): by ``airflow dags test`` and by the api-server's REST trigger
(``POST /api/v2/dags/{dag_id}/dagRuns``, what the UI's trigger form sends). Issue 18
item 6: it used to pass the trigger and fail only in ``run_job``, after
``prepare_input`` had run."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart import parse_restart_params
from tests.fixtures.airflow_env import VENV_BIN, AirflowEnv
from tests.fixtures.net import free_port, running_api_server

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "dags" / "checkpointed_streaming_job.py"
DAG_ID = "checkpointed_streaming_job"
INVERTED = {"type": "exponential-delay", "exponential-delay.initial-backoff": "2 min",
            "exponential-delay.max-backoff": "1 min"}


def runs(env: AirflowEnv) -> int:
    with sqlite3.connect(env.db) as db:
        return int(db.execute("SELECT count(*) FROM dag_run WHERE dag_id = ?",
                              (DAG_ID,)).fetchone()[0])


def tasks(env: AirflowEnv) -> int:
    with sqlite3.connect(env.db) as db:
        return int(db.execute("SELECT count(*) FROM task_instance WHERE dag_id = ?",
                              (DAG_ID,)).fetchone()[0])


def parser_message() -> str:
    with pytest.raises(ConfigError) as parsed:
        parse_restart_params(INVERTED)
    return str(parsed.value)


def test_an_inverted_backoff_is_refused_before_any_task_runs(
    airflow_env: AirflowEnv, tmp_path: Path
) -> None:
    input_dir = tmp_path / "input"  # prepare_input, the first task, would create it
    before = runs(airflow_env), tasks(airflow_env)
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
    for line in parser_message().splitlines():  # the parser's message, line by line
        assert line in output, output[-3000:]
    assert "Invalid input for param restart_strategy" in output
    assert (runs(airflow_env), tasks(airflow_env)) == before
    assert not input_dir.exists()


@pytest.fixture(scope="module")
def api_server(airflow_env: AirflowEnv, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[str]:
    """The real api-server (no-login SimpleAuthManager) over the example DAGs, stored
    serialised as the dag-processor would; it never parses the DAG files itself."""
    log = tmp_path_factory.mktemp("trigger") / "api-server.log"
    port = free_port()
    env = {**airflow_env.env, "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLE.parent),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    with running_api_server(VENV_BIN / "airflow", env, port, log) as url:
        yield url


def trigger(url: str, conf: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{url}/api/v2/dags/{DAG_ID}/dagRuns", method="POST",
        data=json.dumps({"logical_date": None, "conf": conf}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_rest_trigger_refuses_an_inverted_backoff(
    api_server: str, airflow_env: AirflowEnv
) -> None:
    before = runs(airflow_env)
    status, body = trigger(api_server, {"restart_strategy": INVERTED})
    assert status == 400, body
    assert body["detail"] == f"Invalid input for param restart_strategy: {parser_message()}"
    fixed = {**INVERTED, "exponential-delay.max-backoff": "2 min"}
    status, body = trigger(api_server, {"restart_strategy": fixed})
    assert status == 200, body  # created (queued: no scheduler runs it here)
    assert runs(airflow_env) == before + 1  # the refused trigger created none
