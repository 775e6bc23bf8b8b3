"""Document keys of every type keep their documents (issue 22).

A key travels as text (``source_key::text``) and is cast back to the key's exact type to find
its row. A cast that drops the type's modifier (``character(3)`` read as ``character``, i.e.
char(1)) or a session setting that prints a key differently (DateStyle, extra_float_digits...)
made every keyed render miss its row and delete the chunk. The property below drives a parent
and a child type over each key type through every path that renders: a full refresh, a keyed
refresh, trigger writes (insert, update, no-op update, move, delete), and a rebuild, in a session
whose output settings differ from pgrag's, and checks that ``pgrag.verify`` finds nothing and
no document is missing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgrag import documents
from pgrag.errors import DocumentError

from .conftest import run_pgrag

# Printable text that stresses the text forms a key passes through: array literals, row
# literals, quotes, backslashes, braces, commas, blanks (leading and trailing).
_TRICKY = st.sampled_from(list("aZ09 _-,;{}()\"'\\/.:%$é漢"))


def _text(max_size: int) -> st.SearchStrategy[str]:
    return st.lists(_TRICKY, min_size=1, max_size=max_size).map("".join)


def _timestamps() -> st.SearchStrategy[dt.datetime]:
    return st.datetimes(
        min_value=dt.datetime(1900, 1, 1),
        max_value=dt.datetime(2200, 1, 1),
        timezones=st.sampled_from(
            [
                dt.UTC,
                dt.timezone(dt.timedelta(hours=5, minutes=30)),
                dt.timezone(-dt.timedelta(hours=7)),
            ]
        ),
    )


# (SQL type of the key, DDL to run first or None, values) for every key type the issue names,
# and a few more whose text form depends on a session setting.
KEY_TYPES: list[tuple[str, str | None, st.SearchStrategy[Any]]] = [
    ("smallint", None, st.integers(-32768, 32767)),
    ("integer", None, st.integers(-(2**31), 2**31 - 1)),
    ("bigint", None, st.integers(-(2**63), 2**63 - 1)),
    (
        "numeric(10,2)",
        None,
        st.decimals(min_value=-99_999_999, max_value=99_999_999, places=2, allow_nan=False),
    ),
    ("text", None, _text(12)),
    ("varchar(6)", None, _text(6)),
    # values shorter than n: stored with trailing blanks, printed without them
    ("character(3)", None, _text(3)),
    ("uuid", None, st.uuids()),
    ("date", None, st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31))),
    ("timestamptz", None, _timestamps()),
    ("kt.code3", "create domain kt.code3 as character(3)", _text(3)),
    (
        "kt.mood",
        "create type kt.mood as enum ('sad', 'ok', 'happy', 'très content')",
        st.sampled_from(["sad", "ok", "happy", "très content"]),
    ),
    ("citext", "create extension if not exists citext", _text(8)),
    # printed differently under extra_float_digits = 0, IntervalStyle, bytea_output
    ("double precision", None, st.floats(allow_nan=False, allow_infinity=False, width=64)),
    (
        "interval",
        None,
        st.timedeltas(min_value=-dt.timedelta(days=9999), max_value=dt.timedelta(days=9999)),
    ),
    ("bytea", None, st.binary(min_size=0, max_size=6)),
]

# Output settings other than pgrag's pinned ones (DateStyle ISO, TimeZone UTC, ...): the
# application's session may set any of them, and a key must still find its row.
ODD_SESSION = {
    "datestyle": "SQL, DMY",
    "timezone": "America/New_York",
    "extra_float_digits": "0",
    "intervalstyle": "sql_standard",
    "bytea_output": "escape",
}


def _prepare(conn: psycopg.Connection[Any], key_type: str, ddl: str | None) -> None:
    conn.execute("create schema kt")
    if ddl:
        conn.execute(ddl)
    ktype = sql.SQL(key_type)  # one of KEY_TYPES above, never input
    conn.execute(
        sql.SQL("create table kt.parent (k {} primary key, name text not null)").format(ktype)
    )
    conn.execute(
        sql.SQL(
            "create table kt.child (id integer primary key, pk {} not null "
            "references kt.parent on update cascade on delete cascade, note text)"
        ).format(ktype)
    )
    conn.execute(
        """select pgrag.declare_document('kt_parent',
            $$select p.k as source_key, format('Parent %s named %s', p.k, p.name) as text,
                     jsonb_build_object('name', p.name) as metadata
              from kt.parent p$$,
            '{"kt.parent": "select k from changed"}')"""
    )
    conn.execute(
        """select pgrag.declare_document('kt_child',
            $$select c.id as source_key, c.pk as parent_key,
                     format('Child %s of %s (%s)', c.id, c.pk, c.note) as text
              from kt.child c$$,
            '{"kt.child": "select id from changed"}', parent_type => 'kt_parent')"""
    )


def _check(conn: psycopg.Connection[Any], step: str) -> None:
    problems = documents.verify(conn)
    assert problems == [], f"after {step}: {problems[:5]}"
    counts = conn.execute(
        "select (select count(*) from kt.parent), "
        "(select count(*) from pgrag.chunks where doc_type = 'kt_parent'), "
        "(select count(*) from kt.child), "
        "(select count(*) from pgrag.chunks where doc_type = 'kt_child'), "
        "(select count(*) from pgrag.chunks c where c.doc_type = 'kt_child' and c.parent_id "
        "  is distinct from (select p.id from pgrag.chunks p where p.doc_type = 'kt_parent' "
        "                    and p.source_key = c.parent_key))"
    ).fetchone()
    assert counts is not None
    parents, parent_chunks, children, child_chunks, unlinked = counts
    assert (parent_chunks, child_chunks, unlinked) == (parents, children, 0), f"after {step}"


def _insert_parents(
    conn: psycopg.Connection[Any], key_type: str, values: list[Any], first_name: int
) -> None:
    """Insert the values as parent keys, named ``name <i>`` from first_name (equal keys once)."""
    for i, v in enumerate(values, start=first_name):
        conn.execute(
            sql.SQL("insert into kt.parent values (%s::{}, %s) on conflict do nothing").format(
                sql.SQL(key_type)
            ),
            (v, f"name {i}"),
        )


# Rows named in SQL, not by this session's text of their key.
FIRST = "(select k from kt.parent order by k limit 1)"
NEWEST = "(select k from kt.parent order by name = 'name 100' desc, k desc limit 1)"


def _exercise(
    conn: psycopg.Connection[Any], key_type: str, ddl: str | None, values: list[Any]
) -> None:
    """Every path that renders, each followed by the check. Keys are handled as values in SQL,
    never as this session's text (which the odd settings print differently)."""
    _prepare(conn, key_type, ddl)
    _insert_parents(conn, key_type, values[:-1], 0)
    conn.execute(
        "insert into kt.child select row_number() over (order by p.k, j), p.k, 'note ' || j "
        "from kt.parent p, generate_series(1, 2) j"
    )
    conn.execute("select pgrag.refresh('kt_parent'), pgrag.refresh('kt_child')")
    _check(conn, "the full refresh")

    stored = [r[0] for r in conn.execute("select pgrag.document_keys('kt_parent')")]
    documents.refresh(conn, "kt_parent", stored)
    documents.refresh(
        conn, "kt_child", [r[0] for r in conn.execute("select id::text from kt.child")]
    )
    _check(conn, "a keyed refresh of every key")

    conn.execute("update kt.parent set name = name || '!' where k = " + FIRST)
    _check(conn, "an update through the trigger")
    conn.execute("update kt.parent set name = name where k = " + FIRST)
    _check(conn, "a no-op update through the trigger")
    _insert_parents(conn, key_type, values[-1:], 100)
    conn.execute("insert into kt.child select 1000, " + NEWEST + ", 'new'")
    _check(conn, "an insert through the trigger")
    conn.execute(
        "update kt.child set pk = " + NEWEST + " where id = (select min(id) from kt.child)"
    )
    _check(conn, "a move through the trigger")
    conn.execute("delete from kt.child where id = (select max(id) from kt.child where id < 1000)")
    _check(conn, "a child's delete")
    conn.execute(
        "delete from kt.parent where k = (select k from kt.parent order by k desc limit 1)"
    )
    _check(conn, "a parent's delete (its children cascade)")
    conn.execute("update kt.child set note = note || '.'")
    _check(conn, "an update of every child")

    documents.rebuild(conn)
    _check(conn, "a rebuild")


@pytest.mark.parametrize(
    ("key_type", "ddl", "values"), KEY_TYPES, ids=[t[0].split("(")[0] for t in KEY_TYPES]
)
def test_every_key_type_keeps_its_documents(
    conn: psycopg.Connection[Any], key_type: str, ddl: str | None, values: st.SearchStrategy[Any]
) -> None:
    @settings(
        max_examples=6,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(vals=st.lists(values, min_size=2, max_size=5), odd=st.booleans())
    def run(vals: list[Any], odd: bool) -> None:
        with conn.transaction(force_rollback=True):
            if odd:
                for name, value in ODD_SESSION.items():
                    conn.execute("select set_config(%s, %s, true)", (name, value))
            _exercise(conn, key_type, ddl, vals)

    run()


def _countries(conn: psycopg.Connection[Any], n: int) -> list[str]:
    """n country codes of three letters, some of two (stored with a trailing blank), each with
    a few cities: the shape of the public schema that lost 4,318 documents."""
    conn.execute(
        "create schema geo; "
        "create table geo.country (code character(3) primary key, name text not null); "
        "create table geo.city (id integer primary key, "
        "  country character(3) not null references geo.country, name text not null)"
    )
    conn.execute(
        "insert into geo.country "
        "select left(chr(65 + i %% 26) || chr(65 + i / 26 %% 26) || chr(65 + i / 676 %% 26), "
        "            case when i %% 10 = 0 then 2 else 3 end), "
        "       'Country ' || i from generate_series(1, %s) i on conflict do nothing",
        (n,),
    )
    conn.execute(
        "insert into geo.city select row_number() over (), c.code, 'City ' || c.code || ' ' || j "
        "from geo.country c, generate_series(1, 17) j"
    )
    conn.execute("analyze geo.country, geo.city")
    conn.execute(
        """select pgrag.declare_document('country',
            $$select c.code as source_key, 'Country ' || c.name as text from geo.country c$$,
            '{"geo.country": "select code from changed"}')"""
    )
    conn.execute(
        """select pgrag.declare_document('city',
            $$select c.id as source_key, c.country as parent_key,
                     'City ' || c.name || ' in ' || c.country as text from geo.city c$$,
            '{"geo.city": "select id from changed"}', parent_type => 'country')"""
    )
    conn.execute("select pgrag.refresh('country'), pgrag.refresh('city')")
    return [r[0] for r in conn.execute("select code::text from geo.country order by code")]


def _chunk_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "select count(*) from pgrag.chunks where doc_type in ('country', 'city')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_character_3_keys_survive_keyed_refresh_rebuild_and_triggers(
    conn: psycopg.Connection[Any],
) -> None:
    codes = _countries(conn, 239)
    total = _chunk_count(conn)
    assert total == len(codes) * 18
    assert any(len(c) == 2 for c in codes)  # shorter than n: a trailing blank in the column

    assert documents.refresh(conn, "country", codes[:2]) == 0  # unchanged: nothing written
    assert _chunk_count(conn) == total
    documents.rebuild(conn)
    assert _chunk_count(conn) == total
    conn.execute("update geo.country set name = name where code = %s", (codes[0],))
    conn.execute("select pgrag.sync_now()")
    assert _chunk_count(conn) == total
    assert documents.verify(conn) == []


def test_keyed_render_of_character_keys_uses_the_source_index(
    conn: psycopg.Connection[Any],
) -> None:
    codes = _countries(conn, 2000)

    def scans() -> tuple[int, int]:
        row = conn.execute(
            "select coalesce(seq_scan, 0), coalesce(idx_scan, 0) from pg_stat_xact_user_tables "
            "where relid = 'geo.country'::regclass"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    conn.execute(
        "update geo.country set name = name || '.' where code = any(%s::text[]::character(3)[])",
        (codes[:3],),
    )
    before = scans()
    conn.execute("select pgrag.refresh('country', %s::text[])", (codes[3:6],))
    after = scans()
    assert after[0] == before[0], "the keyed render scanned the whole source table"
    assert after[1] > before[1]


def test_a_key_the_cast_would_change_is_an_error_not_a_delete(
    conn: psycopg.Connection[Any],
) -> None:
    """The guard behind the exact cast: a key that names an existing document but does not
    survive the cast to the key type is a render error naming the key and the type (raised
    when asked for, recorded otherwise), and deletes nothing. Forged as a user would meet it:
    the key column's type changes after the declaration, and the generated render still casts
    to the old type."""
    conn.execute(
        "create schema kt; "
        "create table kt.doc (source_key character(1) primary key, text text not null); "
        "insert into kt.doc values ('A', 'first'), ('B', 'second')"
    )
    conn.execute(
        "select pgrag.declare_document('kt_doc', 'kt.doc', "
        '\'{"kt.doc": "select source_key from changed"}\')'
    )
    conn.execute("alter table kt.doc alter column source_key type character(3)")
    conn.execute("set local pgrag.sync = off")  # the trigger would refuse it too
    conn.execute("insert into kt.doc values ('ABW', 'third')")
    conn.execute("reset pgrag.sync")
    conn.execute("select pgrag.refresh('kt_doc')")  # all: no cast, chunk ABW stored
    expected = r"key 'ABW' of kt_doc reads back as 'A'.*character\(1\)"
    with pytest.raises(DocumentError, match=expected), conn.transaction():
        documents.refresh(conn, "kt_doc", ["ABW"], on_error="raise")
    conn.execute("select pgrag.refresh('kt_doc', array['ABW'])")  # recorded, not raised
    row = conn.execute(
        "select sqlstate, message from pgrag.render_errors where doc_type = 'kt_doc'"
    ).fetchone()
    assert row is not None and row[0] == "PR004" and "reads back as 'A'" in row[1]
    keys = [
        r[0]
        for r in conn.execute(
            "select source_key from pgrag.chunks where doc_type = 'kt_doc' order by 1"
        )
    ]
    assert keys == ["A", "ABW", "B"]


def test_verify_names_the_fix_that_works(db_url: str) -> None:
    """`pgrag verify`: an undeclared type is exit 6 naming the declared ones; a stale document
    is fixed by `pgrag rebuild TYPE`; a type whose source is gone is not (a rebuild cannot
    render it), so the advice is to declare it again or drop it."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "create schema kt; "
            "create table kt.a (source_key integer primary key, text text not null); "
            "create table kt.b (source_key integer primary key, text text not null); "
            "insert into kt.a values (1, 'one'); insert into kt.b values (1, 'uno')"
        )
        for name in ("kt_a", "kt_b"):
            c.execute(
                "select pgrag.declare_document(%s, %s, jsonb_build_object(%s::text, "
                "'select source_key from changed')), pgrag.refresh(%s)",
                (name, name.replace("_", "."), name.replace("_", "."), name),
            )
        unknown = run_pgrag("--database-url", db_url, "verify", "no_such_type")
        assert unknown.returncode == 6
        assert unknown.stderr.count("\n") == 1
        assert "no_such_type is not declared (declared: kt_a, kt_b)" in unknown.stderr

        def written_then_verified(mode: str, text: str) -> Any:
            with c.transaction():
                c.execute(sql.SQL("set local pgrag.sync = {}").format(sql.Literal(mode)))
                c.execute("update kt.a set text = %s", (text,))
            done = run_pgrag("--database-url", db_url, "verify")
            assert done.returncode == 1
            return done

        stale = written_then_verified("off", "ONE")
        assert "kt_a 1: stale text" in stale.stdout
        assert "run `pgrag rebuild kt_a` to fix them" in stale.stderr
        assert "render queue" not in stale.stderr
        # written in queue mode: stale until the worker renders it, which the advice says
        queued = written_then_verified("queue", "One")
        assert "1 render queue entries wait for the worker (`pgrag worker`)" in queued.stderr
        assert "else run `pgrag rebuild kt_a` to fix them" in queued.stderr

        c.execute("drop table kt.b")
        gone = run_pgrag("--database-url", db_url, "verify")
        assert gone.returncode == 1
        assert "the source view of kt_b is gone: re-declare the type" in gone.stderr
        assert "rebuild kt_a" in gone.stderr and "rebuild kt_b" not in gone.stderr


def test_names_and_keys_nobody_here_chose_keep_their_documents(db_url: str) -> None:
    """Found on schemas nobody here wrote: a watched column named ``r`` (the row path recorded
    its values, NULL ones as no row at all: documents silently lost), columns named ``mode``
    or ``keys`` (ambiguous in pgrag's generated functions: every write queued the whole type),
    a key too long for an index entry (the write itself failed at commit, and the worker
    stopped), and a NULL key (counted, not stored, and reported as a source view gone)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "create schema qn; "
            "create table qn.team (id integer primary key, name text not null); "
            "create table qn.player (id integer primary key, team_id integer, r numeric); "
            "insert into qn.team values (1, 'Reds'), (2, 'Blues'); "
            "create table qn.transport (mode text primary key, description text, keys integer); "
            "create table qn.page (url text not null, title text not null); "
            "create table qn.nk (k text unique, v text not null)"
        )
        c.execute(
            "select pgrag.declare_document('qn_player', $$select p.id as source_key, 'Player ' "
            "|| p.id || ' plays for ' || t.name as text from qn.player p join qn.team t on "
            't.id = p.team_id$$, \'{"qn.player": "select p.id from changed c join qn.player p '
            'on p.id = c.id", "qn.team": "select p.id from changed c join qn.player p on '
            "p.team_id = c.id\"}')"
        )
        c.execute("insert into qn.player values (10, 1, null), (11, 2, 7.5)")
        c.execute("update qn.team set name = 'Greens' where id = 2")
        c.execute(
            "select pgrag.declare_document('qn_transport', $$select mode as source_key, "
            "description as text, keys from qn.transport$$, "
            '\'{"qn.transport": "select mode from changed where keys is not null"}\')'
        )
        c.execute("insert into qn.transport values ('bus', 'a big car', 1)")
        c.execute("update qn.transport set description = 'a long car'")
        c.execute(
            "select pgrag.declare_document('qn_page', 'select url as source_key, title as text "
            'from qn.page\', \'{"qn.page": "select url from changed"}\')'
        )
        # (incompressible: an index entry holds a compressed value, 3,000 x's fit)
        long_url = "https://example.com/?q=" + "".join(
            hashlib.md5(str(i).encode()).hexdigest() for i in range(94)
        )
        for mode in ("commit", "queue"):
            c.execute("select pgrag.set_sync('qn_page', %s)", (mode,))
            c.execute(  # both commit: the long key is a render error, the short one a chunk
                "insert into qn.page values (%s, 'long'), (%s, 'short')",
                (long_url + mode, f"https://example.com/{mode}"),
            )
        c.execute("select pgrag.render_queued(100)")  # the worker's render does not stop
        texts: dict[str, str] = dict(
            c.execute(
                "select source_key, text from pgrag.chunks where doc_type like 'qn_%' "
                "and length(source_key) < 100"
            ).fetchall()
        )
        assert texts == {
            "10": "Player 10 plays for Reds",
            "11": "Player 11 plays for Greens",
            "bus": "a long car",
            "https://example.com/commit": "short",
            "https://example.com/queue": "short",
        }
        errors = c.execute(
            "select message from pgrag.render_errors where doc_type = 'qn_page'"
        ).fetchall()
        assert len(errors) == 2
        assert all("more than an index entry holds: declare a shorter key" in e for (e,) in errors)
        assert (
            c.execute("select * from pgrag.render_queue where doc_type like 'qn_%'").rowcount == 0
        )

        c.execute("select pgrag.set_sync('qn_page', 'commit')")
        c.execute("delete from qn.page where length(url) > 100")
        c.execute(
            "select pgrag.declare_document('qn_nk', 'select k as source_key, v as text "
            'from qn.nk\', \'{"qn.nk": "select k from changed"}\')'
        )
        c.execute("insert into qn.nk values ('a', 'x'), (null, 'n1')")
        done = run_pgrag("--database-url", db_url, "verify")
        assert done.returncode == 1
        assert done.stdout.splitlines() == [
            "qn_nk NULL: a NULL source_key: the source gives a row without a key, which no "
            "chunk can hold (leave it out of the source, or give it a key)"
        ], done.stdout
        assert "gives rows without a source_key" in done.stderr and "is gone" not in done.stderr
