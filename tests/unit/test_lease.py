"""JobLease on the file backend: exclusive, expires, detects takeover."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConcurrentDriverError
from airflow_ckpt.runtime.lease import JobLease
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "s").as_uri())


def test_second_driver_is_refused_while_the_first_is_alive(store: CheckpointStorage) -> None:
    first = JobLease(store, "job", "run-a", ttl_s=5, heartbeat_s=0.1)
    first.acquire()
    try:
        with pytest.raises(ConcurrentDriverError, match="run-a") as err:
            JobLease(store, "job", "run-b", ttl_s=5).acquire(wait_s=0.3)
        assert "Stop that driver" in str(err.value)
    finally:
        first.release()
    # Released: the next driver gets it at once.
    second = JobLease(store, "job", "run-b", ttl_s=5)
    assert second.acquire(wait_s=0).epoch == 2
    second.release()


def test_expired_lease_is_taken_over_and_the_old_holder_notices(
    store: CheckpointStorage,
) -> None:
    old = JobLease(store, "job", "run-a", ttl_s=0.3, heartbeat_s=60)  # never beats
    old.acquire()
    time.sleep(0.5)
    new = JobLease(store, "job", "run-b", ttl_s=0.3, heartbeat_s=60)
    assert new.acquire(wait_s=0).epoch == 2
    with pytest.raises(ConcurrentDriverError, match="took over"):
        old.check()
    assert old.lost.is_set()
    new.release()


def test_dead_process_on_this_host_frees_the_lease_at_once(store: CheckpointStorage) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    import socket

    record = {"epoch": 1, "owner": "run-dead", "host": socket.gethostname(),
              "pid": int(dead.stdout), "acquired_ts": time.time(), "heartbeat_ts": time.time(),
              "released": False}
    store.put_bytes("job/lease/0000000001.json", json.dumps(record).encode())
    lease = JobLease(store, "job", "run-b", ttl_s=300)
    assert lease.acquire(wait_s=0).epoch == 2
    assert [i.key for i in store.list("job/lease/")] == ["job/lease/0000000002.json"]
    lease.release()


def test_heartbeat_keeps_a_live_lease_from_expiring(store: CheckpointStorage) -> None:
    holder = JobLease(store, "job", "run-a", ttl_s=0.5, heartbeat_s=0.1)
    holder.acquire()
    try:
        time.sleep(1.0)  # twice the TTL, but the heartbeat kept it fresh
        with pytest.raises(ConcurrentDriverError):
            JobLease(store, "job", "run-b", ttl_s=0.5).acquire(wait_s=0)
    finally:
        holder.release()
