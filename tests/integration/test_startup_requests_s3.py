"""Start-up independent of the job's age, counted in HTTP requests on the real S3
endpoint (pages included): a job root with 200 savepoints, 300 answered control
requests and 300 history events costs the lease takeover, ``restore(latest)`` and the
store's recovery exactly the requests of a fresh one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.request_count import RequestCounter
from tests.unit.test_startup_reads import aged_job, start_up

pytestmark = pytest.mark.integration


def test_start_up_requests_do_not_grow_with_the_jobs_age(
    s3_endpoint: S3Endpoint, s3_bucket: str, storage_options: dict[str, Any], tmp_path: Path,
) -> None:
    sent: dict[str, Counter[tuple[str, str]]] = {}
    for name, age in (("fresh", (0, 0, 0)), ("aged", (200, 300, 300))):
        storage = s3_endpoint.storage(f"s3://{s3_bucket}/{name}", **storage_options)
        try:
            aged_job(storage, *age)
            counter = RequestCounter()
            counter.attach(storage)
            start_up(storage, tmp_path / name)
            sent[name] = Counter(counter.counts())
        finally:
            storage.close()
    assert sent["fresh"] == sent["aged"], sent
