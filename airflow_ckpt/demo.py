"""``make demo``: the odd/even example job end to end on the embedded defaults.

Starts a local S3-compatible endpoint (moto on 127.0.0.1; ``AIRFLOW_CKPT_TEST_S3=seaweedfs``
runs SeaweedFS instead, see :mod:`airflow_ckpt.testing.s3_server`), writes input numbers, runs
the checkpointed odd/even job as a real driver process, kills it with SIGKILL
mid-stream, restarts it with ``restore=latest``, lets it finish, then prints the
checkpoint history and checks the result against the ground truth.
``AIRFLOW_CKPT_STORAGE`` (``file:///tmp/x`` or ``s3://bucket/prefix`` with the usual
AWS_* variables) points the demo at other storage.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import SNAPSHOT_COMPLETED_EVENTS
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.testing.numbers import (
    JobSpec,
    kill_hard,
    start_job,
    verify_output,
    wait_for_checkpoints,
    write_numbers,
)

CHECKPOINT_CONFIG = {
    "execution.checkpointing.interval": "1 s",
    "execution.checkpointing.num-retained": 3,
    "execution.checkpointing.incremental": True,
}


@contextlib.contextmanager
def _storage() -> Iterator[tuple[str, dict[str, str]]]:
    configured = os.environ.get("AIRFLOW_CKPT_STORAGE")
    if configured:
        yield configured.rstrip("/") + f"/demo-{uuid.uuid4().hex[:6]}", {}
        return
    from airflow_ckpt.testing.s3_server import selected_s3_server

    with selected_s3_server() as endpoint:  # moto unless AIRFLOW_CKPT_TEST_S3 says
        endpoint.create_bucket("airflow-ckpt-demo")
        print(f"S3-compatible endpoint: {endpoint.url}, {endpoint.version or endpoint.server} "
              "(bucket airflow-ckpt-demo)")
        yield "s3://airflow-ckpt-demo/checkpoints", endpoint.env()


def _print_history(storage: CheckpointStorage, job: str) -> None:
    print(f"\n{'event':22} {'id':>4} {'batch':>5} {'state B':>8} {'uploaded B':>10} "
          f"{'delay ms':>8} {'sync ms':>7} {'async ms':>8} {'e2e ms':>7}")
    for event in HistoryReader(storage, job).events():
        d = event.data
        if event.type in SNAPSHOT_COMPLETED_EVENTS:
            print(f"{event.type:22} {d['id']:>4} {d['batch_id']:>5} {d['state_size']:>8} "
                  f"{d['checkpointed_size']:>10} {d['start_delay']:>8} {d['sync_duration']:>7} "
                  f"{d['async_duration']:>8} {d['end_to_end_duration']:>7}")
        else:
            detail = d.get("path") or d.get("cause") or d.get("restore") or ""
            print(f"{event.type:22} {str(detail)[:80]}")
    print()
    for m in CheckpointCatalog(storage, job).completed_checkpoints():
        t = m.timings
        print(f"retained chk-{m.checkpoint_id}: batch {m.batch_id}, state {m.state_size} B, "
              f"uploaded {m.checkpointed_size} B, {len(m.files)} files, start delay "
              f"{t.start_delay_ms} ms, sync {t.sync_duration_ms} ms, async "
              f"{t.async_duration_ms} ms, end-to-end {t.end_to_end_duration_ms} ms")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="airflow-ckpt-demo-"))
    truth = write_numbers(work / "input", files=16, per_file=250)
    print(f"input: {truth.numbers} numbers in 16 files under {work / 'input'}")
    with _storage() as (root, env):
        os.environ.update(env)
        storage = open_storage(root)
        spec = JobSpec(
            job="odd-even-sums", storage_uri=root, input_dir=work / "input",
            output_uri=root + "-output", checkpoint_config=CHECKPOINT_CONFIG,
            confs={"spark.airflow_ckpt.demo.batch_delay_s": "0.4"}, workdir=work / "driver",
        )
        log_path = work / "driver.log"
        print(f"run 1: starting the driver (log: {log_path})")
        proc = start_job(spec, env, log_path)
        done = wait_for_checkpoints(storage, spec.job, 3, proc, timeout_s=240)
        if proc.poll() is not None:
            print(f"the driver exited early with code {proc.returncode}; see {log_path}")
            return 1
        print(f"run 1: {done} checkpoints completed; kill -9 of the driver now")
        kill_hard(proc)
        time.sleep(0.2)
        print("run 2: restarting with restore=latest")
        proc = start_job(spec, env, log_path)
        code = proc.wait(timeout=600)
        print(f"run 2: driver exited with {code}")
        _print_history(storage, spec.job)
        verdict = verify_output(JsonLinesSink(open_storage(spec.output_uri), ""), truth,
                                finished=True)
        print(f"\nresult: {verdict.final}")
        print(f"ground truth: {truth.totals}")
        if code != 0 or not verdict.ok:
            print("FAILED: " + "; ".join(verdict.problems or [f"exit code {code}"]))
            return 1
        print("OK: exactly the ground truth after a kill -9 and a restore")
    return 0


if __name__ == "__main__":
    sys.exit(main())
