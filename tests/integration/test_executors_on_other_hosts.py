"""Executors on another host, simulated on this machine with a mount namespace.

The runtime's sync phase hard-links Spark's working directory *on the driver*, so the
executors' state files must be on a filesystem the driver shares at the same path. A
Spark standalone worker is started in its own mount namespace (``unshare --mount
--propagation private``) with a private tmpfs over the working directories' parent:
that worker and its executors are "another host" whose local disk the driver cannot
see. Inside it, ``shared/`` is bind-mounted back from the real directory (what an NFS
mount of the driver's directory would be); ``private/`` stays on the tmpfs.

* shared working directory: the kill test (``kill -9`` of the driver at random moments
  after a checkpoint, restart with ``restore=latest``) passes through that worker and the
  final output equals the ground truth;
* private working directory: the job fails at once with ``WorkdirNotSharedError`` (final:
  not restarted) naming the fix, and storage holds no completed checkpoint lacking state.

The driver runs on the host (client mode); the worker is the cluster's only one, so
every task runs in the namespace. Needs root (or CAP_SYS_ADMIN) for ``unshare`` and
``mount``; skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import random
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.testing.numbers import (
    JobSpec,
    after_checkpoint,
    checkpoint_state_problems,
    finished_job_problems,
    kill_hard,
    killed_run_problems,
    run_with_kills,
    start_job,
    verify_output,
    write_numbers,
)
from airflow_ckpt.testing.s3_server import S3Endpoint
from tests.fixtures.spark_standalone import (
    SparkStandalone,
    mount_namespace_problem,
    standalone_cluster,
)

pytestmark = pytest.mark.integration

KILLS = 1  # the random-kill tests in test_kill_restore.py do more; this one proves the path
CHECKPOINTS = {
    "execution.checkpointing.interval": "300 ms",
    "execution.checkpointing.num-retained": 2,
    "execution.checkpointing.incremental": True,
}
KEYED_ROCKSDB = ["--state-store", "rocksdb", "--keyed"]


@dataclass(frozen=True)
class OtherHost:
    cluster: SparkStandalone
    shared: Path  #: same directory for the driver and the worker (NFS)
    private: Path  #: the worker sees its own tmpfs here


@pytest.fixture(scope="module")
def other_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtherHost]:
    base = tmp_path_factory.mktemp("other_host")
    probe = base / "probe"
    probe.mkdir()
    problem = mount_namespace_problem(probe)
    if problem:
        pytest.skip(f"cannot simulate a second host: {problem}")
    parent = base / "workdirs"  # the working directories' parent: a tmpfs on the worker
    shared, private, export = parent / "shared", parent / "private", base / "export"
    cluster_dir = base / "cluster"
    for d in (shared, private, export, cluster_dir):
        d.mkdir(parents=True)
    q = {k: shlex.quote(str(v)) for k, v in
         {"parent": parent, "shared": shared, "private": private,
          "export": export}.items()}
    # In the worker's namespace only: keep the real shared/ reachable, hide the parent
    # under a tmpfs, and mount shared/ back at its own path (the "NFS" mount).
    script = (
        f"set -e; mount --bind {q['shared']} {q['export']}; "
        f"mount -t tmpfs -o size=512m other-host {q['parent']}; "
        f"mkdir {q['shared']} {q['private']}; mount --bind {q['export']} {q['shared']}; "
        'exec "$@"'
    )
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "worker"]
    with standalone_cluster(cluster_dir, worker_wrapper=wrapper) as cluster:
        yield OtherHost(cluster, shared, private)


def _executor_apps(cluster: SparkStandalone) -> list[str]:
    """Applications whose executors the (namespaced) worker launched."""
    work = cluster.log_dir / "work"
    return sorted(p.name for p in work.glob("app-*")) if work.exists() else []


def _spec(job: str, other_host: OtherHost, workdir: Path, s3_uri: str, input_dir: Path,
          **confs: str) -> JobSpec:
    return JobSpec(
        job=job, storage_uri=s3_uri, input_dir=input_dir, output_uri=s3_uri + "-out",
        checkpoint_config=CHECKPOINTS, confs=confs, extra_args=KEYED_ROCKSDB,
        workdir=workdir, master=other_host.cluster.master_url,
    )


@pytest.mark.soak
@pytest.mark.timeout(900)  # three driver lives, each starting an executor JVM on the worker
def test_shared_working_directory_kill_test_passes_through_the_other_host(
    other_host: OtherHost, s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"KILL_SEED={seed}")
    truth = write_numbers(tmp_path / "in", files=8, per_file=30, keyed=True)
    spec = _spec("other-host-shared", other_host, other_host.shared / "driver", s3_uri,
                 tmp_path / "in", **{"spark.airflow_ckpt.demo.batch_delay_s": "0.3"})
    storage = s3_endpoint.storage(s3_uri)
    sink = JsonLinesSink(s3_endpoint.storage(spec.output_uri), "")
    apps_before = _executor_apps(other_host.cluster)

    def after_kill(round_: int) -> None:
        problems = killed_run_problems(storage, spec.job, sink, truth)
        problems += checkpoint_state_problems(storage, spec.job)
        assert not problems, f"seed {seed}, kill {round_ + 1}: {problems}"

    # a random moment within ~3 batches after this life's first completed checkpoint
    kills = run_with_kills(spec, s3_endpoint.env(), tmp_path / "driver.log", kills=KILLS,
                           moment=after_checkpoint(storage, spec.job, rng, within_s=3.0),
                           after_kill=after_kill)
    print(f"kills landed: {kills}")
    assert kills >= 1, f"seed {seed}: the driver finished before the first kill"

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"seed {seed}: {verdict.problems}"
    problems = finished_job_problems(storage, spec.job, num_retained=2)
    assert not problems, f"seed {seed}: {problems}"
    events = JobHistory(storage, spec.job).events()
    assert len([e for e in events if e.type == ev.RESTORED]) >= kills
    # every driver life ran its tasks on the namespaced worker (the only one)
    assert len(_executor_apps(other_host.cluster)) - len(apps_before) == kills + 1


def test_private_working_directory_fails_at_once_and_completes_no_stateless_checkpoint(
    other_host: OtherHost, s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path
) -> None:
    files = 12
    truth = write_numbers(tmp_path / "in", files=files, per_file=30, keyed=True)
    spec = _spec("other-host-private", other_host, other_host.private / "driver", s3_uri,
                 tmp_path / "in", **{"spark.airflow_ckpt.demo.batch_delay_s": "0.5"})
    storage = s3_endpoint.storage(s3_uri)
    log = tmp_path / "driver.log"
    proc = start_job(spec, s3_endpoint.env(), log)
    try:
        code = proc.wait(timeout=240)
    finally:
        kill_hard(proc)
    text = log.read_text(errors="replace")
    assert code != 0, text[-3000:]
    # a clear error naming the fix
    assert "WorkdirNotSharedError" in text, text[-3000:]
    assert "holds no state data for state/0/" in text
    assert "spark.airflow_ckpt.workdir" in text and "same path" in text

    events = JobHistory(storage, spec.job).events()
    failed = [e for e in events if e.type == ev.JOB_FAILED]
    assert [e.data.get("error") for e in failed] == ["WorkdirNotSharedError"], failed
    # final at once: the first checkpoint with state failed the job; nothing restarted,
    # no second checkpoint was tried, and the query did not run through its input
    declined = [e for e in events if e.type == ev.CHECKPOINT_FAILED]
    assert len(declined) == 1 and "No checkpoint was completed" in str(declined[0].data)
    assert not [e for e in events if e.type in (ev.RESTART, ev.FAILURE)]
    commits = spec.workdir / "work" / "commits"  # type: ignore[operator]
    assert len(list(commits.glob("[0-9]*"))) < files
    # storage: no completed checkpoint of any batch (at most an initial one, batch -1,
    # no state); none lacks state files, none is left half-written, no output committed
    catalog = CheckpointCatalog(storage, spec.job)
    assert [m.batch_id for m in catalog.completed_checkpoints() if m.batch_id >= 0] == []
    assert catalog.checkpoint_ids(completed_only=False) == catalog.checkpoint_ids()
    assert checkpoint_state_problems(storage, spec.job) == []
    sink = JsonLinesSink(s3_endpoint.storage(spec.output_uri), "")
    assert sink.committed_batches() == []
    assert verify_output(sink, truth, finished=False).ok
