"""A running worker outlives its connections: a server restart or a terminated backend is
retried with backoff, and what was queued meanwhile is embedded once it is back (issue 15,
point 16: ``pgrag worker`` exited with "consuming input failed")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from pgrag import migrate
from pgrag.errors import ConnectionFailed
from pgrag.server import EmbeddedServer
from pgrag.worker import Backoff, Reconnect, Worker, connection_lost
from tests.conftest import PATIENCE_S
from tests.embed_server import wait_until
from tests.hostile import HashEmbedder
from tests.test_worker import insert

FAST = Backoff(base_s=0.05, max_s=0.5)


def _waiting(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("select count(*) from pgrag.chunks where embedding is null").fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def running_worker(url: str) -> Iterator[list[Reconnect]]:
    events: list[Reconnect] = []
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with Worker(url, HashEmbedder(), batch_size=8, stop=stop) as w:
                w.check()
                w.run_forever(poll_s=0.2, on_reconnect=events.append, backoff=FAST)
        except BaseException as exc:  # the test reads it below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield events
    finally:
        stop.set()
        thread.join(PATIENCE_S)
    assert not thread.is_alive(), "the worker did not stop"
    assert failed == [], failed


@pytest.mark.chaos
def test_terminated_backends_are_reconnected(db_url: str) -> None:
    insert(db_url, [f"first {i}" for i in range(20)])
    with running_worker(db_url) as events:
        wait_until(lambda: _waiting(db_url) == 0, timeout=PATIENCE_S)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity "
                "where application_name like 'pgrag worker%'"
            )
        insert(db_url, [f"second {i}" for i in range(20)])
        wait_until(lambda: _waiting(db_url) == 0, timeout=PATIENCE_S)
        wait_until(lambda: any(e.error is None for e in events), timeout=PATIENCE_S)
    assert events[0].error is not None and connection_lost(events[0].error)


@pytest.mark.chaos
def test_a_server_restart_is_waited_out(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    url = server.start()
    try:
        migrate.upgrade(url)
        insert(url, [f"before {i}" for i in range(10)])
        with running_worker(url) as events:
            wait_until(lambda: _waiting(url) == 0, timeout=PATIENCE_S)
            server.stop()
            wait_until(lambda: len(events) >= 2, timeout=PATIENCE_S)  # down: it keeps trying
            assert server.start() == url
            insert(url, [f"after {i}" for i in range(10)])
            wait_until(lambda: _waiting(url) == 0, timeout=PATIENCE_S)
        assert any(e.error is None for e in events)
        assert all(e.delay_s <= FAST.max_s for e in events)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("consuming input failed: server closed the connection"), True),
        (ConnectionFailed("cannot connect"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.SerializationFailure("tuple ... moved to another partition"), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True),
        (psycopg.errors.UndefinedTable("no such table"), False),
        (ValueError("x"), False),
    ],
)
def test_what_counts_as_a_lost_connection(error: BaseException, lost: bool) -> None:
    assert connection_lost(error) is lost


def test_backoff_doubles_to_its_ceiling_with_jitter() -> None:
    b = Backoff(base_s=1.0, max_s=60.0)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (1000, 60.0)]:
        d = b.delay(attempt)
        assert ceiling / 2 <= d <= ceiling
