"""What a reader can reach beyond its own tenant's chunks (issue 15, points 8 and 9).

A reader may search, read statistics and use the shared query cache. It must not choose how old
a cached question may be (that let it read entries past the configured TTL and time when a
guessed question was cached), and no function it may call runs SQL text with another role's
rights (``pgrag.estimate_rows`` gave it the planner's estimate of any condition over every
tenant's chunks).
"""

from __future__ import annotations

import hashlib

import psycopg
import pytest

from tests.security.conftest import Reader

MODEL = "test-model"
QUESTION = "which customers asked for a refund"


def _hash() -> bytes:
    return hashlib.sha256(QUESTION.encode()).digest()


def _cache_one(db_url: str, age: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        dim = conn.execute("select embedding_dim from pgrag.settings").fetchone()
        assert dim is not None
        conn.execute(
            "insert into pgrag.query_cache (model, query_hash, query, embedding, created_at) "
            "values (%s, %s, %s, array_fill(0.5, array[%s])::vector, now() - %s::interval)",
            (MODEL, _hash(), QUESTION, dim[0], age),
        )


def test_the_query_cache_ttl_is_the_servers(db_url: str, reader: Reader) -> None:
    _cache_one(db_url, "8 days")  # older than the default TTL, a week
    # the caller cannot pass a TTL of its own: no such function
    with psycopg.connect(reader.url) as conn, pytest.raises(psycopg.errors.UndefinedFunction):
        conn.execute("select pgrag.query_cache_get(%s, %s, interval '100 years')", (MODEL, _hash()))
    with psycopg.connect(reader.url) as conn:
        got = conn.execute("select pgrag.query_cache_get(%s, %s)", (MODEL, _hash())).fetchone()
        assert got == (None,)
    # the DBA's setting is the one that counts
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("update pgrag.settings set query_cache_ttl = interval '30 days'")
    try:
        with psycopg.connect(reader.url) as conn:
            got = conn.execute(
                "select pgrag.query_cache_get(%s, %s) is not null", (MODEL, _hash())
            ).fetchone()
            assert got == (True,)
            # nor may a reader change it
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("update pgrag.settings set query_cache_ttl = interval '1000 years'")
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("update pgrag.settings set query_cache_ttl = default")
            conn.execute("delete from pgrag.query_cache where model = %s", (MODEL,))


def test_a_ttl_must_be_positive(db_url: str) -> None:
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("update pgrag.settings set query_cache_ttl = interval '0'")


# The security definer functions a reader may call, each documented in docs/security.md: none
# takes SQL text or hands the reader anything beyond its tenant but what the docs say.
READER_DEFINERS = {
    "pgrag.current_tenant()",
    "pgrag.query_cache_get(text,bytea)",
    "pgrag._common_lexemes(real,bigint)",
}


def test_a_reader_calls_no_definer_but_the_documented_ones(db_url: str, reader: Reader) -> None:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "select p.oid::regprocedure::text from pg_proc p "
            "where p.pronamespace = 'pgrag'::regnamespace and p.prosecdef "
            "and has_function_privilege(%s, p.oid, 'execute')",
            (reader.role,),
        ).fetchall()
    assert {r[0].replace(", ", ",") for r in rows} == READER_DEFINERS


def test_two_tenants_reading_as_one_role_get_their_own_vocabulary(
    db_url: str, reader: Reader
) -> None:
    """The parser's vocabulary is cached per role and tenant: two login roles bound to different
    tenants that both SET ROLE to the reader role share a current_user, not a vocabulary (the
    cache followed the setting pgrag.tenant, not the login role's binding)."""
    from psycopg import sql

    from pgrag.vocabulary import forget_vocabulary, load_vocabulary
    from tests.security.conftest import drop_role, make_reader

    globex = make_reader(db_url, f"{reader.role}_globex", "globex")
    with psycopg.connect(db_url, autocommit=True) as conn:
        reader_role = conn.execute("select reader_role from pgrag.settings").fetchone()
        assert reader_role is not None
        conn.execute(
            "create table public.people (id integer primary key, tenant text, name text);"
            "insert into public.people values (1, 'acme', 'Alice Acmeworth'), "
            "(2, 'globex', 'Bob Globexley');"
            "grant select on public.people to public"
        )
        conn.execute(
            "select pgrag.declare_document('person', $$select p.id as source_key, p.tenant, "
            "p.name as text, jsonb_build_object('name', p.name) as metadata "
            'from public.people p$$, \'{"public.people": "select id from changed"}\', '
            "metadata_schema => '{\"name\": \"text\"}', tenant_column => 'tenant')"
        )
        conn.execute("select pgrag.refresh('person')")
    try:
        forget_vocabulary()
        seen = {}
        for url in (reader.url, globex.url):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("set role {}").format(sql.Identifier(reader_role[0])))
                v = load_vocabulary(conn)
                seen[url] = set(v.types["person"].keys["name"].values)
        assert list(seen.values()) == [{"Alice Acmeworth"}, {"Bob Globexley"}]
    finally:
        forget_vocabulary()
        drop_role(db_url, globex.role)
