"""``make faults``: real drivers of the example job through a faulty S3 path.

Every driver talks to S3 through a :class:`~airflow_ckpt.testing.faultproxy.FaultProxy`
in front of a moto server (its own process). Per fault rate (2 %, 10 %, 30 % of all
requests, every fault kind of the proxy, latency 2-8 s on a tenth of them) and once
through an outage (2 % faults, then every request refused for 120 s after the first
checkpoint), each run is one story of the example job:

1. life 1 starts (``restore=latest``), completes at least two checkpoints, and is
   killed with SIGKILL;
2. life 2 restores the latest checkpoint and runs to the end of its input.

Checked against the moto server directly (no faults) and the ground truth of the input:

* **false failures** (must be 0): a life that exited non-zero on its own, a
  ``ConcurrentDriverError`` in a driver's log (there is only one driver), or a
  checkpoint reported failed although its completion marker is in storage;
* **output exact**: the committed output is exactly the ground truth
  (:func:`~airflow_ckpt.testing.numbers.verify_output`);
* **restore exact**: life 2 restored the newest checkpoint completed before the kill,
  and every retained checkpoint is whole
  (:func:`~airflow_ckpt.testing.numbers.finished_job_problems`).

Prints one line per rate (false failures, output and restore exact, checkpoints
completed/failed, requests, faults in all and by kind); exits 1 if any false failure or
inexact run was seen.
``python -m airflow_ckpt.testing.faults_run --help`` for the knobs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.testing.faultproxy import FaultProxy, FaultSchedule
from airflow_ckpt.testing.numbers import (
    JobSpec,
    finished_job_problems,
    kill_hard,
    start_job,
    verify_output,
    wait_for_checkpoints,
    write_numbers,
)
from airflow_ckpt.testing.s3_server import S3Endpoint, s3_server_process

BUCKET = "airflow-ckpt-faults"
NUM_RETAINED = 3
CHECKPOINT_CONFIG = {
    "execution.checkpointing.interval": "1 s",
    "execution.checkpointing.num-retained": NUM_RETAINED,
    "execution.checkpointing.incremental": True,
}


@dataclass(slots=True)
class RunResult:
    """What one story (two lives) showed."""

    false_failures: list[str] = field(default_factory=list)
    #: checkpoints completed and failed over both lives (their history events)
    completed: int = 0
    failed: int = 0
    output_exact: bool = False
    restore_exact: bool = False
    problems: list[str] = field(default_factory=list)


_ERROR_LINE = re.compile(r"^[\w.]+(Error|Exception): .*", re.MULTILINE)


def _false_failures(direct: CheckpointStorage, job: str, logs: Sequence[Path],
                    codes: Sequence[int | None]) -> list[str]:
    out: list[str] = []
    for life, (log_path, code) in enumerate(zip(logs, codes, strict=True), start=1):
        text = log_path.read_text(errors="replace")
        if code not in (None, 0):
            errors = [m.group(0) for m in _ERROR_LINE.finditer(text)]
            last = errors[-1][:300] if errors else "no error line"
            out.append(f"life {life} exited {code} ({log_path}): {last}")
        if "ConcurrentDriverError" in text:
            out.append(f"life {life}: ConcurrentDriverError with a single driver")
    events = JobHistory(direct, job).events()
    failed = {e.data.get("id") for e in events if e.type == ev.CHECKPOINT_FAILED}
    stored = set(CheckpointCatalog(direct, job).checkpoint_ids()) | {
        e.data.get("id") for e in events if e.type == ev.CHECKPOINT_COMPLETED}
    out += [f"checkpoint {i} reported failed but its marker is in storage"
            for i in sorted(failed & stored, key=str)]
    return out


def run_story(endpoint: S3Endpoint, proxy: FaultProxy, work: Path, name: str,
              outage_s: float = 0.0, timeout_s: float = 300) -> RunResult:
    """One run: life 1 (killed after two checkpoints, or an outage of ``outage_s``
    after the first, then killed), life 2 to the end."""
    job = "odd-even-" + name
    root = f"s3://{BUCKET}/{name}"
    direct = endpoint.storage(root)
    out_direct = endpoint.storage(root + "-output")
    truth = write_numbers(work / name / "input", files=12, per_file=200)
    spec = JobSpec(job=job, storage_uri=root, input_dir=work / name / "input",
                   output_uri=root + "-output", checkpoint_config=CHECKPOINT_CONFIG,
                   confs={"spark.airflow_ckpt.demo.batch_delay_s": "0.5"},
                   workdir=work / name / "driver")
    env = {**endpoint.env(), "AWS_ENDPOINT_URL": proxy.url}
    logs = [work / name / "driver-1.log", work / name / "driver-2.log"]
    result = RunResult()
    codes: list[int | None] = []
    proc = start_job(spec, env, logs[0])
    try:
        if outage_s:
            wait_for_checkpoints(direct, job, 1, proc, timeout_s)
            with proxy.outage():
                ends = time.monotonic() + outage_s
                if _wait(proc, outage_s):
                    result.problems.append("life 1 exited during the outage")
                time.sleep(max(0.0, ends - time.monotonic()))  # the outage lasts
        wait_for_checkpoints(direct, job, 2, proc, timeout_s)
        codes.append(proc.poll())
    finally:
        kill_hard(proc)
    latest = CheckpointCatalog(direct, job).latest_checkpoint()
    proc = start_job(spec, env, logs[1])
    try:
        codes.append(proc.wait(timeout=timeout_s))
    finally:
        kill_hard(proc)
    result.false_failures = _false_failures(direct, job, logs, codes)
    verdict = verify_output(JsonLinesSink(out_direct, ""), truth, finished=True)
    result.output_exact = verdict.ok
    result.problems += verdict.problems
    events = JobHistory(direct, job).events()
    result.completed = sum(e.type == ev.CHECKPOINT_COMPLETED for e in events)
    result.failed = sum(e.type == ev.CHECKPOINT_FAILED for e in events)
    restored = [e for e in events if e.type == ev.RESTORED]
    restore_problems = finished_job_problems(direct, job, num_retained=NUM_RETAINED)
    if latest is not None and not any(
            e.data.get("checkpoint_id") == latest.checkpoint_id for e in restored):
        restore_problems.append(f"life 2 did not restore chk-{latest.checkpoint_id}: "
                                f"{[e.data.get('path') for e in restored]}")
    result.restore_exact = not restore_problems
    result.problems += restore_problems
    direct.close()
    out_direct.close()
    return result


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether ``proc`` exited within ``seconds``."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_ckpt.testing.faults_run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0.02,0.10,0.30",
                   help="fault rates (share of all requests), comma-separated")
    p.add_argument("--runs", type=int, default=1, help="stories per rate")
    p.add_argument("--outage-s", type=float, default=120.0,
                   help="length of the outage run's outage (0: no outage run)")
    p.add_argument("--seed", type=int, default=20)
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r]
    work = Path(tempfile.mkdtemp(prefix="airflow-ckpt-faults-"))
    print(f"work directory (driver logs): {work}", flush=True)
    plan = [(f"{rate:.0%} faults", rate, 0.0) for rate in rates]
    if args.outage_s:
        plan.append((f"outage {args.outage_s:.0f} s", 0.02, args.outage_s))
    bad = False
    with s3_server_process() as server, FaultProxy(server.endpoint.url) as proxy:
        server.endpoint.create_bucket(BUCKET)
        print(f"{'':16} {'runs':>4} {'false failures':>14} {'output exact':>12} "
              f"{'restore exact':>13} {'checkpoints ok/failed':>21} {'requests':>8} "
              f"{'faults':>6}  faults by kind", flush=True)
        for label, rate, outage_s in plan:
            results: list[RunResult] = []
            start_requests, start_faults = proxy.requests, len(proxy.injected)
            start_kinds, start_refused = proxy.counts(), proxy.refused
            for i in range(args.runs):
                proxy.set_schedule(FaultSchedule.uniform(rate, args.seed + i))
                name = re.sub(r"[^a-z0-9]+", "-", f"{label}-{i}-{uuid.uuid4().hex[:4]}")
                results.append(run_story(server.endpoint, proxy, work, name.strip("-"),
                                         outage_s))
                proxy.set_schedule(None)
            false = sum(len(r.false_failures) for r in results)
            exact_out = sum(r.output_exact for r in results)
            exact_restore = sum(r.restore_exact for r in results)
            kinds = {k: n - start_kinds[k] for k, n in proxy.counts().items()}
            by_kind = ", ".join([f"{k.value} {n}" for k, n in kinds.items() if n] + (
                [f"outage refused {proxy.refused - start_refused}"]
                if proxy.refused > start_refused else []))
            checkpoints = (f"{sum(r.completed for r in results)}/"
                           f"{sum(r.failed for r in results)}")
            print(f"{label:16} {len(results):>4} {false:>14} {exact_out:>9}/{len(results):<2} "
                  f"{exact_restore:>10}/{len(results):<2} {checkpoints:>21} "
                  f"{proxy.requests - start_requests:>8} "
                  f"{len(proxy.injected) - start_faults:>6}  {by_kind or '-'}", flush=True)
            for r in results:
                for line in r.false_failures + r.problems:
                    print(f"    {line}", flush=True)
            bad |= false > 0 or exact_out < len(results) or exact_restore < len(results)
    print("FAILED: see above and the driver logs" if bad else "OK: no false failure, "
          "every output and restore exact")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
