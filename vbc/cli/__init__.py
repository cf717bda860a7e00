"""The `vbc` command line: run a node, manage a local cluster, run statements and inspect a running cluster."""
from __future__ import annotations

from vbc.cli.parser import main

__all__ = ["main"]
