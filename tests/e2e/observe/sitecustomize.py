"""Observation hooks for ``airflow dags test`` subprocesses of the e2e tests.

Put this directory on ``PYTHONPATH`` and set ``AIRFLOW_CKPT_OBSERVE=<file.jsonl>``: Python
imports ``sitecustomize`` at start-up, and this one wraps two of ``dag.test()``'s steps
to append what Airflow did to the file, without changing what it does:

* after each task process returns (``run_task_in_process``), the task instance's state
  and trigger *as stored in the metadata DB* (written by Airflow's execution API): a
  deferred task shows ``state == "deferred"`` and its trigger's class path;
* around each inline trigger run (``dag.test()`` runs triggers in-process), when it
  started, when it fired and the event payload.

Without ``AIRFLOW_CKPT_OBSERVE`` this module does nothing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

# popped: processes this one starts (e.g. spark-submit) do not observe themselves
_OUT = os.environ.pop("AIRFLOW_CKPT_OBSERVE", None)


def _record(**fields: Any) -> None:
    assert _OUT is not None
    with open(_OUT, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"ts": time.time(), **fields}, default=str) + "\n")


def _install() -> None:
    import airflow.sdk.definitions.dag as dag_module
    from airflow.sdk.execution_time import supervisor

    run_task = supervisor.run_task_in_process
    run_trigger = dag_module._run_inline_trigger

    def observed_run_task(ti: Any, task: Any) -> Any:
        result = run_task(ti=ti, task=task)
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.get(TaskInstance, ti.id)
            trigger = session.get(Trigger, row.trigger_id) if row and row.trigger_id else None
            _record(event="task_returned", task_id=ti.task_id, try_number=ti.try_number,
                    state=str(row.state) if row and row.state else None,
                    next_method=row.next_method if row else None,
                    trigger=trigger.classpath if trigger else None)
        return result

    def observed_run_trigger(trigger: Any, task_sdk_ti: Any) -> Any:
        _record(event="trigger_started", task_id=task_sdk_ti.task_id,
                trigger=f"{type(trigger).__module__}.{type(trigger).__qualname__}")
        event = run_trigger(trigger, task_sdk_ti)
        _record(event="trigger_fired", task_id=task_sdk_ti.task_id,
                payload=event.payload if event is not None else None)
        return event

    supervisor.run_task_in_process = observed_run_task  # imported by name at call time
    dag_module._run_inline_trigger = observed_run_trigger


if _OUT:
    _install()
