"""The ``airflow_ckpt`` Airflow plugin: the checkpoint history in the Airflow UI.

Registered with the ``airflow.plugins`` entry point. It adds

* a FastAPI app, mounted by the api-server under :data:`URL_PREFIX` (``/airflow-ckpt``):
  JSON (``/jobs``, ``/jobs/{job}/checkpoints`` shaped like Flink's REST
  ``/jobs/:id/checkpoints``, ``/jobs/{job}/history``) and HTML pages (a jobs index at
  ``/`` and one page per job at ``/view/{job}``), see :mod:`airflow_ckpt.plugins.app`;
* a "Checkpoints" entry in the UI's *Browse* menu (an ``external_view``: the UI shows
  the jobs index in an iframe);
* a "Checkpoint history" extra link on every ``CheckpointedSparkSubmitOperator`` task,
  pointing at the history page of the job that task instance submitted.

Settings: :mod:`airflow_ckpt.plugins.settings`.

Importing this module is cheap (no FastAPI, no Spark provider, no storage access): the
app and the operator link are built the first time Airflow asks for them, which only
the api-server (and ``airflow plugins``) do. Task processes load plugins too.
Importing it registers the restart strategy's JSON Schema format checker
(:func:`~airflow_ckpt.restart.schema.register_format_checker`), so the api-server refuses
a triggered run whose restart strategy the parser refuses, with the parser's message.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urljoin

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from airflow_ckpt.restart.schema import register_format_checker
from airflow_ckpt.runtime.storage.layout import is_job_name

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

# The api-server validates a triggered run's params (Param schemas) without parsing DAG
# files, but it loads plugins at start: the restart strategy's format checker runs the
# parser there (airflow_ckpt.restart.schema says why).
register_format_checker()

URL_PREFIX = "/airflow-ckpt"
APP_NAME = "Checkpoint history"
NAV_NAME = "Checkpoints"


def task_history_path(dag_id: str, run_id: str, task_id: str, job: str | None = None) -> str:
    """The app-relative path that finds the job a task instance submitted (``task?...``)."""
    params = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id}
    if job:
        params["job"] = job
    return f"task?{urlencode(params)}"


def rendered_job_name(ti_key: TaskInstanceKey) -> str | None:
    """The ``job_name`` this task instance rendered (Airflow's rendered-fields table)."""
    try:
        from airflow.models.renderedtifields import RenderedTaskInstanceFields

        fields = RenderedTaskInstanceFields.get_templated_fields(ti_key)  # type: ignore[arg-type]
    except Exception:  # no metadata DB here, or not rendered yet: the page searches
        return None
    job = (fields or {}).get("job_name")
    return job if isinstance(job, str) and is_job_name(job) else None


class CheckpointHistoryLink(BaseOperatorLink):
    """Extra link of ``CheckpointedSparkSubmitOperator``: the job's checkpoint history.

    Computed by the api-server from the task instance's key. A literal ``job_name`` goes
    into the link; a templated one is looked up in the task instance's rendered template
    fields (one row of Airflow's metadata DB), and only when that fails (not rendered
    yet, no DB) found by the page from the ``job_submitted`` history events, which record
    the submitting task instance (a search over every job).
    """

    name = "Checkpoint history"

    @property
    def operators(self) -> list[type[BaseOperator]]:  # type: ignore[override]
        """Imported on use: the plugin module must not import the Spark provider."""
        from airflow_ckpt.operators.checkpointed_spark_submit import (
            CheckpointedSparkSubmitOperator,
        )

        return [CheckpointedSparkSubmitOperator]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.configuration import conf

        job = getattr(operator, "job_name", None)
        literal = job if isinstance(job, str) and "{{" not in job else None
        if literal is None:
            literal = rendered_job_name(ti_key)
        path = task_history_path(ti_key.dag_id, ti_key.run_id, ti_key.task_id, literal)
        base = conf.get("api", "base_url", fallback="/") or "/"
        return urljoin(base.rstrip("/") + "/", f"{URL_PREFIX.strip('/')}/{path}")


class AirflowCkptPlugin(AirflowPlugin):
    """Checkpoint history pages, JSON endpoints, a nav entry and an operator extra link."""

    name = "airflow_ckpt"
    external_views = [
        {
            "name": NAV_NAME,
            # relative: the UI resolves it against its <base href> (works under a base_url)
            "href": f"{URL_PREFIX.strip('/')}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "checkpoints",
        }
    ]
    # attached to CheckpointedSparkSubmitOperator tasks when the api-server reads DAGs
    operator_extra_links = [CheckpointHistoryLink()]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Built on first use: only the api-server (and ``airflow plugins``) asks."""
        from airflow_ckpt.plugins.app import create_app

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": APP_NAME}]
