"""``airflow-ckpt``: the storage admin's command line.

::

    airflow-ckpt --storage s3://bucket/prefix jobs
    airflow-ckpt --storage ... checkpoints <job>        # id, kind, trigger, batch, sizes, durations
    airflow-ckpt --storage ... savepoints <job>
    airflow-ckpt --storage ... describe <path-or-id> [--job J] [--json]
    airflow-ckpt --storage ... history <job> [--type T] [--limit N] [--json]  # wraps, never cuts
    airflow-ckpt --storage ... dispose <savepoint path> [--yes] [--force]
    airflow-ckpt --storage ... state <savepoint path> [--json]   # needs pyspark
    airflow-ckpt --storage ... import <spark checkpoint dir> --job J [--savepoint-name N]
    airflow-ckpt --storage ... export <checkpoint or savepoint> <dir> [--job J]
    airflow-ckpt [--storage ...] examples <dags folder> [--jobs-dir D] [--create-bucket]
    airflow-ckpt --storage ... check-storage     # probe the guarantees the runtime needs
    airflow-ckpt --version

Every listing takes ``-o table|json|yaml`` (``--output``, as Airflow's CLI; ``--json`` is
``-o json``). The storage is ``--storage`` or ``$AIRFLOW_CKPT_STORAGE``. Credentials,
endpoint and region come from ``--conn-id <aws connection>`` (resolved by Airflow, with the
Amazon provider's semantics when it is installed) or else from ``--endpoint-url`` /
``--region`` and the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, profiles,
instance roles). Airflow is imported only for ``--conn-id``; pyspark only by ``state``.
``examples`` (:mod:`airflow_ckpt.examples`) needs no storage (default: the examples'
``file://`` root).

Exit codes: 0 success, 1 an operation failed (message on stderr; also a ``file://`` root
that does not exist, and ``check-storage`` when a property the runtime needs is missing),
2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from airflow_ckpt import __version__, examples
from airflow_ckpt.driver_output import root_cause
from airflow_ckpt.errors import AirflowCkptError, StorageAccessDeniedError
from airflow_ckpt.formatting import human_bytes, human_ms
from airflow_ckpt.jobnames import unknown_job_hint
from airflow_ckpt.runtime.adopt.exporter import export_checkpoint
from airflow_ckpt.runtime.adopt.importer import import_spark_checkpoint
from airflow_ckpt.runtime.adopt.spark_dir import open_location, open_spark_checkpoint
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog, CompletedRef
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.control.savepoints import (
    dispose_savepoint,
    last_lifecycle_event,
    resolve_savepoint,
    resolve_snapshot,
)
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.sources.kafka import position_lines
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.check import check_storage
from airflow_ckpt.runtime.storage.factory import parse_storage_uri
from airflow_ckpt.runtime.storage.layout import JobLayout

STORAGE_ENV = "AIRFLOW_CKPT_STORAGE"


class CliError(AirflowCkptError):
    """A command could not do what was asked (exit code 1)."""


# --------------------------------------------------------------------------- formatting


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: Sequence[Sequence[object]], header: Sequence[str], out: TextIO) -> None:
    """Print a left-aligned text table (numbers right-aligned)."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(isinstance(r[i], int | float) for r in rows) and bool(rows)
               for i in range(len(header))]
    for n, row in enumerate(cells):
        line = "  ".join(
            (c.rjust(w) if numeric[i] and n else c.ljust(w))
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        out.write(line.rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _snapshot_row(m: Manifest) -> list[object]:
    t = m.timings
    shared = sum(1 for f in m.files if f.shared)
    return [
        m.savepoint_id if m.savepoint_id else m.checkpoint_id,
        m.kind, m.trigger, m.batch_id, iso(t.completed_ts),
        human_bytes(m.state_size), human_bytes(m.checkpointed_size),
        human_ms(t.end_to_end_duration_ms), human_ms(t.start_delay_ms),
        human_ms(t.sync_duration_ms), human_ms(t.async_duration_ms),
        f"{len(m.files)} ({shared} shared)" if shared else len(m.files),
    ]


SNAPSHOT_HEADER = ("id", "kind", "trigger", "batch", "completed (UTC)", "state size",
                   "uploaded", "end-to-end", "start delay", "sync", "async", "files")


OUTPUTS = ("table", "json", "yaml")


def _print_json(obj: Any, out: TextIO, output: str = "json") -> None:
    """Print ``obj`` as JSON or YAML (``-o json|yaml``)."""
    if output == "yaml":
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - PyYAML comes with Airflow
            raise CliError("-o yaml needs PyYAML: pip install pyyaml") from exc
        plain = json.loads(json.dumps(obj, default=str))
        out.write(yaml.safe_dump(plain, sort_keys=True, default_flow_style=False))
        return
    out.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _structured(args: argparse.Namespace) -> bool:
    return bool(args.output != "table")


# --------------------------------------------------------------------------- commands


def cmd_jobs(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    rows = []
    for job in CheckpointCatalog.jobs(storage):
        try:
            catalog = CheckpointCatalog(storage, job)
        except AirflowCkptError:  # a directory that is not a job (bad name)
            continue
        ids = catalog.checkpoint_ids()
        event = last_lifecycle_event(storage, job)
        rows.append({
            "job": job,
            "latest_checkpoint": ids[-1] if ids else None,
            "checkpoints": len(ids),
            "savepoints": len(catalog.savepoint_ids()),
            "status": event.type if event else None,
            "status_since": iso(event.ts) if event else None,
        })
    if _structured(args):
        _print_json(rows, out, args.output)
    elif not rows:
        out.write(f"no jobs in {storage.uri}\n")
    else:
        table([list(r.values()) for r in rows],
              ("job", "latest checkpoint", "checkpoints", "savepoints", "last event",
               "since (UTC)"), out)
    return 0


def _list_snapshots(storage: CheckpointStorage, manifests: list[Manifest], what: str, job: str,
                    args: argparse.Namespace, out: TextIO) -> int:
    if _structured(args):
        _print_json([{**m.history_entry(), "completed_ts": m.timings.completed_ts,
                      "files": len(m.files)} for m in manifests], out, args.output)
    elif not manifests:
        hint = unknown_job_hint(storage, job)
        out.write(f"job {job!r} has no completed {what}" + (f" ({hint})" if hint else "") + "\n")
    else:
        table([_snapshot_row(m) for m in manifests], SNAPSHOT_HEADER, out)
    return 0


def cmd_checkpoints(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    catalog = CheckpointCatalog(storage, args.job)
    return _list_snapshots(storage, catalog.completed_checkpoints(), "checkpoints", args.job,
                           args, out)


def cmd_savepoints(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    catalog = CheckpointCatalog(storage, args.job)
    return _list_snapshots(storage, catalog.savepoints(), "savepoints", args.job, args, out)


def _read(storage: CheckpointStorage, ref: CompletedRef) -> tuple[CheckpointCatalog, Manifest]:
    catalog = CheckpointCatalog(storage, ref.job)
    return catalog, catalog.read(ref)


def cmd_describe(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    ref = resolve_snapshot(storage, args.path, args.job)
    catalog, m = _read(storage, ref)
    if _structured(args):
        _print_json({"uri": catalog.uri_of(ref), "stats": m.history_entry(),
                     "manifest": asdict(m)}, out, args.output)
        return 0
    t = m.timings
    shared = [f for f in m.files if f.shared]
    lines = [
        ("uri", catalog.uri_of(ref)),
        ("kind", f"{m.kind} ({m.trigger})"),
        ("checkpoint id", m.checkpoint_id),
        ("savepoint id", m.savepoint_id or "-"),
        ("batch id", m.batch_id),
        ("job / query", f"{m.job} / {m.query_id}"),
        ("mode", m.mode),
        ("spark", m.spark_version),
        ("restored from", m.restored_from or "-"),
        ("imported from", m.extra.get("imported_from") or "-"),
        ("triggered", iso(t.trigger_ts)),
        ("completed", iso(t.completed_ts)),
        ("end-to-end", human_ms(t.end_to_end_duration_ms)),
        ("start delay", human_ms(t.start_delay_ms)),
        ("sync / async", f"{human_ms(t.sync_duration_ms)} / {human_ms(t.async_duration_ms)}"),
        ("state size", f"{human_bytes(m.state_size)} ({m.state_size} B)"),
        ("uploaded", f"{human_bytes(m.checkpointed_size)} ({m.checkpointed_size} B)"),
        ("subtasks", f"{m.num_acknowledged_subtasks}/{m.num_subtasks} acknowledged"),
        ("files", f"{len(m.files)} ({len(shared)} shared, {len(m.files) - len(shared)} own)"),
        ("pending 2PC batches", ", ".join(map(str, m.pending_transactions)) or "-"),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        out.write(f"{key.ljust(width)}  {value}\n")
    if m.operators:
        out.write("\nstateful operators:\n")
        table([[o.operator_id, o.num_partitions, ", ".join(o.store_names)] for o in m.operators],
              ("operator", "partitions", "stores"), out)
    if m.source_offsets:
        out.write("\nsource offsets (what a restore re-reads from):\n")
        for i, offset in enumerate(m.source_offsets):
            partitions = position_lines(offset)
            if partitions is None:
                out.write(f"  {json.dumps(offset, sort_keys=True)}\n")
                continue
            out.write(f"  source {i} (kafka):\n")
            out.writelines(f"    {line}\n" for line in partitions)
    return 0


def cmd_history(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    events = HistoryReader(storage, args.job).events(args.type or None)
    if args.limit:
        events = events[-args.limit:]
    if _structured(args):
        _print_json([e.data for e in events], out, args.output)
        return 0
    if not events:
        hint = unknown_job_hint(storage, args.job)
        out.write(f"job {args.job!r} has no history events" + (f" ({hint})" if hint else "")
                  + "\n")
        return 0
    rows = []
    for e in events:
        lines = textwrap.wrap(_history_details(e.type, e.data), HISTORY_DETAILS_WIDTH,
                              break_on_hyphens=False) or [""]
        rows.append([iso(e.ts), e.type, lines[0]])
        rows.extend(["", "", line] for line in lines[1:])
    table(rows, ("time (UTC)", "event", "details"), out)
    return 0


#: the ``history`` table wraps an event's details at this width (never cuts them)
HISTORY_DETAILS_WIDTH = 100
#: payload fields shown first, so what decides (restart, delay, attempt) leads the row
_HISTORY_LEAD = {
    ev.RESTART: ("restart", "delay_s", "attempt", "level", "strategy", "cause"),
    ev.FAILURE: ("level", "cause", "exit_code", "attempt"),
    ev.RESTORED: ("kind", "checkpoint_id", "savepoint_id", "batch_id", "from_job", "path"),
    ev.SAVEPOINT_COMPLETED: ("savepoint_id", "batch_id", "imported_from", "path"),
}


def _history_details(event_type: str, data: dict[str, Any]) -> str:
    """Every payload field as ``key=<json>``: the event type's lead fields first."""
    lead = [k for k in _HISTORY_LEAD.get(event_type, ()) if k in data]
    rest = [k for k in data if k not in lead and k not in ("type", "ts", "job")]
    return ", ".join(f"{k}={json.dumps(data[k], default=str)}" for k in (*lead, *rest))


def cmd_dispose(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    ref = resolve_savepoint(storage, args.path, args.job)
    uri = CheckpointCatalog(storage, ref.job).uri_of(ref)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"refusing to delete {uri} without --yes (stdin is not a terminal)")
        answer = input(f"Delete savepoint {uri} and all its files? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            out.write("not deleted\n")
            return 1
    done = dispose_savepoint(storage, args.path, job=args.job, force=args.force)
    out.write(f"disposed {done.uri}: {done.num_objects} objects, "
              f"{human_bytes(done.num_bytes)}\n")
    return 0


def cmd_check_storage(storage: CheckpointStorage, args: argparse.Namespace,
                      out: TextIO) -> int:
    """Probe the storage (:mod:`airflow_ckpt.runtime.storage.check`): one line per
    property; fails naming every property that is missing."""
    out.write(f"checking {storage!r} in a scratch prefix (removed afterwards)\n")
    result = check_storage(storage)
    for line in result.lines():
        out.write(line + "\n")
    if not result.ok:
        names = ", ".join(f.prop.value for f in result.missing)
        raise CliError(f"{result.uri} lacks what the runtime's guarantees rest on: {names}")
    return 0


def summarize_state(checkpoint_dir: Path, manifest: Manifest) -> list[dict[str, Any]]:
    """Per operator/store: partitions, batch range and row counts per partition.

    Uses Spark's state data sources (``state-metadata`` for the operators, ``statestore``
    for the rows) on a local checkpoint directory. Imports pyspark.
    """
    with local_spark("airflow-ckpt state") as spark:
        return _read_state(spark, str(checkpoint_dir), manifest)


@contextlib.contextmanager
def local_spark(app: str) -> Iterator[Any]:
    """The active Spark session, or a local one of our own for the block (stopped after
    it: no JVM is left behind). Its JVM reads ``HADOOP_CONF_DIR`` as Spark does, so
    ``hdfs://`` name services resolve as in the user's jobs. Imports pyspark."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    existing = SparkContext._active_spark_context
    spark = (
        SparkSession.builder.master("local[2]").appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def _read_state(spark: Any, location: str, manifest: Manifest) -> list[dict[str, Any]]:
    from pyspark.sql import functions

    # Spark 4.2's HDFS state store reports loads to the StateStoreCoordinator, which only
    # exists once the session's StreamingQueryManager does; without it, reading the
    # state of a session that never ran a query fails with CANNOT_LOAD_STATE_STORE.
    _ = spark.streams.active
    stores: list[dict[str, Any]] = []
    try:
        for row in spark.read.format("state-metadata").load(location).collect():
            stores.append({"operator_id": row["operatorId"], "operator": row["operatorName"],
                           "store": row["stateStoreName"], "partitions": row["numPartitions"],
                           "min_batch": row["minBatchId"], "max_batch": row["maxBatchId"]})
    except Exception as exc:  # no operator metadata (older checkpoint): use the manifest
        if not manifest.operators:
            raise CliError(f"Spark cannot read the state metadata: {root_cause(exc, 300)}"
                           ) from exc
        stores = [{"operator_id": o.operator_id, "operator": None, "store": name,
                   "partitions": o.num_partitions, "min_batch": None, "max_batch": None}
                  for o in manifest.operators for name in o.store_names]
    for store in stores:
        try:
            df = (spark.read.format("statestore")
                  .option("operatorId", store["operator_id"])
                  .option("storeName", store["store"]).load(location))
            counts = {r["partition_id"]: r["count"]
                      for r in df.groupBy("partition_id").agg(
                          functions.count(functions.lit(1)).alias("count")).collect()}
            store["rows"] = sum(counts.values())
            store["rows_per_partition"] = {str(p): counts.get(p, 0)
                                           for p in range(store["partitions"] or 0)}
        except Exception as exc:
            store["error"] = root_cause(exc, 300)
    return stores


def cmd_state(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    ref = resolve_savepoint(storage, args.path, args.job)
    catalog, manifest = _read(storage, ref)
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-state-") as tmp:
        target = Path(args.keep) if args.keep else Path(tmp) / "checkpoint"
        materialize(storage, manifest, JobLayout(ref.job).root, target)
        stores = summarize_state(target, manifest)
    if _structured(args):
        _print_json({"uri": catalog.uri_of(ref), "batch_id": manifest.batch_id,
                     "stores": stores}, out, args.output)
        return 0
    out.write(f"{catalog.uri_of(ref)} (batch {manifest.batch_id})\n")
    if not stores:
        out.write("no stateful operators\n")
        return 0
    rows = []
    for s in stores:
        per = list((s.get("rows_per_partition") or {}).values())
        spread = f"{min(per)}..{max(per)}" if per else "-"
        rows.append([s["operator_id"], s["operator"] or "-", s["store"], s["partitions"],
                     s.get("rows", "-") if "error" not in s else "error: " + s["error"],
                     spread])
    table(rows, ("operator", "name", "store", "partitions", "rows", "rows/partition"), out)
    return 0


def cmd_import(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    """A stopped Spark query's checkpoint directory becomes a savepoint of ``--job``."""
    with contextlib.ExitStack() as stack:
        source = open_spark_checkpoint(  # a Spark session only for hdfs://
            args.source, lambda: stack.enter_context(local_spark("airflow-ckpt import")))
        done = import_spark_checkpoint(storage, args.job, source, args.savepoint_name,
                                       allow_uncommitted=args.allow_uncommitted_batch)
    m = done.manifest
    if _structured(args):
        _print_json({"uri": done.uri, "imported_from": done.source, "savepoint_id":
                     m.savepoint_id, "batch_id": m.batch_id, "files": len(m.files),
                     "state_size": m.state_size}, out, args.output)
        return 0
    out.write(f"imported batch {m.batch_id} of {done.source} as {done.uri} "
              f"({len(m.files)} files, {human_bytes(m.state_size)})\n"
              f"restore it with restore={done.uri} (the query's next batch is "
              f"{m.batch_id + 1})\n")
    return 0


def cmd_export(storage: CheckpointStorage, args: argparse.Namespace, out: TextIO) -> int:
    """A checkpoint or savepoint as a plain Spark checkpoint directory."""
    ref = resolve_snapshot(storage, args.path, args.job)
    catalog, manifest = _read(storage, ref)
    with contextlib.ExitStack() as stack:
        target = open_location(  # a Spark session only for hdfs://
            args.target, "export to",
            lambda: stack.enter_context(local_spark("airflow-ckpt export")))
        done = export_checkpoint(storage, manifest, target)
    out.write(f"exported {catalog.uri_of(ref)} (batch {done.batch_id}, {done.num_files} "
              f"files) to {done.location}\nplain Spark resumes from it with "
              f"checkpointLocation={done.location} (its next batch is {done.batch_id + 1})\n")
    return 0


def cmd_examples(args: argparse.Namespace, out: TextIO) -> int:
    """Check the storage, copy the example DAGs and jobs, print the settings to make."""
    uri = parse_storage_uri(args.storage or examples.DEFAULT_STORAGE).uri
    dags_folder = Path(args.dags_folder).expanduser().absolute()
    jobs_dir = (Path(args.jobs_dir).expanduser().absolute() if args.jobs_dir
                else examples.default_jobs_dir(dags_folder))
    storage = open_cli_storage(args, uri, must_exist=False)
    try:
        note = examples.prepare_storage(storage, create_bucket=args.create_bucket)
    finally:
        storage.close()
    copied = examples.copy_examples(dags_folder, jobs_dir, force=args.force)
    env = examples.settings(
        uri, jobs_dir, conn_id=args.conn_id,
        endpoint_url=args.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"),
        region_name=args.region or os.environ.get("AWS_DEFAULT_REGION"))
    out.write(examples.report(copied, note, env))
    return 0


# --------------------------------------------------------------------------- parser

Command = Callable[[CheckpointStorage, argparse.Namespace, TextIO], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-ckpt",
        description="Inspect and administer airflow-ckpt checkpoint storage.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_storage_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    def add_output(p: argparse.ArgumentParser, json_help: str = "same as -o json") -> None:
        p.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                       help="output format (default: table)")
        p.add_argument("--json", action="store_const", dest="output", const="json",
                       help=json_help)

    p = add("jobs", cmd_jobs, "list the jobs in the storage")
    add_output(p, "print JSON")
    for name, func, what in (("checkpoints", cmd_checkpoints, "retained checkpoints"),
                             ("savepoints", cmd_savepoints, "savepoints")):
        p = add(name, func, f"list a job's completed {what} with their stats")
        p.add_argument("job")
        add_output(p, "print the Flink-style stats as JSON")
    p = add("describe", cmd_describe, "show one checkpoint's or savepoint's manifest stats")
    p.add_argument("path", help="full URI, <job>/chk-<n>, <job>/savepoints/sp-<id>; or with "
                                "--job: <n>, chk-<n>, sp-<id>")
    p.add_argument("--job", help="the job, when PATH is short")
    add_output(p, "print the whole manifest as JSON")
    p = add("history", cmd_history, "show a job's history events")
    p.add_argument("job")
    p.add_argument("--type", action="append", help="only events of this type (repeatable)")
    p.add_argument("--limit", type=int, default=0, help="only the newest N events")
    add_output(p, "print JSON")
    p = add("dispose", cmd_dispose, "delete a savepoint (never a checkpoint)")
    p.add_argument("path", help="the savepoint: full URI or <job>/savepoints/sp-<id>")
    p.add_argument("--job", help="the job, when PATH is short (sp-<id>)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--force", action="store_true",
                   help="also delete an incomplete savepoint (no or unreadable _metadata)")
    p = add("state", cmd_state,
            "summarise a savepoint's state per operator (Spark state data source)")
    p.add_argument("path", help="the savepoint: full URI or <job>/savepoints/sp-<id>")
    p.add_argument("--job", help="the job, when PATH is short (sp-<id>)")
    p.add_argument("--keep", metavar="DIR",
                   help="materialise into DIR and keep it (default: a temporary directory)")
    add_output(p, "print JSON")
    p = add("import", cmd_import,
            "turn a stopped Spark query's checkpoint directory (its checkpointLocation) "
            "into a savepoint of a job; the job restores it with no batch run again")
    p.add_argument("source", help="the Spark checkpoint directory: a local path or file://")
    p.add_argument("--job", required=True, help="the job the savepoint belongs to")
    p.add_argument("--savepoint-name", metavar="N",
                   help="the savepoint id (default: spark-<query id>-b<batch>)")
    p.add_argument("--allow-uncommitted-batch", action="store_true",
                   help="the query is stopped for sure although a batch was planned and "
                        "not committed (it was killed inside it): import the last "
                        "committed batch")
    add_output(p, "print JSON")
    p = add("export", cmd_export,
            "write a checkpoint or savepoint as a plain Spark checkpoint directory that "
            "Spark resumes from without airflow-ckpt")
    p.add_argument("path", help="full URI, <job>/chk-<n>, <job>/savepoints/sp-<id>; or with "
                                "--job: <n>, chk-<n>, sp-<id>")
    p.add_argument("target", help="a new (or empty) local directory")
    p.add_argument("--job", help="the job, when PATH is short")
    add("check-storage", cmd_check_storage,
        "probe the storage for what the runtime relies on (create-only and "
        "compare-and-swap writes, listings, ETags, ranged reads) in a scratch prefix "
        "it removes; exits 1 naming any property that is missing")
    p = sub.add_parser(
        "examples", help="copy the example DAGs and Spark jobs into an Airflow deployment",
        description="Copy the example DAGs into DAGS_FOLDER and their Spark jobs beside it, "
                    "check the storage (--storage, default the examples' file:// root; "
                    "--create-bucket creates a missing S3 bucket) and print the "
                    "environment settings the Airflow components need.")
    p.add_argument("dags_folder", help="Airflow's DAGs folder ([core] dags_folder)")
    p.add_argument("--jobs-dir", metavar="DIR",
                   help="where the Spark jobs go (default: spark_jobs beside DAGS_FOLDER)")
    p.add_argument("--create-bucket", action="store_true",
                   help="create the S3 bucket of --storage if it does not exist")
    p.add_argument("--force", action="store_true",
                   help="replace files that differ from the shipped examples")
    add_storage_options(p, top_level=False)
    return parser


def add_storage_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--storage``, ``--endpoint-url``, ``--region``, ``--conn-id``: before the command
    (``top_level``, with their defaults) or also after it (``examples``; only when given,
    so they do not mask the ones before it)."""
    def default(value: str | None) -> str | None:
        return value if top_level else argparse.SUPPRESS

    parser.add_argument("--storage", default=default(os.environ.get(STORAGE_ENV)),
                        help=f"storage root, s3://bucket/prefix or file:///path "
                             f"(default: ${STORAGE_ENV})")
    parser.add_argument("--endpoint-url", default=default(None),
                        help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL / AWS)")
    parser.add_argument("--region", default=default(None),
                        help="S3 region (default: $AWS_DEFAULT_REGION / AWS config)")
    parser.add_argument("--conn-id", default=default(None), metavar="CONN_ID",
                        help="take credentials, endpoint and region from this Airflow aws "
                             "connection (needs Airflow; --endpoint-url/--region override)")


def connection_options(storage_uri: str, conn_id: str) -> dict[str, Any]:
    """Storage options from an Airflow ``aws`` connection (imports Airflow).

    Airflow configures its logging at import, writing to the ``sys.stdout`` of that
    moment; it is imported with stdout pointing at stderr, so that its logs (and those of
    boto3 it routes) stay out of the command's output (``-o json`` must parse). botocore's
    INFO line "Found credentials in environment variables", which Airflow's logging
    would print on every call, is silenced (its warnings still show).
    """
    with contextlib.redirect_stdout(sys.stderr):
        try:
            from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
        except ImportError as exc:
            raise CliError(f"--conn-id needs Apache Airflow installed ({exc})") from exc
        logging.getLogger("botocore.credentials").setLevel(logging.WARNING)
        return CheckpointStoreHook(storage_uri, conn_id).storage_options()


#: attempts per S3 request of a CLI command (the storage's default is 5). A command
#: reads many objects and a single request that fails fails the whole command, while a
#: retried read costs nothing: at 30 % faulty requests, 5 attempts lose about one
#: request in 400, 10 about one in 170,000. (A read whose body breaks off is read again
#: by the storage itself.)
CLI_MAX_ATTEMPTS = 10


def open_cli_storage(args: argparse.Namespace, uri: str | None = None, *,
                     must_exist: bool = True) -> CheckpointStorage:
    """Open ``uri`` (default ``--storage``) with the connection's or the environment's
    credentials, retrying each S3 request up to ``CLI_MAX_ATTEMPTS`` times (a
    connection's own ``max_attempts`` wins); a ``file://`` root must exist unless
    ``must_exist`` is false."""
    uri = uri or args.storage
    parsed = parse_storage_uri(uri)
    if must_exist and parsed.scheme == "file" and not Path(str(parsed.path)).is_dir():
        raise CliError(f"storage root {parsed.uri} does not exist (or is not a directory)")
    options: dict[str, Any] = {}
    if args.conn_id and parsed.scheme == "s3":
        options.update(connection_options(uri, args.conn_id))
    overrides = {"endpoint_url": args.endpoint_url, "region_name": args.region}
    options.update({k: v for k, v in overrides.items() if v})
    if parsed.scheme == "s3":
        options.setdefault("max_attempts", CLI_MAX_ATTEMPTS)
    return open_storage(uri, **options)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (argument errors exit 2 via argparse)."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.storage and args.command != "examples":
        parser.error(f"--storage is required (or set ${STORAGE_ENV})")
    if getattr(args, "limit", 0) and args.limit < 0:
        parser.error("--limit must be >= 0")
    try:
        if args.command == "examples":
            return cmd_examples(args, out)
        storage = open_cli_storage(args)
        try:
            code: int = args.func(storage, args, out)
            return code
        finally:
            storage.close()
    except StorageAccessDeniedError as exc:
        hint = "" if args.conn_id else (
            "\nairflow-ckpt: hint: --conn-id <aws connection> uses an Airflow connection's "
            "credentials; otherwise set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        sys.stderr.write(f"airflow-ckpt: error: {exc}{hint}\n")
        return 1
    except AirflowCkptError as exc:
        sys.stderr.write(f"airflow-ckpt: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("airflow-ckpt: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
