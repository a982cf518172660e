"""The ``dis`` command line: one sub-command per operator task."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _cmd_binlog_dump(args: argparse.Namespace) -> int:
    from disd.binlog.dump import dump

    return dump(args.file, as_json=args.json, limit=args.limit)


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
