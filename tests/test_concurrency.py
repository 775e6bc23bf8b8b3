"""Concurrency and crashes: many writers while workers embed; SIGKILL of the worker, a client
and the server; upgrades while clients search; downgrades that would drop data.

The long versions are bench/soak.py and bench/kills.py (figures in docs/reliability.md).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrag import migrate
from pgrag.errors import ConfigError, PgragError
from pgrag.search import search
from pgrag.server import EmbeddedServer
from pgrag.worker import Worker

from .conftest import run_pgrag
from .hostile import HashEmbedder, hash_vector
from .kills import TARGETS, KillStats, kill_round
from .soak import prepare_shop, run_soak


@pytest.mark.parametrize("sync", ["commit", "queue"])
def test_writers_and_workers_agree_afterwards(db_url: str, sync: str) -> None:
    prepare_shop(db_url)
    r = run_soak(db_url, writers=4, workers=2, seconds=12, seed=7, sync=sync)
    assert r.other_errors == []
    assert r.deadlocks == 0  # one statement per transaction: pgrag adds no deadlock
    assert r.transactions > 100, r
    assert r.mismatches == []
    assert (r.missing_vectors, r.wrong_vectors) == (0, 0)
    assert r.chunks > 20 and r.embedded >= r.chunks


@pytest.mark.parametrize("sync", ["commit", "queue"])
def test_multi_statement_writers_never_deadlock_on_document_locks(db_url: str, sync: str) -> None:
    """Transactions of several statements: documents render at commit under per-document
    locks taken in one order (or by the workers), so no deadlock goes through a document lock
    (the writers' own row-lock cycles, which exist without pgrag, may still happen and say
    40P01), and nothing is left inconsistent (docs/reliability.md)."""
    prepare_shop(db_url)
    r = run_soak(db_url, writers=4, workers=2, seconds=8, seed=11, max_statements=3, sync=sync)
    assert r.document_lock_deadlocks == 0, r
    assert r.other_errors == []  # a deadlock is DeadlockDetected, never PR004
    assert r.transactions > 30, r
    assert r.mismatches == []
    assert (r.missing_vectors, r.wrong_vectors) == (0, 0)


def test_sigkill_worker_client_and_server(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    url = server.start()
    try:
        migrate.upgrade(url)
        prepare_shop(url)
        stats = KillStats()
        rng = random.Random(3)
        for target in TARGETS:
            url = kill_round(server, url, target, rng, stats)
    finally:
        server.stop()
    assert stats.kills == {"worker": 1, "client": 1, "server": 1}
    assert stats.committed > 0
    assert (stats.lost, stats.stale_marked_fresh) == (0, 0)
    assert (stats.mismatches, stats.missing_vectors, stats.wrong_vectors) == (0, 0, 0)


def _embed_all(url: str) -> None:
    with Worker(url, HashEmbedder(), batch_size=64) as w:
        w.drain()


def test_upgrade_while_clients_search(db_url: str) -> None:
    prepare_shop(db_url)
    _embed_all(db_url)
    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    vector = hash_vector("orders of John Smith")

    def client(mode: Any) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    search(conn, "orders John", vector=vector, model="test:hash", mode=mode,
                           filter={"segment": "VIP"}, stats=True)  # fmt: skip
                    outcomes["ok"] += 1
                except (PgragError, psycopg.Error) as exc:
                    outcomes[f"{type(exc).__name__}: {str(exc).splitlines()[0]}"] += 1

    threads = [threading.Thread(target=client, args=(m,)) for m in ("hybrid", "text", "vector")]
    for t in threads:
        t.start()
    upgrades = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < 8:
            migrate.upgrade(db_url)
            upgrades += 1
    finally:  # a failed upgrade must not leave the clients searching for the rest of the run
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert upgrades >= 3
    assert outcomes["ok"] > 50
    assert set(outcomes) == {"ok"}, outcomes


def test_downgrade_that_would_drop_data_is_refused(db_url: str) -> None:
    prepare_shop(db_url)  # declared documents and their chunks
    with pytest.raises(
        ConfigError, match=r"past 0004_search would drop pgrag\.doc_stats, which hold rows"
    ):
        migrate.downgrade(db_url, "0001")
    assert migrate.current(db_url) == migrate.head()  # nothing changed
    migrate.downgrade(db_url, "0004")  # eval_runs is empty: nothing of the user's is lost
    assert migrate.current(db_url) == "0004"
    r = run_pgrag("--database-url", db_url, "db", "downgrade", "base")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--drop-data" in r.stderr and "pgrag.doc_stats" in r.stderr
    r = run_pgrag("--database-url", db_url, "db", "downgrade", "base", "--drop-data")
    assert r.returncode == 0, r.stderr
    assert migrate.current(db_url) is None
