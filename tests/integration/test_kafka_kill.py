"""The Kafka example job against a real KRaft broker: kills, older restores, replays.

Real parts only: a single-node Kafka broker on 127.0.0.1 (tests/fixtures/kafka.py), the
Spark connector's jars from the cache, ``kafka_counts.py`` as its own ``python`` driver
process (local Spark) reading a 4-partition topic with ``maxOffsetsPerTrigger``. The
ground truth is what was produced: (count, sum) of the values per key.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from airflow_ckpt.examples import JOBS_DIR
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.testing.kafka_broker import KafkaBroker, produce_numbers
from airflow_ckpt.testing.numbers import (
    JobSpec,
    after_checkpoint,
    finished_job_problems,
    killed_run_problems,
    run_with_kills,
    verify_output,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
RECORDS = 20_000
#: how long the rest of a driver may live on after its JVM or its Python was killed
#: (liveness only: the driver unit follows within a second or two)
FOLLOW_S = 60.0


def kafka_spec(job: str, tmp_path: Path, broker: KafkaBroker, topic: str,
               jars: list[Path], *extra: str) -> JobSpec:
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
                    "--sink", "jsonl", "--available-now",
                    "--max-offsets-per-trigger", "1000", *extra],
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
