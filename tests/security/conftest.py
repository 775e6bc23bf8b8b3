"""The adversarial suite's fixtures: a real non-superuser attacker, a superuser victim.

The attacker is a login role that is a member of the writer role (what pgrag grants an ingestion
role or a worker), connecting as itself: no SET ROLE it could undo. The victim is the test
server's superuser (the embedded server's default connection), who migrates, declares, refreshes,
searches and asks. An escalation shows as the attacker becoming a superuser, or as the attacker's
code recording that it ran as another role (``attack.ran``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

PASSWORD = "pgrag-attacker-password"


@dataclass(frozen=True)
class Scene:
    victim: str  # the superuser's URL
    attacker: str  # the attacker's URL (a login role, member of the writer role)
    app: str  # an application's URL: another login in the writer role, with rights of its own
    role: str  # the attacker's role name
    schema: str  # where the attacker may create functions (pgrag_docs; pgrag before 0009)

    def attacker_is_superuser(self) -> bool:
        with psycopg.connect(self.victim) as conn:
            row = conn.execute(
                "select rolsuper from pg_roles where rolname = %s", (self.role,)
            ).fetchone()
        return bool(row and row[0])

    def ran_as(self) -> set[str]:
        """Every role the attacker's code ran as (its log, written by that code)."""
        with psycopg.connect(self.victim) as conn:
            return {r[0] for r in conn.execute("select distinct who from attack.ran")}


EVIL = """
create function {schema}.evil() returns integer language plpgsql volatile as $$
begin
    insert into attack.ran values (current_user);
    if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
        execute format('alter role %I superuser', {role});
    end if;
    return 1;
end $$;
create function {schema}.pwn_i(x integer) returns integer language plpgsql immutable as $$
begin
    perform {schema}.evil();
    return x;
end $$;
"""


@pytest.fixture
def scene(db_url: str) -> Iterator[Scene]:
    role = f"pgrag_t_attacker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
        conn.execute(
            sql.SQL("create role {} login password {} in role {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD), sql.Identifier(writer[0])
            )
        )
        # the attacker's own schema and tables: a log its code writes, a table it watches
        conn.execute(
            sql.SQL(
                "create schema attack authorization {r}; "
                "create table attack.ran (who name); grant insert on attack.ran to public; "
                "create table attack.things (id integer primary key, name text not null); "
                "alter table attack.things owner to {r}; "
                "insert into attack.things values (1, 'one'), (2, 'two')"
            ).format(r=sql.Identifier(role))
        )
        # the victim's own table and schema (the attacker may read them, as writers render)
        conn.execute(
            sql.SQL(
                "create schema victim; create table victim.notes (id integer primary key, "
                "body text not null); insert into victim.notes values (1, 'note one'); "
                "grant usage on schema victim to {w}; grant select on victim.notes to {w}"
            ).format(w=sql.Identifier(writer[0]))
        )
        schema = (
            "pgrag_docs"
            if conn.execute("select to_regnamespace('pgrag_docs') is not null").fetchone()
            == (True,)
            else "pgrag"
        )
    app = f"{role}_app"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "create role {a} login password {p} in role {w}; "
                "grant usage on schema attack to {a}; "
                "grant select, insert, update, delete on attack.things to {a}; "
                "grant select, insert, update, delete on victim.notes to {a}"
            ).format(a=sql.Identifier(app), p=sql.Literal(PASSWORD), w=sql.Identifier(writer[0]))
        )
    url = psycopg.conninfo.make_conninfo(db_url, user=role, password=PASSWORD)
    app_url = psycopg.conninfo.make_conninfo(db_url, user=app, password=PASSWORD)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EVIL.format(schema=schema, role=sql.Literal(role).as_string(conn)).encode())
    yield Scene(victim=db_url, attacker=url, app=app_url, role=role, schema=schema)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for r in (app, role):
            conn.execute(sql.SQL("drop owned by {} cascade").format(sql.Identifier(r)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(r)))


def declare_things(conn: psycopg.Connection[Any], name: str = "things") -> None:
    """The attacker's own document type, over its own table."""
    conn.execute(
        "select pgrag.declare_document(%s, $$select t.id as source_key, t.name as text "
        'from attack.things t$$, \'{"attack.things": "select id from changed"}\')',
        (name,),
    )
    conn.execute("select pgrag.refresh(%s)", (name,))


@dataclass(frozen=True)
class Reader:
    url: str  # a login role, member of the reader role, bound to tenant "acme"
    role: str


@pytest.fixture
def reader(db_url: str) -> Iterator[Reader]:
    """A real reader: a login role in the reader role, bound to a tenant, as an application
    that only searches would connect."""
    role = f"pgrag_t_reader_{uuid.uuid4().hex[:8]}"
    yield make_reader(db_url, role, "acme")
    drop_role(db_url, role)


def make_reader(db_url: str, role: str, tenant: str) -> Reader:
    """A login role in the reader role, bound to ``tenant``."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("select reader_role from pgrag.settings").fetchone()
        assert row is not None
        conn.execute(
            sql.SQL("create role {} login password {} in role {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD), sql.Identifier(row[0])
            )
        )
        conn.execute("select pgrag.bind_tenant_role(%s, %s)", (role, tenant))
    return Reader(psycopg.conninfo.make_conninfo(db_url, user=role, password=PASSWORD), role)


def drop_role(db_url: str, role: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop owned by {} cascade").format(sql.Identifier(role)))
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))
