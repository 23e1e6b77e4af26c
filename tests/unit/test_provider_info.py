"""get_provider_info() is valid against Airflow's own provider-info schema, and declares
the ``[airflow_ckpt]`` options the code reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import airflow
import jsonschema

from airflow_ckpt.get_provider_info import get_provider_info
from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.plugins.settings import CONFIG_SECTION

SCHEMA = Path(airflow.__file__).parent / "provider_info.schema.json"


def test_provider_info_is_valid_against_airflows_schema() -> None:
    jsonschema.validate(get_provider_info(), json.loads(SCHEMA.read_text()))


def test_config_declares_every_option_the_plugin_reads() -> None:
    source = (Path(__file__).parents[2] / "airflow_ckpt/plugins/settings.py").read_text()
    options = get_provider_info()["config"][CONFIG_SECTION]["options"]
    read = set(re.findall(r'conf\.get\w*\(CONFIG_SECTION, "(\w+)"', source))
    assert read == set(options)
    assert float(options["stale_checkpoint_multiple"]["default"]) == DEFAULT_MULTIPLE
    assert options["history_limit"]["default"] == "1000"
