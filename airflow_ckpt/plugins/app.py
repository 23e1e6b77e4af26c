"""The FastAPI app the api-server mounts under ``/airflow-ckpt`` (see :mod:`.history`).

JSON::

    GET /jobs                       every job, its newest retained checkpoint
    GET /jobs/{job}/checkpoints     Flink REST /jobs/:id/checkpoints: counts, summary,
                                    latest completed/savepoint/failed/restored, history
    GET /jobs/{job}/history         the raw events (?type=...&limit=N), oldest first

HTML (shown in the Airflow UI's iframe; every value is escaped by Jinja's autoescape)::

    GET /                           jobs index
    GET /view/{job}                 checkpoints table + restarts/failures of one job
    GET /task?dag_id=&run_id=&task_id=[&job=]
                                    redirects to the job a task instance submitted
                                    (the operator extra link points here)

Every route requires a user who may view the Airflow website (the api-server's auth
manager decides, from the UI's session cookie or a bearer token): Airflow does not
authenticate plugin apps by itself. Jobs are further filtered by the DAGs the user may
read (:mod:`.access`). Handlers are plain functions, so FastAPI runs their blocking
storage reads in its thread pool.
"""


import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from airflow_ckpt.errors import InvalidStorageUriError, StorageError
from airflow_ckpt.formatting import human_bytes, human_ms
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.plugins import jobstate, overview
from airflow_ckpt.plugins.access import EVERY_DAG, DagAccess, access_of
from airflow_ckpt.plugins.settings import (
    CONFIG_SECTION,
    STORAGE_ENV,
    PluginSettings,
    load_settings,
)
from airflow_ckpt.runtime.history.reader import EventCache
from airflow_ckpt.runtime.storage import CheckpointStorage

HERE = Path(__file__).parent
MAX_LIMIT = 100_000
# The pages need no script; the UI's iframe sandbox allows same-origin framing only.
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'self'")


class StorageNotConfiguredError(LookupError):
    """Neither ``[airflow_ckpt] storage_uri`` nor ``$AIRFLOW_CKPT_STORAGE`` is set."""


class _Stores:
    """One opened storage per (URI, connection), shared by requests, closed at shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: dict[tuple[str, str | None], CheckpointStoreHook] = {}
        self._caches: dict[str, EventCache] = {}

    def cache(self, storage: CheckpointStorage) -> EventCache:
        """Parsed history objects of one storage (immutable, so shared by requests)."""
        with self._lock:
            return self._caches.setdefault(storage.uri, EventCache())

    def get(self, settings: PluginSettings) -> CheckpointStorage:
        if not settings.storage_uri:
            raise StorageNotConfiguredError(
                f"no checkpoint storage is configured: set [{CONFIG_SECTION}] storage_uri "
                f"(AIRFLOW__{CONFIG_SECTION.upper()}__STORAGE_URI) or ${STORAGE_ENV} for the "
                "api-server, e.g. s3://bucket/checkpoints or file:///data/checkpoints"
            )
        key = (settings.storage_uri, settings.conn_id)
        with self._lock:
            hook = self._hooks.get(key)
            if hook is None:
                hook = CheckpointStoreHook(settings.storage_uri, settings.conn_id)
                self._hooks[key] = hook
        return hook.storage

    def close(self) -> None:
        with self._lock:
            hooks, self._hooks = list(self._hooks.values()), {}
        for hook in hooks:
            hook.close()


def _ms_time(ms: Any) -> str:
    if not isinstance(ms, int | float):
        return ""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _s_time(ts: Any) -> str:
    return _ms_time(ts * 1000) if isinstance(ts, int | float) else ""


def _bytes(n: Any) -> str:
    return human_bytes(n) if isinstance(n, int) else ""


def _duration(ms: Any) -> str:
    return human_ms(ms) if isinstance(ms, int) else ""


def _age(seconds: Any) -> str:
    """``95.2`` -> ``"1 min 35 s ago"``."""
    if not isinstance(seconds, int | float):
        return ""
    s = int(seconds)
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min {s % 60} s ago"
    if s < 172_800:
        return f"{s // 3600} h {s % 3600 // 60} min ago"
    return f"{s // 86400} d {s % 86400 // 3600} h ago"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its extension
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ms_time=_ms_time, s_time=_s_time, bytes=_bytes, duration=_duration, age=_age,
                       urlpart=lambda s: quote(str(s), safe=""))
    return env


def create_app(
    settings: PluginSettings | None = None,
    *,
    authenticate: bool = True,
    dag_access: Callable[[], DagAccess] | None = None,
) -> FastAPI:
    """The plugin's app.

    :param settings: fixed settings (tests); by default ``[airflow_ckpt]`` is read per
        request, so a changed option needs no restart
    :param authenticate: require a user allowed to view the Airflow website (needs the
        api-server's auth manager) and show only jobs of DAGs the user may read; only
        tests of the bare app turn it off
    :param dag_access: without ``authenticate``: the DAGs "the user" may read (tests);
        default every DAG
    """
    stores = _Stores()
    env = _templates()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        stores.close()

    dependencies = []
    if authenticate:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
        from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view

        dependencies.append(Depends(requires_access_view(AccessView.WEBSITE)))

        def user_dags(user: GetUserDep) -> DagAccess:
            # the singleton, as requires_access_view uses: AuthManagerDep reads
            # request.app.state, which is this mounted app's state, not the api-server's
            return access_of(get_auth_manager(), user)

        readable_dags: Callable[..., DagAccess] = user_dags
    else:
        readable_dags = dag_access if dag_access is not None else (lambda: EVERY_DAG)

    app = FastAPI(
        title="airflow-ckpt checkpoint history",
        description=__doc__,
        lifespan=lifespan,
        dependencies=dependencies,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # every route needs a user; no unauthenticated schema either
    )
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def current_settings() -> PluginSettings:
        return settings if settings is not None else load_settings()

    def storage() -> CheckpointStorage:
        return stores.get(current_settings())

    def limit_of(limit: int | None) -> int:
        return limit if limit is not None else current_settings().history_limit

    def html_route(root: str) -> Any:
        """Marks an HTML route (errors become pages); ``root``: its path to the app root."""

        def mark(request: Request) -> None:
            request.state.html_root = root

        return Depends(mark)

    Storage = Annotated[CheckpointStorage, Depends(storage)]
    Access = Annotated[DagAccess, Depends(readable_dags)]

    def visible_job(store: CheckpointStorage, job: str, access: DagAccess) -> jobstate.JobState:
        return overview.require_visible_job(store, job, access, stores.cache(store))

    def visible_jobs(store: CheckpointStorage, access: DagAccess) -> list[dict[str, Any]]:
        rows = overview.jobs_overview(store, stores.cache(store),
                                      stale_multiple=current_settings().stale_multiple)
        return [row for row in rows if access.may_read(row["dag_id"])]
    Limit = Annotated[int | None, Query(ge=1, le=MAX_LIMIT,
                                        description="newest history events to read")]

    def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        body = env.get_template(name).render(**context)
        return HTMLResponse(body, status_code=status_code)

    def error(request: Request, status_code: int, message: str) -> Response:
        root = getattr(request.state, "html_root", None)
        if root is not None:
            return page("error.html", status_code, title="Checkpoint history", root=root,
                        code=status_code, message=message)
        return JSONResponse({"detail": message}, status_code=status_code)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if response.headers.get("content-type", "").startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", CSP)
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(overview.UnknownJobError)
    async def unknown_job(request: Request, exc: overview.UnknownJobError) -> Response:
        return error(request, 404, str(exc))

    @app.exception_handler(StorageNotConfiguredError)
    async def not_configured(request: Request, exc: StorageNotConfiguredError) -> Response:
        return error(request, 503, str(exc))

    @app.exception_handler(InvalidStorageUriError)
    async def bad_uri(request: Request, exc: InvalidStorageUriError) -> Response:
        return error(request, 503, str(exc))

    @app.exception_handler(StorageError)
    async def storage_failed(request: Request, exc: StorageError) -> Response:
        return error(request, 502, f"the checkpoint storage failed: {exc}")

    # ------------------------------------------------------------------------- JSON

    @app.get("/jobs", summary="Jobs in the checkpoint storage")
    def jobs(store: Storage, access: Access) -> dict[str, Any]:
        return {"storage": store.uri, "jobs": visible_jobs(store, access)}

    @app.get("/jobs/{job}/checkpoints", summary="Checkpoint statistics (Flink REST shape)")
    def checkpoints(job: str, store: Storage, access: Access,
                    limit: Limit = None) -> dict[str, Any]:
        visible_job(store, job, access)
        window = overview.read_history(store, job, limit_of(limit), cache=stores.cache(store))
        return overview.checkpoint_stats(store, job, window)

    @app.get("/jobs/{job}/history", summary="History events, oldest first")
    def history(
        job: str,
        store: Storage,
        access: Access,
        limit: Limit = None,
        type: Annotated[list[str] | None, Query(description="only these event types")] = None,
    ) -> dict[str, Any]:
        visible_job(store, job, access)
        window = overview.read_history(store, job, limit_of(limit), type or None,
                                       cache=stores.cache(store))
        return {"job": job, "events": [overview.event_json(e) for e in window.events],
                "history_window": window.describe(), "errors": window.errors}

    # ------------------------------------------------------------------------- HTML

    @app.get("/", response_class=HTMLResponse, include_in_schema=False,
             dependencies=[html_route("")])
    def index(store: Storage, access: Access) -> HTMLResponse:
        return page("index.html", title="Checkpoint history", root="", storage=store.uri,
                    jobs=visible_jobs(store, access))

    @app.get("/view/{job}", response_class=HTMLResponse, include_in_schema=False,
             dependencies=[html_route("../")])
    def job_page(job: str, store: Storage, access: Access, limit: Limit = None) -> HTMLResponse:
        view = overview.job_view(store, job, limit=limit_of(limit), access=access,
                                 cache=stores.cache(store),
                                 stale_multiple=current_settings().stale_multiple)
        return page("job.html", title=f"{job}: checkpoint history", root="../",
                    storage=store.uri, **view)

    @app.get("/task", include_in_schema=False, dependencies=[html_route("")])
    def task(
        store: Storage,
        access: Access,
        dag_id: Annotated[str, Query(max_length=250)],
        run_id: Annotated[str, Query(max_length=250)],
        task_id: Annotated[str, Query(max_length=250)],
        job: Annotated[str | None, Query(max_length=128)] = None,
    ) -> Response:
        found = None
        if not access.may_read(dag_id):
            pass  # as if it had submitted nothing: the DAG's ids do not leak
        elif job:
            try:
                found = visible_job(store, job, access).job
            except overview.UnknownJobError:
                found = None
        if found is None and access.may_read(dag_id):
            found = overview.find_job_for_task(store, dag_id, run_id, task_id,
                                               stores.cache(store))
            if found is not None and not access.may_read(
                    jobstate.job_state(store, found, stores.cache(store)).dag_id):
                found = None
        if found is None:
            raise overview.UnknownJobError(
                f"task {dag_id}/{run_id}/{task_id} has not submitted a checkpointed job to "
                f"{store.uri} (yet)"
            )
        return RedirectResponse(f"view/{quote(found, safe='')}", status_code=303)

    return app
