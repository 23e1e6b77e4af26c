"""CheckpointStoreHook: an Airflow ``aws`` connection -> checkpoint storage.

The connection means what it means to the Amazon provider: with
``apache-airflow-providers-amazon`` installed (``pip install 'airflow-ckpt[amazon]'``),
credentials come from ``AwsBaseHook(aws_conn_id).get_session()``, so ``role_arn`` (and
``assume_role_method``/``assume_role_kwargs``), ``profile_name``, ``aws_session_token``,
``region_name``, ``endpoint_url`` and ``service_config.s3.endpoint_url`` all apply, and a
missing connection falls back to boto3's default chain with the provider's warning.

Without the Amazon provider only login (access key id), password (secret access key) and
the extras ``aws_session_token``, ``endpoint_url``, ``region_name`` can be honoured; extras
that need it (``role_arn``, ``profile_name``, ...) raise a ``ConfigError`` saying to install
it, and a missing connection is a warning (the driver then uses its own AWS environment).

Drivers get credentials as ``AWS_*`` environment variables (:meth:`job_env`). Static keys do
not expire; temporary ones (assumed role, session token) do, and a driver that runs longer
than they live fails with ``ExpiredToken``. For long-running drivers give the driver host or
pod its own role (instance profile, IRSA, EKS Pod Identity: boto3 refreshes those itself)
and set the connection extra ``"driver_credentials": "environment"`` so no credentials are
handed over at all (see docs/storage.md, "Credentials").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from airflow.sdk import BaseHook

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.hooks import DEFAULT_CONN_ID
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.control.savepoints import DisposedSavepoint, dispose_savepoint
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.masking import register_secrets
from airflow_ckpt.runtime.sparkconf import ENDPOINT_URL, REGION_NAME
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage

#: Connection extra: how the driver gets credentials. ``"connection"`` (default): the
#: connection's credentials as ``AWS_*`` variables; ``"environment"``: none, the driver uses
#: its own AWS environment (instance profile, IRSA, ``~/.aws``), which refreshes itself.
DRIVER_CREDENTIALS_EXTRA = "driver_credentials"

#: Extras only the Amazon provider can honour; refused without it rather than ignored.
_NEEDS_AMAZON = ("role_arn", "profile_name", "assume_role_method", "assume_role_kwargs",
                 "aws_account_id", "aws_iam_role", "service_config", "session_kwargs")

_ENV_NAMES = {"access_key": "AWS_ACCESS_KEY_ID", "secret_key": "AWS_SECRET_ACCESS_KEY",
              "token": "AWS_SESSION_TOKEN"}


def amazon_provider_installed() -> bool:
    """Whether ``AwsBaseHook`` can be imported."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What a connection resolves to (secrets included: never log this object)."""

    access_key: str | None = None
    secret_key: str | None = None
    token: str | None = None
    endpoint_url: str | None = None
    region_name: str | None = None
    #: where the credentials came from: "connection", "assumed-role", "environment"...
    source: str = "environment"
    #: expiry of temporary credentials (None: static or unknown)
    expires: datetime | None = None
    driver_credentials: Literal["connection", "environment"] = "connection"

    @property
    def temporary(self) -> bool:
        return bool(self.token) or self.expires is not None


class CheckpointStoreHook(BaseHook):
    """Reads (and, for control requests and savepoint disposal, writes) the storage contract.

    :param storage_uri: ``s3://bucket/prefix`` or ``file:///path``
    :param conn_id: an ``aws``-type connection; ``aws_default`` by default
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "aws"
    hook_name = "Checkpoint store (S3-compatible)"

    def __init__(self, storage_uri: str, conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.storage_uri = storage_uri
        self.conn_id = conn_id

    @cached_property
    def settings(self) -> StoreSettings:
        """The connection's S3 settings and credentials (empty for ``file://`` or no
        ``conn_id``). The secrets are registered for masking (Airflow's task-log masker and
        :mod:`airflow_ckpt.runtime.masking`) as soon as they are read."""
        if not self.storage_uri.startswith(("s3://", "s3a://")) or not self.conn_id:
            return StoreSettings()
        if amazon_provider_installed():
            settings = self._from_aws_hook(self.conn_id)
        else:
            settings = self._from_connection(self.conn_id)
        secrets = [settings.access_key, settings.secret_key, settings.token]
        register_secrets(secrets)
        _mask_in_airflow_logs(secrets)
        return settings

    def _from_aws_hook(self, conn_id: str) -> StoreSettings:
        """Resolve with the Amazon provider: its session, its semantics."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        aws = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
        wrapper = aws.conn_config  # a missing connection: the provider warns, then empty
        extra = dict(wrapper.extra_dejson or {})
        endpoint = wrapper.get_service_endpoint_url("s3") or None
        region = aws.region_name or None
        driver = _driver_credentials(extra, conn_id)
        own = bool(wrapper.aws_access_key_id or wrapper.role_arn or wrapper.profile_name)
        if not own:  # the worker's own AWS environment: let each process resolve its own
            return StoreSettings(endpoint_url=endpoint, region_name=region,
                                 driver_credentials=driver)
        credentials = aws.get_session().get_credentials()
        if credentials is None:
            raise ConfigError("storage connection", {
                conn_id: "the Amazon provider resolved no AWS credentials from it"})
        frozen = credentials.get_frozen_credentials()
        expiry = getattr(credentials, "_expiry_time", None)
        source = ("assumed-role" if wrapper.role_arn
                  else "profile" if wrapper.profile_name else "connection")
        return StoreSettings(
            access_key=frozen.access_key, secret_key=frozen.secret_key,
            token=frozen.token or None, endpoint_url=endpoint, region_name=region,
            source=source, expires=expiry if isinstance(expiry, datetime) else None,
            driver_credentials=driver,
        )

    def _from_connection(self, conn_id: str) -> StoreSettings:
        """Without the Amazon provider: login/password/extras, refusing what needs it."""
        try:
            conn = self.get_connection(conn_id)
        except Exception as exc:  # AirflowNotFoundException; its module and, outside a
            # task (api-server, CLI), the error itself vary by Airflow version
            self.log.warning(
                "connection %r not found (%s): using this machine's AWS environment for the "
                "storage; the Spark driver gets no credentials and must find its own",
                conn_id, type(exc).__name__)
            return StoreSettings()
        extra = conn.extra_dejson or {}
        needs = sorted(k for k in _NEEDS_AMAZON if extra.get(k))
        if needs:
            raise ConfigError("storage connection", {
                f"{conn_id}.extra.{k}": "needs the Amazon provider to take effect: "
                "pip install 'airflow-ckpt[amazon]' (or apache-airflow-providers-amazon)"
                for k in needs})
        return StoreSettings(
            access_key=conn.login or None, secret_key=conn.password or None,
            token=extra.get("aws_session_token") or None,
            endpoint_url=extra.get("endpoint_url") or conn.host or None,
            region_name=extra.get("region_name") or None,
            source="connection" if conn.login else "environment",
            driver_credentials=_driver_credentials(extra, conn_id),
        )

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`open_storage` from the connection (may be empty)."""
        s = self.settings
        options = {"aws_access_key_id": s.access_key, "aws_secret_access_key": s.secret_key,
                   "aws_session_token": s.token, "endpoint_url": s.endpoint_url,
                   "region_name": s.region_name}
        return {key: value for key, value in options.items() if value}

    def job_env(self) -> dict[str, str]:
        """The credentials a Spark driver gets, as the standard ``AWS_*`` variables.

        Empty when the connection has no credentials of its own or says
        ``"driver_credentials": "environment"``: the driver then uses its own AWS
        environment (instance profile / IRSA, which refresh themselves). Temporary
        credentials (assumed role, session token) are handed over with a warning: they
        expire while a long-running driver still needs them.

        These are secrets. In client and local mode spark-submit passes them to the driver
        in its environment; on YARN and Kubernetes the Spark provider turns ``env_vars``
        into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``, which
        ``ps`` and the Spark UI show: use ``"driver_credentials": "environment"`` there.
        """
        s = self.settings
        if s.driver_credentials == "environment" or not s.access_key:
            return {}
        if s.temporary:
            until = f" (they expire at {s.expires:%Y-%m-%d %H:%M:%S %Z})" if s.expires else ""
            self.log.warning(
                "the Spark driver gets temporary AWS credentials from connection %r%s: a "
                "driver that runs longer fails with ExpiredToken. Give the driver its own "
                "role (instance profile, IRSA) and set the connection extra "
                '"%s": "environment".', self.conn_id, until, DRIVER_CREDENTIALS_EXTRA)
        values = {"access_key": s.access_key, "secret_key": s.secret_key, "token": s.token}
        return {_ENV_NAMES[k]: v for k, v in values.items() if v}

    def secret_values(self) -> list[str]:
        """The secret values this hook resolved (for :func:`~airflow_ckpt.runtime.masking.
        mask_secrets`)."""
        s = self.settings
        return [v for v in (s.access_key, s.secret_key, s.token) if v]

    def job_conf(self) -> dict[str, str]:
        """The connection's non-secret settings as ``spark.airflow_ckpt.*`` confs."""
        s = self.settings
        confs = {ENDPOINT_URL: s.endpoint_url, REGION_NAME: s.region_name}
        return {conf: value for conf, value in confs.items() if value}

    def get_conn(self) -> CheckpointStorage:
        """The opened storage (Airflow's generic hook entry point)."""
        return self.storage

    @cached_property
    def storage(self) -> CheckpointStorage:
        """The storage at ``storage_uri``, opened once per hook with the connection's options."""
        return open_storage(self.storage_uri, **self.storage_options())

    def catalog(self, job: str) -> CheckpointCatalog:
        """Completed checkpoints and savepoints of ``job``."""
        return CheckpointCatalog(self.storage, job)

    def history(self, job: str) -> JobHistory:
        """The append-only event history of ``job``."""
        return JobHistory(self.storage, job)

    def control(self, job: str) -> ControlChannel:
        """Savepoint / stop requests to the running ``job``."""
        return ControlChannel(self.storage, job)

    def list_jobs(self) -> list[str]:
        """Names of the jobs stored under ``storage_uri``."""
        return CheckpointCatalog.jobs(self.storage)

    def dispose_savepoint(
        self, job: str, savepoint_id_or_path: str, *, force: bool = False
    ) -> DisposedSavepoint:
        """Delete one savepoint of ``job`` on purpose (retention never deletes savepoints).

        Accepts the savepoint id, ``sp-<id>`` or its path/URI; refuses checkpoints. See
        :func:`airflow_ckpt.runtime.control.savepoints.dispose_savepoint`.
        """
        return dispose_savepoint(self.storage, savepoint_id_or_path, job=job, force=force)

    def close(self) -> None:
        """Release the storage's clients if it was opened."""
        if "storage" in self.__dict__:
            self.storage.close()
            del self.__dict__["storage"]


DriverCredentials = Literal["connection", "environment"]


def _driver_credentials(extra: dict[str, Any], conn_id: str) -> DriverCredentials:
    value = extra.get(DRIVER_CREDENTIALS_EXTRA, "connection")
    if value not in ("connection", "environment"):
        raise ConfigError("storage connection", {
            f"{conn_id}.extra.{DRIVER_CREDENTIALS_EXTRA}":
                f'expected "connection" or "environment", got {value!r}'})
    return "environment" if value == "environment" else "connection"


def _mask_in_airflow_logs(values: list[str | None]) -> None:
    """Register with Airflow's secrets masker (task logs), where it exists."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older Task SDKs
        return
    for value in values:
        if value:
            mask_secret(value)
