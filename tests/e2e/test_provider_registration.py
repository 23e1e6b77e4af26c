"""The installed distribution registers with Airflow: `airflow providers list` and
`airflow plugins` (real CLI, temp AIRFLOW_HOME)."""

from __future__ import annotations

import json
import subprocess

import pytest

from airflow_ckpt import __version__
from tests.fixtures.airflow_env import VENV_BIN, AirflowEnv

pytestmark = pytest.mark.e2e


def airflow(env: AirflowEnv, *args: str) -> str:
    proc = subprocess.run([str(VENV_BIN / "airflow"), *args], env=env.env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_airflow_providers_list_shows_the_provider(airflow_env: AirflowEnv) -> None:
    providers = json.loads(airflow(airflow_env, "providers", "list", "--output", "json"))
    ours = [p for p in providers if p["package_name"] == "airflow-ckpt"]
    assert ours and ours[0]["version"] == __version__
    info = airflow(airflow_env, "providers", "get", "airflow-ckpt", "--full", "--output", "json")
    for module in ("airflow_ckpt.hooks.checkpoint_store",
                   "airflow_ckpt.operators.checkpointed_spark_submit",
                   "airflow_ckpt.sensors.checkpoint", "airflow_ckpt.triggers.checkpoint"):
        assert module in info


def test_airflow_plugins_lists_the_history_view(airflow_env: AirflowEnv) -> None:
    plugins = json.loads(airflow(airflow_env, "plugins", "--output", "json"))
    assert any(p["name"] == "airflow_ckpt" for p in plugins), plugins


def test_airflow_config_knows_the_airflow_ckpt_options(airflow_env: AirflowEnv) -> None:
    """The provider's ``config`` section reaches ``airflow config`` (defaults included)."""
    listed = airflow(airflow_env, "config", "list", "--section", "airflow_ckpt", "--defaults")
    for option in ("storage_uri", "storage_conn_id", "history_limit"):
        assert option in listed, listed
    value = airflow(airflow_env, "config", "get-value", "airflow_ckpt", "history_limit")
    assert value.strip() == "1000"
