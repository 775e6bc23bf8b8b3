"""pgrag on Northwind, a public schema nobody here wrote, through the public API only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from pgrag import documents
from pgrag.server import bin_dir

from .conftest import REPO

NORTHWIND = Path(
    os.environ.get("PGRAG_NORTHWIND_SQL", REPO / "examples" / "northwind" / "northwind.sql")
)


def psql_file(url: str, path: Path) -> None:
    subprocess.run(
        [str(bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(path)],
        check=True,
        capture_output=True,
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
        counts = dict(
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
        before = dict(conn.execute("select id, text from pgrag.chunks").fetchall())
        conn.execute(
            "update public.order_details set quantity = quantity + 1 "
            "where order_id = 10248 and product_id = 11"
        )
        conn.execute("select pgrag.sync_now()")  # render now, not at commit: read them here
        after = dict(conn.execute("select id, text from pgrag.chunks").fetchall())
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
