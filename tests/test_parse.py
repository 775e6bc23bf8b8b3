"""The question parser: rules on the seed questions and time phrases; the LLM parser on a fake
chat endpoint (tests/chat_server.py)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

from pgrag.filters import check_filter, value_fits
from pgrag.parse import (
    CUSTOMER_PROFILE,
    ORDER_DETAIL,
    SHOP_SCHEMAS,
    LLMParser,
    ParsedQuery,
    parse_question,
)
from tests.chat_server import ChatServer, Reply, unused_port_url
from tests.shop_fixture import load_tiny_shop

TODAY = dt.date(2024, 6, 15)
CATEGORIES = ["Books", "Electronics", "Toys", "Home & Kitchen", "Clothing"]


def parse(question: str, **kwargs: Any) -> ParsedQuery:
    kwargs.setdefault("categories", CATEGORIES)
    kwargs.setdefault("today", TODAY)
    parsed = parse_question(question, **kwargs)
    # Every rule-based filter uses keys of the document types it prefers, with their types
    # (the server checks the whole filter: test_rule_filters_pass_the_servers_check).
    schema = {k: v for d in parsed.doc_types for k, v in SHOP_SCHEMAS[d].items()}
    for key, value in parsed.filter.items():
        operands = value.values() if isinstance(value, dict) else [value]
        for operand in operands:
            for one in operand if isinstance(operand, list) else [operand]:
                assert value_fits(schema[key], one), (key, one)
    assert parsed.search_text == question
    return parsed


# ---- the seed questions ----


def test_products_a_named_customer_returned() -> None:
    p = parse("What products did John Smith return?")
    assert p.customer_name == "John Smith"
    assert p.doc_types == (ORDER_DETAIL,)
    assert p.filter == {"has_returns": True}
    assert p.intent == "products"
    assert not p.needs_stats
    assert {m.phrase for m in p.matched} >= {"John Smith", "return"}


def test_vip_customers_with_many_returns() -> None:
    p = parse("Who among VIP customers has many returns?")
    assert p.doc_types == (CUSTOMER_PROFILE,)
    assert p.filter == {"segment": "VIP", "has_returns": True}
    assert p.intent == "customers"
    assert not p.needs_stats
    assert p.customer_name is None


def test_total_revenue_and_average_order_value_for_vip() -> None:
    p = parse("What's the total revenue and average order value for VIP customers?")
    assert p.needs_stats
    assert p.intent == "stats"
    assert p.filter == {"segment": "VIP"}
    assert p.doc_types == (ORDER_DETAIL,)
    assert p.customer_name is None


def test_undelivered_products_of_customer_123_in_january_2024() -> None:
    p = parse(
        "Which products did customer 123 buy in January 2024 that haven't been delivered yet?"
    )
    assert p.customer_id == 123
    assert p.doc_types == (ORDER_DETAIL,)
    assert p.filter == {
        "customer_id": 123,
        "status": {"$nin": ["delivered", "cancelled"]},
        "order_date": {"$gte": "2024-01-01", "$lte": "2024-01-31"},
    }
    assert p.time_range is not None and p.time_range.phrase == "January 2024"
    assert p.intent == "products"
    assert p.customer_name is None


# ---- rules ----


@pytest.mark.parametrize(
    ("phrase", "start", "end"),
    [
        ("orders in January 2024", "2024-01-01", "2024-01-31"),
        ("orders in Feb 2024", "2024-02-01", "2024-02-29"),
        ("orders in 2023", "2023-01-01", "2023-12-31"),
        ("orders in the last 3 months", "2024-03-15", "2024-06-15"),
        ("orders over the past two weeks", "2024-06-01", "2024-06-15"),
        ("orders of the last 30 days", "2024-05-16", "2024-06-15"),
        ("orders placed yesterday", "2024-06-14", "2024-06-14"),
        ("orders placed today", "2024-06-15", "2024-06-15"),
        ("orders since March 2024", "2024-03-01", "2024-06-15"),
        ("orders since 2023", "2023-01-01", "2024-06-15"),
        ("orders since September", "2023-09-01", "2024-06-15"),
        ("orders last month", "2024-05-01", "2024-05-31"),
        ("orders last year", "2023-01-01", "2023-12-31"),
        ("orders this year", "2024-01-01", "2024-06-15"),
        ("orders this month", "2024-06-01", "2024-06-15"),
        ("orders in Q1 2024", "2024-01-01", "2024-03-31"),
        ("orders in May", "2024-05-01", "2024-05-31"),
        ("orders before March 2024", None, "2024-02-29"),
    ],
)
def test_time_phrases(phrase: str, start: str | None, end: str | None) -> None:
    p = parse(phrase)
    assert p.time_range is not None
    assert (p.time_range.start and p.time_range.start.isoformat()) == start
    assert (p.time_range.end and p.time_range.end.isoformat()) == end
    expected = {k: v for k, v in (("$gte", start), ("$lte", end)) if v is not None}
    assert p.filter["order_date"] == expected


def test_may_as_a_verb_is_not_a_month() -> None:
    assert parse("Which customers may have returns?").time_range is None


@pytest.mark.parametrize(
    ("question", "segment"),
    [
        ("Show dormant customers", "Dormant"),
        ("List new customers", "New"),
        ("which regular customers like books", "Regular"),
        ("inactive buyers", "Dormant"),
        ("VIPs with returns", "VIP"),
    ],
)
def test_tiers(question: str, segment: str) -> None:
    assert parse(question).filter["segment"] == segment


def test_two_tiers_are_an_in_list() -> None:
    p = parse("Compare VIP and dormant customers")
    assert p.filter["segment"] == {"$in": ["VIP", "Dormant"]}


def test_new_as_an_adjective_of_products_is_not_a_tier() -> None:
    assert "segment" not in parse("Which new products were bought?").filter


def test_categories_come_from_the_caller() -> None:
    p = parse("Who bought books and home & kitchen items?")
    assert p.categories == ("Books", "Home & Kitchen")
    assert p.filter["categories"] == {"$in": ["Books", "Home & Kitchen"]}
    assert "categories" not in parse("Who bought garden tools?").filter
    p = parse("Who bought garden tools?", categories=["Garden"])
    assert p.filter["categories"] == {"$contains": "Garden"}


def test_categories_loaded_from_the_data(conn: psycopg.Connection[Any]) -> None:
    for i, cats in enumerate([["Books", "Toys"], ["Garden Tools"], ["Books"]]):
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text, metadata) "
            "values ('order_detail', %s, 'o', %s::jsonb)",
            ("ptest:" + str(i), json.dumps({"categories": cats})),
        )
    rows = conn.execute(
        "select distinct c from pgrag.chunks, "
        "jsonb_array_elements_text(metadata -> 'categories') as c "
        "where source_key like 'ptest:%' order by c"
    ).fetchall()
    known = [r[0] for r in rows]
    assert known == ["Books", "Garden Tools", "Toys"]
    p = parse("How many orders had garden tools last month?", categories=known)
    assert p.filter["categories"] == {"$contains": "Garden Tools"}
    assert p.needs_stats


@pytest.mark.parametrize(
    "question",
    [
        "orders not delivered yet",
        "undelivered orders of VIPs",
        "orders that have not been delivered",
        "which orders haven\u2019t been delivered",
        "orders that are yet to be delivered",
        "open orders",
    ],
)
def test_undelivered(question: str) -> None:
    p = parse(question)
    assert p.filter["status"] == {"$nin": ["delivered", "cancelled"]}
    assert p.doc_types == (ORDER_DETAIL,)


def test_explicit_statuses() -> None:
    assert parse("How many orders were cancelled?").filter["status"] == "cancelled"
    assert parse("shipped or pending orders").filter["status"] == {"$in": ["shipped", "pending"]}


@pytest.mark.parametrize(
    ("question", "stats"),
    [
        ("How many orders did VIPs place?", True),
        ("What is the average order value?", True),
        ("total spent by dormant customers", True),
        ("Sum of returns in 2023", True),
        ("Who are the top 5 customers?", True),
        ("Which customers bought books?", False),
        ("Who has many returns?", False),
    ],
)
def test_needs_stats(question: str, stats: bool) -> None:
    assert parse(question).needs_stats is stats


def test_customer_ids_names_and_known_names() -> None:
    assert parse("orders of customer #42").customer_id == 42
    assert parse("orders of customer id 42").filter["customer_id"] == 42
    assert parse("What did Maria Garcia buy in March 2024?").customer_name == "Maria Garcia"
    p = parse("what did maria garcia buy?", known_names=["Maria Garcia", "Li Wei"])
    assert p.customer_name == "Maria Garcia"
    assert parse("Which VIP Customers bought Books?").customer_name is None
    assert parse("What happened in March 2024?").customer_name is None
    assert parse("Did Mary-Jane O'Brien buy toys?").customer_name == "Mary-Jane O'Brien"
    assert parse("orders of Ronald McDonald").customer_name == "Ronald McDonald"
    assert parse("Who bought Garden Tools?", categories=["Garden Tools"]).customer_name is None
    assert parse("order #512 status").filter["order_id"] == 512


def test_a_key_the_document_type_lacks_is_dropped_with_a_note() -> None:
    schemas = {ORDER_DETAIL: {"order_id": "integer", "order_date": "date"}}
    p = parse("VIP orders in 2023", schemas=schemas)
    assert p.filter == {"order_date": {"$gte": "2023-01-01", "$lte": "2023-12-31"}}
    assert any("'segment'" in note for note in p.notes)
    odd = {ORDER_DETAIL: {"segment": "integer", "order_date": "date"}}
    p = parse("VIP orders in 2023", schemas=odd)
    assert "segment" not in p.filter and "order_date" in p.filter
    assert any("'segment' expects integer" in note for note in p.notes)


# ---- the LLM parser ----


@pytest.fixture
def shop(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    load_tiny_shop(conn)
    return conn


def llm_parser(url: str, conn: psycopg.Connection[Any]) -> LLMParser:
    return LLMParser(
        base_url=url,
        model="tiny-parser",
        api_key="test-key",
        check=lambda flt, doc_types: check_filter(conn, flt, doc_types),
    )


def test_rule_filters_pass_the_servers_check(shop: psycopg.Connection[Any]) -> None:
    for question in (
        "VIP customers who returned Electronics in January 2024",
        "Undelivered orders of customer 123 last 3 months",
        "How much did Regular and New customers spend on Books since March 2024?",
    ):
        parsed = parse(question)
        check_filter(shop, parsed.filter, parsed.doc_types)


def test_llm_proposal_is_validated_and_used(shop: psycopg.Connection[Any]) -> None:
    proposal = {
        "filter": {"segment": "VIP", "total": {"$gte": 100}},
        "doc_types": ["order_detail"],
        "needs_stats": True,
        "intent": "stats",
        "customer_name": None,
        "customer_id": None,
    }
    with ChatServer([Reply(content=json.dumps(proposal))]) as server:
        p = llm_parser(server.url, shop).parse(
            "Big VIP orders: how much?", categories=CATEGORIES, today=TODAY
        )
    assert p.parser == "llm"
    assert p.filter == proposal["filter"]
    assert p.doc_types == (ORDER_DETAIL,)
    assert p.needs_stats and p.intent == "stats"
    assert p.notes == ()
    (request,) = server.requests
    body = request["body"]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer test-key"
    assert body["model"] == "tiny-parser"
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]["content"]
    assert '"has_returns": "boolean"' in system and '"Home & Kitchen"' in system
    assert "Today is 2024-06-15" in system
    assert body["messages"][1] == {"role": "user", "content": "Big VIP orders: how much?"}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"filter": {"colour": "red"}}', "unknown filter key 'colour'"),
        (
            '{"filter": {"total": {"$gt": "lots"}}, "doc_types": ["order_detail"]}',
            "'total' expects numeric",
        ),
        ('{"filter": {}, "doc_types": ["invoices"]}', "doc_types must be a list of"),
        ('{"filter": ["VIP"]}', "filter must be an object"),
        ("VIP customers, I think", "not JSON"),
        ('{"filter": {}, "needs_stats": "yes"}', "needs_stats must be true or false"),
    ],
)
def test_invalid_llm_proposals_fall_back_to_rules(
    shop: psycopg.Connection[Any], content: str, why: str
) -> None:
    with ChatServer([Reply(content=content)]) as server:
        p = llm_parser(server.url, shop).parse(
            "Who among VIP customers has many returns?", categories=CATEGORIES, today=TODAY
        )
    assert p.parser == "rules"
    assert p.filter == {"segment": "VIP", "has_returns": True}
    (note,) = p.notes
    assert "rejected" in note and why in note and "rule-based" in note


def test_endpoint_errors_fall_back_to_rules(shop: psycopg.Connection[Any]) -> None:
    with ChatServer([Reply(status=500, error="boom")]) as server:
        p = llm_parser(server.url, shop).parse("VIP customers", categories=CATEGORIES, today=TODAY)
    assert p.parser == "rules" and p.filter == {"segment": "VIP"}
    assert "LLM parser not used" in p.notes[0] and "InternalServerError" in p.notes[0]

    p = llm_parser(unused_port_url(), shop).parse(
        "VIP customers", categories=CATEGORIES, today=TODAY
    )
    assert p.parser == "rules"
    assert "APIConnectionError" in p.notes[0]
