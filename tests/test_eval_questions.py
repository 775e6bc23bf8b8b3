"""pgrag.lab.eval.questions: JSONL round trip, bad lines, and generated ground truth against SQL."""

from __future__ import annotations

import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrag.errors import ConfigError
from pgrag.lab.eval.questions import (
    NOT_FOUND,
    Question,
    Relevant,
    generate_shop_questions,
    generate_type_questions,
    labels,
    parse_jsonl,
    qrels,
    read_jsonl,
    write_jsonl,
)
from pgrag.lab.sample import load_sample
from tests.shop_fixture import load_tiny_shop


@pytest.fixture(scope="module")
def shop300(pg_server: Any, template_db: str) -> Any:
    from tests.conftest import create_database, drop_database

    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    load_sample(url, customers=300, progress=False)
    yield url
    drop_database(pg_server, name)


@pytest.fixture(scope="module")
def questions300(shop300: str) -> list[Question]:
    with psycopg.connect(shop300) as c:
        return generate_shop_questions(c, limit_per_template=8, seed=7)


def test_jsonl_round_trip(tmp_path: Path, questions300: list[Question]) -> None:
    path = tmp_path / "q.jsonl"
    write_jsonl(path, questions300)
    assert read_jsonl(path) == questions300
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert set(first) >= {"id", "question", "expected_answer", "relevant", "complexity", "category"}


GOOD = {
    "id": "q1",
    "question": "What did John Smith return?",
    "expected_answer": "Wireless Mouse",
    "relevant": [{"doc_type": "customer_profile", "source_key": "1"}],
    "complexity": "simple",
    "category": "returns",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"complexity": "hard"}, "line 2: field 'complexity' is 'hard': use one of simple"),
        ({"relevant": [{"doc_type": "x", "source_key": 1}]}, "field 'relevant' item 0"),
        ({"relevant": "1"}, "field 'relevant' must be a list"),
        ({"question": ""}, "field 'question' must be a non-empty string"),
        ({"filters": [1]}, "field 'filters' must be a JSON object"),
        ({"colour": "red"}, "field 'colour' is not a question field"),
        ({"id": "q0"}, "field 'id' 'q0' repeats line 1"),
    ],
)
def test_bad_lines_name_line_field_and_fix(change: dict[str, Any], message: str) -> None:
    first = json.dumps({**GOOD, "id": "q0"})
    bad = {**GOOD, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_jsonl([first, json.dumps(bad)], "set.jsonl")


def test_missing_field_and_broken_json() -> None:
    without = {k: v for k, v in GOOD.items() if k != "expected_answer"}
    with pytest.raises(ConfigError, match="line 1: field 'expected_answer' is missing"):
        parse_jsonl([json.dumps(without)])
    with pytest.raises(ConfigError, match="line 3: not valid JSON .*one JSON object per line"):
        parse_jsonl([json.dumps(GOOD), "", "{oops"])
    with pytest.raises(ConfigError, match="cannot read questions file"):
        read_jsonl("/nonexistent/q.jsonl")


def test_qrels_and_labels_feed_the_metrics() -> None:
    (q,) = parse_jsonl([json.dumps(GOOD)])
    assert q.relevant == (Relevant("customer_profile", "1"),)
    assert qrels([q]) == {"q1": {"customer_profile:1": 1}}
    assert labels([q]) == {"q1": {"complexity": "simple", "category": "returns"}}


def test_generated_set_at_300_customers(questions300: list[Question]) -> None:
    qs = questions300
    assert len(qs) >= 60
    assert len({q.id for q in qs}) == len(qs)
    cats = Counter(q.category for q in qs)
    assert set(cats) >= {
        "returns",
        "orders",
        "segments",
        "products",
        "aggregates",
        "edge",
        "adversarial",
    }
    assert set(Counter(q.complexity for q in qs)) == {"simple", "medium", "complex"}
    for q in qs:
        if q.category in ("edge", "adversarial") and q.id.split("-")[1] != "unsold":
            assert q.relevant == (), q
        if q.category == "edge" and q.id.startswith("edge-customer"):
            assert q.expected_answer == NOT_FOUND
    assert len({q.question for q in qs}) == len(qs)


def test_ground_truth_checked_by_independent_sql(
    shop300: str, questions300: list[Question]
) -> None:
    by_prefix: dict[str, list[Question]] = {}
    for q in questions300:
        by_prefix.setdefault(q.id.rsplit("-", 1)[0], []).append(q)
    with psycopg.connect(shop300) as c:
        # what did X return: the orders with a returned item
        q = by_prefix["returns-customer"][0]
        cid = int(q.relevant[0].source_key)
        rows = c.execute(
            "select distinct o.order_id::text from shop.orders o join shop.order_items i"
            " using (order_id) where o.customer_id = %s and i.return_status <> 'none'",
            (cid,),
        ).fetchall()
        assert {r.source_key for r in q.relevant[1:]} == {r[0] for r in rows}
        # order status
        q = by_prefix["orders-status"][0]
        row = c.execute(
            "select status from shop.orders where order_id = %s", (int(q.relevant[0].source_key),)
        ).fetchone()
        assert row is not None and q.expected_answer == row[0]
        # segment revenue, overall or in a year: the exact number
        for q in by_prefix["aggregates-revenue"]:
            seg = next(s for s in ("VIP", "Regular", "New", "Dormant") if f" {s} " in q.question)
            found = re.search(r" in (20\d\d)", q.question)
            year = int(found.group(1)) if found else None
            row = c.execute(
                "select sum(i.quantity * i.unit_price) from shop.order_items i"
                " join shop.orders o using (order_id) join shop.customers cu using (customer_id)"
                " where cu.segment = %s and o.status <> 'cancelled'"
                " and (%s::int is null or extract(year from o.order_date) = %s::int)",
                (seg, year, year),
            ).fetchone()
            assert row is not None
            assert q.expected_answer == f"${Decimal(row[0]):,.2f}", q
        # which VIP customers have 3 or more returns: includes the guaranteed ones
        vip3 = [
            q for q in by_prefix["segments-returns"] if "VIP" in q.question and " 3 " in q.question
        ]
        for q in vip3:
            assert {"1", "10", "20", "30", "40", "50"} <= {r.source_key for r in q.relevant}
    # undelivered orders: filters are in pgrag's filter language
    for q in by_prefix["orders-undelivered"]:
        assert q.filters is not None and set(q.filters) == {"customer_id", "order_date", "status"}


def test_maria_garcia_january_2024(shop300: str) -> None:
    with psycopg.connect(shop300) as c:
        qs = generate_shop_questions(c, limit_per_template=400, seed=1)
    maria = [
        q
        for q in qs
        if q.id.startswith("orders-undelivered")
        and "Maria Garcia" in q.question
        and "January 2024" in q.question
    ]
    assert len(maria) == 1
    assert "shipped" in maria[0].expected_answer and "processing" in maria[0].expected_answer
    assert len(maria[0].relevant) == 2


def test_type_questions_name_one_chunk(conn: psycopg.Connection[Any]) -> None:
    load_tiny_shop(conn)
    qs = generate_type_questions(conn, "order_detail", 3)
    assert len(qs) == 3
    for q in qs:
        assert len(q.relevant) == 1 and q.relevant[0].doc_type == "order_detail"
    assert generate_type_questions(conn, "no_such_type", 5) == []
    with pytest.raises(ConfigError, match="n must be 1 to 10000"):
        generate_type_questions(conn, "order_detail", 0)


def test_at_least_200_questions_at_1000_customers(db_url: str) -> None:
    load_sample(db_url, customers=1000, progress=False)
    with psycopg.connect(db_url) as c:
        qs = generate_shop_questions(c)
        again = generate_shop_questions(c)
    assert len(qs) >= 200
    assert qs == again  # same seed, same set
