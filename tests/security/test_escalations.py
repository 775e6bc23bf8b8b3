"""The three ways a pgrag_writer member became a superuser (issue 15), each as a real attacker
against a superuser victim, and the principle behind the fixes: what a role declares runs with
that role's rights, whoever triggers it (docs/security.md).

Each test fails on the release before 0009: the attack made the attacker a superuser there.
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgrag import migrate
from pgrag.ask import ask
from pgrag.search import search
from pgrag.security import tenant_scope
from tests.embed_server import default_embedder

from ..conftest import wait_for, waits_on_lock
from .conftest import PASSWORD, Scene, declare_things


def _victim_declares(scene: Scene, name: str = "victim") -> None:
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute(
            "select pgrag.declare_document(%s, $$select n.id as source_key, n.body as text "
            'from victim.notes n$$, \'{"victim.notes": "select id from changed"}\')',
            (name,),
        )
        conn.execute("select pgrag.refresh(%s)", (name,))


# ---- 1. through a migration: a key query planned (or run) as the migrating role ----


def test_a_migration_runs_no_key_query_the_attacker_wrote(scene: Scene) -> None:
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        # its own type's key query, rewritten behind the declaration's back, to one that runs
        # the escalation when planned (an immutable function of constant arguments)
        conn.execute(
            "update pgrag.doc_watches set key_query = "
            f"'select 1 where {scene.schema}.pwn_i(1) = 1' where doc_type = 'things'"
        )
        # and its trigger function dropped, so that a migration must create it again
        for (stmt,) in conn.execute(
            "select format('drop function %s cascade', p.oid::regprocedure) from pg_proc p "
            "where p.proname ~ '^sync_things_'"
        ).fetchall():
            conn.execute(stmt.encode())
    migrate.upgrade(scene.victim)  # the DBA, a superuser
    migrate.upgrade(scene.victim)  # and every later upgrade
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}


def test_a_writer_cannot_put_sql_into_another_roles_type(scene: Scene) -> None:
    _victim_declares(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        with pytest.raises(psycopg.Error):
            conn.execute(
                "insert into pgrag.doc_watches (doc_type, source_table, key_query) values "
                f"('victim', 'attack.things', 'select 1 where {scene.schema}.pwn_i(1) = 1')"
            )
        updated = conn.execute(
            "update pgrag.doc_watches set key_query = 'select 2' where doc_type = 'victim'"
        )
        assert updated.rowcount == 0  # the victim's rows are not the attacker's to change
        with pytest.raises(psycopg.Error, match="belongs to role"):
            conn.execute(
                "select pgrag.declare_document('victim', $$select 1 as source_key, "
                f"{scene.schema}.evil()::text as text$$)"
            )
        with pytest.raises(psycopg.Error, match="belongs to role"):
            conn.execute("select pgrag.drop_document('victim')")
    migrate.upgrade(scene.victim)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("update victim.notes set body = body || '!'")
        conn.execute("select pgrag.refresh('victim')")
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == set()


# ---- 2. squatting on the names of a type's generated functions ----


def test_functions_squatted_before_a_declaration_are_not_kept(scene: Scene) -> None:
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        for name, ret in (
            ("render_victim", "table (key text, parent text, body text, meta jsonb, tenant text)"),
            ("store_victim", "bigint"),
        ):
            conn.execute(
                f"create function {scene.schema}.{name}(keys text[]) returns {ret} "
                f"language plpgsql as $$ begin perform {scene.schema}.evil(); end $$".encode()
            )
    _victim_declares(scene)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("update victim.notes set body = body || '!'")  # the watched table
        conn.execute("select pgrag.refresh('victim')")
        owners = conn.execute(
            "select p.proname, p.proowner::regrole::text from pg_proc p "
            "where p.proname in ('render_victim', 'store_victim')"
        ).fetchall()
    assert {o for _, o in owners} == {"postgres"} or all(o != scene.role for _, o in owners)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        with pytest.raises(psycopg.Error):  # must be owner of the victim's function
            conn.execute(
                f"create or replace function {scene.schema}.store_victim(keys text[]) "
                f"returns bigint language plpgsql as $$ begin perform {scene.schema}.evil(); "
                "return 0; end $$".encode()
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # schema pgrag is pgrag's
            conn.execute("create function pgrag.refresh2() returns int language sql return 1")
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.refresh('victim')")
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == set()


# ---- 3. statistics a writer declares, read by a superuser ----


def test_statistics_run_as_their_declarer_whoever_asks(scene: Scene) -> None:
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('n', count(*), "
            f"'x', {scene.schema}.evil()) from hits h$s$)"
        )
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute("select pgrag.stats()")
    assert not scene.attacker_is_superuser()
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute("select * from pgrag.stats_detail('{}')")
        conn.execute("select pgrag.stats('{}', '{things}')")
        search(conn, "one", mode="text", stats=True)
        ask(conn, "How many things are there?", embedder=default_embedder(), use_env_llm=False)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == {scene.role}  # it ran, as the attacker only
    # the body the generated function runs refuses any other caller
    with (
        psycopg.connect(scene.victim, autocommit=True) as conn,
        pytest.raises(psycopg.Error, match="run as"),
    ):
        conn.execute("select * from pgrag._type_stats('things', '{}', null)")


def test_statistics_of_another_roles_type_cannot_be_declared(scene: Scene) -> None:
    _victim_declares(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="belongs to role"):
            conn.execute(
                "select pgrag.declare_stats('victim', $s$select jsonb_build_object('x', "
                f"{scene.schema}.evil()) from hits$s$)"
            )
        with pytest.raises(psycopg.Error):
            conn.execute(
                "insert into pgrag.doc_stats (doc_type, stats_sql) values ('victim', "
                f"'select jsonb_build_object(''x'', {scene.schema}.evil()) from hits')"
            )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.stats()")
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == set()


# ---- the principle, for every piece of declared SQL ----


def test_everything_a_writer_declared_runs_as_the_writer(scene: Scene) -> None:
    """Its view, its key query and its statistics, whoever triggers them: a write by the
    superuser, a refresh, a rebuild, verify, a migration, a search with statistics."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            "select pgrag.declare_document('things', $$select t.id as source_key, t.name || "
            f"{scene.schema}.evil()::text as text from attack.things t$$, "
            '\'{"attack.things": "select id from changed where '
            f"{scene.schema}.evil() = 1\"}}')"
        )
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('x', "
            f"{scene.schema}.evil()) from hits$s$)"
        )
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute("select pgrag.refresh('things')")
        conn.execute("update attack.things set name = name || '!'")
        conn.execute("select * from pgrag.verify()")
        conn.execute("select pgrag.document_keys('things')")
        conn.execute("select pgrag.stats()")
    migrate.upgrade(scene.victim)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == {scene.role}


# ---- 4. through the generated functions' own attributes (the attacker owns them) ----


def _declare_evil_things(scene: Scene) -> None:
    """The attacker's type whose view, key query and statistics call its logging function."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            "select pgrag.declare_document('things', $$select t.id as source_key, t.name || "
            f"{scene.schema}.evil()::text as text from attack.things t$$, "
            '\'{"attack.things": "select id from changed where '
            f"{scene.schema}.evil() = 1\"}}')"
        )
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('x', "
            f"{scene.schema}.evil()) from hits$s$)"
        )


def _victim_runs_everything(scene: Scene) -> list[str]:
    """What an application (another writer login) does that calls a type's generated
    functions; the errors it got. (A superuser's session runs none: see below.)"""
    errors: list[str] = []
    with psycopg.connect(scene.app, autocommit=True) as conn:
        for stmt in (
            "select pgrag.refresh('things')",
            "update attack.things set name = name || '!'",
            "select * from pgrag.verify('things')",
            "select pgrag.document_keys('things')",
            "select pgrag.stats()",
            "insert into pgrag.render_queue (doc_type, keys) values ('things', array['1'])",
            "select pgrag.render_queued(100)",
        ):
            try:
                conn.execute(stmt.encode())
            except psycopg.Error as exc:
                errors.append(str(exc))
        errors += [
            r[0]
            for r in conn.execute(
                "select message from pgrag.render_errors where doc_type = 'things'"
            ).fetchall()
        ]
    return errors


def test_a_generated_function_altered_to_run_as_its_caller_is_not_run(scene: Scene) -> None:
    """ALTER FUNCTION ... SECURITY INVOKER needs only ownership: the declarer owns its type's
    functions, so it could make a superuser's refresh, write, verify, listing, statistics or
    the worker's render run its SQL as the superuser. pgrag calls none that is not the
    declarer's security definer any more."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        for (fn,) in conn.execute(
            "select p.oid::regprocedure::text from pg_proc p "
            "where p.pronamespace = 'pgrag_docs'::regnamespace "
            "and p.proname ~ '^(render|store|list|stats|keys)_things'"
        ).fetchall():
            conn.execute(f"alter function {fn} security invoker".encode())
    errors = _victim_runs_everything(scene)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}
    assert any("runs as its caller (security invoker)" in e for e in errors), errors


def test_a_generated_function_replaced_by_its_declarer_is_not_run(scene: Scene) -> None:
    """The same through CREATE OR REPLACE (the declarer may create in pgrag_docs): a body of
    its own, running as its caller."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            "create or replace function pgrag_docs.stats_things(filter jsonb, doc_types text[], "
            "out stats jsonb, out cached boolean) language plpgsql security invoker "
            f"as $$begin perform {scene.schema}.evil(); stats := '{{}}'; cached := false; "
            "end$$"
        )
        conn.execute(
            "create or replace function pgrag_docs.store_things(keys text[]) returns bigint "
            f"language plpgsql security invoker as $$begin perform {scene.schema}.evil(); "
            "return 0; end$$"
        )
    errors = _victim_runs_everything(scene)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}
    assert any("was altered" in e for e in errors), errors


def test_an_overload_of_another_roles_function_is_named_not_called(scene: Scene) -> None:
    """A writer may create functions in pgrag_docs: an overload with a defaulted argument
    makes a call by name ambiguous. pgrag names it, and its owner, in the error it records."""
    _victim_declares(scene)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute(
            "select pgrag.declare_stats('victim', "
            "$s$select jsonb_build_object('n', count(*)) from hits$s$)"
        )
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            "create function pgrag_docs.store_victim(keys text[], x integer default 0) "
            "returns bigint language sql as 'select 0::bigint'"
        )
        conn.execute(
            "create function pgrag_docs.stats_victim(filter jsonb, doc_types text[], "
            "x integer default 0, out stats jsonb, out cached boolean) language sql "
            "as $$select '{}'::jsonb, false$$"
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("update victim.notes set body = 'changed'")  # the write commits
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'victim'"
        ).fetchone() or ("",)
        assert "has 2 functions of that name" in message and scene.role in message
        with pytest.raises(psycopg.Error, match=f"has 2 functions.*{scene.role}"):
            conn.execute("select pgrag.stats('{}', '{victim}')")


def test_a_writer_cannot_delete_the_changes_that_keep_cached_statistics_true(
    scene: Scene,
) -> None:
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        for stmt in (
            "delete from pgrag.stats_changes",
            "update pgrag.stats_cache_horizon set pruned_below = pruned_below",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt.encode())
        conn.execute("select pgrag._prune_stats_changes()")  # pgrag prunes them itself


def test_a_catalog_row_written_by_hand_drops_no_view_and_fails_no_upgrade(
    scene: Scene,
) -> None:
    """A writer may write its own catalog rows: a source pointing at another role's view must
    not make a superuser's drop_document drop it, and a watch it may not trigger on must not
    fail every later upgrade."""
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("create view victim.important as select 1 as x")
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        conn.execute(
            "update pgrag.doc_types set source = 'victim.important'::regclass, "
            "owns_source = true where name = 'things'"
        )
        conn.execute(
            "insert into pgrag.doc_watches (doc_type, source_table, key_query, reads) "
            "values ('things', 'victim.notes'::regclass, 'select 1', '{}')"
        )
    migrate.upgrade(scene.victim)  # warns about the watch, upgrades the rest
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.drop_document('things')")
        assert conn.execute("select to_regclass('victim.important')").fetchone() == (
            "victim.important",
        )


# ---- 5. through the session the declared code runs in (found by a second attacker's review) ----

PLANT = """
create function {schema}.plant() returns text language plpgsql volatile as $$
begin
    if session_user <> {role} then
        -- a non-local setting outlives the definer that sets it
        perform pg_catalog.set_config('search_path', '{schema}, pg_catalog, public', false);
        execute 'create or replace temp view planted_view as select 1 as x';
        if not exists (select from pg_catalog.pg_prepared_statements
                        where name operator(pg_catalog.=) 'planted_statement') then
            execute 'prepare planted_statement as select 1';
        end if;
    end if;
    return '';
end $$;
grant execute on function {schema}.plant() to public;
"""


def test_declared_code_cannot_leave_state_in_the_callers_session(scene: Scene) -> None:
    """A declarer's view, key query or statistics run (as the declarer) inside the caller's
    session: a non-local set_config of search_path, a temporary view, a prepared statement
    left there would run as the caller later (an operator of the declarer's schema picked by
    pgrag's next statement, the caller's unqualified table name, psycopg's prepared
    statements). pgrag compares the session before and after each call of a generated function
    and undoes the call when it changed."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        role = sql.Literal(scene.role).as_string(conn)
        conn.execute(PLANT.format(schema=scene.schema, role=role).encode())
        conn.execute(
            "select pgrag.declare_document('things', $$select t.id as source_key, t.name || "
            f"{scene.schema}.plant() as text from attack.things t$$, "
            '\'{"attack.things": "select id from changed"}\')'
        )
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('n', count(*), "
            f"'x', {scene.schema}.plant()) from hits$s$)"
        )
    with psycopg.connect(scene.app, autocommit=True) as conn:
        path = conn.execute("show search_path").fetchone()
        refused: list[str] = []
        for stmt in (
            "select pgrag.refresh('things')",
            "select * from pgrag.verify('things')",
            "select pgrag.document_keys('things')",
            "select pgrag.stats()",
        ):
            try:
                conn.execute(stmt.encode())
            except psycopg.Error as exc:
                assert "changed this session" in str(exc), exc
                refused.append(stmt)
            assert conn.execute("show search_path").fetchone() == path, stmt
            assert conn.execute("select to_regclass('pg_temp.planted_view')").fetchone() == (
                None,
            ), stmt
            assert conn.execute(
                "select count(*) from pg_prepared_statements where name = 'planted_statement'"
            ).fetchone() == (0,), stmt
        # every one refused, loudly (a keyed render records it and goes on)
        assert len(refused) == 4, refused
        conn.execute("select pgrag.refresh('things', array['1'])")
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
        assert "changed this session" in message
        assert conn.execute("show search_path").fetchone() == path
    assert not scene.attacker_is_superuser()


# pgrag's settings, as its SQL and its Python name them
_PGRAG_SETTING = re.compile(r"""(?:set_config|current_setting)\(\s*['"](pgrag\.[a-z_]+)['"]""")
_PGRAG_OPTION = re.compile(r"""["'](pgrag\.[a-z_]+)["']\s*:""")  # migrate.py's options


def test_the_session_state_compared_holds_every_pgrag_setting(db_url: str) -> None:
    """A setting pgrag reads that the comparison around a declarer's call leaves out is one
    that call may change for the caller's later statements (a review found pgrag.defer_tsv
    missing; pgrag.ef_search and the filters' kept estimates were). Every one pgrag's SQL or
    Python names is in pgrag._session_state."""
    root = Path(__file__).resolve().parents[2]
    named: set[str] = set()
    for path in [*(root / "sql").rglob("*.sql"), *(root / "pgrag").rglob("*.py")]:
        text = path.read_text()
        named |= set(_PGRAG_SETTING.findall(text))
    named |= set(_PGRAG_OPTION.findall((root / "pgrag" / "migrate.py").read_text()))
    with psycopg.connect(db_url) as conn:
        (body,) = conn.execute(
            "select prosrc from pg_proc where oid = 'pgrag._session_state'::regproc"
        ).fetchone() or ("",)
        # (a dict's keys may be tables: pgrag.settings, pgrag.doc_stats...)
        named = {
            n for n in named if conn.execute("select to_regclass(%s)", (n,)).fetchone() == (None,)
        }
    assert {"pgrag.sync", "pgrag.ef_search", "pgrag.drop_data"} <= named
    assert {n for n in named if f"'{n}'" not in body} == set()


@pytest.mark.parametrize("setting", ["pgrag.ef_search", "pgrag.filter_estimates"])
def test_declared_code_cannot_change_the_callers_later_searches(scene: Scene, setting: str) -> None:
    """A declarer's view that leaves pgrag.ef_search at 1000 (every later search of the
    caller's session slow) or forges the filters' kept estimates: the call is undone."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "create function {}.tamper() returns text language plpgsql volatile as $$ "
                "begin if session_user <> {} then "
                "perform pg_catalog.set_config({}, '1000', false); end if; return ''; end $$"
            )
            .format(sql.Identifier(scene.schema), sql.Literal(scene.role), sql.Literal(setting))
            .as_bytes(conn)
        )
        conn.execute(
            sql.SQL("grant execute on function {}.tamper() to public").format(
                sql.Identifier(scene.schema)
            )
        )
        conn.execute(
            "select pgrag.declare_document('things', $$select t.id as source_key, t.name || "
            f"{scene.schema}.tamper() as text from attack.things t$$, "
            '\'{"attack.things": "select id from changed"}\')'
        )
    with psycopg.connect(scene.app, autocommit=True) as conn:
        now = "select coalesce(current_setting(%s, true), '')"  # ('': a placeholder made)
        before = conn.execute(now, (setting,)).fetchone()
        conn.execute("select pgrag.refresh('things', array['1'])")
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
        assert "changed this session" in message, message
        assert conn.execute(now, (setting,)).fetchone() == before


@pytest.mark.parametrize("outer_transaction", [False, True])
def test_declared_statistics_cannot_keep_a_scoped_tenant_for_the_session(
    scene: Scene, outer_transaction: bool
) -> None:
    """The declarer's statistics make the caller's local tenant the session's, by setting the
    same value non-locally: the comparison around the call sees the same value, and a local
    restore left it in place after the commit, so the pooled connection's next caller read
    that tenant's chunks (found by review, 2026-12-04). tenant_scope, when it is its own
    transaction, restores the session's value; inside the caller's transaction it restores a
    local one (that caller resets the session: docs/security.md)."""
    promote = (
        "create function {}.promote() returns bigint language plpgsql volatile as $$ "
        "begin if session_user <> {} then perform pg_catalog.set_config('pgrag.tenant', "
        "pg_catalog.current_setting('pgrag.tenant', true), false); end if; return 0; end $$"
    )
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            sql.SQL(promote)
            .format(sql.Identifier(scene.schema), sql.Literal(scene.role))
            .as_bytes(conn)
        )
        conn.execute(
            sql.SQL("grant execute on function {}.promote() to public").format(
                sql.Identifier(scene.schema)
            )
        )
        declare_things(conn)
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('n', count(*) "
            f"+ {scene.schema}.promote()) from hits$s$)"
        )
    tenant = "select coalesce(current_setting('pgrag.tenant', true), '')"
    with psycopg.connect(scene.app, autocommit=not outer_transaction) as conn:
        if outer_transaction:
            conn.execute("select 1")  # (the caller's transaction: the scope is a savepoint)
        with tenant_scope(conn, "acme"):
            conn.execute("select pgrag.stats()")
        if outer_transaction:
            conn.commit()
            assert conn.execute(tenant).fetchone() == ("acme",)  # the documented limit
            conn.execute("reset pgrag.tenant")
            conn.commit()
        assert conn.execute(tenant).fetchone() == ("",)


@pytest.mark.parametrize(
    "alters",
    [
        ["security invoker"],
        # a seventh review: to SECURITY INVOKER and back left oid, definer flag and owner as
        # they were, and the after-check saw nothing (766 of 15,421 calls in a race ran as the
        # caller, their effects kept): the row version is compared too
        ["security invoker", "security definer"],
    ],
)
def test_a_generated_function_altered_while_it_runs_is_undone(
    scene: Scene, alters: list[str]
) -> None:
    """The check before a call and the call are two steps: an ALTER committed between them
    (the reviewer won that race in 4% of calls) ran the function as its caller. pgrag compares
    the function's catalog row after the call too, and undoes the call when it changed. Forged
    here deterministically: the body alters its own function while it runs."""
    body = "".join(
        f"execute 'alter function pgrag_docs.store_things(text[]) {a}'; " for a in alters
    )
    declare_things_with_store = (
        "create or replace function pgrag_docs.store_things(keys text[]) returns bigint "
        "language plpgsql security definer set search_path = pg_catalog, pg_temp as $$"
        f"begin {body}return 0; end $$"
    )
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        conn.execute(declare_things_with_store.encode())
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute("select pgrag.refresh('things', array['1'])")
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
        assert "was altered while it ran" in message, message
        # the ALTER was undone with the call
        assert conn.execute(
            "select prosecdef from pg_proc where proname = 'store_things'"
        ).fetchone() == (True,)


def test_caching_statistics_parses_them_as_their_declarer_and_leaves_no_trace(
    scene: Scene,
) -> None:
    """pgrag.cache_stats reads which tables a statistics query depends on by creating a
    temporary view of it, as the caller: parsing runs code (a domain's CHECK over an array
    literal), which ran as the superuser caching them. It is parsed as the declarer now, in a
    subtransaction rolled back afterwards, so nothing it did to the session stays."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        role = sql.Literal(scene.role).as_string(conn)
        conn.execute(PLANT.format(schema=scene.schema, role=role).encode())
        conn.execute(
            f"create function {scene.schema}.chk(v text) returns boolean language plpgsql "
            f"volatile as $$begin perform {scene.schema}.evil(); perform {scene.schema}.plant(); "
            f"return true; end $$; grant execute on function {scene.schema}.chk(text) to public; "
            f"create domain {scene.schema}.dom as text check ({scene.schema}.chk(value)); "
            f"grant usage on domain {scene.schema}.dom to public"
        )
        declare_things(conn)
        conn.execute(
            "select pgrag.declare_stats('things', $s$select jsonb_build_object('n', count(*), "
            f"'x', cardinality('{{a}}'::{scene.schema}.dom[])) from hits$s$)"
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        path = conn.execute("show search_path").fetchone()
        with contextlib.suppress(psycopg.Error):  # (refused or not: what matters is below)
            conn.execute("select pgrag.cache_stats('things')")
        assert conn.execute("show search_path").fetchone() == path
        assert conn.execute("select to_regclass('pg_temp.planted_view')").fetchone() == (None,)
        assert conn.execute(
            "select count(*) from pg_prepared_statements where name = 'planted_statement'"
        ).fetchone() == (0,)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}


def test_a_superuser_session_runs_no_other_roles_declared_sql(scene: Scene) -> None:
    """Whatever pgrag checks around a declarer's code, it runs in the caller's session, where
    it can leave what no check sees (a deferred trigger that fires at commit, a role reset to
    the session's login under SET ROLE) and act outside the transaction (the third review
    made a writer superuser both ways). So a superuser's session runs no other role's declared
    SQL: its writes queue the documents for the worker, its refresh, verify, listing, named
    statistics and cache_stats are refused (PR008) or leave the type out, and its worker
    leaves them in the queue."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        for stmt in (
            "select pgrag.refresh('things')",
            "select pgrag.document_keys('things')",
            "select pgrag.stats('{}', '{things}')",
            "select pgrag.cache_stats('things')",
        ):
            with pytest.raises(psycopg.Error, match="privileged session"):
                conn.execute(stmt.encode())
        assert "privileged session" in str(
            conn.execute("select problem from pgrag.verify('things')").fetchone()
        )
        conn.execute("select pgrag.stats()")  # the writer's statistics left out
        conn.execute("update attack.things set name = name || '?'")  # commits, queued
        assert conn.execute(
            "select count(*) from pgrag.render_queue where doc_type = 'things'"
        ).fetchone() != (0,)
        assert conn.execute("select entries from pgrag.render_queued()").fetchone() == (0,)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}


def test_a_session_that_can_act_as_a_superuser_runs_no_other_roles_declared_sql(
    scene: Scene,
) -> None:
    """A fourth review got past the boundary above, which looked at session_user and
    current_user only: a superuser who ran SET SESSION AUTHORIZATION to a writer login (code
    there can RESET SESSION AUTHORIZATION back: PostgreSQL checks the login), a writer login
    that is a member of a superuser role (it can SET ROLE to it), and one in
    pg_execute_server_program (COPY ... TO PROGRAM runs as the server's OS account) each ran
    the attacker's code as an ordinary session would, and it planted a search_path that made
    the attacker superuser. Each such session is privileged now: the attacker's code does not
    run there at all."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")  # (its declaration ran it, as itself)
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
    su, dba, prog = (f"{scene.role}_{s}" for s in ("su", "dba", "prog"))
    app = str(psycopg.conninfo.conninfo_to_dict(scene.app)["user"])
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "create role {su} superuser nologin; "
                "create role {dba} login password {p} in role {su}, {w}; "
                "create role {prog} login password {p} in role pg_execute_server_program, {w}; "
                "grant usage on schema attack to {dba}, {prog}; "
                "grant select, update on attack.things to {dba}, {prog}"
            ).format(
                su=sql.Identifier(su),
                dba=sql.Identifier(dba),
                prog=sql.Identifier(prog),
                w=sql.Identifier(writer[0]),
                p=sql.Literal(PASSWORD),
            )
        )
    try:
        with psycopg.connect(scene.victim, autocommit=True) as conn:
            conn.execute(sql.SQL("set session authorization {}").format(sql.Identifier(app)))
            assert conn.execute("select session_user, current_user").fetchone() == (app, app)
            for stmt in ("select pgrag.refresh('things')", "select pgrag.stats('{}', '{things}')"):
                with pytest.raises(psycopg.Error, match="privileged session"):
                    conn.execute(stmt.encode())
        logins = [psycopg.conninfo.make_conninfo(scene.victim, user=u, password=PASSWORD)
                  for u in (dba, prog)]  # fmt: skip
        for url in logins:
            with psycopg.connect(url, autocommit=True) as conn:
                with pytest.raises(psycopg.Error, match="privileged session"):
                    conn.execute("select pgrag.stats('{}', '{things}')")
                assert "privileged session" in str(
                    conn.execute("select problem from pgrag.verify('things')").fetchone()
                )
        assert scene.ran_as() == set()
        # their writes queue the documents (the watched table's trigger function is the
        # writer's own, TRIGGER trust: docs/security.md, known limits), and they render none
        for url in logins:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("update attack.things set name = name || '?'")
                assert conn.execute("select entries from pgrag.render_queued()").fetchone() == (0,)
        assert scene.ran_as() <= {scene.role}
        # the writer's own login runs its code, and renders what the others queued
        with psycopg.connect(scene.attacker, autocommit=True) as conn:
            assert conn.execute("select entries from pgrag.render_queued()").fetchone() != (0,)
    finally:
        with psycopg.connect(scene.victim, autocommit=True) as conn:
            for r in (dba, prog, su):
                conn.execute(sql.SQL("drop owned by {} cascade").format(sql.Identifier(r)))
                conn.execute(sql.SQL("drop role {}").format(sql.Identifier(r)))
    assert not scene.attacker_is_superuser()


def test_a_writer_hangs_no_type_under_another_roles_nor_lists_tables_for_its_statistics(
    scene: Scene,
) -> None:
    """The fourth review: a writer declared its type a child of another role's, which then
    could neither drop its own type nor give it tenants; and it wrote the tables its
    statistics read (pgrag.doc_stats.query_tables, its own row) so that a superuser's
    cache_stats put statement triggers on pgrag.tenant_roles."""
    _victim_declares(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="belongs to role"):
            conn.execute(
                "select pgrag.declare_document('hanger', $$select t.id as source_key, "
                "t.name as text, 1 as parent_key from attack.things t$$, "
                "parent_type => 'victim')"
            )
        declare_things(conn)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # row-level security
            conn.execute("update pgrag.doc_types set parent_type = 'victim' where name = 'things'")
        conn.execute(
            "select pgrag.declare_stats('things', "
            "$s$select jsonb_build_object('n', count(*)) from hits$s$)"
        )
        conn.execute(
            "update pgrag.doc_stats set query_tables = "
            "'{attack.things,pgrag.tenant_roles}'::regclass[] where doc_type = 'things'"
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.drop_document('victim')")  # nothing hangs under it
        deps = conn.execute("select pgrag.cache_stats('things')::text[]").fetchone()
        assert deps is not None and "pgrag.tenant_roles" not in deps[0], deps
        assert conn.execute(
            "select count(*) from pg_trigger where tgrelid = 'pgrag.tenant_roles'::regclass "
            "and not tgisinternal"
        ).fetchone() == (0,)


def test_a_type_re_declared_by_another_role_takes_over_none_of_its_statistics(scene: Scene) -> None:
    """A fifth review: the statistics of a type moved to whoever re-declared it, so a superuser
    re-declaring a writer's type (as the owner of its watched table must, to change its
    triggers) made the writer's statistics query a security definer of the superuser's, which
    the writer then ran with `pgrag.stats()`. They are removed instead, with a warning. And
    statistics that read pgrag's own bookkeeping (pgrag.stats_changes) are not cached: the
    cache's statement trigger on that table fired itself until every write to the store
    failed."""
    stats = (
        "select pgrag.declare_stats('things', $s$select jsonb_build_object('n', count(*), "
        f"'x', {scene.schema}.evil()) from hits$s$)"
    )
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        conn.execute(stats.encode())
    declaration = (
        "select pgrag.declare_document('things', $$select t.id as source_key, t.name as text "
        'from attack.things t$$, \'{"attack.things": "select id from changed"}\')'
    )
    warnings: list[str] = []
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
        conn.execute(declaration)
        assert conn.execute(
            "select count(*) from pgrag.doc_stats where doc_type = 'things'"
        ).fetchone() == (0,)
    assert any("statistics of things, declared by" in w for w in warnings), warnings
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute("select pgrag.stats()")
        with pytest.raises(psycopg.Error, match="belongs to role"):
            conn.execute(stats.encode())  # the type is the superuser's now
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() <= {scene.role}
    # statistics over pgrag.stats_changes: refused by the cache, in any session
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn, "counted")
        conn.execute(
            "select pgrag.declare_stats('counted', $s$select jsonb_build_object('n', count(*), "
            "'c', (select count(*) from pgrag.stats_changes)) from hits$s$)"
        )
        with pytest.raises(psycopg.Error, match="pgrag.stats_changes"):
            conn.execute("select pgrag.cache_stats('counted')")
        conn.execute(
            "update pgrag.doc_stats set query_tables = "
            "'{pgrag.chunks,pgrag.doc_stats,pgrag.stats_changes}' where doc_type = 'counted'"
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="table of pgrag's own"):
            conn.execute("select pgrag.cache_stats('counted')")
        assert conn.execute(
            "select count(*) from pg_trigger where tgrelid = 'pgrag.stats_changes'::regclass "
            "and not tgisinternal"
        ).fetchone() == (0,)
        conn.execute("update attack.things set name = name || '.'")  # the store still writes


def test_a_repeatable_read_transaction_runs_no_function_altered_after_it_began(
    scene: Scene,
) -> None:
    """A sixth review: pgrag's checks read pg_proc through the transaction's snapshot, and a
    REPEATABLE READ transaction's snapshot is its first statement's. The declarer altered its
    store function to SECURITY INVOKER after the application's transaction began: the check
    saw the old definer, the call ran the new definition, as the application. Now such a
    transaction asks the catalog as it is (pgrag._definer_now), and refuses."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")  # (its declaration ran it, as itself)
    with psycopg.connect(scene.app) as conn:
        conn.execute("set transaction isolation level repeatable read")
        conn.execute("select 1")  # the snapshot
        with psycopg.connect(scene.attacker, autocommit=True) as attacker:
            attacker.execute("alter function pgrag_docs.store_things(text[]) security invoker")
        refresh = "select pgrag.refresh('things', on_error => 'raise')"
        with pytest.raises(psycopg.Error, match="changed after this REPEATABLE READ"):
            conn.execute(refresh)
        conn.rollback()
        # a transaction begun after the change sees it as any read committed one does
        with pytest.raises(psycopg.Error, match="security invoker"):
            conn.execute(refresh)
    assert scene.ran_as() <= {scene.role}


def test_the_session_state_reader_compiles_no_type_of_a_declarers_search_path(
    scene: Scene,
) -> None:
    """pgrag._session_state has no SET clause (it reads the caller's search_path), so PL/pgSQL
    compiles it in whatever search_path the session has: a migration's CREATE OR REPLACE made
    the next call, right after a declarer's code left `attack` first in the path, compile its
    `oid` variable as the declarer's domain, whose CHECK then ran as the caller at every guarded
    call (found by review). Its types are qualified."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            f"create domain attack.oid as pg_catalog.oid check ({scene.schema}.evil() = 1); "
            f"create domain attack.text as pg_catalog.text check ({scene.schema}.evil() = 1)"
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app, autocommit=True) as conn:  # a new backend: compiled here
        conn.execute("set search_path = attack, pg_catalog")
        assert conn.execute("select pgrag._session_state()").fetchone() is not None
    assert scene.ran_as() == set()


def test_a_generated_function_missing_at_the_check_is_not_called(scene: Scene) -> None:
    """A seventh review: the check returned "no such function" and its callers called anyway,
    so a function the declarer created after the check (after the transaction's snapshot, in
    REPEATABLE READ, every time) ran unchecked, as a security invoker, as the caller: a
    reader's or an application's statistics. A missing function is refused now."""
    _declare_evil_things(scene)
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute("drop function pgrag_docs.stats_things(jsonb, text[])")
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app) as conn:
        conn.execute("set transaction isolation level repeatable read")
        conn.execute("select 1")  # the snapshot: no stats_things
        with psycopg.connect(scene.attacker, autocommit=True) as attacker:
            attacker.execute(
                "create function pgrag_docs.stats_things(filter jsonb, doc_types text[], "
                "out stats jsonb, out cached boolean) language plpgsql security invoker as $$ "
                f"begin perform {scene.schema}.evil(); stats := '{{}}'; cached := false; end $$"
            )
        with pytest.raises(psycopg.Error, match="stats_things does not exist"):
            conn.execute("select pgrag.stats()")
        conn.rollback()
    assert scene.ran_as() <= {scene.role}


@pytest.mark.parametrize(
    "fails_with",
    [
        "raise exception using errcode = 'query_canceled'",
        "assert false",
        "raise exception using errcode = 'PR008'",
    ],
)
def test_a_failing_call_leaves_no_prepared_statement_of_its_own(
    scene: Scene, fails_with: str
) -> None:
    """An eighth review: the declarer's store replaced the session's prepared statements and
    then failed in a way pgrag's `when others` handlers do not catch (a cancel, an ASSERT), or
    raised PR008, which pgrag took for its own privileged-session refusal: the statements it
    prepared outlived the call, and the application's next run of its own statement ran the
    declarer's code as the application. Every failed call deallocates what it prepared."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        conn.execute(
            "create function attack.swap() returns void language plpgsql as $$ "
            "declare r record; begin "
            "for r in select name, parameter_types from pg_prepared_statements loop "
            "execute format('deallocate %I', r.name); "
            "execute format('prepare %I(%s) as select "
            f"{scene.schema}.evil()', r.name, "
            "array_to_string(r.parameter_types::text[], ',')); "
            "end loop; end $$; grant usage on schema attack to public".encode()
        )
        conn.execute(
            "create or replace function pgrag_docs.store_things(keys text[]) returns bigint "
            "language plpgsql security definer set search_path = pg_catalog, pg_temp as $$ "
            f"begin perform attack.swap(); {fails_with}; return 0; end $$".encode()
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app, autocommit=True) as conn:
        for refresh in ("select pgrag.refresh('things', array['1'])",
                        "update attack.things set name = name || '!' where id = 1"):  # fmt: skip
            conn.execute("deallocate all")
            conn.execute("prepare q(integer) as select $1")
            with contextlib.suppress(psycopg.Error):  # (a cancel or an ASSERT goes through)
                conn.execute(refresh.encode())
            # the declarer's q is deallocated with its call (the application's is gone too:
            # the call deallocated it; it is never the declarer's that runs)
            with contextlib.suppress(psycopg.errors.InvalidSqlStatementName):
                assert conn.execute("execute q(7)").fetchone() == (7,)
    assert scene.ran_as() <= {scene.role}


def test_a_call_leaves_no_held_cursor_nor_temporary_objects_of_its_own(scene: Scene) -> None:
    """A ninth review: the session state compared around a call missed a WITH HOLD cursor
    the declarer's code declared (PostgreSQL runs its query at the caller's commit, as the
    caller), and counted temporary objects, so a DISCARD TEMP followed by as many objects of
    its own (a view named like the caller's temporary table) passed. Open cursors and the
    temporary objects' oids are compared now."""
    _declare_evil_things(scene)
    calls = {
        "stats": (
            "create or replace function pgrag_docs.stats_things(filter jsonb, doc_types "
            "text[], out stats jsonb, out cached boolean) language plpgsql security definer "
            "set search_path = pg_catalog, pg_temp as $$ begin execute 'declare held cursor "
            f"with hold for select {scene.schema}.evil()'; stats := '{{}}'; cached := false; "
            "end $$",
            "select pgrag.stats()",
        ),
        "store": (
            "create or replace function pgrag_docs.store_things(keys text[]) returns bigint "
            "language plpgsql security definer set search_path = pg_catalog, pg_temp as $$ "
            "begin discard temp; execute 'create temp view foo as select "
            f"{scene.schema}.evil() as x'; execute 'grant all on foo to public'; return 0; "
            "end $$",
            "select pgrag.refresh('things', on_error => 'raise')",
        ),
    }
    for replace, call in calls.values():
        with psycopg.connect(scene.attacker, autocommit=True) as conn:
            conn.execute(replace.encode())
        with psycopg.connect(scene.victim, autocommit=True) as conn:
            conn.execute("delete from attack.ran")
        with psycopg.connect(scene.app, autocommit=True) as conn:
            conn.execute("create temp table foo (x integer); insert into foo values (1)")
            with pytest.raises(psycopg.Error, match="changed this session"):
                conn.execute(call.encode())
            assert conn.execute("select x from foo").fetchone() == (1,)  # the caller's own
            assert conn.execute("select count(*) from pg_cursors").fetchone() == (0,)
        assert scene.ran_as() <= {scene.role}


# ---- 6. a commit's types stored together, under one call guard (2026-12-05) ----

# Code of the attacker's that leaves a mark outside the transaction (a sequence's value survives
# the rollback that undoes a refused call) when it runs as any role but the attacker's.
LEAK = """
create sequence attack.leak;
grant update, select on sequence attack.leak to public;
create function {schema}.leak() returns integer language plpgsql volatile as $$
begin
    if current_user <> {role} then
        perform pg_catalog.setval('attack.leak', 42);
    end if;
    return 1;
end $$;
grant execute on function {schema}.leak() to public;
"""


def _declare_two_types(scene: Scene, first_view_calls: str) -> None:
    """The attacker's two types over its table: `things` (its view calls the given function of
    the attacker's) and `zthings`, stored after it at a commit that changes both."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        role = sql.Literal(scene.role).as_string(conn)
        conn.execute(LEAK.format(schema=scene.schema, role=role).encode())
        for name, view in (
            ("things", f"t.name || {scene.schema}.{first_view_calls}()"),
            ("zthings", "'z ' || t.name"),
        ):
            conn.execute(
                f"select pgrag.declare_document('{name}', $$select t.id as source_key, {view} "
                'as text from attack.things t$$, \'{"attack.things": "select id from changed"}\')'
            )
            conn.execute(f"select pgrag.refresh('{name}')")


def _write_and_render(conn: psycopg.Connection[Any]) -> None:
    """The application's write, rendered in its own session (`pgrag.sync_now()`, which a
    session calls to read its chunks before it commits; the commit's own render runs as the
    role whose trigger queued it)."""
    with conn.transaction():
        conn.execute("update attack.things set name = name || '!' where id = 1")
        conn.execute("select pgrag.sync_now()")


def _leaked(scene: Scene) -> bool:
    with psycopg.connect(scene.victim) as conn:
        row = conn.execute("select last_value from attack.leak").fetchone()
    return row is not None and row[0] == 42


def test_a_commit_calls_each_of_its_types_functions_only_as_checked(scene: Scene) -> None:
    """A writer's commit stores the types it changed together, under one check before the
    calls and one after. A role that declared two of them owns both types' functions, so the
    first one's code could replace the second one's store function (as a security invoker)
    between the check and its call, and the second call would run the attacker's code as the
    writer. Each function is compared again just before its call."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            f"""
            create function {scene.schema}.flip() returns text language plpgsql volatile as $$
            begin
                if session_user <> {sql.Literal(scene.role).as_string(conn)} then
                    execute 'create or replace function pgrag_docs.store_zthings(keys text[])
                             returns bigint language plpgsql security invoker as $b$
                             begin perform {scene.schema}.leak(); return 0; end $b$';
                end if;
                return '';
            end $$;
            grant execute on function {scene.schema}.flip() to public;
            """.encode()
        )
    _declare_two_types(scene, "flip")
    with psycopg.connect(scene.app, autocommit=True) as conn:
        _write_and_render(conn)
        errors = [
            r[0]
            for r in conn.execute(
                "select message from pgrag.render_errors where doc_type = 'zthings'"
            ).fetchall()
        ]
        # the first type's document is stored: the refusal is the second's alone
        assert conn.execute(
            "select text from pgrag.chunks where doc_type = 'things' and source_key = '1'"
        ).fetchone() == ("one!",)
    assert not _leaked(scene)
    assert any("runs as its caller" in e for e in errors), errors
    assert not scene.attacker_is_superuser()


def test_a_commit_runs_nothing_where_a_types_code_left_the_search_path(scene: Scene) -> None:
    """Between two types' calls at one commit, pgrag's own statements (adding the counts,
    reading the next keys) would look up operators and functions on the search_path the first
    type's code set for the session: an operator `+` of the attacker's schema, first in it,
    would run as the writer. The search_path is compared after each call; a type that changed
    the session is then stored by itself and refused, the other stored."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        role = sql.Literal(scene.role).as_string(conn)
        conn.execute(
            f"""
            create function {scene.schema}.plus(a bigint, b bigint) returns bigint
                language plpgsql volatile as $$
            begin
                perform {scene.schema}.leak();
                return a operator(pg_catalog.+) b;
            end $$;
            grant execute on function {scene.schema}.plus(bigint, bigint) to public;
            create operator {scene.schema}.+ (leftarg = bigint, rightarg = bigint,
                                              function = {scene.schema}.plus);
            create function {scene.schema}.steer() returns text language plpgsql volatile as $$
            begin
                if session_user <> {role} then
                    perform pg_catalog.set_config(
                        'search_path', '{scene.schema}, pg_catalog, public', false);
                end if;
                return '';
            end $$;
            grant execute on function {scene.schema}.steer() to public;
            """.encode()
        )
    _declare_two_types(scene, "steer")
    with psycopg.connect(scene.app, autocommit=True) as conn:
        path = conn.execute("show search_path").fetchone()
        _write_and_render(conn)
        assert conn.execute("show search_path").fetchone() == path
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
        assert "changed this session" in message and "store_zthings" not in message, message
        assert conn.execute(
            "select text from pgrag.chunks where doc_type = 'zthings' and source_key = '1'"
        ).fetchone() == ("z one!",)
    assert not _leaked(scene)


# A declarer's generated function made again with types of its own: PostgreSQL converts
# pgrag's arguments to them, or the result from them, in the caller's call, running the
# declarer's code as the caller (a domain's CHECK, a cast's function; found by an attacker's
# review, 2026-12-05).
_CONVERSIONS = {
    "domain argument": """
create function attack.chk(v text[]) returns boolean language plpgsql volatile as $$
begin perform {schema}.evil(); return true; end $$;
create domain attack.keys as text[] check (attack.chk(value));
drop function pgrag_docs.{fn}(text[]);
create function pgrag_docs.{fn}(keys attack.keys) returns {result}
    language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin return {value}; end $$;
grant execute on function pgrag_docs.{fn}(attack.keys) to {writer};
""",
    "argument cast": """
create type attack.kt as (k text[]);
create function attack.tokt(v text[]) returns attack.kt language plpgsql volatile as $$
begin perform {schema}.evil(); return row(v)::attack.kt; end $$;
create cast (text[] as attack.kt) with function attack.tokt(text[]) as implicit;
drop function pgrag_docs.{fn}(text[]);
create function pgrag_docs.{fn}(keys attack.kt) returns {result}
    language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin return {value}; end $$;
grant execute on function pgrag_docs.{fn}(attack.kt) to {writer};
""",
    "result cast": """
create type attack.big as (x bigint);
create function attack.tobig(v attack.big) returns {result} language plpgsql volatile as $$
begin perform {schema}.evil(); return {value}; end $$;
create cast (attack.big as {result}) with function attack.tobig(attack.big) as assignment;
drop function pgrag_docs.{fn}(text[]);
create function pgrag_docs.{fn}(keys text[]) returns attack.big
    language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin return row(0)::attack.big; end $$;
grant execute on function pgrag_docs.{fn}(text[]) to {writer};
""",
}


@pytest.mark.parametrize("conversion", list(_CONVERSIONS))
@pytest.mark.parametrize("types", [1, 2], ids=["one type", "two types"])
def test_a_generated_function_made_again_with_types_of_its_own_is_not_run(
    scene: Scene, conversion: str, types: int
) -> None:
    """pgrag calls a generated function only with the argument and result types it generates
    it with (`pgrag._generated_signature`): a commit, a refresh and the worker run no
    conversion the declarer wrote."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        if types == 2:
            declare_things(conn, "zthings")
        (writer,) = conn.execute("select writer_role from pgrag.settings").fetchone() or ("",)
        conn.execute(
            _CONVERSIONS[conversion]
            .format(
                schema=scene.schema,
                fn="store_things",
                result="bigint",
                value="0",
                writer=sql.Identifier(writer).as_string(conn),
            )
            .encode()
        )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app, autocommit=True) as conn:
        _write_and_render(conn)
        conn.execute("select pgrag.refresh('things', array['2'])")
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things' limit 1"
        ).fetchone() or ("",)
    assert scene.ran_as() <= {scene.role}
    assert "takes or returns types pgrag does not generate it with" in message, message


# ---- 7. a declarer's own session, under the lighter guard (2026-12-05) ----


def test_a_declarers_own_session_takes_the_lighter_guard_and_no_other_does(
    scene: Scene,
) -> None:
    """Where every role of the session is the declarer of the types a commit stores, the
    declared code runs in its declarer's own session: what it leaves there acts with rights
    the session has anyway, so pgrag compares only the functions around the calls
    (`pgrag._check_own`). Seen from outside: a view that leaves a search_path in the session
    is stored in the declarer's own session, and refused in the application's."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            f"""
            create function {scene.schema}.steer() returns text language plpgsql volatile as $$
            begin
                if pg_catalog.current_setting('attack.steer', true) = 'on' then
                    perform pg_catalog.set_config('search_path', 'attack, pg_catalog', false);
                end if;
                return '';
            end $$;
            grant execute on function {scene.schema}.steer() to public;
            """.encode()
        )
    _declare_two_types(scene, "steer")
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute("set attack.steer = 'on'")
        conn.execute("update attack.things set name = name || '+' where id = 1")
        assert conn.execute(
            "select count(*) from pgrag.render_errors where doc_type in ('things', 'zthings')"
        ).fetchone() == (0,)
        assert conn.execute(
            "select text from pgrag.chunks where doc_type = 'zthings' and source_key = '1'"
        ).fetchone() == ("z one+",)
        # (its own view left it: the declarer's own session, the declarer's own business)
        assert conn.execute("show search_path").fetchone() == ("attack, pg_catalog",)
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute("set attack.steer = 'on'")
        path = conn.execute("show search_path").fetchone()
        _write_and_render(conn)
        assert conn.execute("show search_path").fetchone() == path
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
        assert "changed this session" in message, message


def test_a_declarers_own_session_runs_no_other_writers_function_of_its_types(
    scene: Scene,
) -> None:
    """Any writer may create functions in pgrag_docs: once the declarer's own store function is
    gone (dropped, say, by an undeclare racing a commit), another writer's function of that
    name would be called in its place, as the declarer, in the declarer's own session. The
    lighter guard takes only the declarer's own function, the only one of its name; anything
    else goes to the full guard, which refuses it."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("drop function pgrag_docs.store_things(text[])")
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app, autocommit=True) as conn:
        conn.execute(
            "create function pgrag_docs.store_things(keys text[]) returns bigint "
            "language plpgsql security invoker as $$ "
            "begin insert into attack.ran values (current_user); return 0; end $$"
        )
        conn.execute("grant execute on function pgrag_docs.store_things(text[]) to public")
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute("update attack.things set name = name || '+' where id = 1")
        (message,) = conn.execute(
            "select message from pgrag.render_errors where doc_type = 'things'"
        ).fetchone() or ("",)
    assert scene.ran_as() == set(), scene.ran_as()
    assert "belongs to" in message, message


def test_a_declarers_own_commit_calls_each_function_only_as_checked(scene: Scene) -> None:
    """The lighter guard compares each function again just before its call, as the full guard
    does. Another writer stalls the declarer's first call on a chunk row it locks (writers may
    lock chunks); meanwhile the declarer's second store function is dropped (an undeclare, a
    regeneration racing the commit) and the other writer puts its own of that name in its
    place. Called, it would run as the declarer, and a sequence's value it set outlives the
    rollback that the check after the calls makes (found by review, 2026-12-05)."""
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        declare_things(conn)
        declare_things(conn, "zthings")
        conn.execute("create sequence attack.owned; select pg_catalog.setval('attack.owned', 7)")
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("delete from attack.ran")
    with psycopg.connect(scene.app) as staller:
        staller.execute(
            "select id from pgrag.chunks where doc_type = 'things' and source_key = '1' for update"
        )
        declarer = psycopg.connect(scene.attacker, autocommit=True)
        pid = declarer.info.backend_pid
        errors: list[BaseException] = []

        def write() -> None:
            try:
                declarer.execute("update attack.things set name = name || '+' where id = 1")
            except BaseException as exc:  # (reported below)
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            wait_for(
                lambda: waits_on_lock(scene.victim, pid),
                "the declarer's first call waiting on the locked chunk row",
            )
            with psycopg.connect(scene.attacker, autocommit=True) as conn:
                conn.execute("drop function pgrag_docs.store_zthings(text[])")
            with psycopg.connect(scene.app, autocommit=True) as conn:
                conn.execute(
                    "create function pgrag_docs.store_zthings(keys text[]) returns bigint "
                    "language plpgsql security invoker as $$ begin "
                    "insert into attack.ran values (current_user); "
                    "perform pg_catalog.setval('attack.owned', 42); return 0; end $$"
                )
                conn.execute("grant execute on function pgrag_docs.store_zthings(text[]) to public")
        finally:
            staller.rollback()
            writer.join()
            declarer.close()
        assert not errors, errors
    assert scene.ran_as() == set(), scene.ran_as()
    with psycopg.connect(scene.victim) as conn:
        assert conn.execute("select last_value from attack.owned").fetchone() == (7,)


def test_a_declaration_in_a_session_with_temporary_objects_is_refused(scene: Scene) -> None:
    """Found by review (2026-12-05): the generated functions look names up on `pg_catalog,
    pg_temp`, so a type whose source was the victim's temporary view named it without a
    schema, and in the attacker's session found the attacker's temporary view of that name:
    its function ran as the victim, a superuser. A second review got past a check of the
    declared SQL's dependencies with a cast to a temporary row type in JSON_QUERY's RETURNING
    (PostgreSQL records no dependency on it), the attacker's table of that name holding a
    domain whose CHECK ran its function. A declaration is refused in a session that holds any
    temporary object: then no name in it can resolve to one."""
    notes = (
        "select pgrag.declare_document('notes', 'select n.id as source_key, n.body as text "
        """from victim.notes n', '{"victim.notes": "select id from changed"}')"""
    )
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute(notes)
        conn.execute(
            "create temp table tt (id integer, name text); "
            "create temp view tv as select id as source_key, id::text as text from tt; "
            "create domain pg_temp.posint as integer check (value > 0)"
        )
        attempts = [
            "select pgrag.declare_document('tmpv', 'tv')",
            "select pgrag.declare_document('tmpq', 'select id as source_key, name as text "
            """from attack.things', '{"attack.things": "select c.id from changed c """
            """where json_query(to_jsonb(c), ''$'' returning tt) is not null"}')""",
            "select pgrag.declare_document('tmpw', 'select id as source_key, "
            """id::text as text from tt', '{"tt": "select id from changed"}')""",
            "select pgrag.declare_stats('notes', $s$select jsonb_build_object('n', "
            "json_value(jsonb_build_object('v', 1), '$.v' returning posint)) from hits h$s$)",
            "select pgrag.declare_stats('notes', $s$select jsonb_build_object('n', "
            "length(to_tsvector('pg_temp.cfg', 'x'))) from hits h$s$)",
            notes,  # permanent tables only, but from this session
        ]
        for attempt in attempts:
            with pytest.raises(psycopg.Error, match="no temporary table") as e:
                conn.execute(attempt)
            assert e.value.sqlstate == "PR003"
        declared = conn.execute(
            "select array_agg(name order by name) from pgrag.doc_types "
            "where name in ('tmpv', 'tmpq', 'tmpw')"
        ).fetchone()
        assert declared == (None,)
        stats = conn.execute("select count(*) from pgrag.doc_stats where doc_type = 'notes'")
        assert stats.fetchone() == (0,)
        conn.execute("discard temp")
        conn.execute(notes)  # (nothing temporary left)
    # the attack itself, had the first declaration gone through: the attacker's temporary
    # view of the victim's name, with its own function, finds nothing of the victim's to run
    with psycopg.connect(scene.attacker, autocommit=True) as conn:
        conn.execute(
            f"create temp view tv as select 1 as source_key, {scene.schema}.evil()::text as text"
        )
        assert conn.execute(
            "select count(*) from pg_proc where proname like %s", ("%tmpv%",)
        ).fetchone() == (0,)
    assert not scene.attacker_is_superuser()
