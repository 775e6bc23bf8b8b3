"""The three ways a pgrag_writer member became a superuser (issue 15), each as a real attacker
against a superuser victim, and the principle behind the fixes: what a role declares runs with
that role's rights, whoever triggers it (docs/security.md).

Each test fails on the release before 0009: the attack made the attacker a superuser there.
"""

from __future__ import annotations

import psycopg
import pytest

from pgrag import migrate
from pgrag.ask import ask
from pgrag.search import search
from tests.embed_server import default_embedder

from .conftest import Scene, declare_things


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
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.stats()")
    assert not scene.attacker_is_superuser()
    with psycopg.connect(scene.victim, autocommit=True) as conn:
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
    with psycopg.connect(scene.victim, autocommit=True) as conn:
        conn.execute("select pgrag.refresh('things')")
        conn.execute("update attack.things set name = name || '!'")
        conn.execute("select * from pgrag.verify()")
        conn.execute("select pgrag.document_keys('things')")
        conn.execute("select pgrag.stats()")
    migrate.upgrade(scene.victim)
    assert not scene.attacker_is_superuser()
    assert scene.ran_as() == {scene.role}
