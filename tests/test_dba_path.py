"""The DBA's first hour on a managed PostgreSQL: no superuser, ``vector`` created beforehand by an
administrator, roles made by the DBA from the statements the migration prints. Then the whole
path as those roles: migrate, declare, render, write, embed, search, downgrade to nothing.

Plain alembic's errors are one line with pgrag's exit codes; ``--sql`` writes the upgrade as a
script a DBA reviews and runs with psql.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgrag import migrate
from pgrag.errors import ConfigError, MissingExtension

from .conftest import REPO, TestServer, create_database, drop_database, run_pgrag
from .embed_server import FakeEmbeddings

ALEMBIC = str(Path(sys.executable).parent / "alembic")


def as_user(url: str, user: str) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(url)
    parts["user"] = user
    parts.pop("password", None)
    return psycopg.conninfo.make_conninfo(**parts)  # type: ignore[arg-type]


@dataclass
class Cluster:
    """The administrator's side of a managed PostgreSQL: a superuser that makes roles and
    databases and runs ``create extension vector`` on request; everything it made is dropped."""

    server: TestServer
    roles: list[str]
    databases: list[str]

    def admin(self, statement: sql.Composed | str, dbname: str = "postgres") -> None:
        url = self.server.url_for(dbname)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement if isinstance(statement, sql.Composed) else statement.encode())

    def role(self, options: str = "") -> str:
        name = f"pgrag_t_dba_{uuid.uuid4().hex[:8]}"
        self.roles.append(name)
        self.admin(
            sql.SQL("create role {} login {}").format(sql.Identifier(name), sql.SQL(options))
        )
        return name

    def name(self, kind: str) -> str:
        name = f"pgrag_t_{kind}_{uuid.uuid4().hex[:8]}"
        self.roles.append(name)
        return name

    def database(self, owner: str, *, vector: bool = True) -> str:
        name = create_database(self.server)
        self.databases.append(name)
        self.admin(
            sql.SQL("alter database {} owner to {}").format(
                sql.Identifier(name), sql.Identifier(owner)
            )
        )
        if vector:
            self.admin("create extension vector", name)
        return as_user(self.server.url_for(name), owner)


@pytest.fixture
def cluster(pg_server: TestServer) -> Iterator[Cluster]:
    made = Cluster(pg_server, [], [])
    yield made
    for name in made.databases:
        drop_database(pg_server, name)
    for role in reversed(made.roles):
        made.admin(
            "do $$ begin if exists (select from pg_roles where rolname = '"
            + role
            + "') then execute 'drop role "
            + role
            + "'; end if; end $$"
        )


def scalar(url: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode(), params or None).fetchone()
        return row[0] if row else None


SCHEMA = """
create schema lib;
create table lib.authors (id integer primary key, name text not null);
create table lib.books (id integer primary key,
                        author_id integer not null references lib.authors,
                        title text not null);
insert into lib.authors values (1, 'Ursula Le Guin'), (2, 'Stanislaw Lem');
insert into lib.books values (1, 1, 'The Dispossessed'), (2, 1, 'The Lathe of Heaven'),
                             (3, 2, 'Solaris');
create view lib.author_doc as
select a.id as source_key,
       'Author ' || a.name || ' wrote ' || string_agg(b.title, ', ' order by b.id) || '.' as text,
       jsonb_build_object('books', count(b.id)) as metadata
from lib.authors a left join lib.books b on b.author_id = a.id
group by a.id, a.name;
select pgrag.declare_document(
    'author_doc', 'lib.author_doc',
    '{"lib.authors": "select id from changed", "lib.books": "select author_id from changed"}',
    metadata_schema => '{"books": "integer"}');
select pgrag.refresh('author_doc');
"""


def walk_the_whole_path(dba_url: str, cluster: Cluster, reader: str, writer: str) -> None:
    """As the DBA: declare and render; as an application login in the writer role: write;
    embed; as a login in the reader role: search; as the DBA: downgrade to nothing."""
    # upgrading again, in a session that has not loaded pgvector's library: a SET clause of
    # its settings (hnsw.*) was refused to a non-superuser, so no second upgrade worked
    migrate.upgrade(dba_url, reader_role=reader, writer_role=writer)
    with psycopg.connect(dba_url, autocommit=True) as conn:
        conn.execute(SCHEMA.encode())
    app = cluster.role(f"in role {writer}")
    searcher = cluster.role(f"in role {reader}")
    dbname = psycopg.conninfo.conninfo_to_dict(dba_url)["dbname"]
    cluster.admin(
        sql.SQL(
            "grant usage on schema lib to {r}; grant select, insert, update on all tables "
            "in schema lib to {r}"
        ).format(r=sql.Identifier(app)),  # fmt: skip
        str(dbname),
    )
    with psycopg.connect(as_user(dba_url, app), autocommit=True) as conn:
        conn.execute("insert into lib.books values (4, 2, 'The Cyberiad')")
    text = scalar(dba_url, "select text from pgrag.chunks where source_key = '2'")
    assert text == "Author Stanislaw Lem wrote Solaris, The Cyberiad.", text
    fake = FakeEmbeddings()
    try:
        embedded = run_pgrag("embed", env={"PGRAG_DATABASE_URL": dba_url, **fake.env()})
        assert embedded.returncode == 0, embedded.stderr
        found = run_pgrag(
            "search", "Cyberiad", "-k", "1", "--filter", '{"books": 2}', "--json",
            env={"PGRAG_DATABASE_URL": as_user(dba_url, searcher), **fake.env()},
        )  # fmt: skip
    finally:
        fake.close()
    assert found.returncode == 0, found.stderr
    assert '"source_key": "2"' in found.stdout, found.stdout
    # what a reader may not do: one line naming the role and who may (exit 2, not the 1 of
    # verify's mismatches)
    denied = run_pgrag("verify", env={"PGRAG_DATABASE_URL": as_user(dba_url, searcher)})
    assert denied.returncode == 2, denied.stderr
    assert denied.stderr.count("\n") == 1 and "permission denied" in denied.stderr
    assert f"(as role {searcher}): connect as a role that may" in denied.stderr
    assert scalar(dba_url, "select count(*) from pgrag.verify()") == 0
    with psycopg.connect(dba_url, autocommit=True) as conn:
        conn.execute("select pgrag.drop_document('author_doc')")
    migrate.downgrade(dba_url, "base", drop_data=True)
    left = scalar(
        dba_url,
        "select string_agg(nspname, ', ') from pg_namespace where nspname like 'pgrag%'",
    )
    assert left is None, left
    assert scalar(dba_url, "select to_regclass('public.pgrag_alembic_version')") is None


def test_a_dba_without_createrole_migrates_after_running_the_printed_statements(
    cluster: Cluster,
) -> None:
    dba = cluster.role()
    url = cluster.database(dba)
    reader, writer = cluster.name("reader"), cluster.name("writer")
    with pytest.raises(ConfigError, match="may not create roles") as err:
        migrate.upgrade(url, reader_role=reader, writer_role=writer)
    assert migrate.current(url) is None  # nothing changed
    printed = re.search(r"`(create role .*?)`", str(err.value))
    assert printed, err.value
    cluster.admin(printed.group(1))  # the administrator runs exactly what was printed
    migrate.upgrade(url, reader_role=reader, writer_role=writer)
    assert migrate.current(url) == migrate.head()
    assert scalar(url, "select rolsuper or rolcreaterole from pg_roles where rolname = %s",
                  (dba,)) is False  # fmt: skip
    walk_the_whole_path(url, cluster, reader, writer)


def test_a_dba_with_createrole_migrates_and_makes_the_roles(cluster: Cluster) -> None:
    # PostgreSQL 16+: a CREATEROLE role administers the roles it creates but is not a member
    dba = cluster.role("createrole")
    url = cluster.database(dba)
    reader, writer = cluster.name("reader"), cluster.name("writer")
    migrate.upgrade(url, reader_role=reader, writer_role=writer)
    assert migrate.current(url) == migrate.head()
    # a member it may act as and inherit from (ADMIN alone, which PostgreSQL 16 gives a role's
    # creator, left it unable to verify or upgrade types declared as the writer role)
    acts = "select pg_has_role(current_user, %s, 'SET') and pg_has_role(current_user, %s, 'USAGE')"
    assert scalar(url, acts, (writer, writer)) is True
    walk_the_whole_path(url, cluster, reader, writer)


def test_without_vector_a_non_superuser_is_told_to_ask_an_administrator(
    cluster: Cluster,
) -> None:
    dba = cluster.role()
    url = cluster.database(dba, vector=False)
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with pytest.raises(MissingExtension, match="ask an administrator") as err:
        migrate.upgrade(url)
    assert f"`create extension vector` in {dbname}" in str(err.value)
    assert err.value.exit_code == 3
    cli = run_pgrag("db", "upgrade", env={"PGRAG_DATABASE_URL": url})
    assert cli.returncode == 3 and "ask an administrator" in cli.stderr, cli.stderr
    plain = subprocess.run(
        [ALEMBIC, "upgrade", "head"],
        cwd=REPO,
        env={**os.environ, "PGRAG_DATABASE_URL": url},
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 3, plain.stderr
    assert "Traceback" not in plain.stderr
    errors = [line for line in plain.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1 and "ask an administrator" in errors[0], plain.stderr


def test_plain_alembic_database_errors_are_one_line(empty_db_url: str) -> None:
    # a failure inside a SQL file: the cause in one line, not the file in a traceback
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("create schema pgrag")  # revision 0001 creates it: it fails
    plain = subprocess.run(
        [ALEMBIC, "upgrade", "head"],
        cwd=REPO,
        env={**os.environ, "PGRAG_DATABASE_URL": empty_db_url},
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 1, plain.stderr
    errors = [line for line in plain.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1, plain.stderr
    assert 'schema "pgrag" already exists' in errors[0] and "nothing changed" in errors[0]


def test_downgrade_to_base_leaves_no_version_table(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    assert scalar(empty_db_url, "select to_regclass('public.pgrag_alembic_version')") is None
    assert migrate.current(empty_db_url) is None
    plain = subprocess.run(
        [ALEMBIC, "upgrade", "head"],
        cwd=REPO,
        env={**os.environ, "PGRAG_DATABASE_URL": empty_db_url},
        capture_output=True,
    )
    assert plain.returncode == 0
    subprocess.run(
        [ALEMBIC, "downgrade", "base"],
        cwd=REPO,
        env={**os.environ, "PGRAG_DATABASE_URL": empty_db_url},
        capture_output=True,
        check=True,
    )
    assert scalar(empty_db_url, "select to_regclass('public.pgrag_alembic_version')") is None


def catalog(url: str) -> list[str]:
    """pgrag's functions (with their definitions), relations, settings and revision."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            select p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid))
              from pg_proc p join pg_namespace n on n.oid = p.pronamespace
             where n.nspname like 'pgrag%%'
            union all
            select c.oid::regclass::text || ' ' || c.relkind::text
              from pg_class c join pg_namespace n on n.oid = c.relnamespace
             where n.nspname like 'pgrag%%' or c.relname like 'pgrag%%'
            union all
            select 'revision ' || version_num from public.pgrag_alembic_version
            union all
            select 'settings ' || embedding_dim || ' ' || hnsw_m || ' ' || reader_role
              from pgrag.settings
            order by 1
            """
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_upgrade_sql_is_a_script_that_migrates_like_the_online_upgrade(
    pg_server: TestServer, empty_db_url: str, template_db: str
) -> None:
    script = subprocess.run(
        [ALEMBIC, "upgrade", "head", "--sql"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert script.startswith("BEGIN;") and script.rstrip().endswith("COMMIT;")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(script.encode())
    assert catalog(empty_db_url) == catalog(pg_server.url_for(template_db))
    # the same script from pgrag's own module and CLI (an installed wheel has no alembic.ini)
    assert migrate.upgrade_sql() == script
    cli = run_pgrag("db", "upgrade", "--sql")
    assert cli.returncode == 0 and cli.stdout == script, cli.stderr


def test_upgrade_sql_from_a_revision_ends_with_head_functions(
    pg_server: TestServer, empty_db_url: str, template_db: str
) -> None:
    migrate.upgrade(empty_db_url, "0007")
    script = migrate.upgrade_sql(start="0007")
    assert "Running upgrade  -> 0001" not in script
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(script.encode())
    assert catalog(empty_db_url) == catalog(pg_server.url_for(template_db))


def test_downgrade_sql_is_refused_in_one_line() -> None:
    plain = subprocess.run(
        [ALEMBIC, "downgrade", f"{migrate.head()}:base", "--sql"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 2, plain.stderr
    assert plain.stdout == ""  # no partial script
    errors = [line for line in plain.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1 and "run online only" in errors[0], plain.stderr


def test_a_script_made_for_another_revision_changes_nothing(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0008")
    script = migrate.upgrade_sql(start="0009")  # made for a database at 0009
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="upgrades from revision 0009.*is at 0008"):
            conn.execute(script.encode())
        conn.execute("rollback")
    assert migrate.current(empty_db_url) == "0008"


def test_a_role_without_create_on_schema_public_is_told_what_to_grant(cluster: Cluster) -> None:
    # PostgreSQL 15+: only the database owner may create in schema public, where the version
    # table lives; CREATE on the database alone is not enough
    owner = cluster.role()
    url = cluster.database(owner)
    dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    dba = cluster.role()
    cluster.admin(
        sql.SQL("grant create on database {} to {}").format(
            sql.Identifier(dbname), sql.Identifier(dba)
        )
    )
    with pytest.raises(ConfigError, match="may not create tables in schema public") as err:
        migrate.upgrade(as_user(url, dba))
    assert f"grant create on schema public to {dba};" in str(err.value)
    assert migrate.current(url) is None
