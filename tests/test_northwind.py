"""pgrag on Northwind, a public schema nobody here wrote, through the public API only."""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgrag import documents

from .conftest import REPO, psql_file

NORTHWIND = Path(
    os.environ.get("PGRAG_NORTHWIND_SQL", REPO / "examples" / "northwind" / "northwind.sql")
)


@pytest.fixture
def northwind(db_url: str) -> str:
    if not NORTHWIND.is_file():
        pytest.fail(f"Northwind not found at {NORTHWIND}: set PGRAG_NORTHWIND_SQL to northwind.sql")
    psql_file(db_url, NORTHWIND)
    psql_file(db_url, REPO / "examples" / "northwind" / "documents.sql")
    return db_url


def test_northwind_documents_are_complete_and_in_sync(northwind: str) -> None:
    with psycopg.connect(northwind) as conn:
        counts: dict[str, int] = dict(
            conn.execute("select doc_type, count(*) from pgrag.chunks group by 1").fetchall()
        )
        assert counts == {"nw_customer": 91, "nw_order": 830}
        alfki = conn.execute(
            "select text, metadata from pgrag.chunks where doc_type = 'nw_customer' "
            "and source_key = 'ALFKI'"
        ).fetchone()
        assert alfki is not None
        assert alfki[0].startswith("Alfreds Futterkiste (customer ALFKI), Berlin, Germany.")
        assert "6 orders totalling $4,273.00" in alfki[0]
        assert alfki[1]["total_orders"] == 6
        orphans = conn.execute(
            "select count(*) from pgrag.chunks where doc_type = 'nw_order' and parent_id is null"
        ).fetchone()
        assert orphans == (0,)
        assert documents.verify(conn) == []


def test_one_order_line_change_rebuilds_exactly_its_order_and_customer(northwind: str) -> None:
    with psycopg.connect(northwind) as conn:
        before: dict[int, str] = dict(conn.execute("select id, text from pgrag.chunks").fetchall())
        conn.execute(
            "update public.order_details set quantity = quantity + 1 "
            "where order_id = 10248 and product_id = 11"
        )
        conn.execute("select pgrag.sync_now()")  # render now, not at commit: read them here
        after: dict[int, str] = dict(conn.execute("select id, text from pgrag.chunks").fetchall())
        changed = conn.execute(
            "select doc_type, source_key from pgrag.chunks where id = any(%s) order by 1",
            ([i for i in after if after[i] != before.get(i)],),
        ).fetchall()
        assert changed == [("nw_customer", "VINET"), ("nw_order", "10248")]
        assert documents.verify(conn) == []


def test_northwind_questions_point_at_chunks_that_exist(northwind: str) -> None:
    from pgrag.lab.eval.northwind import generate_northwind_questions

    with psycopg.connect(northwind) as conn:
        questions = generate_northwind_questions(conn, limit_per_template=5, seed=3)
        keys = set(conn.execute("select doc_type, source_key from pgrag.chunks").fetchall())
    ids = [q.id for q in questions]
    assert len(ids) == len(set(ids)) and len(ids) >= 40
    for q in questions:
        assert {(r.doc_type, r.source_key) for r in q.relevant} <= keys, q
        assert (q.relevant == ()) == (q.category in ("edge", "adversarial")), q


# Northwind's own numbers, from its tables (not from the documents' views): an order's total is
# sum(unit_price * quantity * (1 - discount)) rounded to cents.
_TRUTH = """
with totals as (
    select o.order_id, o.customer_id, o.order_date, o.shipped_date,
           round(sum(d.unit_price * d.quantity * (1 - d.discount))::numeric, 2) as total
    from public.orders o
    join public.order_details d on d.order_id = o.order_id
    group by o.order_id
)
select jsonb_build_object(
    'customer_count', count(distinct t.customer_id), 'order_count', count(*),
    'revenue', coalesce(sum(t.total), 0), 'average_order_value', round(avg(t.total), 2),
    'shipped_count', count(t.shipped_date))::text
from totals t
where (%(customer)s::text is null or t.customer_id = %(customer)s)
  and (%(year)s::integer is null or extract(year from t.order_date) = %(year)s)
"""


def _json(conn: psycopg.Connection[Any], query: str, params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return json.loads(row[0], parse_float=Decimal)


def test_northwind_statistics_are_the_sql_truth(northwind: str) -> None:
    with psycopg.connect(northwind) as conn:
        declared = conn.execute("select doc_type from pgrag.doc_stats order by 1").fetchall()
        assert declared == [("nw_customer",), ("nw_order",)]

        def stats(flt: Any, types: list[str] | None = None) -> Any:
            return _json(
                conn,
                "select pgrag.stats(%s, %s)::text",
                (None if flt is None else Jsonb(flt), types),
            )

        def truth(customer: str | None = None, year: int | None = None) -> Any:
            return _json(conn, _TRUTH, {"customer": customer, "year": year})

        every = truth()
        assert every["order_count"] == 830
        got = stats(None)
        assert got["nw_order"] == every
        # every customer, those without orders too (91 of them; 89 have ordered)
        assert got["nw_customer"] == {**every, "customer_count": 91}

        alfki = truth(customer="ALFKI")
        assert alfki["order_count"] == 6 and alfki["revenue"] == Decimal("4273.00")
        assert stats({"customer_id": "ALFKI"}) == {"nw_customer": alfki, "nw_order": alfki}

        in_1997 = {"order_date": {"$gte": "1997-01-01", "$lte": "1997-12-31"}}
        assert stats(in_1997, ["nw_order"]) == {"nw_order": truth(year=1997)}


NORTHWIND_QUESTIONS = [
    "How many orders has Around the Horn placed?",
    "Who bought Chai in November 1997?",
    "Unshipped orders for Italy?",
    "Which customers are in Berlin?",
    "How much has Ernst Handel spent in total?",
    "Orders shipped to Germany in 1997",
    "How was order 10248 shipped?",
    "What did Zebulon Trading Co. order?",
]


def test_renaming_every_northwind_type_and_key_changes_no_parse(northwind: str) -> None:
    """The parser knows no dataset: Northwind under other names (types t0, t1; keys k0...,
    each described with its old name's words) parses to the same filters, types and numbers."""
    from pgrag.parse import parse_question
    from pgrag.vocabulary import load_vocabulary

    from .test_parse import TODAY, _rename, renamed

    with psycopg.connect(northwind) as conn:
        vocabulary = load_vocabulary(conn, fresh=True)
    other, types, keys = renamed(vocabulary)
    for question in NORTHWIND_QUESTIONS:
        a = parse_question(question, vocabulary, today=TODAY)
        b = parse_question(question, other, today=TODAY)
        assert b.filter == _rename(a.filter, keys), question
        assert b.doc_types == tuple(sorted(types[t] for t in a.doc_types)), question
        assert [(x.via_type, x.key) for x in b.links] == [
            (types[x.via_type], keys[x.key]) for x in a.links
        ], question
        assert (b.needs_stats, b.aggregate, b.unknown_names) == (
            a.needs_stats,
            a.aggregate,
            a.unknown_names,
        ), question
    # and the parse is not empty: the values, links and dates of the schema are found
    first = parse_question(NORTHWIND_QUESTIONS[0], vocabulary, today=TODAY)
    assert first.links and first.links[0].key == "customer_id"
