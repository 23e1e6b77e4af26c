"""Crash-point enumeration: crash a driver right before or right after every storage
mutation it makes, restart it with ``restore=latest``, and check the guarantees.

The real :class:`~airflow_ckpt.runtime.job.checkpointed_job.CheckpointedJob` (coordinator, store,
lease, restore, materialisation, sinks, control channel) runs against
:class:`SimulatedSpark`: a deterministic stand-in for a streaming query that writes a
Spark-shaped working directory (``metadata``, ``offsets/<b>``, ``commits/<b>``,
per-partition state versions ``state/0/<p>/<b+1>.delta``, purging old entries the way
``minBatchesToRetain`` does) and keeps a running sum as its state. With the
coordinator's ``threaded=False`` mode every storage mutation happens in one order, so
"mutation k" names the same step in every run, and one driver life takes milliseconds
instead of a JVM start: every point can be explored.

A crash is :class:`CrashingStorage` turning into a dead process at mutation ``k``: it
raises :class:`Crash` (a ``BaseException``, which no runtime handler swallows) and
refuses every later call, so nothing the dead driver's leftover code runs can touch
storage. Its lease record names a process that is gone (as after ``kill -9``), so the
next driver takes over at once.

Scenario of the enumerated driver life (:func:`scenario`): restore ``latest`` past a
damaged newest checkpoint (fallback), periodic incremental checkpoints with
``num-retained`` 2 (subsumption, shared-file GC), exactly-once sink commits, a
savepoint, a query failure with an in-process restart, and stop-with-savepoint.
Invariants checked (:func:`check_after_crash`, :func:`check_final`) are listed in
docs/architecture.md.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.driver.process import HolderIdentity
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned
from airflow_ckpt.testing import simquery
from airflow_ckpt.testing.damage import damage_one_file
from airflow_ckpt.testing.simquery import SimulatedQuery, run_to_end, write_file

JOB = "crash"
SINK_PREFIX = "_out/crash"
PER_BATCH = 3  # numbers per micro-batch
Moment = Literal["before", "after"]


class Crash(BaseException):
    """The simulated driver process died."""


@dataclass
class CrashingStorage(CheckpointStorage):
    """Counts mutations of ``inner``; dies right before or after mutation ``at``."""

    inner: CheckpointStorage
    at: int | None = None
    moment: Moment = "before"
    count: int = 0
    dead: bool = False
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.uri = self.inner.uri

    def _alive(self) -> None:
        if self.dead:
            raise Crash("the driver is dead")

    def _mutate(self, what: str, action: Callable[[], Any]) -> Any:
        self._alive()
        self.count += 1
        self.log.append(what)
        if self.count == self.at and self.moment == "before":
            self.dead = True
            raise Crash(f"killed before mutation {self.count}: {what}")
        try:
            result = action()
        finally:
            # "after" also when the request failed (a create-only write refused: the
            # driver dies right after the storage's answer, whatever it was)
            if self.count == self.at and self.moment == "after":
                self.dead = True
                raise Crash(f"killed after mutation {self.count}: {what}")
        return result

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        what = "create" if create_only else "swap" if if_match is not None else "put"
        etag: str = self._mutate(f"{what} {key}", lambda: self.inner.put_bytes(
            key, data, create_only=create_only, if_match=if_match))
        return etag

    def upload_file(self, path: Path, key: str) -> None:
        self._mutate(f"upload {key}", lambda: self.inner.upload_file(path, key))

    def copy(self, src_key: str, dst_key: str) -> None:
        self._mutate(f"copy {src_key} {dst_key}", lambda: self.inner.copy(src_key, dst_key))

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if batch:
            self._mutate(f"delete {' '.join(batch)}", lambda: self.inner.delete_many(batch))

    def abort_incomplete_uploads(self, prefix: str) -> int:
        self._alive()
        return self.inner.abort_incomplete_uploads(prefix)

    def get_bytes(self, key: str) -> bytes:
        self._alive()
        return self.inner.get_bytes(key)

    def get_versioned(self, key: str) -> Versioned:
        self._alive()
        return self.inner.get_versioned(key)

    def exists(self, key: str) -> bool:
        self._alive()
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._alive()
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._alive()
        return self.inner.list_dirs(prefix)

    def download_file(self, key: str, path: Path) -> None:
        self._alive()
        self.inner.download_file(key, path)


# ---------------------------------------------------------------------- the "Spark" side


@dataclass
class Script:
    """What happens during one driver life, by batch id."""

    batches: int  # the input has this many micro-batches
    fail_at: int | None = None  # a query failure (once) after this batch's pre-commit
    stop_at: int | None = None  # a stop-with-savepoint request when this batch starts
    failed: bool = False


class _Query(SimulatedQuery):
    """A micro-batch query over ``Script.batches`` batches of ``PER_BATCH`` numbers.

    One batch runs per ``awaitTermination`` call, as Spark would: offsets written,
    ``foreachBatch`` called, state version ``b + 1`` written, then ``commits/b``; then
    log entries and state versions older than ``minBatchesToRetain`` (3) are purged.
    """

    def __init__(self, workdir: Path, fn: Callable[[Any, int], None], script: Script,
                 on_batch: Callable[[int], None]) -> None:
        super().__init__(workdir, fn, on_batch)
        self.script = script
        self._sums = [0, 0]
        (workdir / "state" / "0" / "_metadata").mkdir(parents=True, exist_ok=True)
        write_file(workdir / "metadata", json.dumps({"id": "crash-query"}))
        write_file(workdir / "state" / "0" / "_metadata" / "metadata",
                   'v1\n{"stateStoreInfo":[{"storeName":"default","numPartitions":2}]}')

    def _next(self) -> int:
        done = [int(p.name) for p in (self.workdir / "commits").glob("*") if p.name.isdigit()]
        return max(done, default=-1) + 1

    def _plan(self) -> int | None:
        b = self._next()
        return b if b < self.script.batches else None

    def _input(self, b: int) -> list[dict[str, Any]]:
        write_file(self.workdir / "offsets" / str(b),
                   'v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n' + json.dumps({"b": b}))
        self._sums = [_read_state(self.workdir, p, b) for p in (0, 1)]
        numbers = list(range(b * PER_BATCH + 1, (b + 1) * PER_BATCH + 1))
        for n in numbers:
            self._sums[n % 2] += n
        return [{"n": n, "batch": b, "running": sum(self._sums)} for n in numbers]

    def _after_batch(self, b: int) -> None:
        if b == self.script.fail_at and not self.script.failed:
            self.script.failed = True
            raise RuntimeError(f"injected query failure in batch {b}")

    def _finish(self, b: int) -> None:
        for p in (0, 1):
            write_file(self.workdir / "state" / "0" / str(p) / f"{b + 1}.delta",
                       json.dumps({"sum": self._sums[p]}))
        write_file(self.workdir / "commits" / str(b), "v1\n{}")
        for log_dir in ("offsets", "commits"):
            for old in (self.workdir / log_dir).glob("*"):
                if old.name.isdigit() and int(old.name) < b - 3:
                    old.unlink()
        for p in (0, 1):  # each version holds the whole sum: older ones are not needed
            for old in (self.workdir / "state" / "0" / str(p)).glob("*.delta"):
                if int(old.name.split(".")[0]) < b - 3:
                    old.unlink()


def _read_state(workdir: Path, partition: int, version: int) -> int:
    if version == 0:
        return 0
    path = workdir / "state" / "0" / str(partition) / f"{version}.delta"
    if not path.exists():  # restored state is missing: fail loudly, never guess 0
        raise Crash(f"state version {version} of partition {partition} is missing")
    return int(json.loads(path.read_text())["sum"])


class SimulatedSpark(simquery.SimulatedSpark):
    """The part of ``SparkSession`` the runtime uses, plus the scripted query."""

    def __init__(self, script: Script, on_batch: Callable[[int], None]) -> None:
        super().__init__(on_batch)
        self.script = script

    def query(self, workdir: Path, fn: Callable[[Any, int], None]) -> _Query:
        return _Query(workdir, fn, self.script, self.on_batch)


# ---------------------------------------------------------------------- one driver life

CONFIG = {
    "execution.checkpointing.interval": "1 ms",  # due at every tick after a new batch
    "execution.checkpointing.min-pause": "0 ms",
    "execution.checkpointing.num-retained": 2,
    "execution.checkpointing.incremental": True,
    # the scenario's state files are small: without this they would all travel inside
    # _metadata (issue 26) and no shared-file upload, copy or GC delete would be crashed
    "state.storage.fs.memory-threshold": 0,
    "execution.checkpointing.tolerable-failed-checkpoints": 1000,
    # an injected storage error is one that outlasts any outage: raised at once
    "execution.checkpointing.tolerable-storage-outage": "0 s",
}
RESTART = {"type": "fixed-delay", "fixed-delay.attempts": 1000, "fixed-delay.delay": "0 s"}


@contextlib.contextmanager
def _dead_holder() -> Iterator[None]:
    """Lease records of the simulated drivers name a pid that no longer exists, as a
    driver killed with ``kill -9`` on this machine: the next one takes over at once."""
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    real = HolderIdentity.current
    me = real()
    fake = replace(me, pid=dead, start_ticks=me.start_ticks or 1)
    HolderIdentity.current = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls: fake)
    try:
        yield
    finally:
        HolderIdentity.current = real  # type: ignore[method-assign]


def run_life(storage: CheckpointStorage, workdir: Path, script: Script, *,
             restore: str = "latest", control: ControlChannel | None = None,
             run_id: str = "life") -> str:
    """One driver life until it finishes, stops, or crashes; returns how it ended."""
    def on_batch(b: int) -> None:
        if control is not None and b == script.stop_at:
            control.request_savepoint(savepoint_id="stop", stop=True, timeout_s=3600)

    spark = SimulatedSpark(script, on_batch)
    job = CheckpointedJob(
        spark,  # type: ignore[arg-type]
        job=JOB, storage=storage, checkpoint_config=CONFIG, restart_strategy=RESTART,
        restore=restore, workdir=workdir, run_id=run_id, threaded=False,
    )
    job.lease.heartbeat_s = 3600.0  # no heartbeat thread writes during a life
    job.lease.ttl_s = 7200.0
    try:
        # one order of events (real time made the mutation order vary)
        return run_to_end(job, spark, JsonLinesSink(job.storage, SINK_PREFIX))
    except Crash:
        return "crashed"  # a dead process releases nothing


# ---------------------------------------------------------------------- the enumeration


@dataclass(frozen=True)
class Point:
    k: int
    moment: Moment


@dataclass
class Outcome:
    point: Point
    mutation: str
    problems: list[str]


BATCHES = 12


def prepare(base: Path) -> Path:
    """Phase A, once: a first driver runs 4 batches; then its newest checkpoint is
    damaged, so every enumerated life starts with a fallback. Returns the storage root
    (the damaged checkpoint's id is in ``<root>.damaged``)."""
    root = base / "prepared"
    storage = open_storage(root.as_uri())
    with _dead_holder():
        outcome = run_life(storage, base / "work-a", Script(batches=4), run_id="a")
    assert outcome == "finished", outcome
    *older, newest = CheckpointCatalog(storage, JOB).completed_checkpoints()
    kept = {f.key for m in older for f in m.files}
    damage_one_file(storage, newest, spare=kept)
    (base / "prepared.damaged").write_text(str(newest.checkpoint_id))
    return root


def scenario() -> Script:
    return Script(batches=BATCHES - 3, fail_at=5, stop_at=7)


def _life_b(root: Path, work: Path, at: int | None, moment: Moment) -> CrashingStorage:
    storage = CrashingStorage(open_storage(root.as_uri()), at=at, moment=moment)
    ControlChannel(storage.inner, JOB).request_savepoint(savepoint_id="mid", stop=False,
                                                        timeout_s=3600)
    run_life(storage, work, scenario(), control=ControlChannel(storage.inner, JOB),
             run_id="b")
    return storage


def count_mutations(prepared: Path, scratch: Path) -> list[str]:
    """The mutations of the enumerated life when nothing crashes (the points to try)."""
    root = scratch / "count"
    shutil.copytree(prepared, root)
    with _dead_holder():
        storage = _life_b(root, scratch / "count-work", None, "before")
    return storage.log


def explore(prepared: Path, scratch: Path, point: Point, truth_batches: int = BATCHES) -> list[str]:
    """Crash the enumerated life at ``point``, check, recover, check; returns problems."""
    root = scratch / f"p{point.k}{point.moment[0]}"
    shutil.copytree(prepared, root)
    problems: list[str] = []
    with _dead_holder():
        storage = _life_b(root, scratch / f"w{point.k}{point.moment[0]}", point.k, point.moment)
        if not storage.dead:
            problems.append(f"no crash happened at {point}")
        inner = storage.inner
        damaged = int(prepared.with_name("prepared.damaged").read_text())
        problems += check_after_crash(inner, scratch / "verify", damaged)
        # A stop request the crashed driver had not answered yet stops the next driver:
        # then one more driver finishes the input.
        for life in range(3):
            outcome = run_life(inner, scratch / f"r{point.k}{point.moment[0]}",
                               Script(batches=truth_batches), run_id=f"recovery-{life}")
            if outcome != "stopped":
                break
        if outcome != "finished":
            problems.append(f"the recovery run ended {outcome}")
        problems += check_final(inner, truth_batches)
    for leftover in (root, scratch / f"w{point.k}{point.moment[0]}",
                     scratch / f"r{point.k}{point.moment[0]}"):
        shutil.rmtree(leftover, ignore_errors=True)
    return problems


# ---------------------------------------------------------------------- the invariants


def check_after_crash(storage: CheckpointStorage, scratch: Path, damaged: int) -> list[str]:
    """Right after a crash, before anyone recovers:

    * every completed checkpoint that counts, but the one damaged on purpose, and every
      savepoint verifies (materialises with every file present and its checksum right);
    * no committed output is newer than the newest completed checkpoint or savepoint
      that committed it (exactly-once: output is published only once a snapshot covering
      it is durable).
    """
    problems: list[str] = []
    catalog = CheckpointCatalog(storage, JOB)
    newest_batch = -1
    for manifest in [*catalog.completed_checkpoints(), *catalog.savepoints()]:
        if manifest.checkpoint_id == damaged:
            newest_batch = max(newest_batch, manifest.batch_id)  # it did commit its batches
            continue
        target = scratch / f"m{manifest.checkpoint_id}"
        try:
            materialize(storage, manifest, f"{JOB}/", target)
        except Exception as exc:  # the invariant failed: report it, keep checking
            problems.append(f"{manifest.kind} {manifest.checkpoint_id} does not verify: {exc}")
        finally:
            shutil.rmtree(target, ignore_errors=True)
        if not manifest.is_savepoint or manifest.trigger == "stop":
            newest_batch = max(newest_batch, manifest.batch_id)
    committed = JsonLinesSink(storage, SINK_PREFIX).committed_batches()
    if committed and max(committed) > newest_batch:
        problems.append(f"batch {max(committed)} is committed but the newest completed "
                        f"snapshot covers only batch {newest_batch}")
    return problems


def check_final(storage: CheckpointStorage, batches: int) -> list[str]:
    """After the recovery run: every number committed exactly once, each with the
    running sum of all numbers up to its batch (state restored right), nothing pending;
    the recovery restored a checkpoint instead of starting from scratch."""
    problems: list[str] = []
    rows = JsonLinesSink(storage, SINK_PREFIX).committed_rows()
    numbers = sorted(r["n"] for r in rows)
    expected = list(range(1, batches * PER_BATCH + 1))
    if numbers != expected:
        seen: dict[int, int] = {}
        for n in numbers:
            seen[n] = seen.get(n, 0) + 1
        lost = sorted(set(expected) - set(seen))
        twice = sorted(n for n, c in seen.items() if c > 1)
        problems.append(f"committed output wrong: lost {lost[:10]}, duplicated {twice[:10]}")
    for r in rows:
        top = (r["batch"] + 1) * PER_BATCH
        if r["running"] != top * (top + 1) // 2:
            problems.append(f"batch {r['batch']}: running sum {r['running']} is wrong "
                            "(state lost or replayed twice)")
            break
    if JsonLinesSink(storage, SINK_PREFIX).pending():
        problems.append("transactions are still pending after a clean finish")
    history = JobHistory(storage, JOB)
    starts = [e for e in history.events([ev.JOB_STARTED])
              if str(e.data.get("run_id")).startswith("recovery")]
    restored = [e for e in history.events([ev.RESTORED]) if e.key > starts[0].key] \
        if starts else []
    if not restored:
        problems.append("the recovery run started from scratch although checkpoints exist")
    return problems


def points(mutations: int, every: int = 1) -> list[Point]:
    """Crash points, every ``every``-th mutation (1: all), before and after each."""
    ks = range(1, mutations + 1, every)
    return [Point(k, moment) for k in ks for moment in ("before", "after")]


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_ckpt.testing.crashpoints [--every N]``: explore and report."""
    import argparse
    import tempfile
    import time

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="explore every N-th mutation")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir()
                                     else None) as tmp:
        base = Path(tmp)
        prepared = prepare(base)
        log = count_mutations(prepared, base)
        failures: list[Outcome] = []
        explored = points(len(log), args.every)
        for i, point in enumerate(explored):
            if i and i % 50 == 0:
                print(f"... {i} points, {time.monotonic() - started:.0f} s", flush=True)
            problems = explore(prepared, base, point)
            if problems:
                failures.append(Outcome(point, log[point.k - 1], problems))
                print(f"FAIL {point.moment} mutation {point.k} ({log[point.k - 1]}): "
                      + "; ".join(problems), flush=True)
    print(f"crash points explored: {len(explored)} ({len(log)} mutations, before and after "
          f"each{'' if args.every == 1 else f', every {args.every}th'}); failed: "
          f"{len(failures)}; {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
