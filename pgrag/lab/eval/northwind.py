"""Questions about Northwind with ground truth from its tables (sql/eval/northwind_questions.sql).

Relevant chunks are the Northwind documents of examples/northwind/documents.sql: ``nw_customer``
(source key = customer_id, e.g. ``ALFKI``) and ``nw_order`` (source key = order_id).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import psycopg

from pgrag.lab.eval.questions import (
    ADVERSARIAL,
    NOT_FOUND,
    REFUSAL,
    Question,
    QuestionList,
    check_limit,
    rows_of,
)
from pgrag.lab.eval.runner import named_queries

CUSTOMER = "nw_customer"
ORDER = "nw_order"
_FAKE_COMPANIES = (
    "Zebulon Trading Co.",
    "Quackenbush Imports",
    "Featherstonehaugh & Sons",
    "Vanderbilt-Ng Delicatessen",
    "Oyelaran Foods",
)


def _month(day: dt.date) -> str:
    return day.strftime("%B %Y")


def generate_northwind_questions(
    conn: psycopg.Connection[Any], *, limit_per_template: int = 20, seed: int = 42
) -> list[Question]:
    """Questions about Northwind (schema public) with SQL ground truth (docs/evaluation.md)."""
    check_limit(limit_per_template)
    q = named_queries("northwind_questions.sql")
    rng = random.Random(seed)
    params: dict[str, Any] = {"seed": str(seed), "lim": limit_per_template}
    out = QuestionList()
    add = out.add

    def customers(keys: Iterable[str]) -> list[tuple[str, str]]:
        return [(CUSTOMER, k) for k in keys]

    def orders(keys: Iterable[str]) -> list[tuple[str, str]]:
        return [(ORDER, k) for k in keys]

    for r in rows_of(conn, q, "customer_totals", params):
        name, key = r["company_name"], customers([r["customer_id"]])
        text = rng.choice(["How many orders has {n} placed?", "{n}: number of orders?"])
        add("nw-orders-count", text.format(n=name), str(r["order_count"]), key, "simple", "orders")
        text = rng.choice(["How much has {n} spent in total?", "What is the total spend of {n}?"])
        spent: Decimal = r["spent"]
        add("nw-spent", text.format(n=name), f"${spent:,.2f}", key, "simple", "aggregates")

    for r in rows_of(conn, q, "order_shipping", params):
        shipped: dt.date | None = r["shipped_date"]
        answer = (
            f"shipped {shipped} via {r['shipper']} to {r['ship_country']}"
            if shipped
            else f"not shipped yet (to {r['ship_country']})"
        )
        text = rng.choice(
            ["How was order {o} shipped, and where to?", "Has order {o} been shipped?"]
        ).format(o=r["order_id"])
        add("nw-order-shipping", text, answer, orders([str(r["order_id"])]), "simple", "orders")

    for r in rows_of(conn, q, "customer_month_orders", params):
        text = rng.choice(
            ["Which orders did {n} place in {m}?", "What did {n} order in {m}?"]
        ).format(n=r["company_name"], m=_month(r["month"]))
        keys: list[str] = r["keys"]
        add("nw-customer-month", text, ", ".join(keys), orders(keys), "medium", "orders")

    for r in rows_of(conn, q, "product_buyers_month", params):
        text = rng.choice(["Who bought {p} in {m}?", "Which customers ordered {p} in {m}?"]).format(
            p=r["product_name"], m=_month(r["month"])
        )
        keys = sorted(r["keys"], key=int)
        add("nw-product-month", text, r["names"], orders(keys), "complex", "products")

    for r in rows_of(conn, q, "city_customers", params):
        text = rng.choice(
            ["Which customers are based in {c}?", "List our customers in {c}, {k}."]
        ).format(c=r["city"], k=r["country"])
        add("nw-city", text, r["names"], customers(r["keys"]), "medium", "customers")

    for r in rows_of(conn, q, "unshipped_by_country", params):
        text = rng.choice(
            [
                "Which orders to {c} have not been shipped yet?",
                "Unshipped orders for {c}?",
            ]
        ).format(c=r["ship_country"])
        keys = r["keys"]
        add("nw-unshipped", text, ", ".join(keys), orders(keys), "medium", "orders")

    for r in rows_of(conn, q, "category_customers_country", params):
        text = rng.choice(
            ["Which customers in {c} buy {g}?", "Who in {c} has bought {g} products?"]
        ).format(c=r["country"], g=r["category"])
        add("nw-category", text, r["names"], customers(r["keys"]), "complex", "products")

    bounds = rows_of(conn, q, "bounds", params)[0]
    fakes = list(_FAKE_COMPANIES)
    rng.shuffle(fakes)
    lim = min(5, limit_per_template)
    for r in rows_of(conn, q, "absent_names", {"names": fakes, "lim": lim}):
        text = rng.choice(["How many orders has {n} placed?", "What did {n} order?"])
        add("nw-edge-customer", text.format(n=r["name"]), NOT_FOUND, [], "simple", "edge")
    for i in range(lim):
        text = f"How was order {bounds['max_order'] + 1000 + 37 * i} shipped?"
        add("nw-edge-order", text, NOT_FOUND, [], "simple", "edge")
    first_day: dt.date | None = bounds["first_day"]
    if first_day is not None and bounds["some_name"] is not None:
        for years in (1, 2, 3)[:limit_per_template]:
            month = first_day.replace(day=1, year=first_day.year - years)
            text = f"What did {bounds['some_name']} order in {_month(month)}?"
            add("nw-edge-month", text, NOT_FOUND, [], "medium", "edge")
    for text in ADVERSARIAL[:limit_per_template]:
        add("nw-adversarial", text, REFUSAL, [], "simple", "adversarial")
    return out


__all__ = ["generate_northwind_questions"]
