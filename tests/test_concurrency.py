"""Concurrency and crashes: many writers while workers embed; SIGKILL of the worker, a client
and the server; upgrades while clients search; downgrades that would drop data.

Every test here counts work, never time: the writers run until they committed a number of
transactions, a kill comes after a number of commits, the upgrades interleave with a number of
searches; a deadline exists only so that a broken build fails instead of hanging. The soak and
kill tests carry the ``chaos`` marker (selected by default). The long, timed versions are
bench/reliability.py soak and kills (figures in docs/reliability.md).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrag import migrate
from pgrag.errors import ConfigError, PgragError
from pgrag.search import search
from pgrag.server import EmbeddedServer
from pgrag.worker import Worker

from .conftest import PATIENCE_S, run_pgrag, wait_for
from .hostile import HashEmbedder, hash_vector
from .kills import TARGETS, KillStats, kill_round
from .soak import prepare_shop, run_soak

# Committed writer transactions per soak run, by pgrag.sync: about what 12 s (one statement per
# transaction) and 8 s (up to three) gave at a load average of 5 on the 2-core machine (writers
# that only queue commit about five times as many).
SOAK_TRANSACTIONS = {"commit": 2_000, "queue": 10_000}
MULTI_TRANSACTIONS = {"commit": 1_000, "queue": 5_000}


@pytest.mark.chaos
@pytest.mark.parametrize("sync", ["commit", "queue"])
def test_writers_and_workers_agree_afterwards(db_url: str, sync: str) -> None:
    prepare_shop(db_url)
    n = SOAK_TRANSACTIONS[sync]
    r = run_soak(db_url, writers=4, workers=2, transactions=n, seed=7, sync=sync)
    assert r.other_errors == []
    assert r.deadlocks == 0  # one statement per transaction: pgrag adds no deadlock
    assert r.transactions >= n, r
    assert r.mismatches == []
    assert (r.missing_vectors, r.wrong_vectors) == (0, 0)
    assert r.chunks > 20 and r.embedded >= r.chunks


@pytest.mark.chaos
@pytest.mark.parametrize("sync", ["commit", "queue"])
def test_multi_statement_writers_never_deadlock_on_document_locks(db_url: str, sync: str) -> None:
    """Transactions of several statements: documents render at commit under per-document
    locks taken in one order (or by the workers), so no deadlock goes through a document lock
    (the writers' own row-lock cycles, which exist without pgrag, may still happen and say
    40P01), and nothing is left inconsistent (docs/reliability.md)."""
    prepare_shop(db_url)
    n = MULTI_TRANSACTIONS[sync]
    r = run_soak(db_url, writers=4, workers=2, transactions=n, seed=11, max_statements=3,
                 sync=sync)  # fmt: skip
    assert r.document_lock_deadlocks == 0, r
    assert r.other_errors == []  # a deadlock is DeadlockDetected, never PR004
    assert r.transactions >= n, r
    assert r.mismatches == []
    assert (r.missing_vectors, r.wrong_vectors) == (0, 0)


@pytest.mark.chaos
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
    """Upgrades to head while three clients search: every search answers. Counted, not timed:
    before each upgrade, every client has answered again since the previous one."""
    prepare_shop(db_url)
    _embed_all(db_url)
    stop = threading.Event()
    modes = ("hybrid", "text", "vector")
    answered: Counter[str] = Counter()  # searches that answered, by mode
    failed: Counter[str] = Counter()
    vector = hash_vector("orders of John Smith")

    def client(mode: Any) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    search(conn, "orders John", vector=vector, model="test:hash", mode=mode,
                           filter={"segment": "VIP"}, stats=True)  # fmt: skip
                    answered[mode] += 1
                except (PgragError, psycopg.Error) as exc:
                    failed[f"{type(exc).__name__}: {str(exc).splitlines()[0]}"] += 1

    threads = [threading.Thread(target=client, args=(m,), daemon=True) for m in modes]
    for t in threads:
        t.start()

    def all_answered_since(seen: dict[str, int]) -> bool:
        return bool(failed) or all(answered[m] > seen.get(m, 0) for m in modes)

    upgrades = 5
    try:
        for _ in range(upgrades):
            wait_for(
                partial(all_answered_since, dict(answered)),
                "every client answered a search since the last upgrade",
            )
            migrate.upgrade(db_url)
        wait_for(
            partial(all_answered_since, dict(answered)),
            "every client answered a search after the last upgrade",
        )
    finally:  # a failed upgrade must not leave the clients searching for the rest of the run
        stop.set()
        for t in threads:
            t.join(PATIENCE_S)
    assert failed == Counter(), failed
    assert all(answered[m] >= upgrades + 1 for m in modes), answered


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


_SKEW_SCHEMA = """
create schema skew;
create table skew.projects (id integer primary key, name text not null);
create table skew.tasks (id integer primary key, project_id integer not null, title text not null);
create table skew.comments (id integer primary key, task_id integer not null, body text not null);
create table skew.gate (id integer);
insert into skew.projects values (1, 'alpha'), (2, 'beta');
insert into skew.tasks values (10, 1, 'x'), (20, 1, 'y');
insert into skew.comments values (100, 10, 'hello'), (200, 20, 'world');
-- the application's own deferred check, which here waits for the test at commit, after
-- pgrag's render (its event is queued by a later statement than pgrag's)
create function skew.hold() returns trigger language plpgsql as $$
begin perform pg_advisory_lock(7061733); perform pg_advisory_unlock(7061733); return null; end $$;
create constraint trigger hold after insert on skew.gate deferrable initially deferred
    for each row execute function skew.hold();
select pgrag.declare_document('skew_task',
    $$select t.id as source_key, format('task %s of %s: %s', t.title, p.name,
             coalesce((select string_agg(c.body, ', ' order by c.id) from skew.comments c
                        where c.task_id = t.id), '')) as text
        from skew.tasks t join skew.projects p on p.id = t.project_id$$,
    '{"skew.tasks": "select id from changed",
      "skew.comments": "select task_id from changed",
      "skew.projects": "select t.id from changed p join skew.tasks t on t.project_id = p.id"}');
select pgrag.declare_document('skew_comment',
    $$select c.id as source_key, format('%s on %s', c.body, p.name) as text
        from skew.comments c join skew.tasks t on t.id = c.task_id
        join skew.projects p on p.id = t.project_id$$,
    jsonb_build_object(
        'skew.comments', 'select id from changed',
        'skew.tasks', 'select c.id from changed t join skew.comments c on c.task_id = t.id',
        'skew.projects', 'select c.id from changed p join skew.tasks t on t.project_id = p.id '
                         'join skew.comments c on c.task_id = t.id'));
"""


def test_a_queued_render_that_waited_for_a_writer_sees_what_it_moved(db_url: str) -> None:
    """Found by a concurrency test: a writer (commit mode) moves comment 100 onto task 20 and
    renders it at its commit, project alpha; before it commits, a queue-mode move of task 20
    to project beta is rendered by the worker, whose key query (comments of task 20) cannot
    see comment 100 yet, and which waits for the writer's lock on task 20. The writer commits;
    the worker rendered without running its key queries again, and comment 100's chunk kept
    'alpha' for good. render_queued now runs them again after its locks, as sync_now does."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(_SKEW_SCHEMA.encode())
    with (
        psycopg.connect(db_url, autocommit=True) as test,
        psycopg.connect(db_url) as writer,
        psycopg.connect(db_url, autocommit=True) as mover,
        psycopg.connect(db_url, autocommit=True) as worker,
    ):
        test.execute("select pg_advisory_lock(7061733)")
        writer.execute("update skew.comments set task_id = 20 where id = 100")
        writer.execute("insert into skew.gate values (1)")
        committed: list[BaseException | None] = []

        def commit() -> None:
            try:
                writer.commit()  # renders at commit (alpha), then waits at the gate
                committed.append(None)
            except BaseException as exc:  # noqa: BLE001 (reported by the assertion below)
                committed.append(exc)

        t_commit = threading.Thread(target=commit)
        t_commit.start()
        writer_pid = writer.info.backend_pid
        wait_for(lambda: waits_on_advisory(test, writer_pid), "the writer waits at the gate")
        mover.execute("set pgrag.sync = queue")
        mover.execute("update skew.tasks set project_id = 2 where id = 20")
        rendered: list[Any] = []
        t_render = threading.Thread(
            target=lambda: rendered.append(
                worker.execute("select * from pgrag.render_queued()").fetchone()
            )
        )
        t_render.start()
        worker_pid = worker.info.backend_pid
        wait_for(lambda: waits_on_advisory(test, worker_pid), "the worker waits for the writer")
        test.execute("select pg_advisory_unlock(7061733)")
        t_commit.join(PATIENCE_S)
        t_render.join(PATIENCE_S)
        assert committed == [None] and rendered, (committed, rendered)
        text = test.execute(
            "select text from pgrag.chunks where doc_type = 'skew_comment' and source_key = '100'"
        ).fetchone()
        assert text == ("hello on beta",), text
        assert test.execute("select * from pgrag.verify()").fetchall() == []


def waits_on_advisory(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute(
        "select exists (select from pg_locks where pid = %s and not granted)", (pid,)
    ).fetchone()
    return bool(row and row[0])
