"""CheckpointStoreHook resolves ``aws`` connections the way the Amazon provider does.

With the Amazon provider (the dev install has it) ``role_arn`` really assumes the role
(against the moto server's STS), ``aws_session_token`` travels, a missing connection warns;
without it (simulated by hiding the module) the extras that need it are refused instead of
silently ignored.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.hooks import checkpoint_store
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.runtime import masking, sparkconf
from airflow_ckpt.testing import S3Endpoint

needs_amazon = pytest.mark.skipif(not checkpoint_store.amazon_provider_installed(),
                                  reason="apache-airflow-providers-amazon is not installed")


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **conn: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **conn}))


def logs(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> str:
    """What was logged: Airflow's structlog writes task-hook logs to stdout, not caplog."""
    return caplog.text + capsys.readouterr().out


@pytest.fixture
def without_amazon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import airflow.providers.amazon...`` fail, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    assert not checkpoint_store.amazon_provider_installed()


@pytest.fixture(autouse=True)
def _forget_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masking, "_registered", set())


@pytest.mark.parametrize("amazon", [
    pytest.param(True, marks=needs_amazon), False])
def test_static_keys_become_driver_env_and_settings_become_conf(
    amazon: bool, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if not amazon:
        request.getfixturevalue("without_amazon")
    set_conn(monkeypatch, "ckpt_s3", login="AKIDEXAMPLE", password="s3cr3t-value",
             extra={"endpoint_url": "http://127.0.0.1:1", "region_name": "eu-west-1"})
    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_s3")
    assert hook.job_env() == {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                              "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}
    assert hook.job_conf() == {sparkconf.ENDPOINT_URL: "http://127.0.0.1:1",
                               sparkconf.REGION_NAME: "eu-west-1"}
    assert hook.settings.source == "connection" and not hook.settings.temporary
    # resolving registered the secrets for masking
    assert masking.mask_secrets("key s3cr3t-value") == "key ***"


@needs_amazon
def test_session_token_is_passed_and_flagged_temporary(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    set_conn(monkeypatch, "ckpt_tmp", login="ASIAEXAMPLE", password="secret-of-the-session",
             extra={"aws_session_token": "token-of-the-session", "region_name": "us-east-1"})
    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_tmp")
    with caplog.at_level(logging.WARNING):
        env = hook.job_env()
    assert env["AWS_SESSION_TOKEN"] == "token-of-the-session"
    logged = logs(caplog, capsys)
    assert "temporary AWS credentials" in logged and "ExpiredToken" in logged


@needs_amazon
@pytest.mark.moto_only("assumes a role through moto's STS")
def test_role_arn_is_assumed_through_sts(
    s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``role_arn`` used to be ignored (the base keys went to the driver); now the
    Amazon provider assumes the role and the driver gets the role's session."""
    set_conn(monkeypatch, "ckpt_role", login=s3_endpoint.access_key_id,
             password=s3_endpoint.secret_access_key, extra={
                 "role_arn": "arn:aws:iam::123456789012:role/ckpt-writer",
                 "region_name": s3_endpoint.region_name,
                 "endpoint_url": s3_endpoint.url,
                 "service_config": {"sts": {"endpoint_url": s3_endpoint.url}},
             })
    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_role")
    env = hook.job_env()
    assert hook.settings.source == "assumed-role"
    assert env["AWS_SESSION_TOKEN"]
    assert env["AWS_ACCESS_KEY_ID"] != s3_endpoint.access_key_id
    assert hook.settings.expires is not None
    assert hook.job_conf()[sparkconf.ENDPOINT_URL] == s3_endpoint.url


def test_driver_credentials_environment_hands_over_nothing(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    set_conn(monkeypatch, "ckpt_irsa", login="AKIDEXAMPLE", password="s3cr3t-value",
             extra={"driver_credentials": "environment", "region_name": "eu-west-1"})
    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_irsa")
    assert hook.job_env() == {}
    assert hook.job_conf() == {sparkconf.REGION_NAME: "eu-west-1"}


def test_bad_driver_credentials_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "ckpt_bad", extra={"driver_credentials": "copy"})
    with pytest.raises(ConfigError, match="driver_credentials"):
        CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_bad").job_env()


@pytest.mark.usefixtures("without_amazon")
def test_without_amazon_extras_that_need_it_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "ckpt_role", login="AKIDEXAMPLE", password="s3cr3t-value",
             extra={"role_arn": "arn:aws:iam::123456789012:role/x", "profile_name": "p"})
    with pytest.raises(ConfigError) as err:
        CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_role").job_env()
    message = str(err.value)
    assert "role_arn" in message and "profile_name" in message
    assert "airflow-ckpt[amazon]" in message


@pytest.mark.parametrize("amazon", [
    pytest.param(True, marks=needs_amazon), False])
def test_missing_connection_warns_and_hands_over_nothing(
    amazon: bool, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not amazon:
        request.getfixturevalue("without_amazon")
    hook = CheckpointStoreHook("s3://bucket/prefix", conn_id="no_such_conn")
    with caplog.at_level(logging.WARNING):
        assert hook.job_env() == {}
    warned = [line for line in logs(caplog, capsys).splitlines() if "no_such_conn" in line]
    assert warned and all("warning" in line.lower() for line in warned)


def test_file_storage_needs_no_connection() -> None:
    hook = CheckpointStoreHook("file:///tmp/x", conn_id="no_such_conn")
    assert hook.job_env() == {} and hook.job_conf() == {} and hook.storage_options() == {}


def test_resolved_secrets_are_masked_in_airflow_task_logs(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark hook's own log mask misses AWS_SESSION_TOKEN; Airflow's secrets masker
    (which redacts every task-log line, spark-submit's output included) gets the values
    as soon as the hook resolves them."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    token = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN"
    set_conn(monkeypatch, "ckpt_mask", login="ASIAEXAMPLEMASK", password="secret-to-mask-1",
             extra={"aws_session_token": token})
    assert token in str(redact(f"env AWS_SESSION_TOKEN={token}x"))  # not yet known
    CheckpointStoreHook("s3://bucket/prefix", conn_id="ckpt_mask").job_env()
    line = f"spark-submit env: AWS_SESSION_TOKEN={token} secret secret-to-mask-1"
    masked = str(redact(line))
    assert token not in masked and "secret-to-mask-1" not in masked
