"""A control request's age is judged on the storage's clock (issue 19 B).

The requester's clock sets the timeout (a duration); the job measures the request's age
from the storage's ``LastModified`` to the storage's "now" (the job's clock corrected by
the offset it measured on its own ``job_started`` write): a driver an hour ahead of the
requester never takes a fresh request for expired, and a request written hours ago while
no job ran is still answered "expired".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.storage import open_storage


def test_a_fresh_request_is_not_expired_for_a_driver_an_hour_ahead(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    channel = ControlChannel(storage, "job")
    channel.request_savepoint(stop=True, timeout_s=300)
    [pending] = channel.pending()
    assert pending.stored_ts is not None and abs(pending.stored_ts - time.time()) < 60
    driver_clock = time.time() + 3600
    offset = -3600.0  # what the driver measured: the storage's clock minus its own
    assert not pending.expired(driver_clock + offset)
    assert time.time() + 3600 > pending.expires_ts  # the old rule: "expired" at once


def test_a_request_written_long_ago_is_expired(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    channel = ControlChannel(storage, "job")
    request = channel.request_savepoint(timeout_s=300)
    path = tmp_path / "s" / "job" / "control" / f"{request.request_id}.json"
    two_hours_ago = time.time() - 7200
    os.utime(path, (two_hours_ago, two_hours_ago))  # stored by the storage back then
    [pending] = channel.pending()
    assert pending.expired(time.time())
    assert "stored_ts" not in path.read_text()
