"""Sensitive columns never reach a chunk, whatever their type and whatever text form the view
gives them (issue 15, points 5 to 7).

For each type, a value is rendered by the source view as PostgreSQL prints it (``format('%s')``,
with pgrag's pinned settings) and as its JSON (``to_jsonb``) in the metadata, also under a key
of its own; the column is declared sensitive, masked then omitted. No text form of the value
(its text, its JSON form, an array's elements, a range's bounds, a JSON value's keys and scalars)
may remain in the chunk's text or metadata, ignoring case; an omitted value leaves no entry.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

# (type, a value as a SQL literal) for every built-in kind of value a column can hold
VALUES: list[tuple[str, str]] = [
    ("smallint", "31415"),
    ("integer", "271828"),
    ("bigint", "9007199254740993"),
    ("numeric(10,3)", "12345.678"),
    ("real", "3.14159"),
    ("double precision", "2.718281828459"),
    ("text", "'alice@corp.example'"),
    ("varchar(40)", "'bob@corp.example'"),
    ("character(14)", "'secretcode12'"),
    ("date", "'1990-03-04'"),
    ("time", "'05:06:07.123'"),
    ("timetz", "'05:06:07.123+02'"),
    ("timestamp", "'1990-03-04 05:06:07.123'"),
    ("timestamptz", "'1990-03-04 05:06:07.123+00'"),
    ("interval", "'3 days 04:05:06'"),
    ("uuid", "'8f14e45f-ceea-467f-a0e6-0b0f43d1a9b7'"),
    ("bytea", "'\\xdeadbeef01'"),
    ("inet", "'10.91.82.73'"),
    ("cidr", "'10.91.0.0/16'"),
    ("macaddr", "'08:00:2b:91:82:73'"),
    ("money", "'1234.56'"),
    ("json", """'{"carol@corp.example": "x1", "kind": "private-value-1"}'"""),
    ("jsonb", """'{"dave@corp.example": {"deep-secret-key": "private-value-2"}}'"""),
    ("text[]", "'{erin@corp.example,frank@corp.example}'"),
    ("integer[]", "'{918273,645546}'"),
    ("timestamptz[]", "'{\"1991-05-06 07:08:09+00\"}'"),
    ("int4range", "'[100123,200456)'"),
    ("tstzrange", '\'["1992-06-07 08:09:10+00","1993-07-08 09:10:11+00")\''),
    ("daterange", "'[1994-08-09,1995-09-10)'"),
    ("int4multirange", "'{[300123,300456)}'"),
    ("kt.mail", "'grace@corp.example'"),
    ("kt.mood", "'ecstatic'"),
]

# Every text form of the value v the test knows of, printed under pgrag's pinned settings (as
# the render prints) and under the session's defaults: text, JSON, elements, bounds, keys.
_FORMS = """
with v(x) as (select {value}::{type})
select array_remove(array[x::text, to_jsonb(x) #>> '{{}}'] || coalesce({extra}, '{{}}'), null)
from v
"""


def _extra(type_name: str) -> str:
    if type_name.endswith("[]"):
        return (
            "array(select e::text from unnest(x) e)"
            " || array(select to_jsonb(e) #>> '{}' from unnest(x) e)"
        )
    if type_name.endswith("multirange"):
        return (
            "array(select b from unnest(x) r,"
            " lateral (values (lower(r)::text), (upper(r)::text)) u(b))"
        )
    if type_name.endswith("range"):
        return (
            "array[lower(x)::text, upper(x)::text,"
            " to_jsonb(lower(x)) #>> '{}', to_jsonb(upper(x)) #>> '{}']"
        )
    if type_name in ("json", "jsonb"):
        return (
            "array(select k #>> '{}' from jsonb_path_query(x::jsonb, "
            "'strict $.** ? (@.type() == \"object\").keyvalue().key') k)"
            " || array(select s #>> '{}' from jsonb_path_query(x::jsonb, 'strict $.**') s "
            "where jsonb_typeof(s) = 'string')"
        )
    return "null::text[]"


PINNED = (
    "set local datestyle = 'ISO, YMD'; set local intervalstyle = 'postgres'; "
    "set local timezone = 'UTC'; set local extra_float_digits = 1; set local bytea_output = 'hex'; "
    "set local lc_monetary = 'C'"
)


def _forms(conn: psycopg.Connection[Any], type_name: str, value: str) -> set[str]:
    out: set[str] = set()
    for pinned in (True, False):
        with conn.transaction():
            if pinned:
                conn.execute(PINNED)
            row = conn.execute(
                _FORMS.format(type=type_name, value=value, extra=_extra(type_name)).encode()
            ).fetchone()
        assert row is not None
        out |= {f for f in row[0] if f and len(f) >= 4}
    return out


@pytest.mark.parametrize("mode", ["mask", "omit"])
@pytest.mark.parametrize(("type_name", "value"), VALUES, ids=[t for t, _ in VALUES])
def test_no_text_form_of_a_sensitive_value_reaches_a_chunk(
    conn: psycopg.Connection[Any], type_name: str, value: str, mode: str
) -> None:
    conn.execute(
        "create schema kt; create domain kt.mail as text; "
        "create type kt.mood as enum ('calm', 'ecstatic')"
    )
    conn.execute(
        f"create table kt.person (id integer primary key, v {type_name}, w {type_name})".encode()
    )
    conn.execute(f"insert into kt.person values (1, {value}, {value}), (2, null, null)".encode())
    conn.execute(
        "select pgrag.declare_document('person', $$select p.id as source_key, p.v, "
        "format('Person %%s: value %%s; again %%s.', p.id, p.v, p.w) as text, "
        "jsonb_strip_nulls(jsonb_build_object('v', to_jsonb(p.v), 'deep', "
        "jsonb_build_object('inner', to_jsonb(p.w)), 'label', format('v=%%s', p.v))) as metadata "
        'from kt.person p$$, \'{"kt.person": "select id from changed"}\', '
        "sensitive => jsonb_build_object('v', %s::text))",
        (mode,),
    )
    conn.execute("select pgrag.refresh('person')")
    forms = _forms(conn, type_name, value)
    rows = conn.execute(
        "select source_key, text, metadata from pgrag.chunks where doc_type = 'person' "
        "order by source_key"
    ).fetchall()
    assert [r[0] for r in rows] == ["1", "2"]
    # (w is the same value, not declared sensitive: it is the view's to expose; the check
    # covers what v's column masks, so w is rendered only where v is, in text and metadata)
    _, text, metadata = rows[0]
    blob = (text + " " + json.dumps(metadata, ensure_ascii=False)).lower()
    leaked = [f for f in forms if f.lower() in blob]
    assert leaked == [], (type_name, mode, text, metadata)
    if mode == "omit":  # omitted means absent: no "v" entry, as for the NULL value
        assert "v" not in metadata and "v" not in rows[1][2]
        assert metadata.get("deep", {}).get("inner") in (None, {}) or "inner" not in metadata.get(
            "deep", {}
        )
    else:
        assert "[masked v]" in text
