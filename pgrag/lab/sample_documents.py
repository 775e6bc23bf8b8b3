"""The sample shop's document types, declared through the public SQL API.

``sql/sample/shop_documents.sql`` holds the views and the ``pgrag.declare_document`` calls;
``sql/sample/shop_stats.sql`` the exact statistics searches report (``pgrag.declare_stats``);
``sql/sample/shop_comparison_documents.sql`` the off-by-default comparison types (each
table's rows apart, and flattened JOIN rows) that the strategy benchmark indexes.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgrag import migrate
from pgrag.errors import mapped_database_errors

MAIN_TYPES = ("customer_profile", "order_detail")
COMPARISON_TYPES = ("table_row", "join_row")


def declare_sample_documents(
    conn: psycopg.Connection[Any], *, recent_orders: int = 5, comparisons: bool = False
) -> tuple[str, ...]:
    """Declare the shop's document types (schema shop must exist). Renders nothing."""
    folder = migrate.sql_dir() / "sample"
    with mapped_database_errors(), conn.transaction():
        migrate.run_sql_file(conn, folder / "shop_documents.sql")
        migrate.run_sql_file(conn, folder / "shop_stats.sql")
        conn.execute("update shop.doc_settings set recent_orders = %s", (recent_orders,))
        if comparisons:
            migrate.run_sql_file(conn, folder / "shop_comparison_documents.sql")
    return MAIN_TYPES + (COMPARISON_TYPES if comparisons else ())
