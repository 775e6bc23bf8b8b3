"""Reliability runs, longer than the test suite's: fuzzing, a writers soak, SIGKILL rounds.

    python -m bench.reliability [fuzz|soak|kills|all] [--cases 5000] [--seconds 120]
        [--writers 8] [--workers 2] [--rounds 30] [--seed 1] [--sync commit --sync immediate]

Run from the repository root (it reuses the strategies and helpers of tests/). Each part runs
on its own embedded PostgreSQL in a temporary directory and prints markdown; the figures are in
docs/reliability.md.

- fuzz: the hypothesis strategies of tests/hostile.py, ``--cases`` per target (filters compiled,
  filter JSON, questions parsed; a tenth of that through the database: filters and questions
  searched and asked, declarations, CLI invocations), with the canary and DDL guards checked.
- soak: ``--writers`` writer threads on shop.customers/orders/order_items and ``--workers``
  worker threads for ``--seconds``, once with one statement per transaction and once with up
  to three; then verify and a vector check of every chunk. ``--sync queue`` has the workers
  render what the writers record; ``--sync immediate`` (repeatable
  with ``--sync commit``) runs the writers with ``set pgrag.sync = immediate``, per-statement
  rendering as before revision 0007, for the before/after deadlock figures.
- kills: ``--rounds`` rounds, each SIGKILLing a random one of worker, client, server.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from psycopg import sql

from pgrag import documents, migrate
from pgrag.errors import PgragError
from pgrag.filters import check_filter, parse_filter_json
from pgrag.parse import parse_question
from pgrag.search import search
from pgrag.server import EmbeddedServer
from pgrag.vocabulary import load_vocabulary
from tests.hostile import (
    HashEmbedder,
    declarations,
    filter_json_text,
    filters,
    fingerprint,
    install_guards,
    questions,
)
from tests.kills import KillStats, kill_round
from tests.shop_fixture import load_tiny_shop
from tests.soak import prepare_shop, run_soak


def _fresh_db(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    migrate.upgrade(url)
    return url


def _count(target: Any, strategy: Any, cases: int) -> tuple[int, int, float]:
    """Run ``target`` on ``cases`` examples; (cases, refused with a PgragError, seconds)."""
    seen = [0, 0]

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value: Any) -> None:
        seen[0] += 1
        try:
            target(value)
        except PgragError:
            seen[1] += 1

    started = time.perf_counter()
    run()
    return seen[0], seen[1], time.perf_counter() - started


def fuzz(admin_url: str, cases: int) -> None:
    from click.testing import CliRunner

    from pgrag.cli import cli
    from pgrag.embed.cache import QueryCache

    url = _fresh_db(admin_url, "pgrag_bench_fuzz")
    with psycopg.connect(url) as conn:
        load_tiny_shop(conn)
    install_guards(url)
    before = fingerprint(url)
    embedder = QueryCache(HashEmbedder())
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("set statement_timeout = '20s'")
    db_cases = max(cases // 10, 1)
    vocabulary = load_vocabulary(conn)

    def searched(f: Any) -> None:
        search(conn, "orders", filter=f, embedder=embedder, stats=True)

    def asked(q: Any) -> None:
        from pgrag.ask import ask

        with contextlib.suppress(PgragError):
            search(conn, q, embedder=embedder, mode="text")
        ask(conn, q, embedder=embedder, use_env_llm=False)

    def declared(d: Any) -> None:
        documents.declare(conn, d.name, d.source, d.watches, parent=d.parent,
                          metadata_schema=d.metadata_schema)  # fmt: skip
        documents.drop(conn, d.name)

    def cli_run(flt: str) -> None:
        r = CliRunner().invoke(
            cli, ["--database-url", url, "search", "--mode", "text", "--filter", flt, "orders"]
        )
        if not (r.exception is None or isinstance(r.exception, SystemExit)):
            raise AssertionError(f"the CLI raised {r.exception!r}")

    rows: list[tuple[str, Any, Any, int]] = [
        ("filters compiled", filters, lambda f: check_filter(conn, f, None), cases),
        ("filter JSON parsed", filter_json_text, parse_filter_json, cases),
        ("questions parsed", questions, lambda q: parse_question(q, vocabulary), cases),
        ("filters searched (hybrid, with stats)", filters, searched, db_cases),
        ("questions searched and asked", questions, asked, db_cases),
        ("document declarations", declarations, declared, db_cases),
        (
            "CLI `search --filter` (exit code, never a traceback)",
            filter_json_text,
            cli_run,
            db_cases,
        ),
    ]
    print("| target | cases | refused (PgragError) | other exceptions | seconds |")
    print("|---|---:|---:|---:|---:|")
    total = 0
    for label, strategy, target, n in rows:
        ran, refused, seconds = _count(target, strategy, n)
        total += ran
        print(f"| {label} | {ran:,} | {refused:,} | 0 | {seconds:.1f} |")
    conn.close()
    after = fingerprint(url)
    print(f"\n{total:,} cases; canary and shop unchanged, DDL outside pgrag: "
          f"{'none' if after == before else 'FOUND'}")  # fmt: skip


def soak(admin_url: str, seconds: float, writers: int, workers: int, seed: int,
         syncs: tuple[str, ...] = ("commit",)) -> None:  # fmt: skip
    print("| pgrag.sync | statements per transaction | writers | workers | seconds | "
          "transactions | deadlocks (40P01) | of which through a document lock | other errors | "
          "chunks | verify mismatches | wrong or missing vectors |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sync in syncs:
        for max_statements in (1, 3):
            url = _fresh_db(admin_url, f"pgrag_bench_soak_{sync}_{max_statements}")
            prepare_shop(url)
            r = run_soak(url, writers=writers, workers=workers, seconds=seconds, seed=seed,
                         max_statements=max_statements, sync=sync)  # fmt: skip
            _soak_row(sync, max_statements, writers, workers, r)


def _soak_row(sync: str, max_statements: int, writers: int, workers: int, r: Any) -> None:
    print(
        f"| {sync} | 1 to {max_statements} | {writers} | {workers} | {r.seconds:.0f} | "
        f"{r.transactions:,} | {r.deadlocks:,} | {r.document_lock_deadlocks:,} | "
        f"{len(r.other_errors)} | {r.chunks:,} | "
        f"{len(r.mismatches)} | {r.wrong_vectors + r.missing_vectors} |"
    )


def kills(server: EmbeddedServer, admin_url: str, rounds: int, seed: int) -> None:
    url = _fresh_db(admin_url, "pgrag_bench_kills")
    prepare_shop(url)
    stats = KillStats()
    rng = random.Random(seed)
    started = time.perf_counter()
    for _ in range(rounds):
        target = rng.choice(("worker", "client", "server"))
        url = kill_round(server, url, target, rng, stats)
    k = stats.kills
    print(
        "| rounds | worker kills | client kills | server kills | committed orders | lost | "
        "stale vectors marked done | verify mismatches | wrong or missing vectors | seconds |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {stats.rounds} | {k['worker']} | {k['client']} | {k['server']} | "
        f"{stats.committed:,} | {stats.lost} | {stats.stale_marked_fresh} | {stats.mismatches} | "
        f"{stats.wrong_vectors + stats.missing_vectors} | {time.perf_counter() - started:.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", nargs="?", default="all", choices=["fuzz", "soak", "kills", "all"])
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--sync",
        action="append",
        choices=["commit", "queue", "immediate"],
        help="pgrag.sync of the soak's writers (repeatable; default commit)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgrag-reliability-") as tmp:
        server = EmbeddedServer(Path(tmp) / "pg")
        url = server.start()
        admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
        try:
            if args.part in ("fuzz", "all"):
                print("## Fuzzing\n")
                fuzz(admin, args.cases)
            if args.part in ("soak", "all"):
                print("\n## Writers soak\n")
                soak(admin, args.seconds, args.writers, args.workers, args.seed,
                     tuple(args.sync or ["commit"]))  # fmt: skip
            if args.part in ("kills", "all"):
                print("\n## SIGKILL rounds\n")
                kills(server, psycopg.conninfo.make_conninfo(url, dbname="postgres"),
                      args.rounds, args.seed)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
