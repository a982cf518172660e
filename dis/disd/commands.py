"""Sub-commands of ``dis`` that talk to the daemon or its database (serve, ls, verify, status)."""

from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the daemon-related sub-commands to the ``dis`` parser."""
