"""``python -m bench.requests [--window S] [--quick]``: the S3 request bill of one running job.

One checkpointed job (the example query: parity running sums, default checkpoint
settings, so a checkpoint every 10 s when there is new input) runs on a local S3
endpoint (moto, in its own process). Every HTTP request its driver sends is counted at
its boto3 client (:class:`~airflow_ckpt.testing.request_count.RequestCounter`: retries
and pages included), by billing kind and by layout area, over a measured window, and
extrapolated to a day. Four windows, all in this one run and on this one job:

* **idle, before**: no new input, the control channel listed every second (the old
  polling: ``CONTROL_POLL_S = 1``);
* **idle, after**: no new input, the current defaults (doorbell + a listing a minute);
* **checkpointing, before / after**: an input file every 2 s, a checkpoint every 10 s.

Prices: AWS S3 Standard request list prices, us-east-1 (USD per 1,000 requests): PUT,
COPY, POST, LIST 0.005; GET, HEAD 0.0004; DELETE free. Storage and transfer are not
included. The job ends with a stop-with-savepoint request.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.job.checkpointed_job import CheckpointedJob, JobResult
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.request_count import AREAS, KINDS, RequestCounter
from airflow_ckpt.testing.s3_server import s3_server_process
from bench.harness import JOB, SINK_PREFIX, example_query, spark_session

BUCKET = "airflow-ckpt-requests"
DAY_S = 86_400.0
#: USD per 1,000 requests of each kind (AWS S3 Standard, us-east-1 list prices)
PRICE_PER_1000 = {"LIST": 0.005, "GET": 0.0004, "PUT": 0.005, "DELETE": 0.0, "HEAD": 0.0004,
                  "OTHER": 0.005}
#: the control channel's listing period before this change
OLD_CONTROL_POLL_S = 1.0
FEED_EVERY_S = 2.0
#: issue 26: a checkpoint of small state costs at most this many requests in all
CHECKPOINT_GOAL = 15
#: ``state.storage.fs.memory-threshold`` before inline files (every file an object)
#: and its default
THRESHOLDS = {"before": 0, "after": 20 << 10}


def cost_per_day(per_day: Counter[str]) -> float:
    """USD a day for ``per_day`` requests by kind."""
    return sum(PRICE_PER_1000[kind] * n / 1000 for kind, n in per_day.items())


@dataclass(frozen=True)
class Window:
    """What the driver sent during one measured window, by ``(area, kind)``."""

    scenario: str  # "idle" or "checkpointing"
    policy: str  # "before" or "after"
    seconds: float
    counts: Counter[tuple[str, str]]
    checkpoints: int  # completed during the window
    #: by ``(caller, kind)`` (:func:`~airflow_ckpt.testing.request_count.caller_of`)
    callers: Counter[tuple[str, str]]

    def per_day(self, area: str | None = None) -> Counter[str]:
        """Requests a day by kind, of one area or of all."""
        out: Counter[str] = Counter()
        for (a, kind), n in self.counts.items():
            if area is None or a == area:
                out[kind] += n
        return Counter({k: round(n * DAY_S / self.seconds) for k, n in out.items()})


@contextlib.contextmanager
def control_poll(seconds: float) -> Iterator[None]:
    """Run the driver's control channel with listing period ``seconds`` in the block."""
    previous = job_module.CONTROL_POLL_S
    job_module.CONTROL_POLL_S = seconds
    try:
        yield
    finally:
        job_module.CONTROL_POLL_S = previous


class Feeder:
    """Writes a small input file every ``FEED_EVERY_S`` while :attr:`on` is set."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.on = threading.Event()
        self.stop = threading.Event()
        self.files = 0
        self.thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def write(self) -> None:
        tmp = self.directory / f".n{self.files:05d}.tmp"
        tmp.write_text("".join(f"{self.files * 100 + i}\n" for i in range(100)))
        tmp.rename(self.directory / f"n{self.files:05d}.txt")  # atomic: Spark sees it whole
        self.files += 1

    def _run(self) -> None:
        while not self.stop.wait(FEED_EVERY_S):
            if self.on.is_set():
                self.write()


def _at_listing(counter: RequestCounter, alive: Callable[[], None]
                ) -> tuple[Counter[tuple[str, str]], float]:
    """Wait for the driver's next listing of ``control/``; the counts just before it and
    when it was seen."""
    before = counter.counts()
    listed = sum(n for (area, _), n in before.items() if area == "control")
    while True:
        alive()
        time.sleep(0.01)
        now = counter.counts()
        if sum(n for (area, _), n in now.items() if area == "control") > listed:
            return before, time.monotonic()
        before = now


def measure(counter: RequestCounter, scenario: str, policy: str, seconds: float,
            alive: Callable[[], None], checkpoints: Callable[[], int]) -> Window:
    """Count what the driver sends over at least ``seconds`` (``alive`` raises if the job
    died).

    The window runs from one listing of ``control/`` (counted) to the first one at least
    ``seconds`` later (not counted): it holds whole listing periods, so the rare periodic
    listing is counted exactly, not one more or one less."""
    opened, started = _at_listing(counter, alive)
    callers = counter.callers()
    first = checkpoints()
    while time.monotonic() - started < seconds:
        alive()
        time.sleep(0.1)
    closed, ended = _at_listing(counter, alive)
    closed.subtract(opened)
    by_caller = counter.callers()
    by_caller.subtract(callers)
    done = checkpoints() - first
    elapsed = ended - started
    _log(f"  {scenario}/{policy}: {sum(closed.values())} requests, {done} checkpoints "
         f"in {elapsed:.0f} s")
    return Window(scenario, policy, elapsed, +closed, done, +by_caller)


def run(window_s: float) -> tuple[list[Window], dict[str, Any]]:
    """Start the job, measure the four windows, stop it with a savepoint."""
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-requests-") as tmp, \
            s3_server_process() as server:
        root = Path(tmp)
        endpoint = server.endpoint
        endpoint.create_bucket(BUCKET)
        uri = f"s3://{BUCKET}/requests"
        driver = endpoint.storage(uri)
        counter = RequestCounter()
        counter.attach(driver)
        requester = ControlChannel(endpoint.storage(uri), JOB)
        source = root / "in"
        source.mkdir()
        feeder = Feeder(source)
        feeder.write()  # the job has run a batch before it goes idle
        spark = spark_session()
        # A loaded machine can break one Py4J call: restart in-process rather than lose
        # the run (a restart's restore shows up in that window's data requests).
        job = CheckpointedJob(spark, job=JOB, storage=driver, workdir=root / "work",
                              restart_strategy={"type": "fixed-delay",
                                                "fixed-delay.attempts": 3,
                                                "fixed-delay.delay": "1 s"})
        completed: list[Manifest] = []
        job.on_checkpoint(completed.append)
        sink = JsonLinesSink(job.storage, SINK_PREFIX)
        write = job.exactly_once(sink)
        outcome: list[JobResult | BaseException] = []

        def job_thread() -> None:
            try:
                outcome.append(job.run(lambda: example_query(spark, source, write)
                                       .trigger(processingTime="1 second")))
            except BaseException as exc:  # reported by alive()
                outcome.append(exc)

        def alive() -> None:
            if outcome:
                raise RuntimeError(f"the job ended during the benchmark: {outcome[0]!r}")

        thread = threading.Thread(target=job_thread, name="bench-job")
        thread.start()
        feeder.thread.start()
        windows: list[Window] = []
        try:
            while not completed:  # the job has run a batch and checkpointed it
                alive()
                time.sleep(0.5)
            _log("job running, first checkpoint done; measuring")
            for scenario in ("idle", "checkpointing"):
                if scenario == "checkpointing":
                    feeder.on.set()
                for policy, poll_s in (("before", OLD_CONTROL_POLL_S),
                                       ("after", job_module.CONTROL_POLL_S)):
                    with control_poll(poll_s):
                        windows.append(measure(counter, scenario, policy, window_s, alive,
                                               lambda: len(completed)))
            feeder.on.clear()
            measured = root / "measured"  # the state as the job runs (it is gone after)
            shutil.copytree(root / "work", measured, ignore_dangling_symlinks=True,
                            dirs_exist_ok=True, copy_function=_copy_if_present)
            request = requester.request_savepoint(savepoint_id="bench-end", stop=True)
            thread.join(timeout=300)
        finally:
            feeder.stop.set()
            if thread.is_alive():
                job._cancel.set()  # a failure above must not leave the query running
            thread.join(timeout=120)
            driver.close()
        answer = requester.result(request.request_id)
        info = {"spark": spark.version, "window_s": window_s, "files": feeder.files,
                "checkpoints": sum(not m.is_savepoint for m in completed),
                "stop": answer.status if answer else None,
                "checkpoint": {policy: checkpoint_requests(endpoint, f"s3://{BUCKET}/one-{policy}",
                                                           measured, threshold)
                               for policy, threshold in THRESHOLDS.items()}}
        spark.stop()
    return windows, info


def checkpoint_requests(endpoint: S3Endpoint, uri: str, workdir: Path, threshold: int,
                        options: dict[str, Any] | None = None) -> Counter[tuple[str, str]]:
    """The requests of one checkpoint of ``workdir``'s last batch, by ``(caller, kind)``:
    the real coordinator, store, lease and history on a fresh job root at ``uri``, with
    ``state.storage.fs.memory-threshold`` ``threshold``. Counted from the trigger to the
    completion (upload, marker, lease confirmation, retention and collection, history),
    after two warm-up checkpoints (the lease's id block and the first subsumption are
    once per run). The sinks' transactions are per batch, not per checkpoint: not here."""
    storage = endpoint.storage(uri, **(options or {}))
    counter = RequestCounter()
    counter.attach(storage)
    lease = JobLease(storage, JOB, owner="bench", ttl_s=1e6, heartbeat_s=1e5,
                     max_write_s=10.0)  # beaten by nobody: heartbeats are per time
    record = lease.acquire()
    config = CheckpointConfig.from_dict({
        "execution.checkpointing.interval": "1 h",  # nothing periodic: triggered here
        "state.storage.fs.memory-threshold": threshold,
    })
    store = CompletedCheckpointStore(storage, JOB, config.num_retained, epoch=record.epoch,
                                     confirm=lease.confirm)
    coordinator = CheckpointCoordinator(
        storage=storage, job=JOB, workdir=workdir, config=config, store=store,
        history=JobHistory(storage, JOB), next_checkpoint_id=store.recover(),
        spark_version="4.2.0", lease=LeaseView(record.epoch, lease.confirm, lease.reserve_ids),
        threaded=False)
    try:
        for _ in range(2):
            coordinator.wait(coordinator.trigger("final"))
        before = counter.callers()
        pending = coordinator.trigger("final")  # at the last committed batch
        coordinator.wait(pending)
        if pending.manifest is None:
            raise RuntimeError(f"the measured checkpoint failed: {pending.failure}")
        counted = counter.callers()
        counted.subtract(before)
        return +counted
    finally:
        coordinator.shutdown()
        lease.release()
        storage.close()


def checkpoint_table(counts: dict[str, Counter[tuple[str, str]]]) -> list[str]:
    """Requests of one checkpoint by kind and by caller, ``before`` and ``after``."""
    lines = [f"requests of one checkpoint of the example job's state (goal <= "
             f"{CHECKPOINT_GOAL}; before = state.storage.fs.memory-threshold 0, after = "
             "20 kb)", f"{'':<8}" + "".join(f"{k:>8}" for k in KINDS) + f"{'total':>8}"]
    for policy, counted in counts.items():
        kinds = Counter[str]()
        for (_, kind), n in counted.items():
            kinds[kind] += n
        lines.append(f"{policy:<8}" + "".join(f"{kinds[k]:>8}" for k in KINDS)
                     + f"{sum(kinds.values()):>8}")
        for (caller, kind), n in sorted(counted.items()):
            lines.append(f"{'':<10}{n:>3} {kind:<7}{caller}")
    return lines


def _copy_if_present(src: str, dst: str) -> None:
    """Copy one file of a working directory Spark is writing (one it removed meanwhile,
    a temporary file, is skipped)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(src, dst)


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


def per_checkpoint(w: Window) -> list[str]:
    """Requests per completed checkpoint of window ``w``, by kind and by caller."""
    by_kind: Counter[str] = Counter()
    by_caller: dict[str, Counter[str]] = {}
    for (caller, kind), n in w.callers.items():
        by_kind[kind] += n
        by_caller.setdefault(caller, Counter())[kind] += n
    total = sum(by_kind.values())
    lines = [f"per checkpoint, {w.scenario}/{w.policy} ({w.checkpoints} checkpoints): "
             f"{total / w.checkpoints:.1f} requests: "
             + ", ".join(f"{k} {by_kind[k] / w.checkpoints:.1f}" for k in KINDS if by_kind[k])]
    for caller, kinds in sorted(by_caller.items(), key=lambda c: -sum(c[1].values())):
        lines.append(f"  {sum(kinds.values()) / w.checkpoints:6.1f}  {caller}: "
                     + ", ".join(f"{k} {kinds[k] / w.checkpoints:.1f}" for k in KINDS
                                 if kinds[k]))
    return lines


def report(windows: Sequence[Window], info: dict[str, Any]) -> str:
    """The table: requests per day per job by kind, area and window, with cost."""
    lines = [
        f"S3 requests per day of one running job, by kind (measured over "
        f"{info['window_s']:.0f} s windows, extrapolated; AWS S3 Standard list prices)",
        "",
        f"{'scenario':<14}{'polling':<8}{'area':<9}"
        + "".join(f"{k:>9}" for k in KINDS) + f"{'total':>10}{'USD/day':>9}",
    ]
    for w in windows:
        for area in (*AREAS, None):
            per_day = w.per_day(area)
            if area is not None and not per_day:
                continue
            lines.append(
                f"{w.scenario:<14}{w.policy:<8}{area or 'all':<9}"
                + "".join(f"{_fmt(per_day[k]):>9}" for k in KINDS)
                + f"{_fmt(sum(per_day.values())):>10}{cost_per_day(per_day):>9.4f}")
        lines.append("")
    by = {(w.scenario, w.policy): w for w in windows}
    for scenario in ("idle", "checkpointing"):
        old, new = by[(scenario, "before")], by[(scenario, "after")]
        if scenario == "checkpointing":
            lines.append(f"checkpointing: {old.checkpoints} checkpoints in the 'before' window, "
                         f"{new.checkpoints} in the 'after' one (their own requests scale with "
                         "that number)")
        for area, name in (("control", "control channel"), (None, "whole driver")):
            o, n = sum(old.per_day(area).values()), sum(new.per_day(area).values())
            ratio = f"{o / n:.1f}x fewer" if n else "none left"
            lines.append(
                f"{scenario}, {name}: {_fmt(o)} -> {_fmt(n)} requests/day ({ratio}), USD "
                f"{cost_per_day(old.per_day(area)):.4f} -> {cost_per_day(new.per_day(area)):.4f}"
                " a day")
    for w in windows:
        if w.scenario == "checkpointing" and w.checkpoints:
            lines.extend(["", *per_checkpoint(w)])
    lines.extend(["", *checkpoint_table(info["checkpoint"])])
    lines.append(f"(before = CONTROL_POLL_S {OLD_CONTROL_POLL_S:g} s, the old polling; after = "
                 f"{job_module.CONTROL_POLL_S:g} s + doorbell; Spark {info['spark']}, "
                 f"{info['files']} input files, {info['checkpoints']} checkpoints, "
                 f"stop-with-savepoint {info['stop']})")
    return "\n".join(lines)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.requests",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--window", type=float, default=180.0,
                   help="seconds measured per window (default 180; 4 windows); a multiple "
                        "of the 60 s control listing period counts it exactly")
    p.add_argument("--quick", action="store_true", help="60 s windows")
    args = p.parse_args(argv)
    window = 60.0 if args.quick else args.window
    if window < 60:
        p.error("--window must be >= 60 s (one control listing period)")
    windows, info = run(window)
    print(report(windows, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
