"""The query's source settings: read from the built query, recorded in every checkpoint,
compared when a run restores.

A checkpoint holds the sources' offsets, not what the offsets mean: a rate source
restored with another ``rowsPerSecond``, a Kafka source with other topics or another
``maxOffsetsPerTrigger``, a file source over another directory read other batches than
the checkpoint's run did, and a sink's replay of a committed batch then fails much
later (``SinkReplayMismatchError``) or output changes silently. So the options that
decide what a batch reads are recorded with each checkpoint (``Manifest.sources``) and
compared before the restored query starts: a difference is refused with
:class:`~airflow_ckpt.errors.SourceSettingsChangedError` naming the option, its old and
its new value, unless the run sets ``restore.allow-source-changes`` (Flink's
``execution.state-recovery.ignore-unclaimed-state``: the user says the change is meant).

The settings are read from the logical plan of the ``DataStreamWriter`` the job built
(its ``StreamingRelation``/``StreamingRelationV2`` leaves, in Spark's order of
sources), through the JVM: the options the job passed to ``readStream``. Only the
options in :data:`RECORDED` are kept (no credentials: ``kafka.sasl.jaas.config`` and
the like are never recorded); of any other source only its name. Options that apply
only to a query's first start (Kafka's ``startingOffsets``, ``startingTimestamp``) are
not recorded: a restore ignores them, so a change there changes nothing a batch reads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_ckpt.errors import SourceSettingsChangedError
from airflow_ckpt.runtime.checkpoint.metadata import SourceSettings
from airflow_ckpt.runtime.masking import mask_secrets

if TYPE_CHECKING:
    from pyspark.sql.streaming import DataStreamWriter

log = logging.getLogger("airflow_ckpt.job")

#: the Spark conf (and ``CheckpointedJob`` argument) that accepts changed source settings
ALLOW_SOURCE_CHANGES = "restore.allow-source-changes"

#: the file sources' key in :data:`RECORDED` (their name is the file format)
FILE_SOURCE = "file"

#: per source, the options (Spark's spelling; matched case-insensitively) that decide
#: what a batch reads
RECORDED: Mapping[str, frozenset[str]] = {
    "rate": frozenset({"rowsPerSecond", "rampUpTime", "numPartitions"}),
    "rate-micro-batch": frozenset({"rowsPerBatch", "numPartitions", "startTimestamp",
                                   "advanceMillisPerBatch"}),
    "kafka": frozenset({"subscribe", "subscribePattern", "assign", "maxOffsetsPerTrigger",
                        "minOffsetsPerTrigger", "maxTriggerDelay"}),
    FILE_SOURCE: frozenset({"path", "maxFilesPerTrigger", "maxBytesPerTrigger", "latestFirst",
                            "fileNameOnly", "maxFileAge", "pathGlobFilter",
                            "recursiveFileLookup"}),
    "socket": frozenset({"host", "port"}),
}


def recorded_settings(name: str, options: Mapping[str, str], *,
                      file_source: bool = False) -> SourceSettings:
    """The recorded part of one source's options (secrets in values masked)."""
    wanted = {o.lower(): o for o in RECORDED.get(FILE_SOURCE if file_source else name.lower(),
                                                 ())}
    kept = {wanted[k.lower()]: mask_secrets(str(v)) for k, v in options.items()
            if k.lower() in wanted}
    return SourceSettings(name=name, options=dict(sorted(kept.items())))


def read_sources(writer: DataStreamWriter) -> tuple[SourceSettings, ...] | None:
    """The sources of the query ``writer`` would start, with their recorded options, in
    Spark's order of sources; None when the plan cannot be read (no JVM behind the
    writer, e.g. Spark Connect): then nothing is recorded or checked."""
    jdf = getattr(getattr(writer, "_df", None), "_jdf", None)
    if jdf is None:
        log.info("the query's plan has no JVM behind it (Spark Connect?): its source "
                 "settings are neither recorded nor checked on restore")
        return None
    try:
        plan = jdf.queryExecution().logical()
        leaves = plan.collectLeaves()
        return tuple(s for s in (_source(leaves.apply(i)) for i in range(leaves.size()))
                     if s is not None)
    except Exception:  # a check that cannot run must not stop the job
        log.warning("could not read the query's source settings; they are neither "
                    "recorded nor checked on restore", exc_info=True)
        return None


def _source(leaf: Any) -> SourceSettings | None:
    kind = leaf.getClass().getSimpleName()
    if kind == "StreamingRelationV2":  # rate, Kafka, ...: DataSource V2
        options = leaf.extraOptions().asCaseSensitiveMap()
        return recorded_settings(str(leaf.sourceName()), dict(options.items()))
    if kind == "StreamingRelation":  # file sources, socket: DataSource V1
        source = leaf.dataSource()
        entries = source.options().iterator()
        options = {}
        while entries.hasNext():
            entry = entries.next()
            options[str(entry._1())] = str(entry._2())
        return recorded_settings(str(source.className()), options,
                                 file_source=str(leaf.sourceName()).startswith("FileSource"))
    return None  # not a streaming source (a static table joined to the stream)


def source_changes(
    old: Iterable[SourceSettings], new: Iterable[SourceSettings]
) -> tuple[tuple[str, str, str | None, str | None], ...]:
    """Each difference between two sources' settings as ``(source, option, old, new)``;
    ``option`` is ``"source"`` when a source itself was added, removed or replaced."""
    old, new = tuple(old), tuple(new)
    changes: list[tuple[str, str, str | None, str | None]] = []
    for i in range(max(len(old), len(new))):
        before = old[i] if i < len(old) else None
        after = new[i] if i < len(new) else None
        label = f"source {i} ({(after or before).name})"  # type: ignore[union-attr]
        if before is None or after is None or before.name != after.name:
            changes.append((label, "source", before.name if before else None,
                            after.name if after else None))
            continue
        for option in sorted(set(before.options) | set(after.options)):
            if before.options.get(option) != after.options.get(option):
                changes.append((label, option, before.options.get(option),
                                after.options.get(option)))
    return tuple(changes)


def check_sources(restored: tuple[SourceSettings, ...] | None,
                  current: tuple[SourceSettings, ...] | None, *, restored_from: str | None,
                  allow_changes: bool) -> None:
    """Refuse a restore whose query reads with other source settings than the restored
    checkpoint was taken with (:class:`~airflow_ckpt.errors.SourceSettingsChangedError`,
    naming each option, old and new value), unless ``allow_changes``: then log them.
    Nothing to compare (a fresh start, an unreadable plan, a checkpoint taken before
    sources were recorded) passes."""
    if restored is None or current is None:
        return
    changes = source_changes(restored, current)
    if not changes:
        return
    said = "; ".join(f"{source}: {option} was {_quoted(before)}, now {_quoted(after)}"
                     for source, option, before, after in changes)
    if allow_changes:
        log.warning("restoring %s with other source settings (%s set): %s", restored_from,
                    ALLOW_SOURCE_CHANGES, said)
        return
    raise SourceSettingsChangedError(
        f"the query reads its sources with other settings than {restored_from} was taken "
        f"with: {said}. A restore resumes the recorded offsets, so these settings would "
        f"change what the replayed and later batches read. Restore with the recorded "
        f"settings, or set spark.airflow_ckpt.{ALLOW_SOURCE_CHANGES}=true if the change "
        f"is meant", changes)


def _quoted(value: str | None) -> str:
    return "unset" if value is None else repr(value)
