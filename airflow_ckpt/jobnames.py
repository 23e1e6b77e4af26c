"""A misspelled job name: "did you mean ...?" from the jobs the storage holds (difflib).

Shared by the CLI, the savepoint operator and the history page, which otherwise answer a
misspelled name with an empty listing or "not running (last event: none)".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.storage.base import CheckpointStorage


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"did you mean 'rate-counts'?"`` naming the closest of ``candidates`` (up to
    three, difflib's ratio >= 0.6), or ``""`` if none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=3)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def unknown_job_hint(storage: CheckpointStorage, job: str) -> str:
    """``""`` if ``job`` has something stored under the storage root; else a sentence
    saying so, with "did you mean" when another job's name is close. One listing."""
    jobs = CheckpointCatalog.jobs(storage)
    if job in jobs:
        return ""
    guess = did_you_mean(job, jobs)
    return f"nothing is stored for job {job!r} in {storage.uri}" + (f"; {guess}" if guess else "")
