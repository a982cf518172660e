"""The merge: one column partition of a table, from intraday to historical Parquet, with Spark.

    merge(spark, MergeRequest("Market", "Trade", "2026-11-21", "/var/db", IntradaySource(address=...)))

``spark`` is a session with the ``dis`` source registered (``disd.spark.session()``).  The
command line ``dis merge`` and the spark-submit entry point (``examples/merge_job.py``) are
``disd.merge_job``; this module holds no Spark code of its own: Spark reads through the ``dis``
source (by its name) and writes with ``disd.historical.parquet``.

Steps (docs/historical.md has the layout and the guarantees):

1. **Snapshot** the intraday locations of the partition — from the DIS (``--address``/``--routing``)
   or, with ``--db-root`` and no DIS option, from the column files at their checkpoints — and
   refuse a partition still being written (``disd.historical.liveness``) unless ``--force``.
2. **Lock** the table (one writer at a time), check or write its definition, pick the internal
   partition: the one already holding this partition, else a ``WritablePartitions/<name>`` (the
   one with the most free space; ``Partitions/0`` is created when there is none).
3. **Skip** when the location there already holds exactly these rows: same source identity
   (every intraday location's row count and file sizes, the schema and the settings) and its
   files intact.  A complete version left unlinked by a killed merge is linked instead.
4. **Write** with Spark: read the partition through the ``dis`` source, order by the sort key
   (``--sort-by``, else the definition's), write Parquet into a hidden staging directory next to
   the location, reached through ``WritablePartitions/<name>``.
5. **Publish** (``disd.historical.publish``): fsync, rename to a new version directory, switch the
   location's link, record it in ``MetadataIndex/<Table>.tlmi``.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from disd.errors import DisError
from disd.historical.definitions import DefinitionError, TableDefinition, read_definition, write_definition
from disd.historical.durable import (
    PublishError,
    TableLock,
    current_version,
    ensure_link,
    make_dirs,
    stage_dir,
    sweep_staging,
    switch_link,
)
from disd.historical.index import MetadataIndexError, check_files, read_manifest
from disd.historical.intraday import SourceError, SourceSnapshot, snapshot_from_dis, snapshot_from_files
from disd.historical.layout import (
    DEFAULT_INTERNAL_PARTITION,
    Layout,
    NamespaceRoot,
    NamespaceType,
    nested_locations,
    subdirs,
)
from disd.historical.liveness import DEFAULT_QUIET_S, check_not_live
from disd.historical.parquet import ParquetSettings, write_parquet
from disd.historical.publish import OutputError, finalize, publish_location, record_in_index
from disd.names import NameKind, validate_name
from disd.security import ClientSecurity
from disd.storage.dblock import DatabaseLock, DatabaseLockedError, lock_database

Step = Callable[[str], None]


class MergeError(DisError):
    """A merge that cannot run: nothing to merge, a schema change, something foreign in the way."""


@dataclass(frozen=True)
class MergeSettings:
    sort_by: tuple[str, ...] | None = None  # None: the definition's sort key (or none)
    parquet: ParquetSettings = field(default_factory=ParquetSettings)

    def record(self, sort_by: Sequence[str]) -> dict[str, Any]:
        """What the written files depend on (part of the source identity, kept in the index)."""
        return {"sort_by": list(sort_by), **asdict(self.parquet)}


@dataclass(frozen=True)
class IntradaySource:
    """Where a merge reads intraday rows: a DIS (address or routing, with its security), or the
    column files under the database root (with the DIS's schemas directory)."""

    address: str | None = None
    routing: str | None = None
    security: ClientSecurity | None = None
    schemas: str | None = None

    @property
    def via_dis(self) -> bool:
        return bool(self.address or self.routing)

    def spark_options(self) -> dict[str, str]:
        """The ``dis`` source's options that reach the same DIS with the same security."""
        sec = self.security or ClientSecurity()
        pairs = {"address": self.address, "routing": self.routing, "ca": sec.ca, "cert": sec.cert,
                 "key": sec.key, "token": sec.token, "serverName": sec.server_name}
        return {k: v for k, v in pairs.items() if v}


@dataclass(frozen=True)
class MergeRequest:
    namespace: str
    table: str
    value: str  # the column partition, e.g. 2026-11-21
    db_root: str
    source: IntradaySource = field(default_factory=IntradaySource)
    settings: MergeSettings = field(default_factory=MergeSettings)
    writable_partition: str | None = None
    force: bool = False
    quiet_s: float = DEFAULT_QUIET_S
    today: dt.date | None = None

    def __post_init__(self) -> None:
        validate_name(NameKind.NAMESPACE, self.namespace)
        validate_name(NameKind.TABLE, self.table)
        validate_name(NameKind.COLUMN_PARTITION, self.value)
        if self.writable_partition is not None:
            validate_name(NameKind.INTERNAL_PARTITION, self.writable_partition)


@dataclass(frozen=True)
class MergeResult:
    status: str  # "merged", "unchanged" (already merged) or "relinked" (a killed merge's version)
    namespace: str
    table: str
    value: str
    internal_partition: str
    rows: int
    files: int
    version: str
    path: str
    identity: str
    source: str  # "dis" or "files"
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- steps 1-3 ----------------------------------------------------------------------------------
def snapshot(req: MergeRequest) -> SourceSnapshot:
    """The intraday locations of the partition, from the DIS or the column files."""
    src = req.source
    try:
        if src.via_dis:
            from disd.client import connect

            with connect(src.address, src.routing, src.security) as client:
                return snapshot_from_dis(client, req.namespace, req.table, req.value)
        schema = _schema_from_dir(src.schemas, req.namespace, req.table)
        return snapshot_from_files(req.db_root, schema, req.value)
    except SourceError as e:
        raise MergeError(str(e)) from None


def _schema_from_dir(schemas: str | None, namespace: str, table: str):  # noqa: ANN202
    from disd.schema import SchemaError, SchemaRegistry

    if not schemas:
        raise MergeError("reading column files needs the DIS's schemas directory (--schemas or --config)")
    try:
        s = SchemaRegistry.load_dir(schemas).get(namespace, table)
    except SchemaError as e:
        raise MergeError(str(e)) from None
    if s is None:
        raise MergeError(f"no schema for {namespace}.{table} in {schemas}")
    return s


def _definition(ns: NamespaceRoot, snap: SourceSnapshot, sort_by: tuple[str, ...] | None) -> TableDefinition:
    try:
        old = read_definition(ns, snap.table)
    except DefinitionError as e:
        raise MergeError(str(e)) from None
    if old is not None and old.layout is not Layout.NESTED:
        raise MergeError(f"{old.key} has layout {old.layout.value!r} in {ns.definition_path(snap.table)}; "
                         "merges write the 'nested' layout")
    if old is not None and old.schema_version > snap.schema.version:
        raise MergeError(f"{ns.definition_path(snap.table)} is version {old.schema_version} of {snap.schema.key}, "
                         f"newer than the intraday schema's version {snap.schema.version}: merge through the DIS "
                         "or schemas directory of the newest version")
    chosen = tuple(sort_by) if sort_by is not None else (_sort_key(old, snap.schema) if old is not None else ())
    unknown = [c for c in chosen if c not in snap.schema.column_names]
    if unknown:
        raise MergeError(f"sort column {unknown[0]!r} is not a column of {snap.schema.key} "
                         f"({', '.join(snap.schema.column_names)})")
    new = TableDefinition.from_schema(snap.schema, NamespaceType.SYSTEM, Layout.NESTED, chosen)
    if old is not None and not old.same_rows_as(new) and not _older_version(old, snap.schema):
        raise MergeError(f"the intraday schema of {snap.schema.key} differs from its historical definition "
                         f"{ns.definition_path(snap.table)}: historical and intraday rows would disagree")
    if old != new:
        write_definition(ns, new)
    return new


def _sort_key(old: TableDefinition, schema) -> tuple[str, ...]:  # noqa: ANN001 - TableSchema
    """The definition's sort key in ``schema``'s names: a column renamed since the definition's
    version takes its new name, a column dropped since leaves the key."""
    if not _older_version(old, schema):
        return old.sort_by
    from disd.schemaversions import origins

    now = {was: name for name, was in origins(schema, old.schema_version).items() if was is not None}
    return tuple(now[c] for c in old.sort_by if c in now)


def _older_version(old: TableDefinition, schema) -> bool:  # noqa: ANN001 - TableSchema
    """Whether ``old`` (the definition written by an earlier merge) is an older version of
    ``schema``: merged files of it are then read in the newest version (projected by the version
    recorded in each file), and the definition moves on to ``schema``'s version."""
    earlier = schema.versions.get(old.schema_version)
    return (old.schema_version < schema.version and earlier is not None
            and tuple(earlier.columns) == tuple(old.columns) and old.partition_column == schema.partition_column)


def file_metadata(schema) -> dict[str, str]:  # noqa: ANN001 - TableSchema
    """What a merge records in each Parquet file: the schema version of its rows and every
    version of the table (read back by ``disd.spark.readparquet.file_sources``)."""
    return {"dis.schema_version": str(schema.version), "dis.schema_versions": schema.history_json()}


def writable_partitions(ns: NamespaceRoot) -> list[str]:
    """Names under ``WritablePartitions`` that lead to a directory."""
    return subdirs(ns.writable_dir)


def _free_bytes(path: os.PathLike[str]) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def choose_partition(ns: NamespaceRoot, table: str, value: str, requested: str | None) -> str:
    """The internal partition the location goes to (step 2 of the module docstring)."""
    existing = nested_locations(ns, table, lambda v: v == value)
    writable = writable_partitions(ns)
    if len(existing) > 1:
        raise MergeError(f"{ns.namespace}.{table} {value} is in several internal partitions "
                         f"({', '.join(loc.internal_partition for loc in existing)}): readers see it twice; "
                         "keep one")
    if existing:
        ip = existing[0].internal_partition
        if requested is not None and requested != ip:
            raise MergeError(f"{ns.namespace}.{table} {value} is already in internal partition {ip}, "
                             f"not {requested}")
        if ip not in writable:
            raise MergeError(f"{ns.namespace}.{table} {value} is in internal partition {ip}, which is not "
                             f"writable (no {ns.writable_dir / ip})")
        return ip
    if requested is not None:
        if requested not in writable:
            raise MergeError(f"no writable partition {requested!r} in {ns.writable_dir} "
                             f"(there are: {', '.join(writable) or 'none'})")
        return requested
    if not writable:
        make_dirs(ns.partitions_dir / DEFAULT_INTERNAL_PARTITION)
        ensure_link(ns.writable_dir / DEFAULT_INTERNAL_PARTITION, f"../{ns.partitions_dir.name}/"
                    f"{DEFAULT_INTERNAL_PARTITION}")
        return DEFAULT_INTERNAL_PARTITION
    free = {n: _free_bytes(ns.writable_dir / n) for n in writable}
    return max(writable, key=lambda n: (free[n], -writable.index(n)))


def _same(parent, version: str, identity: str):  # noqa: ANN001, ANN202
    try:
        rec = read_manifest(parent / version)
    except MetadataIndexError:
        return None
    if rec is None or rec.identity != identity or check_files(parent / version, rec) is not None:
        return None
    return rec


def find_merged(parent, table: str, identity: str):  # noqa: ANN001, ANN201
    """(status, record) of a version in ``parent`` holding exactly these rows: the linked one
    ("unchanged"), else a complete one a killed merge did not link ("relinked", now linked)."""
    cur = current_version(parent, table)
    if cur is not None:
        rec = _same(parent, cur, identity)
        if rec is not None:
            return "unchanged", rec
    prefix = f".{table}.v"
    try:
        names = sorted((e.name for e in os.scandir(parent) if e.name.startswith(prefix) and e.is_dir()),
                       reverse=True)
    except FileNotFoundError:
        return None, None
    for name in names:
        if name == cur:
            continue
        rec = _same(parent, name, identity)
        if rec is not None:
            switch_link(parent, table, name)
            return "relinked", rec
    return None, None


# -- step 4 -------------------------------------------------------------------------------------
def write_staging(spark, req: MergeRequest, snap: SourceSnapshot, sort_by: Sequence[str], staging) -> None:  # noqa: ANN001
    """Spark reads the partition through the ``dis`` source and writes Parquet into ``staging``."""
    s = req.settings
    reader = (spark.read.format("dis").option("namespace", req.namespace).option("table", req.table)
              .option("partitions", req.value).option("columns", ",".join(snap.schema.column_names)))
    if req.source.via_dis:
        for k, v in req.source.spark_options().items():
            reader = reader.option(k, v)
    else:
        reader = reader.option("dbRoot", req.db_root).option("schemas", req.source.schemas)
    df = reader.load()
    if sort_by:
        # A global sort: range partitioning (Spark samples the keys), each task's file holds
        # one key range in order, so the files in name order are the rows in sort order.
        df = df.orderBy(*sort_by)
    write_parquet(df, staging, s.parquet)


# -- the job ------------------------------------------------------------------------------------
def _lock_root(req: MergeRequest) -> DatabaseLock:
    try:
        return lock_database(req.db_root, "dis merge")
    except DatabaseLockedError as e:
        raise MergeError(f"cannot read the column files: {e}; while a DIS runs, merge through it "
                         f"(--address or --routing)") from None


def _mergeable_snapshot(req: MergeRequest) -> SourceSnapshot:
    """The partition's snapshot, refused when it has no rows or (unless forced) is live."""
    snap = snapshot(req)
    if not snap.locations or snap.rows == 0:
        raise MergeError(f"no intraday rows of {req.namespace}.{req.table} {req.value} "
                         f"({'at ' + snap.where if snap.kind == 'dis' else 'under ' + snap.where})")
    if not req.force:
        check_not_live(snap, req.today, req.quiet_s)
    return snap


def preflight(req: MergeRequest) -> None:
    """What refuses a merge, checked before any Spark work (a session takes seconds to start):
    the database lock when reading column files, the partition's rows, and the live rule."""
    if not req.source.via_dis:
        _lock_root(req).release()
    _mergeable_snapshot(req)


def merge(spark, req: MergeRequest, on_step: Step | None = None) -> MergeResult:  # noqa: ANN001
    """Merge one column partition (steps 1-5 of the module docstring).

    Reading the column files themselves (no DIS option) takes the database root's lock for the
    whole merge, as every offline writer of the root does (``disd.storage.dblock``): a DIS running
    on that root refuses the merge (read through it with ``--address``), and no DIS starts on the
    root while the merge runs."""
    if req.source.via_dis:
        return _merge(spark, req, on_step)
    with _lock_root(req):
        return _merge(spark, req, on_step)


def _merge(spark, req: MergeRequest, on_step: Step | None) -> MergeResult:  # noqa: ANN001
    t0 = time.perf_counter()
    step = on_step or (lambda name: None)
    snap = _mergeable_snapshot(req)
    ns = NamespaceRoot.system(os.path.abspath(req.db_root), req.namespace)
    with TableLock(ns.lock_path(req.table)):
        step("locked")
        defn = _definition(ns, snap, req.settings.sort_by)
        settings = req.settings.record(defn.sort_by)
        identity = snap.identity(settings)
        ip = choose_partition(ns, req.table, req.value, req.writable_partition)
        parent = ns.writable_parent(ip, req.value)
        sweep_staging(parent, req.table)
        try:
            status, rec = find_merged(parent, req.table, identity)
        except PublishError as e:
            raise MergeError(str(e)) from None
        if rec is not None:
            record_in_index(ns, req.table, defn.partition_column, rec)
        else:
            staging = stage_dir(parent, req.table)
            try:
                write_staging(spark, req, snap, defn.sort_by, staging)
            except Exception as e:
                shutil.rmtree(staging, ignore_errors=True)
                raise MergeError(f"the Spark job failed: {_first_line(e)}") from e
            step("written")
            try:
                files = finalize(staging, file_metadata(snap.schema), req.settings.parquet.compression)
                step("finalized")
                written = sum(f.rows for f in files)
                if written < snap.rows:
                    # Fewer rows than the snapshot pinned: the read listed a replica behind the
                    # one the snapshot came from (the advanced one died in between).  Publishing
                    # would hide rows until the next merge, so nothing is published.
                    raise MergeError(f"the read returned {written} rows of the {snap.rows} the snapshot pinned "
                                     f"(from {snap.where}): a replica behind the snapshot served it; nothing was "
                                     "published, run the merge again")
                if written != snap.rows:
                    # Rows arrived between the snapshot and the read (a forced merge of a live
                    # partition): the files hold what Spark read, which no identity describes,
                    # so the next merge writes a new version.
                    identity = "unpinned:" + identity
                rec = publish_location(ns, req.table, defn.partition_column, parent, staging, ip, req.value,
                                       identity, snap.describe(), settings, files=files, on_step=step)
            except (OutputError, PublishError) as e:
                raise MergeError(str(e)) from None
            status = "merged"
    return MergeResult(status, req.namespace, req.table, req.value, ip, rec.rows, len(rec.files), rec.version,
                       str(ns.location_path(ip, req.value, req.table)), rec.identity, snap.kind,
                       time.perf_counter() - t0)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if "DisSourceError" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(e).__name__
