"""A tiny, hand-written sample shop: every row known, so tests can assert exact documents."""

from __future__ import annotations

from typing import Any

import psycopg

from pgrag import migrate
from pgrag.lab.sample_documents import declare_sample_documents

# The shop's document types as sql/sample/shop_documents.sql declares them (test_documents checks).
SHOP_SCHEMAS: dict[str, dict[str, str]] = {
    "customer_profile": {
        "customer_id": "integer",
        "name": "text",
        "order_ids": "integer[]",
        "segment": "text",
        "registration_year": "integer",
        "categories": "text[]",
        "has_returns": "boolean",
        "return_count": "integer",
        "total_orders": "integer",
        "total_spent": "numeric",
        "last_order_date": "date",
    },
    "order_detail": {
        "order_id": "integer",
        "customer_id": "integer",
        "customer_name": "text",
        "order_date": "date",
        "status": "text",
        "total": "numeric",
        "categories": "text[]",
        "has_returns": "boolean",
        "segment": "text",
    },
}

CUSTOMERS = [
    (1, "John Smith", "john@example.com", "VIP", "2022-03-01", "Boston", "USA"),
    (2, "Ana Lima", "ana@example.com", "Regular", "2023-05-10", "Lisbon", "Portugal"),
    (3, "Kai Chen", "kai@example.com", "New", "2024-06-01", None, None),
]
PRODUCTS = [
    (1, "Wireless Mouse", "Electronics", 25.00),
    (2, "Bluetooth Headphones", "Electronics", 80.00),
    (3, "Cookbook", "Books", 30.00),
]
ORDERS = [
    (10, 1, "2024-01-05", "delivered"),
    (11, 1, "2024-01-20", "shipped"),
    (12, 1, "2024-02-02", "delivered"),
    (20, 2, "2023-12-24", "delivered"),
]
ITEMS = [
    (100, 10, 1, 1, 25.00, "completed"),
    (101, 10, 3, 2, 30.00, "none"),
    (102, 11, 2, 1, 80.00, "none"),
    (103, 12, 2, 1, 75.00, "requested"),
    (200, 20, 3, 1, 30.00, "none"),
]


def load_tiny_shop(conn: psycopg.Connection[Any], *, recent_orders: int = 2) -> None:
    migrate.run_sql_file(conn, migrate.sql_dir() / "sample" / "shop_schema.sql")
    with conn.cursor() as cur:
        cur.executemany("insert into shop.customers values (%s,%s,%s,%s,%s,%s,%s)", CUSTOMERS)
        cur.executemany("insert into shop.products values (%s,%s,%s,%s)", PRODUCTS)
        cur.executemany("insert into shop.orders values (%s,%s,%s,%s)", ORDERS)
        cur.executemany("insert into shop.order_items values (%s,%s,%s,%s,%s,%s)", ITEMS)
    conn.execute("call shop.finish_load()")
    conn.execute("drop procedure shop.finish_load()")
    declare_sample_documents(conn, recent_orders=recent_orders)
    conn.execute("select pgrag.refresh('customer_profile')")
    conn.execute("select pgrag.refresh('order_detail')")


def embed_chunks(conn: psycopg.Connection[Any], embedder: Any) -> None:
    """Give every chunk its vector from ``embedder``, and the store that model's name."""
    rows = conn.execute("select id, text from pgrag.chunks order by id").fetchall()
    vecs = embedder.embed([r[1] for r in rows])
    conn.execute("update pgrag.settings set embedding_model = %s", (embedder.name,))
    for (cid, _), v in zip(rows, vecs, strict=True):
        conn.execute(
            "update pgrag.chunks set embedding = %s::real[]::vector, embedding_model = %s "
            "where id = %s",
            (v.tolist(), embedder.name, cid),
        )
