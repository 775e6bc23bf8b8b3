"""The metadata filter language: compilation (``pgrag._filter_sql``, the one compiler, in SQL),
errors, and results on real rows.

The SQL results are compared with ``reference_match``, an independent Python evaluation of the
same filter, on ~50 chunks carrying the sample shop's metadata (sql/sample/shop_documents.sql).
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pgrag.errors import DocumentError, InvalidFilter, mapped_database_errors
from pgrag.filters import MAX_DEPTH, filter_param, parse_filter_json
from tests.shop_fixture import SHOP_SCHEMAS

MAX_TERMS = 1000  # pgrag._limit('filter_terms')
MAX_IN_VALUES = 10_000  # pgrag._limit('filter_in_values')

CUSTOMER_SCHEMA = SHOP_SCHEMAS["customer_profile"]
ORDER_SCHEMA = {k: v for k, v in SHOP_SCHEMAS["order_detail"].items() if k != "customer_name"}
SCHEMA = {**CUSTOMER_SCHEMA, **ORDER_SCHEMA}

SEGMENTS = ["VIP", "Regular", "New", "Dormant"]
STATUSES = ["pending", "processing", "shipped", "delivered", "cancelled"]
CATEGORIES = ["Books", "Electronics", "Toys", "Garden", "Home & Kitchen"]
NAMES = ["John Smith", "Ann O'Neil", "Li Wei", "Maria Garcia", "Sam Lee"]


def sample_rows() -> list[tuple[str, str, dict[str, Any]]]:
    """25 customer profiles and 25 orders, deterministic; some keys left out on purpose."""
    rnd = random.Random(20240131)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    for cid in range(1, 26):
        md: dict[str, Any] = {
            "customer_id": cid,
            "name": rnd.choice(NAMES),
            "order_ids": sorted(rnd.sample(range(100, 130), rnd.randint(0, 3))),
            "segment": rnd.choice(SEGMENTS),
            "registration_year": rnd.randint(2018, 2025),
            "categories": rnd.sample(CATEGORIES, rnd.randint(0, 3)),
            "has_returns": rnd.random() < 0.4,
            "return_count": rnd.randint(0, 4),
            "total_orders": rnd.randint(0, 9),
            "total_spent": round(rnd.uniform(0, 5000), 2),
            "last_order_date": (
                dt.date(2023, 1, 1) + dt.timedelta(rnd.randint(0, 800))
            ).isoformat(),
        }
        if cid % 7 == 0:
            del md["segment"]  # a missing key: $ne / $nin match it, = / ranges do not
        rows.append(("customer_profile", "customer:" + str(cid), md))
    for oid in range(100, 125):
        md = {
            "order_id": oid,
            "customer_id": rnd.randint(1, 25),
            "order_date": (dt.date(2023, 10, 1) + dt.timedelta(rnd.randint(0, 200))).isoformat(),
            "status": rnd.choice(STATUSES),
            "total": rnd.choice([rnd.randint(5, 900), round(rnd.uniform(5, 900), 2)]),
            "categories": rnd.sample(CATEGORIES, rnd.randint(1, 2)),
            "has_returns": rnd.random() < 0.3,
            "segment": rnd.choice(SEGMENTS),
        }
        if oid % 6 == 0:
            del md["total"]
        rows.append(("order_detail", "order:" + str(oid), md))
    return rows


Row = tuple[int, str, dict[str, Any]]


def insert_rows(conn: psycopg.Connection[Any]) -> list[Row]:
    out: list[Row] = []
    for doc_type, key, md in sample_rows():
        row = conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text, metadata) "
            "values (%s, %s, %s, %s::jsonb) returning id",
            (doc_type, "ftest:" + key, "chunk " + key, json.dumps(md)),
        ).fetchone()
        assert row is not None
        out.append((int(row[0]), doc_type, md))
    return out


def compile_sql(
    conn: psycopg.Connection[Any],
    f: Any,
    schema: Mapping[str, str] = SCHEMA,
    split_keys: Any = (),
    alias: str = "c",
) -> str:
    """The filter compiled by the server (InvalidFilter / DocumentError as the client gets them)."""
    with mapped_database_errors(), conn.transaction():
        row = conn.execute(
            "select pgrag._filter_sql(%s::jsonb, %s::jsonb, %s::text[], %s)",
            (filter_param(f), Jsonb(dict(schema)), list(split_keys), alias),
        ).fetchone()
    assert row is not None
    return str(row[0])


def run(conn: psycopg.Connection[Any], f: Any, ids: list[int]) -> set[int]:
    compiled = compile_sql(conn, f)
    # (the server's SQL text, its % doubled for psycopg's placeholders)
    where = compiled.replace("%", "%%").encode()
    query = b"select c.id from pgrag.chunks c where c.id = any(%(ids)s) and " + where
    return {r[0] for r in conn.execute(query, {"ids": ids}).fetchall()}


# ---- the Python reference evaluation ----


def json_eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def reference_match(f: Mapping[str, Any], schema: Mapping[str, str], row: Row) -> bool:
    _, doc_type, md = row
    for key, value in f.items():
        if key == "$and":
            ok = all(reference_match(x, schema, row) for x in value)
        elif key == "$or":
            ok = any(reference_match(x, schema, row) for x in value)
        elif key == "$not":
            ok = not reference_match(value, schema, row)
        elif key == "doc_type":
            ok = all(ref_op(op, doc_type, x, "text") for op, x in ops_of(value))
        else:
            ok = all(ref_field(schema[key], md, key, op, x) for op, x in ops_of(value))
        if not ok:
            return False
    return True


def ops_of(value: Any) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, Mapping) else [("$eq", value)]


def ref_field(type_name: str, md: dict[str, Any], key: str, op: str, x: Any) -> bool:
    present = key in md
    stored = md.get(key)
    if type_name.endswith("[]"):
        has = present and isinstance(stored, list)

        def contains(e: Any) -> bool:
            return has and any(json_eq(s, e) for s in stored or [])

        wanted = x if isinstance(x, list) else [x]
        if op in ("$eq", "$contains"):
            return all(contains(e) for e in wanted)
        if op == "$ne":
            return not all(contains(e) for e in wanted)
        if op == "$in":
            return any(contains(e) for e in x)
        if op == "$nin":
            return not any(contains(e) for e in x)
        raise AssertionError(op)
    if not present:
        return op in ("$ne", "$nin")
    return ref_op(op, stored, x, type_name)


def ref_op(op: str, stored: Any, x: Any, type_name: str) -> bool:
    if op == "$eq":
        return json_eq(stored, x)
    if op == "$ne":
        return not json_eq(stored, x)
    if op == "$in":
        return any(json_eq(stored, v) for v in x)
    if op == "$nin":
        return not any(json_eq(stored, v) for v in x)
    if type_name == "date":
        if not isinstance(stored, str):
            return False
    elif isinstance(stored, bool) or not isinstance(stored, int | float):
        return False
    return bool(
        {
            "$gt": stored > x,
            "$gte": stored >= x,
            "$lt": stored < x,
            "$lte": stored <= x,
        }[op]
    )


# ---- compilation ----


def test_empty_filter_is_true(conn: psycopg.Connection[Any]) -> None:
    assert compile_sql(conn, None) == "true"
    assert compile_sql(conn, {}) == "true"


def test_equalities_of_one_level_are_one_containment(conn: psycopg.Connection[Any]) -> None:
    compiled = compile_sql(
        conn,
        {"segment": "VIP", "has_returns": True, "categories": {"$contains": ["Books", "Toys"]}},
    )
    assert compiled == (
        """c.metadata @> '{"segment": "VIP", "categories": ["Books", "Toys"], """
        """"has_returns": true}'::jsonb"""
    )


def test_ranges_of_one_level_are_one_jsonpath(conn: psycopg.Connection[Any]) -> None:
    compiled = compile_sql(
        conn, {"order_date": {"$gte": "2024-01-01", "$lte": "2024-01-31"}, "total": {"$gt": 10.5}}
    )
    assert compiled == (
        """c.metadata @? '$ ? (@."total" > 10.5 && @."order_date" >= "2024-01-01" """
        """&& @."order_date" <= "2024-01-31")'::jsonpath"""
    )


def test_a_filter_index_key_gets_its_own_canonical_condition(
    conn: psycopg.Connection[Any],
) -> None:
    # split_keys (the store's filter indexes' keys): an @> / @? of its own, in one form
    split = ["categories", "total", "segment"]
    compiled = compile_sql(
        conn,
        {
            "segment": "VIP",
            "has_returns": True,
            "categories": {"$contains": ["Toys", "Books", "Toys"]},
            "total": {"$lt": 500.0, "$gte": 100},
            "order_date": {"$gte": "2024-01-01"},
        },
        split_keys=split,
    )
    assert compiled == (
        """(c.metadata @> '{"has_returns": true}'::jsonb"""
        """ and c.metadata @> '{"categories": ["Books", "Toys"]}'::jsonb"""
        """ and c.metadata @> '{"segment": "VIP"}'::jsonb"""
        """ and c.metadata @? '$ ? (@."order_date" >= "2024-01-01")'::jsonpath"""
        """ and c.metadata @? '$ ? (@."total" < 500 && @."total" >= 100)'::jsonpath)"""
    )
    # the same conditions written otherwise compile to the same SQL
    again = compile_sql(
        conn,
        {
            "order_date": {"$gte": "2024-01-01"},
            "total": {"$gte": 100.0, "$lt": 500},
            "categories": {"$contains": ["Books", "Toys"]},
            "has_returns": True,
            "segment": {"$eq": "VIP"},
        },
        split_keys=split,
    )
    assert again == compiled


def test_in_ne_nin_not_and_doc_type_shapes(conn: psycopg.Connection[Any]) -> None:
    compiled = compile_sql(
        conn,
        {
            "doc_type": "order_detail",
            "status": {"$nin": ["delivered", "cancelled"]},
            "customer_id": {"$in": [1, 2]},
            "$not": {"segment": {"$ne": "VIP"}},
        },
    )
    assert compiled == (
        """((not (not c.metadata @> '{"segment": "VIP"}'::jsonb))"""
        """ and (not c.metadata @> any(E'{"{\\\\"status\\\\": \\\\"delivered\\\\"}","""
        """"{\\\\"status\\\\": \\\\"cancelled\\\\"}"}'::jsonb[]))"""
        """ and c.doc_type = 'order_detail'"""
        """ and c.metadata @> any(E'{"{\\\\"customer_id\\\\": 1}","""
        """"{\\\\"customer_id\\\\": 2}"}'::jsonb[]))"""
    )
    # no alias: a filter index's predicate
    assert compile_sql(conn, {"segment": "VIP"}, alias="") == (
        """metadata @> '{"segment": "VIP"}'::jsonb"""
    )


def test_empty_in_and_nin(conn: psycopg.Connection[Any]) -> None:
    assert compile_sql(conn, {"status": {"$in": []}}) == "false"
    assert compile_sql(conn, {"status": {"$nin": []}}) == "true"


def test_dates_accept_python_dates_and_integral_floats_are_integers(
    conn: psycopg.Connection[Any],
) -> None:
    compiled = compile_sql(conn, {"order_date": {"$gt": dt.date(2024, 3, 1)}, "customer_id": 5.0})
    assert compiled == (
        """(c.metadata @> '{"customer_id": 5}'::jsonb"""
        """ and c.metadata @? '$ ? (@."order_date" > "2024-03-01")'::jsonpath)"""
    )


@pytest.mark.parametrize(
    ("bad", "needles"),
    [
        ({"colour": "red"}, ["unknown filter key 'colour'", "doc_type", "segment", "$or"]),
        ({"segment": {"$regex": "V.*"}}, ["'$regex'", "'segment' (text)", "$eq, $ne, $in, $nin"]),
        ({"segment": {"$gt": "A"}}, ["'$gt'", "valid operators are $eq, $ne, $in, $nin"]),
        ({"categories": {"$gt": "A"}}, ["'$gt'", "$contains"]),
        ({"$nor": []}, ["unknown operator '$nor'", "$and, $or or $not"]),
        ({"customer_id": "123"}, ["'customer_id' expects integer", 'string "123"', "e.g."]),
        ({"customer_id": True}, ["'customer_id' expects integer", "a boolean"]),
        ({"total": {"$gt": "100"}}, ["'total' expects numeric", '{"total": 99.5}']),
        ({"total": {"$gt": float("inf")}}, ["NaN or infinity"]),
        ({"has_returns": "yes"}, ["'has_returns' expects boolean", "true"]),
        ({"order_date": {"$gte": "01/02/2024"}}, ["'order_date' expects date", "YYYY-MM-DD"]),
        ({"order_date": "2024-02-30"}, ["'order_date' expects date"]),
        ({"categories": 3}, ["'categories' expects text[] elements (text)"]),
        ({"order_ids": {"$in": ["a"]}}, ["'order_ids' expects integer[] elements (integer)"]),
        ({"status": {"$in": "shipped"}}, ["$in on filter key 'status' takes an array"]),
        ({"status": {}}, ["empty operator object"]),
        ({"$or": []}, ["$or takes a non-empty array"]),
        ({"$and": {"segment": "VIP"}}, ["$and takes a non-empty array"]),
        ({"$not": ["segment"]}, ["the value of $not must be an object"]),
        ({"$or": ["segment"]}, ["each item of $or must be an object"]),
        ({"doc_type": 5}, ["doc_type expects a document type name"]),
        ({"doc_type": {"$gt": "a"}}, ["unknown operator '$gt' for doc_type"]),
        ({"categories": []}, ["needs at least one element"]),
        ({1: "a"}, ["filter key 1 is not a string"]),
        ({"segment": "a\x00b"}, ["NUL character"]),
    ],
)
def test_invalid_filters_say_what_is_valid(
    conn: psycopg.Connection[Any], bad: dict[Any, Any], needles: list[str]
) -> None:
    with pytest.raises(InvalidFilter) as info:
        compile_sql(conn, bad)
    message = str(info.value)
    for needle in needles:
        assert needle in message
    assert "\n" not in message


def test_top_level_must_be_an_object(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidFilter, match="the filter must be an object"):
        compile_sql(conn, ["segment"])
    with (
        pytest.raises(InvalidFilter, match="the filter must be an object"),
        mapped_database_errors(),
        conn.transaction(),
    ):
        conn.execute("select pgrag._filter_sql('[1]'::jsonb, '{}'::jsonb)")


def test_absurd_filters_are_refused(conn: psycopg.Connection[Any]) -> None:
    deep: dict[str, Any] = {"segment": "VIP"}
    for _ in range(MAX_DEPTH):
        deep = {"$not": deep}
    with pytest.raises(InvalidFilter, match="nested more than 32"):
        compile_sql(conn, deep)
    ok: dict[str, Any] = {"segment": "VIP"}
    for _ in range(MAX_DEPTH - 1):
        ok = {"$not": ok}
    compile_sql(conn, ok)

    many = {"$or": [{"customer_id": i} for i in range(MAX_TERMS)]}
    with pytest.raises(InvalidFilter, match="more than 1000 conditions"):
        compile_sql(conn, many)

    with pytest.raises(InvalidFilter, match="10,001 values"):
        compile_sql(conn, {"customer_id": {"$in": list(range(MAX_IN_VALUES + 1))}})
    compile_sql(conn, {"customer_id": {"$in": list(range(MAX_IN_VALUES))}})


def test_a_key_declared_with_two_types_is_a_declaration_error(
    conn: psycopg.Connection[Any],
) -> None:
    for name, type_name in (("t_num", "numeric"), ("t_txt", "text")):
        conn.execute(
            "select pgrag.declare_document(%s, 'select 1 as source_key, ''x'' as text', "
            "metadata_schema => jsonb_build_object('total', %s::text))",
            (name, type_name),
        )
    with (
        pytest.raises(DocumentError, match="'total' is numeric in one document type and text"),
        mapped_database_errors(),
        conn.transaction(),
    ):
        conn.execute("select pgrag.check_filter('{}'::jsonb, '{t_num,t_txt}')")
    with mapped_database_errors(), conn.transaction():
        conn.execute("select pgrag.check_filter('{\"total\": 1}'::jsonb, '{t_num}')")


# ---- parse_filter_json ----


def test_parse_filter_json() -> None:
    assert parse_filter_json('{"segment": "VIP"}') == {"segment": "VIP"}
    for text, needle in [
        ('{"segment": }', "not valid JSON (Expecting value at line 1 column 13)"),
        ('["VIP"]', "must be a JSON object, not an array"),
        ('{"a": 1, "a": 2}', "'a' appears twice"),
        ('{"total": {"$gt": NaN}}', "NaN"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (" " * 1_000_001, "characters long"),
    ]:
        with pytest.raises(InvalidFilter) as info:
            parse_filter_json(text)
        assert needle in str(info.value)


# ---- against real rows ----


SEED_FILTERS: list[dict[str, Any]] = [
    {"segment": "VIP", "has_returns": True},
    {"customer_id": 3, "order_date": {"$gte": "2024-01-01", "$lte": "2024-01-31"}},
    {"status": {"$nin": ["delivered", "cancelled"]}, "doc_type": "order_detail"},
    {"categories": {"$contains": "Books"}},
    {"categories": {"$in": ["Toys", "Garden"]}, "total": {"$gte": 100, "$lt": 500.5}},
    {"$or": [{"segment": {"$ne": "VIP"}}, {"total_spent": {"$gt": 2500}}]},
    {"$not": {"doc_type": {"$in": ["customer_profile"]}}, "has_returns": False},
    {"order_ids": {"$nin": [100, 101]}, "segment": {"$in": ["New", "Dormant"]}},
    {"total": {"$gt": 1e2, "$lt": 9.5e2}, "$and": [{"segment": {"$nin": []}}]},
    {"last_order_date": {"$lt": "2024-06-30"}, "return_count": {"$gte": 2}},
    {"name": "Ann O'Neil"},
]


@pytest.mark.parametrize("f", SEED_FILTERS)
def test_seed_filters_match_the_reference(conn: psycopg.Connection[Any], f: dict[str, Any]) -> None:
    rows = insert_rows(conn)
    expected = {r[0] for r in rows if reference_match(f, SCHEMA, r)}
    assert run(conn, f, [r[0] for r in rows]) == expected


def test_the_gin_index_serves_equality_and_in(conn: psycopg.Connection[Any]) -> None:
    """With sequential scans priced out, equality, containment and $in use the GIN index."""
    insert_rows(conn)
    conn.execute("analyze pgrag.chunks")
    conn.execute("set local enable_seqscan = off")
    for f in (
        {"segment": "VIP", "categories": {"$contains": "Books"}},
        {"customer_id": {"$in": [1, 2, 3]}},
        {"customer_id": 3, "order_date": {"$gte": "2024-01-01"}},
    ):
        query = b"explain select c.id from pgrag.chunks c where " + compile_sql(conn, f).encode()
        plan = "\n".join(r[0] for r in conn.execute(query).fetchall())
        assert "Bitmap Index Scan on chunks_metadata_gin" in plan, plan


VALUES: dict[str, st.SearchStrategy[Any]] = {
    "customer_id": st.integers(0, 27),
    "order_id": st.integers(98, 126),
    "registration_year": st.integers(2017, 2026),
    "return_count": st.integers(-1, 5),
    "total_orders": st.integers(0, 10),
    "name": st.sampled_from([*NAMES, "Nobody"]),
    "segment": st.sampled_from([*SEGMENTS, "vip"]),
    "status": st.sampled_from([*STATUSES, "lost"]),
    "has_returns": st.booleans(),
    "total": st.one_of(st.integers(0, 1000), st.integers(0, 100_000).map(lambda x: x / 100)),
    "total_spent": st.integers(0, 500_000).map(lambda x: x / 100),
    "last_order_date": st.dates(dt.date(2022, 12, 1), dt.date(2025, 6, 1)).map(str),
    "order_date": st.dates(dt.date(2023, 9, 1), dt.date(2024, 6, 1)).map(str),
    "categories": st.sampled_from([*CATEGORIES, "Unknown"]),
    "order_ids": st.integers(98, 131),
}


@st.composite
def field_filters(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(st.sampled_from(sorted(VALUES)))
    value = VALUES[key]
    type_name = SCHEMA[key]
    if type_name.endswith("[]"):
        op = draw(st.sampled_from(["=", "$eq", "$contains", "$ne", "$in", "$nin"]))
        if op in ("$in", "$nin"):
            return {key: {op: draw(st.lists(value, max_size=4))}}
        operand = draw(st.one_of(value, st.lists(value, min_size=1, max_size=3)))
        return {key: operand} if op == "=" else {key: {op: operand}}
    ops = ["=", "$eq", "$ne", "$in", "$nin"]
    if type_name in ("integer", "numeric", "date"):
        ops += ["$gt", "$gte", "$lt", "$lte", "range"]
    op = draw(st.sampled_from(ops))
    if op == "=":
        return {key: draw(value)}
    if op in ("$in", "$nin"):
        return {key: {op: draw(st.lists(value, max_size=4))}}
    if op == "range":
        lo, hi = draw(st.sampled_from([("$gt", "$lt"), ("$gte", "$lte"), ("$gte", "$lt")]))
        return {key: {lo: draw(value), hi: draw(value)}}
    return {key: {op: draw(value)}}


doc_type_filters = st.one_of(
    st.sampled_from(["customer_profile", "order_detail", "other"]).map(lambda d: {"doc_type": d}),
    st.lists(st.sampled_from(["customer_profile", "order_detail"]), max_size=2).flatmap(
        lambda xs: st.sampled_from([{"doc_type": {"$in": xs}}, {"doc_type": {"$nin": xs}}])
    ),
)


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, value)  # keys are unique in an object: first one wins
    return merged


filters = st.recursive(
    st.one_of(field_filters(), doc_type_filters),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda xs: {"$and": xs}),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: {"$or": xs}),
        children.map(lambda x: {"$not": x}),
        st.lists(children, min_size=2, max_size=3).map(merge),
    ),
    max_leaves=8,
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(f=filters)
def test_property_sql_equals_reference(conn: psycopg.Connection[Any], f: dict[str, Any]) -> None:
    rows = _rows_once(conn)
    expected = {r[0] for r in rows if reference_match(f, SCHEMA, r)}
    event("matches " + ("none" if not expected else "all" if len(expected) == 50 else "some"))
    assert run(conn, f, [r[0] for r in rows]) == expected, f


_INSERTED: dict[int, list[Row]] = {}


def _rows_once(conn: psycopg.Connection[Any]) -> list[Row]:
    """Insert the rows once per connection (the fixture's transaction outlives the examples)."""
    key = id(conn)
    if key not in _INSERTED:
        _INSERTED.clear()
        _INSERTED[key] = insert_rows(conn)
    return _INSERTED[key]


# ---- hostile input ----

HOSTILE = [
    "'",
    '"',
    "'); drop table x; --",
    '"); drop table x; --',
    "\\",
    "\\'",
    "$$",
    "%s",
    "%(pgrag_f0)s",
    "{}",
    ")) || true || ((",
    '" || @.a == 1 || @."',
    "\x00",
    "\ud800",
    "\u2028",
    "é' or 1=1 --",
    "*/ drop table x; /*",
]


def test_no_hostile_key_or_value_runs_sql(conn: psycopg.Connection[Any]) -> None:
    conn.execute("create table x (id int)")
    conn.execute("insert into x values (1)")
    rows = insert_rows(conn)
    ids = [r[0] for r in rows]
    outcomes = {"result": 0, "invalid": 0}
    candidates: list[Any] = []
    for h in HOSTILE:
        candidates += [
            {h: "VIP"},
            {"segment": h},
            {"segment": {h: 1}},
            {"segment": {"$in": [h, "VIP"]}},
            {"categories": {"$contains": h}},
            {"order_date": {"$gt": h}},
            {"total": {"$lt": h}},
            {"doc_type": h},
            {"$or": [{h: 1}]},
            {"name": {"$nin": [h]}},
        ]
    for f in candidates:
        try:
            run(conn, f, ids)
        except InvalidFilter:
            outcomes["invalid"] += 1
            continue
        outcomes["result"] += 1
    assert outcomes["result"] > 0 and outcomes["invalid"] > 0
    row = conn.execute("select count(*) from x").fetchone()
    assert row is not None and row[0] == 1


def test_a_hostile_key_declared_in_a_schema_is_still_only_data(
    conn: psycopg.Connection[Any],
) -> None:
    """Schema keys come from declarations in the database: they never reach the SQL text."""
    conn.execute("create table x (id int)")
    keys = ["a'\"); drop table x; --", 'b" || @.x == 1 || @."', "c\\"]
    schema = {keys[0]: "text", keys[1]: "numeric", keys[2]: "date"}
    md = {keys[0]: "v'", keys[1]: 5, keys[2]: "2024-01-02"}
    row = conn.execute(
        "insert into pgrag.chunks (doc_type, source_key, text, metadata) "
        "values ('t', 'hostile', 't', %s::jsonb) returning id",
        (json.dumps(md),),
    ).fetchone()
    assert row is not None
    f = {keys[0]: "v'", keys[1]: {"$gte": 5}, keys[2]: {"$lt": "2024-01-03"}}
    for flt, expected in ((f, {row[0]}), ({keys[1]: {"$gt": 5}}, set())):
        compiled = compile_sql(conn, flt, schema)
        where = compiled.replace("%", "%%").encode()
        query = b"select c.id from pgrag.chunks c where c.id = %s and " + where
        assert {r[0] for r in conn.execute(query, (row[0],))} == expected
    assert conn.execute("select to_regclass('x') is not null").fetchone() == (True,)


def test_split_keys_change_the_top_level_only(conn: psycopg.Connection[Any]) -> None:
    # an index on a nested filter is compiled with its own top-level keys; a search with the
    # keys of every filter index: nested levels must come out the same either way
    nested = {
        "$and": [{"segment": "VIP", "has_returns": True}, {"total": {"$lt": 9.0}}],
        "$not": {"categories": ["Toys", "Books"]},
    }
    own = compile_sql(conn, nested, split_keys=nested.keys())
    more = compile_sql(conn, nested, split_keys={*nested, "segment", "total", "categories"})
    assert own == more


def test_split_key_operands_are_canonical(conn: psycopg.Connection[Any]) -> None:
    a = compile_sql(
        conn,
        {"segment": {"$in": ["b", "a", "a"]}, "total": {"$ne": 2.0}},
        split_keys={"segment", "total"},
    )
    b = compile_sql(
        conn, {"total": {"$ne": 2}, "segment": {"$in": ["a", "b"]}}, split_keys={"segment", "total"}
    )
    assert a == b
