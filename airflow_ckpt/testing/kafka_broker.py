"""A real single-node Kafka broker in KRaft mode on 127.0.0.1, for the tests and ``make kafka``.

No container and no mock: the broker's own jars (:data:`airflow_ckpt.testing.jars.BROKER`,
fetched once), ``kafka.tools.StorageTool format`` of a fresh cluster id, then
``kafka.Kafka`` as broker and controller in one JVM (``-Xmx512m``). :func:`start_broker`
returns once its port accepts connections (the kafka jars carry no SLF4J binding, so the
broker's own log is silent: its output file holds only what the JVM prints).

``python -m airflow_ckpt.testing.kafka_broker [--port N] [--dir D]`` runs one in the
foreground until interrupted (``make kafka``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import AirflowCkptError
from airflow_ckpt.testing.jars import BROKER
from airflow_ckpt.testing.numbers import GroundTruth

#: liveness only: a broker on 2 busy cores starts in ~15 s
STARTUP_TIMEOUT_S = 180.0


class BrokerStartError(AirflowCkptError):
    """The broker exited or did not start in time (its log's tail is in the message)."""


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """A running broker: ``bootstrap`` is ``127.0.0.1:<port>``."""

    process: subprocess.Popen[bytes]
    port: int
    directory: Path
    log: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the broker's JVM (SIGTERM, then SIGKILL after 30 s); idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_properties(directory: Path, port: int, controller_port: int) -> str:
    """A single-node broker+controller listening on 127.0.0.1 only; internal topics
    with one replica; segments roll and expire every second so a test can watch
    retention delete records (``retention.ms`` per topic decides what goes)."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={directory / 'data'}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "log.retention.check.interval.ms=1000",
        "log.segment.delete.delay.ms=0",
        "",
    ])


def _java(jars_dir: Path, main: str, *args: str, heap: str = "256m") -> list[str]:
    java = "java"
    if os.environ.get("JAVA_HOME"):
        java = str(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    return [java, f"-Xmx{heap}", "-cp", f"{jars_dir}/*", main, *args]


def start_broker(directory: Path, *, port: int | None = None,
                 timeout_s: float = STARTUP_TIMEOUT_S) -> KafkaBroker:
    """Format a fresh KRaft log directory under ``directory`` and start a broker on it.

    Returns once the broker's client port accepts a TCP connection (KRaft opens it at
    the end of start-up, when the broker has joined its controller); raises
    :class:`BrokerStartError` (with the log's tail) if it exits or ``timeout_s`` passes
    first. The broker leads its own process group.
    """
    jars_dir = BROKER.classpath()[0].parent
    directory.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    properties = directory / "server.properties"
    properties.write_text(server_properties(directory, port, _free_port()))
    cluster_id = subprocess.run(
        _java(jars_dir, "kafka.tools.StorageTool", "random-uuid"),
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    formatted = subprocess.run(
        _java(jars_dir, "kafka.tools.StorageTool", "format", "-t", cluster_id,
              "-c", str(properties)), capture_output=True, text=True, check=False)
    if formatted.returncode != 0:
        raise BrokerStartError(f"kafka StorageTool format failed: {formatted.stderr[-2000:]}")
    log = directory / "broker.log"
    argv = _java(jars_dir, "kafka.Kafka", str(properties), heap="512m")
    argv.insert(1, "-XX:+UseSerialGC")
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    broker = KafkaBroker(process, port, directory, log)
    try:
        _wait_started(broker, timeout_s)
    except BaseException:
        broker.stop()
        raise
    return broker


def _wait_started(broker: KafkaBroker, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if broker.process.poll() is not None:
            raise BrokerStartError(
                f"the Kafka broker exited with {broker.process.returncode}:\n"
                + broker.log.read_text(errors="replace")[-3000:])
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", broker.port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise BrokerStartError(
                f"the Kafka broker did not start in {timeout_s:.0f} s:\n"
                + broker.log.read_text(errors="replace")[-3000:])
        time.sleep(0.2)


@contextlib.contextmanager
def running_broker(directory: Path | None = None, *, port: int | None = None
                   ) -> Iterator[KafkaBroker]:
    """A broker for the duration of the block (in a temporary directory by default)."""
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="airflow-ckpt-kafka-")))
        broker = start_broker(directory, port=port)
        stack.callback(broker.stop)
        yield broker


def create_topic(bootstrap: str, topic: str, partitions: int, **config: str) -> None:
    """Create ``topic`` with ``partitions`` partitions and one replica (kafka-python)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=dict(config))])
    finally:
        admin.close()


def add_partitions(bootstrap: str, topic: str, total: int, *,
                   timeout_s: float = 60.0) -> None:
    """Grow ``topic`` to ``total`` partitions (``CreatePartitions``, what
    ``kafka-topics --alter --partitions`` does); returns once the broker's metadata
    lists all of them, so a producer created afterwards can write to each."""
    from kafka.admin import KafkaAdminClient, NewPartitions

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({topic: NewPartitions(total)})
        deadline = time.monotonic() + timeout_s  # liveness: metadata follows at once
        while len(admin.describe_topics([topic])[0]["partitions"]) != total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} does not list {total} partitions "
                                   f"{timeout_s:.0f} s after CreatePartitions")
            time.sleep(0.1)
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    """The topic's end offset (the next record's) per partition, as the broker has it:
    ``{"0": 200, ...}``, the shape of a checkpoint's Kafka source position."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p)
                      for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {str(tp.partition): int(offset)
                for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def produce_numbers(bootstrap: str, topic: str, count: int, *, partitions: int,
                    start: int = 1) -> GroundTruth:
    """Produce the integers ``start..start+count-1`` as records (key ``n % 10``, value
    ``n``, both text), round-robin over ``partitions``; acknowledged by the broker on
    return. Returns the ground truth of what was produced: (count, sum) per key."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    totals: dict[str, tuple[int, int]] = {}
    try:
        for n in range(start, start + count):
            key = str(n % 10)
            producer.send(topic, key=key.encode(), value=str(n).encode(),
                          partition=n % partitions)
            before = totals.get(key, (0, 0))
            totals[key] = (before[0] + 1, before[1] + n)
        producer.flush()
    finally:
        producer.close()
    return GroundTruth(totals, count)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=9092)
    p.add_argument("--dir", type=Path, help="data directory (default: a temporary one)")
    args = p.parse_args(argv)
    started = time.monotonic()
    with running_broker(args.dir, port=args.port) as broker:
        print(f"Kafka {BROKER.version} (KRaft) at {broker.bootstrap}, started in "
              f"{time.monotonic() - started:.1f} s; data and log in {broker.directory}. "
              "Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            broker.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
