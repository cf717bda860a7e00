"""CQL text parsing speed: the lark LALR parser as configured (contextual lexer, the AST built during the parse),
against SQLite parsing and running the same INSERT statements in memory, in the same run.

Run: `.venv/bin/python bench/parser.py [--rows N]`. Also prints the parser's build time, with and without
lark's grammar cache (`cache=True`), which the node does not use (see the output).
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cql import parser  # noqa: E402


def statements(rows: int) -> list[str]:
    return [f"INSERT INTO ks.t (p, c, v, d) VALUES ({i}, {i * 7}, 'value-{i}', {i / 3})" for i in range(rows)]


def per_second(count: int, run) -> float:
    started = time.perf_counter()
    run()
    return count / (time.perf_counter() - started)


def sqlite_rate(texts: list[str]) -> float:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (p INTEGER, c INTEGER, v TEXT, d REAL, PRIMARY KEY (p, c))")
    local = [text.replace("ks.t", "t") for text in texts]
    return per_second(len(local), lambda: [db.execute(text) for text in local])


def build_seconds(**options) -> float:
    import lark
    started = time.perf_counter()
    lark.Lark(parser._GRAMMAR, parser="lalr", lexer="contextual", maybe_placeholders=True, **options)
    return time.perf_counter() - started


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rows", type=int, default=20_000)
    rows = args.parse_args().rows
    texts = statements(rows)
    ours = per_second(rows, lambda: [parser.parse(text) for text in texts])
    batch = "BEGIN BATCH " + "; ".join(texts[:2000]) + " APPLY BATCH"
    in_batch = per_second(2000, lambda: parser.parse(batch))
    baseline = sqlite_rate(texts)
    print(f"single INSERT statements (4 values): {ours:,.0f}/s; SQLite parsing and running them: {baseline:,.0f}/s; "
          f"ratio {ours / baseline:.3f}")
    print(f"INSERTs inside one BEGIN BATCH of 2,000: {in_batch:,.0f}/s")
    with tempfile.TemporaryDirectory() as directory:
        cache = str(Path(directory) / "grammar.cache")
        plain, first, cached = build_seconds(), build_seconds(cache=cache), build_seconds(cache=cache)
    print(f"building the parser: {plain:.3f} s; with lark's cache: {first:.3f} s to write it, {cached:.3f} s from it "
          "(not used: lark's cache is a pickle, which a daemon should not load from a shared temporary directory)")


if __name__ == "__main__":
    main()
