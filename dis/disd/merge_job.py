"""``dis merge`` and its spark-submit entry point: the command line of the merge job.

    dis merge --namespace Market --table Trade --partition 2026-11-21 [--db-root /var/db] ...
    spark-submit --master spark://host:7077 examples/merge_job.py --namespace Market ...   # the same job

The arguments (the client security flags are ``disd.security``'s), the job's SparkSession with the
``dis`` source registered, and the exit status.  The merge itself is ``disd.historical.merge``;
this module sits above both ``disd.historical`` and ``disd.spark`` because the job needs the
Spark source, which reads historical tables.  docs/historical.md describes the job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Sequence

from disd.config import ConfigError, DisConfig, load_dis_config
from disd.historical.liveness import DEFAULT_QUIET_S, LivePartitionError
from disd.historical.merge import IntradaySource, MergeError, MergeRequest, MergeSettings, Step, merge, preflight
from disd.historical.parquet import ParquetSettings
from disd.names import InvalidNameError
from disd.security import ClientSecurity, add_security_arguments, security_from_args

#: Exit status of ``dis merge`` when the partition is still being written (see liveness).
EXIT_LIVE = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--partition", required=True, help="the column partition to merge, e.g. 2026-11-21")
    p.add_argument("--db-root", default=None,
                   help="the database root (historical output goes under it); without --address/--routing "
                        "intraday rows are read from its column files (run on the DIS host)")
    p.add_argument("--config", default="config/dis.yaml",
                   help="the DIS's configuration, for db_root and schemas when not given (default config/dis.yaml)")
    p.add_argument("--schemas", default=None, help="the DIS's schemas directory (column-file reads)")
    p.add_argument("--address", default=None, help="host:port of the DIS to read through the dis source")
    p.add_argument("--routing", default=None, help="routing file instead of --address")
    add_security_arguments(p)
    p.add_argument("--sort-by", default=None,
                   help="comma-separated columns to order rows by (default: the table definition's)")
    p.add_argument("--row-group-rows", type=int, default=ParquetSettings.row_group_rows,
                   help="rows per Parquet row group at most (default %(default)s)")
    p.add_argument("--row-group-bytes", type=int, default=ParquetSettings.row_group_bytes,
                   help="bytes per Parquet row group at most (default %(default)s)")
    p.add_argument("--max-rows-per-file", type=int, default=ParquetSettings.max_rows_per_file)
    p.add_argument("--compression", default=ParquetSettings.compression,
                   choices=["snappy", "zstd", "gzip", "lz4", "none", "uncompressed"])
    p.add_argument("--writable-partition", default=None,
                   help="the WritablePartitions name to write to (default: the one with most free space)")
    p.add_argument("--force", action="store_true", help="merge even if the partition is still being written")
    p.add_argument("--quiet-seconds", type=float, default=DEFAULT_QUIET_S,
                   help="column-file reads: a checkpoint younger than this means still being written")
    p.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def request_from_args(args: argparse.Namespace) -> MergeRequest:
    cfg = None
    if args.db_root is None or (args.schemas is None and not (args.address or args.routing)):
        if args.config and os.path.exists(args.config):
            try:
                cfg = load_dis_config(args.config)
            except ConfigError as e:
                raise MergeError(str(e)) from None
    db_root = args.db_root or (cfg.db_root if cfg else None)
    if not db_root:
        raise MergeError("give --db-root (or --config with db_root)")
    via_dis = bool(args.address or args.routing)
    address = args.address
    security = None
    if not via_dis and args.db_root is None:  # no DIS option and no --db-root: the DIS --config serves
        address, security = config_dis(cfg or DisConfig(), args)
    schemas = args.schemas or (cfg.schemas if cfg else None)
    sort_by = tuple(c.strip() for c in args.sort_by.split(",") if c.strip()) if args.sort_by is not None else None
    try:
        parquet = ParquetSettings(args.row_group_rows, args.row_group_bytes, args.max_rows_per_file, args.compression)
    except ValueError as e:
        raise MergeError(str(e)) from None
    settings = MergeSettings(sort_by, parquet)
    if (address or args.routing) and security is None:
        try:
            security = security_from_args(args).client_security()
        except ConfigError as e:
            raise MergeError(str(e)) from None
    source = IntradaySource(address, args.routing, security, None if (address or args.routing) else schemas)
    try:
        return MergeRequest(args.namespace, args.table, args.partition, str(db_root), source, settings,
                            args.writable_partition, args.force, args.quiet_seconds)
    except InvalidNameError as e:
        raise MergeError(str(e)) from None


def config_dis(cfg: DisConfig, args: argparse.Namespace) -> tuple[str, ClientSecurity | None]:
    """The DIS ``cfg`` (``--config``) serves, as a client on its host reaches it: its
    ``server.host`` (loopback for an address of every interface) and ``server.port``, its token
    (``server.token_file``) unless ``--token-file`` is given.  A DIS serving TLS needs ``--ca``
    (the configuration holds the server's certificate, not the CA a client trusts), and ``--cert``
    and ``--key`` when it asks for client certificates: a ``MergeError`` says so rather than a
    handshake failing a minute later."""
    host = cfg.host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    address = f"[{host}]:{cfg.port}" if ":" in host else f"{host}:{cfg.port}"
    if cfg.tls is not None and not args.ca:
        raise MergeError(f"{cfg.source}: server.tls: the DIS serves TLS: give --ca (the CA that signed its "
                         "certificate), or --address and the security flags")
    if cfg.tls is not None and cfg.tls.client_ca and not (args.cert and args.key):
        raise MergeError(f"{cfg.source}: server.tls.client_ca: the DIS asks for a client certificate: give --cert "
                         "and --key")
    try:
        security = security_from_args(args)
        if security.token is None and cfg.token_file:
            security = dataclasses.replace(security, token=cfg.token())
    except ConfigError as e:
        raise MergeError(f"{e} (or give --token-file)") from None
    return address, security.client_security()


def job_session(master: str | None = None):  # noqa: ANN201
    """The job's SparkSession: under ``spark-submit`` the one it configured (its ``--master``),
    else ``master`` or ``local[*]``; with the ``dis`` source registered."""
    from pyspark.sql import SparkSession

    import disd.spark

    existing = SparkSession.getActiveSession()
    conf = {**disd.spark.SESSION_CONF, "spark.ui.showConsoleProgress": "false"}
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = SparkSession.builder.appName("dis-merge")  # spark-submit's master and settings
        for k, v in conf.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        disd.spark.register(spark)
    else:
        spark = disd.spark.session(master or "local[*]", app_name="dis-merge", conf=conf)
    if existing is None:  # a session of our own: Spark's INFO lines are not for an operator
        spark.sparkContext.setLogLevel("WARN")
    return spark


def run(args: argparse.Namespace, on_step: Step | None = None) -> int:
    """``dis merge``: exit 0 when the partition is merged (or already was), 3 when it is still
    being written, 1 on any other error."""
    try:
        req = request_from_args(args)
        preflight(req)  # refusals come before Spark starts
        spark = job_session(args.master)
        result = merge(spark, req, on_step)
    except LivePartitionError as e:
        print(f"dis merge: refused: {e}", file=sys.stderr)
        return EXIT_LIVE
    except MergeError as e:
        print(f"dis merge: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"{result.status}: {result.namespace}.{result.table} {result.value} -> {result.path} "
              f"({result.rows} rows, {result.files} files, version {result.version}, "
              f"from {result.source}, {result.seconds:.1f} s)")
    return 0


def register(sub) -> None:  # noqa: ANN001 - argparse sub-parsers
    p = sub.add_parser("merge", help="merge one column partition of a table into historical Parquet (Spark)")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``spark-submit`` (examples/merge_job.py calls it)."""
    p = argparse.ArgumentParser(prog="merge_job", description="merge one column partition into historical Parquet")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
