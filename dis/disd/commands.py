"""Sub-commands of ``dis`` that run or talk to the daemon: serve, health, ls, status, verify."""

from __future__ import annotations

import argparse
import json
import os
import sys

from disd.errors import DisError
from disd.security import add_security_arguments, security_from_args


def _client_args(p: argparse.ArgumentParser, routing: bool = True) -> None:
    p.add_argument("--address", default=None, help="host:port of a DIS (default 127.0.0.1:22021)")
    if routing:
        p.add_argument("--routing", default=None, help="routing file instead of --address")
    add_security_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _connect(args: argparse.Namespace):  # noqa: ANN202
    from disd.client import connect

    address = args.address if args.address or args.routing else "127.0.0.1:22021"
    # interactive: an unreachable DIS is said at once, not after a restart's worth of retries
    return connect(address, args.routing, security_from_args(args), retry_s=0)


def _cmd_serve(args: argparse.Namespace) -> int:
    from disd.config import ConfigError, load_dis_config
    from disd.logconfig import configure_logging
    from disd.schema import SchemaError
    from disd.server.daemon import serve
    from disd.storage.dblock import DatabaseLockedError
    from disd.storage.versionstore import VersionStoreError

    configure_logging(json=True if args.json_logs else None)
    try:
        cfg = load_dis_config(args.config)
        return serve(cfg)
    except (ConfigError, SchemaError, VersionStoreError) as e:  # a schema change the rules refuse, ...
        print(f"dis serve: {e}", file=sys.stderr)
        return 2
    except DatabaseLockedError as e:
        print(f"dis serve: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the port is taken, the database root is not writable, ...
        print(f"dis serve: {e}", file=sys.stderr)
        return 1


def _cmd_proxy(args: argparse.Namespace) -> int:
    from disd.config import ConfigError
    from disd.logconfig import configure_logging
    from disd.proxy.config import load_proxy_config
    from disd.proxy.daemon import serve

    configure_logging(json=True if args.json_logs else None)
    try:
        return serve(load_proxy_config(args.config))
    except ConfigError as e:
        print(f"dis proxy: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a port is taken, a certificate cannot be read, ...
        print(f"dis proxy: {e}", file=sys.stderr)
        return 1


def _cmd_health(args: argparse.Namespace) -> int:
    """Ask a DIS's gRPC health service; exit 0 only when it answers SERVING.  The container's
    HEALTHCHECK and load balancers use it: it checks what a client needs (the port answers, the
    services are up), with the same TLS options as the other commands and no extra tool."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from disd.config import ConfigError
    from disd.rpc.channel import open_channel

    try:
        security = security_from_args(args)
    except ConfigError as e:
        print(f"dis health: {e}", file=sys.stderr)
        return 2
    address = args.address or "127.0.0.1:22021"
    channel = open_channel(address, security)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as e:
        state = f"{e.code().name}: {e.details()}"
    finally:
        channel.close()
    ok = state == "SERVING"
    if args.json:
        print(json.dumps({"dis": address, "service": args.service, "status": state, "ok": ok}))
    else:
        print(f"{address} {args.service or '(server)'}: {state}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _cmd_ls(args: argparse.Namespace) -> int:
    from disd.client import DisClientError

    try:
        with _connect(args) as c:
            tables = c.tables()
            locs = c.locations()
    except DisClientError as e:
        print(f"dis ls: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({
            "tables": [s.canonical() | {"fingerprint": s.fingerprint} for s in tables],
            "locations": [
                {"namespace": loc.key.namespace, "table": loc.key.table, "internal_partition": loc.key.internal_partition,
                 "column_partition": loc.key.column_partition, "schema_version": loc.schema_version or None,
                 "rows": loc.rows, "files": loc.files, "dis": loc.address}
                for loc in locs
            ],
        }))
        return 0
    for s in tables:
        mine = [loc for loc in locs if (loc.key.namespace, loc.key.table) == (s.namespace, s.table)]
        print(f"{s.key}  ({len(mine)} locations, {sum(loc.rows for loc in mine)} rows)  "
              f"{', '.join(f'{c.name}:{c.type.value}' for c in s.columns)}")
        for loc in mine:
            version = f"  version={loc.schema_version}" if loc.schema_version else ""
            print(f"  {loc.key.internal_partition}/{loc.key.column_partition}  rows={loc.rows}  "
                  f"bytes={sum(loc.files.values())}  dis={loc.address}{version}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    """One screen for an operator: per DIS its disk, per table a summary, per location its schema
    version, rows, flush and checkpoint age, the checkpoint's source record, the connected
    tailer, errors and the last problem its tailer reported.

    Exit status (README, "Tools"), as ``dis verify``'s: 0 every DIS answered and no location is
    in error; 1 a location is in error (its ERROR column: the DIS's error, or its Kafka source
    stopped) or a DIS does not answer; 2 the routing file or the security options cannot be
    used.  A tailer's problem is shown and counted in ERRORS but leaves the exit status alone:
    the location itself is fine, and its rows wait in the logs."""
    from disd.client import DisClientError
    from disd.config import ConfigError

    down: list[tuple[str, str]] = []
    try:
        with _connect(args) as c:
            routing = c.routing
            if args.routing:
                # Every DIS of the routing file, each replica of each set: one that does not
                # answer is a row of the report, not the end of it.
                replies = []
                for a in routing.addresses:
                    try:
                        replies.append((a, c.status(a)))
                    except DisClientError as e:
                        down.append((a, str(e)))
            else:
                replies = [(a, c.status(a)) for a in routing.addresses]
    except DisClientError as e:
        print(f"dis status: {e}", file=sys.stderr)
        return 1
    except (ConfigError, OSError) as e:  # the routing file, a certificate or token file
        print(f"dis status: {e}", file=sys.stderr)
        return 2
    report = status_report(replies)
    if args.routing:
        report["unreachable"] = [{"dis": a, "error": err} for a, err in down]
        report["replicas"] = replica_report(routing, replies, dict(down))
    report["ok"] = not down and not any(_location_error(r) for r in report["locations"])
    if args.json:
        print(json.dumps(report))
    else:
        print(format_status(report))
    return 0 if report["ok"] else 1


def replica_report(routing, replies: list, down: dict[str, str]) -> dict:  # noqa: ANN001 - Routing
    """``dis status --routing``'s view of replica sets: per routing entry its replicas, whether
    each answered and how many of its locations are in error, and per table location one row per
    replica of its entry with the rows that replica has published, its lag (rows behind the most
    advanced replica of the location) and its health: ``ok``, ``unreachable``, or ``error`` with
    the location's error at that replica.  An unreachable replica's rows are unknown (None); a
    reachable one without the location has 0."""
    by_address = dict(replies)
    entries, rows = [], []
    for inst in routing.instances:
        members = inst.members
        published: dict[tuple, dict[str, tuple[int, str | None]]] = {}
        for r in members:
            st = by_address.get(r.address)
            for loc in st.locations if st is not None else ():
                k = loc.key
                if routing.owner(k.namespace, k.table) != inst:
                    continue
                key = (k.namespace, k.table, k.internal_partition, k.column_partition)
                published.setdefault(key, {})[r.address] = (int(loc.rows), _proto_location_error(loc))
        in_error = {r.address: sum(1 for have in published.values() if (have.get(r.address) or (0, None))[1])
                    for r in members}
        entries.append({"entry": inst.name, "tables": list(inst.tables), "replicas": [
            {"replica": r.name, "dis": r.address, "reachable": r.address in by_address, "error": down.get(r.address),
             "locations_in_error": in_error[r.address] if r.address in by_address else None}
            for r in members]})
        for key in sorted(published):
            have = published[key]
            most = max(n for n, _ in have.values())
            for r in members:
                reachable = r.address in by_address
                n, error = have.get(r.address, (0, None)) if reachable else (None, None)
                health = "unreachable" if not reachable else "error" if error else "ok"
                rows.append({"entry": inst.name, "namespace": key[0], "table": key[1], "internal_partition": key[2],
                             "column_partition": key[3], "replica": r.name, "dis": r.address,
                             "reachable": reachable, "rows": n, "lag": None if n is None else most - n,
                             "health": health, "error": error})
    return {"entries": entries, "locations": rows}


def _proto_location_error(loc) -> str | None:  # noqa: ANN001 - dis_pb2.LocationStatus
    """What puts a location of a Status reply in error: the DIS's error, or its Kafka source
    stopped (the ERROR column of ``dis status``)."""
    return loc.error or (loc.kafka.stopped if loc.HasField("kafka") else "") or None


def _location_error(r: dict) -> str | None:
    """``_proto_location_error`` of a location of ``status_report``."""
    return r["error"] or (r["kafka"] or {}).get("stopped") or None


def _age_s(v: float) -> float | None:
    return round(v, 3) if v >= 0 else None


def status_report(replies: list) -> dict:
    """``dis status --json``: instances, tables and locations (each location of each DIS).

    A table's line counts each location once, however many replicas of a set (or DISes behind a
    proxy) report it: its rows are the most advanced copy's, as ``dis ls --routing`` lists them;
    it is tailed when every copy has its tailer connected, and counts as an error when any copy is
    in error or has a tailer problem."""
    instances, locations = [], []
    for address, st in replies:
        instances.append({"dis": address, "version": st.version, "uptime_s": round(st.uptime_s, 1),
                          "disk_free_bytes": st.disk_free_bytes, "disk_total_bytes": st.disk_total_bytes})
        for loc in st.locations:
            locations.append({
                "dis": address, "namespace": loc.key.namespace, "table": loc.key.table,
                "internal_partition": loc.key.internal_partition, "column_partition": loc.key.column_partition,
                "schema_version": loc.schema_version or None,
                "rows": loc.rows, "checkpointed_rows": loc.checkpointed_rows,
                "last_flush_age_s": _age_s(loc.last_flush_age_s), "checkpoint_age_s": _age_s(loc.checkpoint_age_s),
                "checkpoint": ({"file": loc.checkpoint_file, "offset": loc.checkpoint_offset,
                                "skip_rows": loc.checkpoint_skip_rows} if loc.checkpoint_file else None),
                "tailer": ({"id": loc.tailer, "peer": loc.tailer_peer, "connected_s": round(loc.tailer_connected_s, 1),
                            "file": loc.ingest_file or None, "offset": loc.ingest_offset} if loc.tailer else None),
                "error": loc.error or None,
                "tailer_problem": ({"problem": loc.tailer_problem, "tailer": loc.tailer_problem_tailer,
                                    "age_s": round(loc.tailer_problem_age_s, 1)} if loc.tailer_problem else None),
                "kafka": _kafka(loc.kafka) if loc.HasField("kafka") else None,
            })
    copies: dict[tuple, list[dict]] = {}
    for r in locations:
        key = (r["namespace"], r["table"], r["internal_partition"], r["column_partition"])
        copies.setdefault(key, []).append(r)
    tables: dict[str, dict] = {}
    for (ns, table, _, _), rs in copies.items():
        t = tables.setdefault(f"{ns}.{table}", {"table": f"{ns}.{table}", "locations": 0, "rows": 0,
                                                 "tailers": 0, "errors": 0, "tailer_problems": 0})
        t["locations"] += 1
        t["rows"] += max(r["rows"] for r in rs)
        t["tailers"] += all(r["tailer"] is not None for r in rs)
        # a location counts once: in error in a DIS, or its tailer reports a problem
        t["errors"] += any(_location_error(r) is not None or r["tailer_problem"] is not None for r in rs)
        t["tailer_problems"] += any(r["tailer_problem"] is not None for r in rs)
    return {"instances": instances, "tables": sorted(tables.values(), key=lambda t: t["table"]),
            "locations": locations}


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def format_status(report: dict) -> str:
    lines = []
    for i in report["instances"]:
        disk = (f"  disk {_gib(i['disk_free_bytes'])} free of {_gib(i['disk_total_bytes'])}"
                if i["disk_total_bytes"] else "")
        lines.append(f"DIS {i['dis']}  version {i['version']}  up {i['uptime_s']:.0f}s{disk}")
    for u in report.get("unreachable", ()):
        lines.append(f"DIS {u['dis']}  UNREACHABLE  {u['error']}")
    lines.append("")
    lines += _grid([["TABLE", "LOCATIONS", "ROWS", "TAILERS", "ERRORS"]] + [
        [t["table"], str(t["locations"]), str(t["rows"]), f"{t['tailers']}/{t['locations']}", str(t["errors"])]
        for t in report["tables"]])
    lines.append("")
    # with several DISes (replicas) a location is a line per DIS that holds it: say which
    by_dis = len(report["instances"]) > 1
    lines += _grid([["LOCATION", *(["DIS"] if by_dis else []), "VERSION", "ROWS", "CKPT ROWS", "FLUSH AGE", "CKPT AGE",
                     "CHECKPOINT AT", "TAILER", "ERROR", "TAILER PROBLEM"]] + [[
        f"{r['namespace']}.{r['table']}/{r['internal_partition']}/{r['column_partition']}",
        *([r["dis"]] if by_dis else []),
        str(r["schema_version"]) if r.get("schema_version") else "-", str(r["rows"]),
        str(r["checkpointed_rows"]), _age(r["last_flush_age_s"]), _age(r["checkpoint_age_s"]),
        _checkpoint_at(r),
        f"{r['tailer']['id']} ({r['tailer']['peer']})" if r["tailer"] else _kafka_at(r.get("kafka")),
        _location_error(r) or "-",
        _tailer_problem(r["tailer_problem"]),
    ] for r in report["locations"]])
    if "replicas" in report:
        lines += ["", *format_replicas(report["replicas"])]
    return "\n".join(lines)


def format_replicas(rep: dict) -> list[str]:
    """The replica sections of ``dis status --routing``: each entry's replicas and their health,
    then per location and replica the rows, the lag behind the most advanced replica and the
    health (``ok``, ``UNREACHABLE``, or ``ERROR:`` and the location's error at that replica)."""
    lines = _grid([["ENTRY", "REPLICA", "DIS", "HEALTH"]] + [
        [e["entry"], r["replica"], r["dis"], _replica_health(r)] for e in rep["entries"] for r in e["replicas"]])
    if rep["locations"]:
        lines.append("")
        lines += _grid([["LOCATION", "REPLICA", "DIS", "ROWS", "LAG", "HEALTH"]] + [[
            f"{r['namespace']}.{r['table']}/{r['internal_partition']}/{r['column_partition']}", r["replica"], r["dis"],
            "-" if r["rows"] is None else str(r["rows"]), "-" if r["lag"] is None else str(r["lag"]),
            {"ok": "ok", "unreachable": "UNREACHABLE"}.get(r["health"]) or f"ERROR: {r['error']}",
        ] for r in rep["locations"]])
    return lines


def _replica_health(r: dict) -> str:
    if not r["reachable"]:
        return "UNREACHABLE"
    n = r["locations_in_error"]
    return f"ERROR: {n} location{'s' if n > 1 else ''} in error" if n else "ok"


def _kafka(k) -> dict:  # noqa: ANN001
    """A Kafka location's source in ``dis status --json`` (docs/kafka.md)."""
    return {"source": k.source, "topic": k.topic, "partition": k.partition,
            "checkpoint_offset": k.checkpoint_offset if k.checkpoint_offset >= 0 else None,
            "next_offset": k.next_offset if k.next_offset >= 0 else None,
            "high_watermark": k.high_watermark if k.high_watermark >= 0 else None,
            "lag": (k.high_watermark - k.next_offset) if k.high_watermark >= 0 and k.next_offset >= 0 else None,
            "messages": k.messages, "errors": k.errors, "stopped": k.stopped or None}


def _checkpoint_at(r: dict) -> str:
    k = r.get("kafka")
    if k is not None:
        return f"{k['topic']}[{k['partition']}]@{k['checkpoint_offset'] if k['checkpoint_offset'] is not None else '-'}"
    return f"{r['checkpoint']['file']}@{r['checkpoint']['offset']}" if r["checkpoint"] else "-"


def _kafka_at(k: dict | None) -> str:
    """The TAILER column of a Kafka location: the consumer's position and lag."""
    if k is None:
        return "-"
    at = "-" if k["next_offset"] is None else str(k["next_offset"])
    return f"kafka {k['source']} @{at}" + (f" lag {k['lag']}" if k["lag"] is not None else "")


def _tailer_problem(p: dict | None) -> str:
    return "-" if p is None else f"{p['problem']} ({p['tailer']}, {p['age_s']:.0f}s ago)"


def _age(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}s"


def verify_sources(args: argparse.Namespace) -> tuple[str, str]:
    """The database root and schemas directory ``dis verify`` checks: the flags, else the DIS's
    configuration (``--config``, by default ``config/dis.yaml`` when it exists).  A configuration
    it reads is checked as ``dis serve`` checks it at start, the tables and columns it names
    against the schemas included.  Raises ``VerifyUsageError`` naming what is missing or wrong:
    never a traceback for a user's slip."""
    from disd.config import ConfigError, load_dis_config

    cfg = None
    explicit = args.config is not None
    if explicit or args.db_root is None or args.schemas is None:
        path = args.config or "config/dis.yaml"
        if explicit or os.path.exists(path):
            try:
                cfg = load_dis_config(path)
            except ConfigError as e:
                raise VerifyUsageError(str(e)) from None
    db_root = args.db_root or (cfg.db_root if cfg else None)
    schemas = args.schemas or (cfg.schemas if cfg else None)
    if db_root is None:
        raise VerifyUsageError("give --db-root, or --config with the DIS's configuration")
    if schemas is None:
        raise VerifyUsageError("give --schemas (the DIS's schemas directory), or --config with the DIS's configuration")
    if not os.path.isdir(db_root):
        raise VerifyUsageError(f"database root {db_root} does not exist (or is not a directory)")
    if not os.path.isdir(schemas):
        raise VerifyUsageError(f"schemas directory {schemas} does not exist (or is not a directory)")
    if cfg is not None:
        import dataclasses

        from disd.schema import SchemaRegistry
        from disd.server.daemon import check_config

        try:  # against the schemas verified (--schemas, or the configuration's own)
            check_config(dataclasses.replace(cfg, schemas=schemas), SchemaRegistry.load_dir(schemas))
        except ConfigError as e:
            raise VerifyUsageError(str(e)) from None
    return db_root, schemas


class VerifyUsageError(DisError):
    """What ``dis verify`` was asked to check cannot be found."""


def _cmd_verify(args: argparse.Namespace) -> int:
    from disd.schema import SchemaError
    from disd.storage.verify import verify_db
    from disd.storage.versionstore import VersionStoreError

    try:
        db_root, schemas = verify_sources(args)
        report = verify_db(db_root, schemas)
    except (VerifyUsageError, SchemaError, VersionStoreError) as e:
        print(f"dis verify: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        for loc in report["locations"]:
            mark = "ok " if loc["ok"] else "BAD"
            print(f"{mark} {loc['location']}  rows={loc.get('rows')}  {'; '.join(loc['problems'])}")
        print(f"{report['ok_count']} ok, {report['bad_count']} bad  ({db_root}, schemas {schemas})")
    return 0 if report["bad_count"] == 0 else 1


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    serve = sub.add_parser("serve", help="run the DIS daemon")
    serve.add_argument("--config", default="config/dis.yaml")
    serve.add_argument("--json-logs", action="store_true", help="JSON logs even on a terminal")
    serve.set_defaults(func=_cmd_serve)

    proxy = sub.add_parser("proxy", help="run the Table Data Cache Proxy (readers' side of one or more DISes)")
    proxy.add_argument("--config", default="config/proxy.yaml")
    proxy.add_argument("--json-logs", action="store_true", help="JSON logs even on a terminal")
    proxy.set_defaults(func=_cmd_proxy)

    health = sub.add_parser("health", help="exit 0 when a DIS answers SERVING on its gRPC health service")
    _client_args(health, routing=False)
    health.add_argument("--service", default="", help="a service name (default: the whole server)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    health.set_defaults(func=_cmd_health)

    ls = sub.add_parser("ls", help="list tables, locations and sizes of a running DIS")
    _client_args(ls)
    ls.set_defaults(func=_cmd_ls)

    status = sub.add_parser("status", help="one screen per location: rows, flush/checkpoint age, tailer, errors")
    _client_args(status)
    status.set_defaults(func=_cmd_status)

    verify = sub.add_parser("verify", help="check every location on disk against its checkpoint (offline)")
    verify.add_argument("--db-root", default=None, help="the database root (default: db_root of --config)")
    verify.add_argument("--schemas", default=None, help="the schemas directory (default: schemas of --config)")
    verify.add_argument("--config", default=None,
                        help="the DIS's configuration, for what --db-root/--schemas leave out (default config/dis.yaml)")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=_cmd_verify)
