"""A restart strategy the parser refuses is refused when the run is triggered, with the
parser's message: through Airflow's own validation code (the SDK ``Param`` a task start
resolves, and the serialized DAG's params as the api-server's ``create_dagrun`` and
``dag.test()`` validate them), the cross-field rule (initial-backoff <= max-backoff)
included, which JSON Schema alone cannot express."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.exceptions import ParamValidationError as ServerParamValidationError
from airflow.sdk import Param
from airflow.sdk.exceptions import ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization
from jsonschema import Draft202012Validator, FormatChecker

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart import parse_restart_params, restart_params_json_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "checkpointed_streaming_job.py"
BACKOFF_INVERTED = {"type": "exponential-delay", "exponential-delay.initial-backoff": "2 min",
                    "exponential-delay.max-backoff": "1 min"}


def parser_message(params: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        parse_restart_params(params)
    return str(raised.value)


def test_the_schema_alone_accepts_an_inverted_backoff() -> None:
    """Why the format checker exists: without it the trigger form let this through."""
    assert Draft202012Validator(restart_params_json_schema()).is_valid(BACKOFF_INVERTED)


@pytest.mark.parametrize("params", [
    BACKOFF_INVERTED,
    {"exponential-delay.initial-backoff": 300},  # the default max-backoff is 1 min
    {"type": "fixed-delay", "fixed-delay.atempts": 3},  # the parser's "did you mean"
    {"type": "fixed-delay", "failure-rate.delay": "1 s", "fixed-delay.delay": "soon"},
])
def test_param_resolve_gives_the_parser_message(params: dict[str, Any]) -> None:
    """The SDK Param (what every task start resolves): the parser's whole message."""
    param = Param({"type": "none"}, schema=restart_params_json_schema())
    with pytest.raises(ParamValidationError) as raised:
        param.resolve(params)
    assert str(raised.value) == parser_message(params)


def test_valid_strategies_pass_the_checker() -> None:
    checker = FormatChecker()
    validator = Draft202012Validator(restart_params_json_schema(), format_checker=checker)
    for params in [{}, {"type": "none"}, {**BACKOFF_INVERTED, "exponential-delay.max-backoff":
                                          "2 min"}, *restart_params_json_schema()["examples"]]:
        assert validator.is_valid(params), params
    assert validator.is_valid([]) is False  # "type": "object" reports a non-object


@pytest.fixture(scope="module")
def serialized_example() -> dict[str, Any]:
    bag = DagBag(dag_folder=str(EXAMPLE))
    assert bag.import_errors == {}
    return DagSerialization.to_dict(bag.dags["checkpointed_streaming_job"])


def test_trigger_time_validation_of_the_example_dag(serialized_example: dict[str, Any]) -> None:
    """What the api-server's create_dagrun (and dag.test()) runs on the serialized DAG."""
    dag = DagSerialization.from_dict(serialized_example)
    with pytest.raises(ServerParamValidationError) as raised:
        dag.params.deep_merge({"restart_strategy": BACKOFF_INVERTED}).validate()
    assert str(raised.value) == (f"Invalid input for param restart_strategy: "
                                 f"{parser_message(BACKOFF_INVERTED)}")
    assert "initial-backoff (2 min) cannot be higher than max-backoff (1 min)" \
        in str(raised.value)
    fixed = {**BACKOFF_INVERTED, "exponential-delay.max-backoff": "2 min"}
    assert dag.params.deep_merge({"restart_strategy": fixed}).validate()["restart_strategy"] \
        == fixed


_API_SERVER = """
import json, sys
from airflow.exceptions import ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization
loaded = "airflow_ckpt.plugins.history" in sys.modules
dag = DagSerialization.from_dict(json.load(open(sys.argv[1])))
try:
    dag.params.deep_merge({"restart_strategy": json.loads(sys.argv[2])}).validate()
    outcome = "accepted"
except ParamValidationError as exc:
    outcome = str(exc)
print(json.dumps({"outcome": outcome, "plugin_loaded_first": loaded,
                  "plugin_loaded": "airflow_ckpt.plugins.history" in sys.modules,
                  "dag_file_imported": any("streaming_job" in m for m in sys.modules)}))
"""


def test_the_api_server_refuses_it_without_the_dag_file(
    serialized_example: dict[str, Any], tmp_path: Path
) -> None:
    """A fresh process that never parses the DAG file, as the api-server: deserialising
    the DAG loads Airflow's plugins (the operator's extra link), ours registers the
    checker, and the trigger-time validation refuses with the parser's message."""
    path = tmp_path / "dag.json"
    path.write_text(json.dumps(serialized_example))
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _API_SERVER, str(path),
                           json.dumps(BACKOFF_INVERTED)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["plugin_loaded_first"] is False and result["plugin_loaded"] is True
    assert result["dag_file_imported"] is False
    assert result["outcome"] == (f"Invalid input for param restart_strategy: "
                                 f"{parser_message(BACKOFF_INVERTED)}")
