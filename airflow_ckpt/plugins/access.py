"""Which jobs a UI user may see: those whose DAG the user may read.

A job's DAG is the ``airflow.dag_id`` of its newest ``job_submitted`` history event (see
:mod:`.jobstate`). The auth manager answers as for Airflow's own ``/api/v2/dags`` routes
(``ReadableDagsFilterDep``): ``get_authorized_dag_ids(user=..., method="GET")``, and
``is_authorized_dag(method="GET", user=...)`` without details for "every DAG".

A job with no known DAG (started outside Airflow, e.g. ``spark-submit`` by hand) is shown
only to users who may read every DAG: its history can hold driver errors and paths that
no DAG permission covers. A job the user may not see answers 404, as an unknown job, so
its name does not leak either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DagAccess:
    """The DAGs a user may read: every one (``all_dags``) or ``dag_ids``."""

    all_dags: bool
    dag_ids: frozenset[str] = frozenset()

    def may_read(self, dag_id: str | None) -> bool:
        """Whether a job submitted by ``dag_id`` (None: not by Airflow) may be shown."""
        if self.all_dags:
            return True
        return dag_id is not None and dag_id in self.dag_ids


#: No DAG filter (the bare app in tests, ``authenticate=False``).
EVERY_DAG = DagAccess(all_dags=True)


def access_of(auth_manager: Any, user: Any) -> DagAccess:
    """Ask Airflow's auth manager which DAGs ``user`` may read (``GET``)."""
    if auth_manager.is_authorized_dag(method="GET", user=user):
        return EVERY_DAG
    ids = auth_manager.get_authorized_dag_ids(user=user, method="GET")
    return DagAccess(False, frozenset(str(i) for i in ids))
