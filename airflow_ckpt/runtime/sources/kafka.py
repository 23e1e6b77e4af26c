"""Kafka retention vs a restore: the records a restored checkpoint needs must still exist.

A checkpoint's source positions (``Manifest.source_offsets``, Spark's offsets log) hold,
for a Kafka source, the next offset to read per topic-partition:
``{"topic": {"0": 1250, "1": 1248}}``. A restore re-reads the topic from exactly there.
If the topic's retention (``retention.ms`` / ``retention.bytes``, or a delete-records
call) removed records since, the partition's earliest offset is past the position and
the records between are gone. Spark then fails the query mid-run under its default
``failOnDataLoss=true``, or skips them silently with ``false``.

:func:`check_retention` asks the broker before the query starts (a consumer of the
connector's ``kafka-clients`` in the driver's JVM, over py4j, with the source's own
``kafka.*`` options: ``beginningOffsets``) and compares:

* records gone and ``failOnDataLoss`` true (Spark's default): :class:`SourceDataLostError`
  (final; the job's history records ``job_failed`` with its message) naming the topic,
  the partitions and the missing offset ranges;
* records gone and the user opted into ``failOnDataLoss=false``: a
  ``source_data_lost`` history event with the ranges, then the query runs (Spark starts
  those partitions at their earliest offset) - never silent.

Partitions the checkpoint does not know (added since) are not checked: Spark reads them
from their earliest offset. Partitions that no longer exist are Spark's to judge
(``failOnDataLoss``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("airflow_ckpt.sources")

#: how long the driver waits for the broker's answer (liveness only)
ADMIN_TIMEOUT_S = 60
_BYTES = "org.apache.kafka.common.serialization.ByteArrayDeserializer"

#: ``{topic: {partition: offset}}``, Spark's Kafka source offset
KafkaPositions = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """A Kafka source of the query, as its ``readStream`` options say."""

    #: the ``kafka.``-prefixed options without the prefix (bootstrap.servers, security)
    client: Mapping[str, str]
    #: what it reads: ``subscribe`` topics, or ``assign``'s, or None (subscribePattern)
    topics: frozenset[str] | None
    pattern: str | None
    fail_on_data_loss: bool

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSource:
        lower = {k.lower(): v for k, v in options.items()}
        client = {k[len("kafka."):]: v for k, v in options.items()
                  if k.lower().startswith("kafka.")}
        topics: frozenset[str] | None = None
        if "subscribe" in lower:
            topics = frozenset(t.strip() for t in lower["subscribe"].split(",") if t.strip())
        elif "assign" in lower:
            topics = frozenset(re.findall(r'"([^"]+)"\s*:', lower["assign"]))
        return cls(client, topics, lower.get("subscribepattern"),
                   lower.get("failondataloss", "true").strip().lower() != "false")

    def reads(self, topics: Iterable[str]) -> bool:
        if self.topics is not None:
            return set(topics) <= self.topics
        return self.pattern is not None and all(re.fullmatch(self.pattern, t) for t in topics)


@dataclass(frozen=True, slots=True, order=True)
class MissingRange:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of a partition are gone."""

    topic: str
    partition: int
    start: int
    end: int

    def describe(self) -> str:
        return (f"{self.topic}-{self.partition}: offsets {self.start}..{self.end - 1} "
                f"({self.end - self.start} records)")

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start,
                "end": self.end}


def kafka_positions(source_offsets: Iterable[Any]) -> list[dict[str, dict[str, int]]]:
    """The source offsets that have a Kafka offset's shape, ``{topic: {partition: n}}``."""
    found = []
    for offset in source_offsets:
        if isinstance(offset, dict) and offset and all(
                isinstance(parts, dict) and parts
                and all(str(p).lstrip("-").isdigit() and isinstance(n, int)
                        for p, n in parts.items())
                for parts in offset.values()):
            found.append({t: {str(p): int(n) for p, n in parts.items()}
                          for t, parts in offset.items()})
    return found


def position_lines(offset: Any) -> list[str] | None:
    """A Kafka position as one line per topic-partition, ``"clicks-0  next offset 1250"``
    (what a restore of it re-reads from); None for another source's offset."""
    positions = kafka_positions([offset])
    if not positions:
        return None
    return [f"{topic}-{partition}  next offset {n}"
            for topic, parts in sorted(positions[0].items())
            for partition, n in sorted(parts.items(), key=lambda p: int(p[0]))]


def missing_ranges(needed: KafkaPositions, earliest: Mapping[tuple[str, int], int]
                   ) -> list[MissingRange]:
    """The ranges between each needed position and the partition's earliest offset, for
    partitions whose earliest offset is past the position (Spark's special offsets -1
    and -2, ``latest``/``earliest``, need nothing)."""
    gone = []
    for topic, parts in needed.items():
        for partition, position in parts.items():
            first = earliest.get((topic, int(partition)))
            if position >= 0 and first is not None and first > position:
                gone.append(MissingRange(topic, int(partition), position, first))
    return sorted(gone)


def kafka_sources(writer: Any) -> list[KafkaSource]:
    """The Kafka sources of the query a ``DataStreamWriter`` would start: the leaves of
    its logical plan read with the ``kafka`` format (py4j)."""
    plan = writer._df._jdf.queryExecution().logical()
    leaves = plan.collectLeaves().iterator()
    found = []
    while leaves.hasNext():
        leaf = leaves.next()
        if not leaf.getClass().getSimpleName().startswith("StreamingRelationV2"):
            continue
        if str(leaf.sourceName()).lower() != "kafka":
            continue
        options = leaf.extraOptions().asCaseSensitiveMap()
        found.append(KafkaSource.from_options({str(k): str(options.get(k))
                                               for k in options.keySet()}))
    return found


def earliest_offsets(jvm: Any, source: KafkaSource, partitions: Iterable[tuple[str, int]]
                     ) -> dict[tuple[str, int], int]:
    """Each partition's earliest offset, asked of the broker with the source's client
    options (``KafkaConsumer.beginningOffsets`` in the driver's JVM)."""
    props = jvm.java.util.Properties()
    for key, value in source.client.items():
        props.put(key, value)
    props.put("key.deserializer", _BYTES)
    props.put("value.deserializer", _BYTES)
    wanted = jvm.java.util.ArrayList()
    for topic, partition in partitions:
        wanted.add(jvm.org.apache.kafka.common.TopicPartition(topic, partition))
    consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props)
    try:
        answer = consumer.beginningOffsets(wanted, jvm.java.time.Duration.ofSeconds(
            ADMIN_TIMEOUT_S))
        return {(str(tp.topic()), int(tp.partition())): int(answer.get(tp))
                for tp in answer.keySet()}
    finally:
        consumer.close()


def lost_records(jvm: Any, sources: list[KafkaSource], source_offsets: Iterable[Any]
                 ) -> list[tuple[KafkaSource, list[MissingRange]]]:
    """For each Kafka position of a checkpoint, the source that reads it and the ranges
    the broker no longer holds (only sources with something missing are returned)."""
    out = []
    for needed in kafka_positions(source_offsets):
        source = next((s for s in sources if s.reads(needed)), None)
        if source is None and len(sources) == 1:
            source = sources[0]
        if source is None:
            log.warning("no Kafka source of this query reads %s; its retention is not "
                        "checked", sorted(needed))
            continue
        partitions = [(t, int(p)) for t, parts in needed.items() for p in parts]
        gone = missing_ranges(needed, earliest_offsets(jvm, source, partitions))
        if gone:
            out.append((source, gone))
    return out
