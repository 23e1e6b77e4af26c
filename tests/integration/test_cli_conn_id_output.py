"""``airflow-ckpt --conn-id ... -o json``: stdout is the JSON alone.

Airflow, imported for ``--conn-id``, configures its logging to the process's stdout, and
boto3's "Found credentials in environment variables" came out there in front of the
JSON (found by tests/e2e/test_examples_from_wheel.py); it now goes nowhere (issue 27:
every call with --conn-id printed it). A real subprocess (Airflow's
logging is configured once per process) against the session's S3 server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_ckpt.testing import S3Endpoint

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_json_output_with_an_airflow_connection(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bucket = f"conn-{uuid.uuid4().hex[:8]}"
    s3_endpoint.create_bucket(bucket)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_"))}
    env.update({
        "PYTHONPATH": str(ROOT),
        "AIRFLOW_HOME": str(tmp_path),
        # no secrets in the connection: boto3 finds them in the environment (and logs so)
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
            {"conn_type": "aws", "extra": {"endpoint_url": s3_endpoint.url,
                                           "region_name": s3_endpoint.region_name}}),
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key,
    })
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_ckpt.cli", "--storage", f"s3://{bucket}/ckpt",
             "--conn-id", "aws_default", "jobs", "-o", "json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == [], proc.stdout
        assert "Found credentials" not in proc.stderr + proc.stdout  # botocore's INFO line
    finally:
        s3_endpoint.delete_bucket(bucket)
