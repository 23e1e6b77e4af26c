"""The Kafka example job against a real KRaft broker: kills, older restores, replays.

Real parts only: a single-node Kafka broker on 127.0.0.1 (tests/fixtures/kafka.py), the
Spark connector's jars from the cache, ``kafka_counts.py`` as its own ``python`` driver
process (local Spark) reading a 4-partition topic with ``maxOffsetsPerTrigger``. The
ground truth is what was produced: (count, sum) of the values per key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.examples import JOBS_DIR
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.testing.kafka_broker import (
    KafkaBroker,
    add_partitions,
    end_offsets,
    produce_numbers,
)
from airflow_ckpt.testing.numbers import (
    GroundTruth,
    JobSpec,
    after_checkpoint,
    finished_job_problems,
    kill_hard,
    killed_run_problems,
    run_with_kills,
    start_job,
    verify_output,
    wait_for_checkpoints,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: 5 batches of maxOffsetsPerTrigger records (a batch takes seconds on a loaded 2-core
#: machine: the story is the kills, not the volume)
RECORDS = 3_200
PER_TRIGGER = 800
#: how long the rest of a driver may live on after its JVM or its Python was killed
#: (liveness only: the driver unit follows within a second or two)
FOLLOW_S = 60.0


def kafka_spec(job: str, tmp_path: Path, broker: KafkaBroker, topic: str,
               jars: list[Path], *extra: str, available_now: bool = True) -> JobSpec:
    """The example job reading ``topic``: to the end of what it holds and finish
    (``available_now``), or streaming until killed."""
    return JobSpec(
        job=job, storage_uri=(tmp_path / "ckpt").as_uri(), input_dir=None,
        output_uri=(tmp_path / "out").as_uri(), script=JOBS_DIR / "kafka_counts.py",
        checkpoint_config={
            "execution.checkpointing.interval": "300 ms",
            "execution.checkpointing.num-retained": 2,
            "execution.checkpointing.incremental": True,
        },
        confs={"spark.jars": ",".join(map(str, jars))},
        extra_args=["--bootstrap-servers", broker.bootstrap, "--topic", topic,
                    "--sink", "jsonl", *(["--available-now"] if available_now else []),
                    "--max-offsets-per-trigger", str(PER_TRIGGER), *extra],
        workdir=tmp_path / "driver",
    )


def _kill(proc: subprocess.Popen[bytes], target: str) -> None:
    """SIGKILL the driver's process group, its JVM alone, or its Python alone; for the
    last two, the rest of the driver must follow by itself."""
    if target == "group":
        os.killpg(proc.pid, signal.SIGKILL)
        return
    if target == "jvm":
        jvms = [c for c in psutil.Process(proc.pid).children(recursive=True)
                if c.name() == "java"]
        assert jvms, "the driver has no JVM child"
        for jvm in jvms:
            jvm.kill()
    else:
        proc.kill()
    try:
        proc.wait(timeout=FOLLOW_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the driver lived on {FOLLOW_S} s after its {target} was "
                             "killed") from None
    if target == "python":  # its JVM follows (the driver unit)
        deadline = time.monotonic() + FOLLOW_S
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, f"the JVM outlived its Python by {FOLLOW_S} s"
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


@pytest.mark.timeout(1800)  # four driver lives: ~2 min idle, far more on a loaded 2-core CI
def test_random_kills_of_the_driver_group_jvm_and_python_then_exact_output(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], kafka_jars: list[Path],
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    targets = rng.sample(["group", "jvm", "python"], 3)
    print(f"KILL_SEED={seed} targets={targets}")
    topic = kafka_topic(PARTITIONS)
    truth = produce_numbers(kafka_broker.bootstrap, topic, RECORDS, partitions=PARTITIONS)
    spec = kafka_spec("kafka-kill", tmp_path, kafka_broker, topic, kafka_jars)
    storage = open_storage(spec.storage_uri)
    sink = JsonLinesSink(open_storage(spec.output_uri), "")
    after_first = after_checkpoint(storage, spec.job, rng, within_s=2.0)

    def moment(proc: subprocess.Popen[bytes], round_: int) -> bool:
        if not after_first(proc, round_):
            return False
        _kill(proc, targets[round_])
        return True

    def after_kill(round_: int) -> None:
        problems = killed_run_problems(storage, spec.job, sink, truth)
        assert not problems, f"seed {seed}, kill {round_ + 1} ({targets[round_]}): {problems}"

    kills = run_with_kills(spec, {}, tmp_path / "driver.log", kills=len(targets),
                           moment=moment, after_kill=after_kill)
    assert kills >= 2, f"seed {seed}: the driver finished after {kills} kills"

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"seed {seed}: {verdict.problems}"
    assert sum(c for c, _ in verdict.final.values()) == RECORDS
    problems = finished_job_problems(storage, spec.job, num_retained=2)
    assert not problems, f"seed {seed}: {problems}"
    # the checkpoints' source positions are Kafka's: every partition of the topic
    latest = CheckpointCatalog(storage, spec.job).latest_checkpoint()
    assert latest is not None
    assert latest.source_offsets == [{topic: {str(p): RECORDS // PARTITIONS
                                              for p in range(PARTITIONS)}}]
    # ... and the CLI shows them per topic-partition
    out = io.StringIO()
    assert cli_main(["--storage", spec.storage_uri, "describe",
                     f"{spec.storage_uri}/{spec.job}/chk-{latest.checkpoint_id}"],
                    out=out) == 0
    for p in range(PARTITIONS):
        assert f"{topic}-{p}  next offset {RECORDS // PARTITIONS}" in out.getvalue()


def _history(storage_uri: str, job: str) -> list[Any]:
    return JobHistory(open_storage(storage_uri), job).events()


@pytest.mark.timeout(1200)
def test_a_restore_whose_records_were_deleted_is_refused_or_recorded(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], kafka_jars: list[Path],
    tmp_path: Path,
) -> None:
    """The first life reads 2 x 100 records and finishes (its final checkpoint at
    offsets 100 of each partition); 2 x 100 more are produced and then deleted up to
    offset 150 of partition 0 and 180 of partition 1 (``DeleteRecords``, what retention
    does). ``restore=latest`` then needs offsets 100.. : the driver refuses before the
    query starts, naming both ranges, and records ``job_failed`` with that message;
    with ``failOnDataLoss=false`` it records ``source_data_lost`` with the ranges and
    goes on from the earliest offsets, so the output holds exactly the records that
    still existed."""
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    topic = kafka_topic(2)
    first = produce_numbers(kafka_broker.bootstrap, topic, 200, partitions=2)
    spec = kafka_spec("kafka-retention", tmp_path, kafka_broker, topic, kafka_jars)
    log = tmp_path / "driver.log"
    assert start_job(spec, {}, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    later = produce_numbers(kafka_broker.bootstrap, topic, 200, partitions=2, start=201)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 150, TopicPartition(topic, 1): 180})
    finally:
        admin.close()

    refused = start_job(spec, {}, log)
    assert refused.wait(timeout=600) != 0, log.read_text()[-3000:]
    failed = [e for e in _history(spec.storage_uri, spec.job) if e.type == ev.JOB_FAILED]
    assert len(failed) == 1 and failed[0].data["error"] == "SourceDataLostError", failed
    cause = failed[0].data["cause"]
    assert f"{topic}-0: offsets 100..149 (50 records)" in cause, cause
    assert f"{topic}-1: offsets 100..179 (80 records)" in cause, cause

    lenient = dataclasses.replace(spec, extra_args=[*spec.extra_args,
                                                    "--fail-on-data-loss", "false"])
    assert start_job(lenient, {}, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    lost = [e for e in _history(spec.storage_uri, spec.job) if e.type == ev.SOURCE_DATA_LOST]
    assert [e.data["ranges"] for e in lost] == [[
        {"topic": topic, "partition": 0, "start": 100, "end": 150},
        {"topic": topic, "partition": 1, "start": 100, "end": 180},
    ]]
    # what survived: the second batch's values whose offsets were not deleted; values
    # 201..400 went round-robin (n % 2), offset 100 + i of a partition is its i-th value
    deleted = {n for n in range(201, 401)
               if (n % 2 == 0 and (n - 201) // 2 < 50) or (n % 2 == 1 and (n - 201) // 2 < 80)}
    kept = produce_truth(n for n in range(1, 401) if n not in deleted)
    verdict = verify_output(JsonLinesSink(open_storage(spec.output_uri), ""), kept,
                            finished=True)
    assert verdict.ok, verdict.problems
    assert first.numbers + later.numbers - len(deleted) == kept.numbers


def produce_truth(values: Iterable[int]) -> GroundTruth:
    """The ground truth of records with these values (key ``n % 10``)."""
    totals: dict[str, tuple[int, int]] = {}
    count = 0
    for n in values:
        before = totals.get(str(n % 10), (0, 0))
        totals[str(n % 10)] = (before[0] + 1, before[1] + n)
        count += 1
    return GroundTruth(totals, count)


@pytest.mark.timeout(1800)
def test_an_older_restore_rereads_exactly_from_its_kafka_offsets(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], kafka_jars: list[Path],
    tmp_path: Path,
) -> None:
    """The first life reads 2 x 150 records in batches of 100 (0..2, a checkpoint each)
    and finishes. Restoring the checkpoint of batch 0 with batches of 150 would replay
    batch 1 over other offsets of each partition: it is refused before the query starts
    (the recorded maxOffsetsPerTrigger differs) and nothing committed changes. Restoring it with the
    batch size it had replays batches 1 and 2 over exactly their committed offsets: both
    are skipped and the output still equals what was produced, once."""
    topic = kafka_topic(2)
    truth = produce_numbers(kafka_broker.bootstrap, topic, 300, partitions=2)
    base = kafka_spec("kafka-older", tmp_path, kafka_broker, topic, kafka_jars)
    spec = dataclasses.replace(
        base, checkpoint_config={**base.checkpoint_config,
                                 "execution.checkpointing.num-retained": 10},
        extra_args=[*base.extra_args, "--max-offsets-per-trigger", "100"])
    log = tmp_path / "driver.log"
    assert start_job(spec, {}, log).wait(timeout=900) == 0, log.read_text()[-3000:]
    storage = open_storage(spec.storage_uri)
    sink = JsonLinesSink(open_storage(spec.output_uri), "")
    assert sink.committed_batches() == [0, 1, 2]
    older = next(m for m in CheckpointCatalog(storage, spec.job).completed_checkpoints()
                 if m.batch_id == 0)
    path = f"{spec.storage_uri}/{spec.job}/chk-{older.checkpoint_id}"

    wider = dataclasses.replace(spec, extra_args=[*spec.extra_args,
                                                  "--max-offsets-per-trigger", "150"])
    assert start_job(wider, {}, log, restore=path).wait(timeout=900) != 0
    failed = [e for e in _history(spec.storage_uri, spec.job) if e.type == ev.JOB_FAILED]
    # refused before the query starts: the checkpoint recorded maxOffsetsPerTrigger 100
    # (issue 27's source settings; the sink's per-partition replay check stands behind it)
    assert [e.data["error"] for e in failed] == ["SourceSettingsChangedError"], failed
    cause = failed[0].data["cause"]
    assert "maxoffsetspertrigger" in cause.lower() and "'150'" in cause, cause
    assert sink.committed_batches() == [0, 1, 2]

    assert start_job(spec, {}, log, restore=path).wait(timeout=900) == 0, \
        log.read_text()[-3000:]
    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, verdict.problems
    assert sink.committed_batches() == [0, 1, 2]


def _wait_for_positions(storage: CheckpointStorage, job: str, topic: str,
                        ends: dict[str, int], proc: subprocess.Popen[bytes],
                        timeout_s: float = 300) -> None:
    """Wait until a completed checkpoint's Kafka position is ``ends`` (every partition
    read to its end); liveness only, the running driver gets there by itself."""
    catalog = CheckpointCatalog(storage, job)
    deadline = time.monotonic() + timeout_s
    while True:
        latest = catalog.latest_checkpoint()
        if latest is not None and latest.source_offsets == [{topic: ends}]:
            return
        assert proc.poll() is None, f"the driver exited with {proc.returncode}"
        assert time.monotonic() < deadline, (
            f"no checkpoint at {ends} in {timeout_s} s; latest "
            f"{latest.source_offsets if latest else None}")
        time.sleep(0.2)


@pytest.mark.timeout(1800)
def test_partitions_added_while_running_and_across_a_restore_lose_and_duplicate_nothing(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], kafka_jars: list[Path],
    tmp_path: Path,
) -> None:
    """A 2-partition topic grows to 3 while the job streams, and to 5 while it is down
    after a ``kill -9``. Spark's Kafka source (AdminClient offset fetching, Spark's
    default since 3.4) sees a new partition when it plans its next batch and reads it
    from its earliest offset, with no option set; a restore does the same for the
    partitions the checkpoint does not know. Every record produced is counted exactly
    once, and the last checkpoint's position is the end of all five partitions."""
    bootstrap = kafka_broker.bootstrap
    topic = kafka_topic(2)
    truth = produce_numbers(bootstrap, topic, 200, partitions=2)
    spec = kafka_spec("kafka-grow", tmp_path, kafka_broker, topic, kafka_jars,
                      "--max-offsets-per-trigger", "200",
                      "--trigger-interval", "500 milliseconds", available_now=False)
    storage = open_storage(spec.storage_uri)
    sink = JsonLinesSink(open_storage(spec.output_uri), "")
    log = tmp_path / "driver.log"

    running = start_job(spec, {}, log)
    try:
        _wait_for_positions(storage, spec.job, topic, {"0": 100, "1": 100}, running)
        add_partitions(bootstrap, topic, 3)
        truth = truth.plus(produce_numbers(bootstrap, topic, 300, partitions=3, start=201))
        grown = end_offsets(bootstrap, topic)
        assert grown["2"] == 100, grown
        # read while running: the new partition from its first record on
        _wait_for_positions(storage, spec.job, topic, grown, running)
        truth = truth.plus(produce_numbers(bootstrap, topic, 300, partitions=3, start=501))
        # kill in the middle of reading these (after their first checkpoint at most)
        wait_for_checkpoints(storage, spec.job, 1, running, 300)
    finally:
        kill_hard(running)
    problems = killed_run_problems(storage, spec.job, sink, truth)
    assert not problems, problems

    add_partitions(bootstrap, topic, 5)
    truth = truth.plus(produce_numbers(bootstrap, topic, 500, partitions=5, start=801))
    restored = dataclasses.replace(spec, extra_args=[*spec.extra_args, "--available-now"])
    assert start_job(restored, {}, log).wait(timeout=900) == 0, log.read_text()[-3000:]

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, verdict.problems
    assert truth.numbers == 1300 == sum(c for c, _ in verdict.final.values())
    assert [e.type for e in _history(spec.storage_uri, spec.job)].count(ev.RESTORED) == 1
    latest = CheckpointCatalog(storage, spec.job).latest_checkpoint()
    assert latest is not None
    ends = end_offsets(bootstrap, topic)
    assert sorted(ends) == ["0", "1", "2", "3", "4"]
    assert latest.source_offsets == [{topic: ends}]
