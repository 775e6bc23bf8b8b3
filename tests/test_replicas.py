"""Read replicas, for real: a primary and a hot standby started from the embedded binaries
(pg_basebackup, streaming replication over the primary's Unix socket), whatever server the
rest of the suite uses. Writes go to the primary, reads to the standby; the rendered chunks
and the worker's vectors arrive by replication; a standby stopped mid-run sends the reads to
the primary without an error (docs/scaling.md)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgrag
from pgrag import documents, migrate
from pgrag.embed.openai import OpenAIEmbedder
from pgrag.replicas import Rotation, commit_lsn, hosts, is_server_failure, later_lsn, split_url
from pgrag.server import EmbeddedServer
from pgrag.worker import Worker

from .conftest import run_pgrag, wait_for
from .embed_server import FakeEmbeddings


@dataclass
class Pair:
    primary: EmbeddedServer
    standby: EmbeddedServer
    primary_url: str
    standby_url: str


def _in_recovery(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("select pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    base = Path(tempfile.mkdtemp(prefix="pgrag-replicas-"))
    primary = EmbeddedServer(base / "primary")
    standby = EmbeddedServer(base / "standby")
    try:
        purl = primary.start()
        migrate.upgrade(purl)
        with psycopg.connect(purl, autocommit=True) as c:
            c.execute("create table public.notes (id int primary key, author text, body text)")
            c.execute(
                "insert into public.notes select g, 'author ' || (g % 3), 'a note on ' || "
                "(array['tides', 'ferns', 'granite'])[g % 3 + 1] || ' number ' || g "
                "from generate_series(1, 30) g"
            )
            documents.declare(
                c,
                "note",
                "select id as source_key, body as text, "
                "jsonb_build_object('author', author) as metadata from public.notes",
                {"public.notes": "select id from changed"},
            )
            documents.rebuild(c)
            c.execute(
                "select pgrag.declare_stats('note', %s)",
                (
                    "select jsonb_build_object('notes', count(*)) "
                    "from hits h join public.notes n on n.id = h.source_key::integer",
                ),
            )
        surl = standby.start_standby(purl)
        yield Pair(primary, standby, purl, surl)
    finally:
        for server in (standby, primary):
            with contextlib.suppress(Exception):  # best effort: the directory goes anyway
                server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings()
    yield server
    server.close()


def test_the_standby_is_a_hot_standby_of_the_primary(pair: Pair) -> None:
    assert pair.standby.is_standby and not pair.primary.is_standby
    with psycopg.connect(pair.standby_url) as s:
        assert _in_recovery(s)
        row = s.execute("select count(*) from pgrag.chunks where doc_type = 'note'").fetchone()
    assert row == (30,)
    # starting it again is a no-op that says where it is, never CREATE DATABASE on a standby
    assert pair.standby.start() == pair.standby_url


def test_reads_go_to_the_standby_and_writes_to_the_primary(pair: Pair) -> None:
    with pgrag.connect(pair.primary_url, replicas=[pair.standby_url]) as client:
        with client.reading() as conn:
            assert _in_recovery(conn)
        with client.connection() as conn:
            assert not _in_recovery(conn)
        assert client.search("granite", mode="text", k=3).hits


def test_read_your_writes_sees_the_rendered_chunk_on_the_standby(pair: Pair) -> None:
    with pgrag.connect(
        pair.primary_url, replicas=[pair.standby_url], read_your_writes=True
    ) as client:
        with client.connection() as conn:
            conn.execute("update public.notes set body = 'a note on basalt columns' where id = 7")
        hits = client.search("basalt", mode="text", k=3).hits
        assert [h.source_key for h in hits] == ["7"]
        # the same read on the standby itself, to show it came from there
        with client.reading() as conn:
            assert _in_recovery(conn)
            row = conn.execute(
                "select text from pgrag.chunks where doc_type = 'note' and source_key = '7'"
            ).fetchone()
        assert row == ("a note on basalt columns",)
        # exact statistics, on the standby (it cannot write the statistics cache: computed)
        assert client.stats(doc_types=["note"]) == {"note": {"notes": 30}}


def test_vectors_the_worker_writes_on_the_primary_reach_the_standby(
    pair: Pair, fake: FakeEmbeddings
) -> None:
    embedder = OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=384)
    with Worker(pair.primary_url, embedder, auto_tune=False) as w:
        w.drain()
    with pgrag.connect(
        pair.primary_url, replicas=[pair.standby_url], read_your_writes=True
    ) as client:
        client.wrote()  # the worker's writes are not this client's: note the primary's position
        with client.reading() as conn:
            assert _in_recovery(conn)
            row = conn.execute(
                "select count(*) filter (where embedding is not null), count(*) "
                "from pgrag.chunks where doc_type = 'note'"
            ).fetchone()
        assert row is not None and row[0] == row[1] == 30


def test_a_lagging_standby_sends_a_fresh_read_to_the_primary(pair: Pair) -> None:
    with psycopg.connect(pair.standby_url, autocommit=True) as s:
        s.execute("select pg_wal_replay_pause()")
        try:
            with pgrag.connect(
                pair.primary_url, replicas=[pair.standby_url], replay_wait_s=0.2
            ) as client:
                with client.connection() as conn:
                    conn.execute("update public.notes set body = 'a note on obsidian' where id = 8")
                # without read_your_writes: the standby's (old) answer
                assert not client.search("obsidian", mode="text", k=3).hits
                # with it: the standby has not replayed the write in time, the primary answers
                hits = client.search("obsidian", mode="text", k=3, fresh=True).hits
                assert [h.source_key for h in hits] == ["8"]
                with client.reading(read_your_writes=True) as conn:
                    assert not _in_recovery(conn)
        finally:
            s.execute("select pg_wal_replay_resume()")


def test_a_standby_stopped_mid_run_sends_reads_to_the_primary(pair: Pair) -> None:
    errors: list[BaseException] = []
    answered = [0]
    stop = threading.Event()
    with pgrag.connect(pair.primary_url, replicas=[pair.standby_url], max_size=2) as client:

        def reader() -> None:
            while not stop.is_set():
                try:
                    assert client.search("tides", mode="text", k=3).hits
                    answered[0] += 1
                except BaseException as exc:  # noqa: BLE001 - every error fails the test
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: answered[0] >= 20 or errors, "searches answered by the standby")
            pair.standby.stop()
            after_stop = answered[0]
            wait_for(lambda: answered[0] >= after_stop + 50 or errors, "searches after the stop")
            with client.reading() as conn:
                assert not _in_recovery(conn)  # the standby is down: the primary reads
        finally:
            stop.set()
            for t in threads:
                t.join()
            pair.standby.start()
        assert errors == []
        # back: once its back-off ends, the standby serves reads again
        wait_for(lambda: _reads_on_standby(client), "reads back on the restarted standby")


def _reads_on_standby(client: pgrag.Client) -> bool:
    with client.reading() as conn:
        return _in_recovery(conn)


def test_a_multi_host_url_reads_from_the_standby_and_writes_to_the_primary(pair: Pair) -> None:
    p = psycopg.conninfo.conninfo_to_dict(pair.primary_url)["host"]
    s = psycopg.conninfo.conninfo_to_dict(pair.standby_url)["host"]
    url = f"postgresql://postgres@/pgrag?host={s},{p}"
    with pgrag.connect(url) as client:
        assert len(client.replicas) == 2  # a pool per host; the primary's refuses to serve
        with client.connection() as conn:
            assert not _in_recovery(conn)
        for _ in range(4):  # every read in turn: the standby's, never the primary's host
            with client.reading() as conn:
                assert _in_recovery(conn)
        assert client.search("granite", mode="text", k=3).hits


def test_the_async_client_routes_reads_the_same_way(pair: Pair) -> None:
    async def run() -> None:
        client = await pgrag.aconnect(
            pair.primary_url, replicas=[pair.standby_url], read_your_writes=True
        )
        async with client:
            async with client.connection() as conn:
                await conn.execute("update public.notes set body = 'a note on pumice' where id = 9")
            hits = (await client.search("pumice", mode="text", k=3)).hits
            assert [h.source_key for h in hits] == ["9"]
            async with client.reading() as conn:
                cur = await conn.execute("select pg_is_in_recovery()")
                assert await cur.fetchone() == (True,)
            before = client.written_lsn
            await client.wrote()  # the primary's position now, as Client.wrote()
            assert (
                before is not None and later_lsn(before, client.written_lsn) == client.written_lsn
            )

    asyncio.run(run())


def test_url_splitting_and_rotation() -> None:
    writer, readers = split_url("postgresql://u@a:5432,b:5433/db")
    assert "target_session_attrs=read-write" in writer and "a,b" in writer
    assert [psycopg.conninfo.conninfo_to_dict(r)["host"] for r in readers] == ["a", "b"]
    assert [psycopg.conninfo.conninfo_to_dict(r)["port"] for r in readers] == ["5432", "5433"]
    assert all("target_session_attrs=standby" in r for r in readers)
    assert split_url("postgresql://u@a/db") == ("postgresql://u@a/db", [])
    assert hosts("host=a,b dbname=x") == ["a", "b"]
    assert later_lsn("0/10", "1/0") == "1/0" and later_lsn(None, "0/5") == "0/5"
    # right after a page header (24 bytes; 40 on a segment's first page): the page's start
    assert commit_lsn("0/3002018") == "0/3002000" and commit_lsn("0/3000028") == "0/3000000"
    assert commit_lsn("0/3002030") == "0/3002030"
    r = Rotation(3)
    assert [r.order()[0] for _ in range(4)] == [0, 1, 2, 0]
    r.down(1)
    r.down(1)  # a second failure while it is down does not lengthen its back-off
    assert r._backoff[1] == 1.0
    assert all(1 not in r.order() for _ in range(3))
    r.up(1)
    assert sorted(r.order()) == [0, 1, 2]


def test_only_the_servers_failures_move_a_read_to_another_server() -> None:
    timeout = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    assert not is_server_failure(timeout, None)  # the read's own: never run twice
    assert not is_server_failure(psycopg.errors.UndefinedTable("x"), None)
    assert is_server_failure(psycopg.errors.AdminShutdown("shutting down"), None)
    assert is_server_failure(psycopg.errors.SerializationFailure("conflict"), None)
    wrapped = pgrag.PgragError("wrapped")
    wrapped.__cause__ = psycopg.errors.CrashShutdown("crash")
    assert is_server_failure(wrapped, None)
    # a cause that leads back to itself (a search raised an unmapped error "from" itself, and a
    # reader thread spun here when its standby stopped): the walk ends
    looped = psycopg.errors.UndefinedTable("x")
    looped.__cause__ = looped
    assert not is_server_failure(looped, None)
    # an error raised while handling the server's ("cannot exit pipeline mode while busy")
    busy = psycopg.OperationalError("cannot exit pipeline mode while busy")
    busy.__context__ = psycopg.errors.AdminShutdown("terminating connection")
    assert is_server_failure(busy, None)
    busy.__context__ = timeout
    assert not is_server_failure(busy, None)


def test_a_search_error_pgrag_does_not_map_is_raised_as_it_is() -> None:
    """Not "from" itself: an unmapped error's cause stays what psycopg made it."""
    from pgrag.search import _raise_database_error

    exc = psycopg.errors.QueryCanceled("canceling statement")
    with pytest.raises(psycopg.errors.QueryCanceled) as raised:
        _raise_database_error(exc)
    assert raised.value is exc and raised.value.__cause__ is not exc


def test_a_read_that_fails_on_its_own_runs_once_and_leaves_the_replica_up(pair: Pair) -> None:
    calls = []

    def slow(conn: psycopg.Connection[Any]) -> None:
        calls.append(1)
        # what a statement timeout or a cancel raises (57014), without waiting for one
        conn.execute(
            "do $$ begin raise exception using errcode = 'query_canceled', "
            "message = 'canceling statement due to statement timeout'; end $$"
        )

    with pgrag.connect(pair.primary_url, replicas=[pair.standby_url]) as client:
        with pytest.raises(psycopg.errors.QueryCanceled):
            client._read(slow, None, None)
        assert calls == [1]
        with client.reading() as conn:
            assert _in_recovery(conn)  # not marked down


def test_a_replica_url_that_is_not_a_string_is_a_one_line_error(pair: Pair) -> None:
    with pytest.raises(pgrag.ConfigError, match="replica URL '' is not a connection string"):
        pgrag.connect(pair.primary_url, replicas=[""])
    with pytest.raises(pgrag.ConfigError, match="is not a connection string .missing"):
        pgrag.connect(pair.primary_url, replicas=["host=a dbname"])


def test_the_standby_command_starts_a_standby_and_refuses_a_primary(pair: Pair) -> None:
    env = {"PGRAG_DATA_DIR": str(pair.primary.data_dir)}
    again = run_pgrag("server", "standby", str(pair.standby.data_dir), env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == pair.standby_url
    refused = run_pgrag("server", "standby", str(pair.primary.data_dir), env=env)
    assert refused.returncode == 3
    assert refused.stderr.strip().splitlines() == [
        f"pgrag: error: data directory {pair.primary.data_dir} holds a primary, not a standby: "
        "give the standby an empty or new directory"
    ]


def test_the_worker_refuses_a_standby_in_one_line(pair: Pair, fake: FakeEmbeddings) -> None:
    embedder = OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=384)
    with (
        pytest.raises(pgrag.ConfigError, match="is a standby .read-only.: run the worker"),
        Worker(pair.standby_url, embedder, auto_tune=False),
    ):
        pass


def test_status_shows_the_standbys_and_a_standbys_lag(pair: Pair) -> None:
    def primary_sees_it() -> bool:
        with pgrag.connect(pair.primary_url) as client:
            r = client.status().replication or {}
        return any(
            sb["name"] == "pgrag standby standby" and sb["state"] == "streaming"
            for sb in r.get("standbys", [])
        )

    wait_for(primary_sees_it, "the primary lists the standby as streaming")
    with pgrag.connect(pair.standby_url) as client:
        r = client.status().replication
    assert r is not None and r["role"] == "standby" and r["received_not_replayed_bytes"] >= 0
    out = run_pgrag("status", env={"PGRAG_DATABASE_URL": pair.primary_url})
    assert out.returncode == 0, out.stderr
    assert "replication: 1 standby(s): pgrag standby standby (streaming" in out.stdout
    out = run_pgrag("status", env={"PGRAG_DATABASE_URL": pair.standby_url})
    assert out.returncode == 0, out.stderr
    assert "replication: a hot standby (read-only)" in out.stdout


def test_commands_given_a_multi_host_url_reach_the_primary(pair: Pair) -> None:
    p = psycopg.conninfo.conninfo_to_dict(pair.primary_url)["host"]
    s = psycopg.conninfo.conninfo_to_dict(pair.standby_url)["host"]
    url = f"postgresql://postgres@/pgrag?host={s},{p}"  # the standby first
    out = run_pgrag("status", env={"PGRAG_DATABASE_URL": url})
    assert out.returncode == 0, out.stderr
    assert "replication: 1 standby(s)" in out.stdout  # the primary's view, not the standby's
