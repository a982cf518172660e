"""The ``dis`` command line: one sub-command per operator task."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def _cmd_binlog_dump(args: argparse.Namespace) -> int:
    from disd.binlog import BinlogError, RowFlag, read_file

    try:
        contents = read_file(args.file)
    except (OSError, BinlogError) as e:
        print(f"dis binlog dump: {e}", file=sys.stderr)
        return 1
    header = contents.header
    table = contents.table
    if args.limit is not None:
        table = table.slice(0, args.limit)
    flags = contents.flags[: table.num_rows]
    if args.json:
        meta = {
            "file": args.file,
            "version": header.version,
            "fingerprint": header.fingerprint,
            "schema": header.schema.canonical(),
            "rows": contents.table.num_rows,
            "frames": len(contents.frame_ends),
            "end_offset": contents.end_offset,
            "torn_tail": contents.torn,
        }
        print(json.dumps(meta))
        cols = table.column_names
        pylists = [table.column(c).to_pylist() for c in cols]
        for i in range(table.num_rows):
            row = {"flag": RowFlag(int(flags[i])).name}
            for c, values in zip(cols, pylists):
                v = values[i]
                row[c] = v.isoformat() if hasattr(v, "isoformat") else v
            print(json.dumps(row, ensure_ascii=False))
        return 0
    s = header.schema
    print(f"file:        {args.file}")
    print(f"table:       {s.key}   format v{header.version}   fingerprint {header.fingerprint}")
    print(f"columns:     {', '.join(f'{c.name}:{c.type.value}' for c in s.columns)}")
    print(f"rows:        {contents.table.num_rows} in {len(contents.frame_ends)} frames")
    tail = "  (torn tail after it: incomplete frame)" if contents.torn else ""
    print(f"end offset:  {contents.end_offset}{tail}")
    if table.num_rows:
        print()
        df_cols = ["flag", *table.column_names]
        rows = [[RowFlag(int(f)).name for f in flags]] + [
            ["null" if v is None else str(v) for v in table.column(c).to_pylist()] for c in table.column_names
        ]
        widths = [max(len(h), *(len(x) for x in col)) for h, col in zip(df_cols, rows)]
        print("  ".join(h.ljust(w) for h, w in zip(df_cols, widths)))
        for i in range(table.num_rows):
            print("  ".join(rows[j][i].ljust(widths[j]) for j in range(len(df_cols))))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from disd.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dis", description="dis: the Data Import Server")
    sub = p.add_subparsers(dest="command", required=True)

    binlog = sub.add_parser("binlog", help="inspect binary log files")
    bsub = binlog.add_subparsers(dest="binlog_command", required=True)
    dump = bsub.add_parser("dump", help="print a binary log for a person (--json for machines)")
    dump.add_argument("file")
    dump.add_argument("--json", action="store_true", help="one JSON object of metadata, then one per row")
    dump.add_argument("--limit", type=int, default=None, help="print at most this many rows")
    dump.set_defaults(func=_cmd_binlog_dump)

    demo = sub.add_parser("demo", help="run the main job on the embedded default configuration")
    demo.add_argument("--workdir", default="var/demo", help="where logs and the database go")
    demo.add_argument("--rows", type=int, default=10_000)
    demo.set_defaults(func=_cmd_demo)

    from disd import commands  # sub-commands of the daemon and its clients

    commands.register(sub)

    from disd import merge_job  # `dis merge`: intraday to historical (a Spark job)

    merge_job.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
