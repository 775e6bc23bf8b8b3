"""Relationship-preserving documents: declared in SQL, kept true by triggers at every statement."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest

from pgrag import documents, migrate
from pgrag.errors import DocumentError, mapped_database_errors

from .conftest import PATIENCE_S, wait_for, waits_on_lock
from .shop_fixture import load_tiny_shop


def chunk(conn: psycopg.Connection[Any], doc_type: str, key: str) -> dict[str, Any] | None:
    row = conn.execute(
        "select id, text, metadata, parent_id, embedding is null, updated_at from pgrag.chunks "
        "where doc_type = %s and source_key = %s",
        (doc_type, key),
    ).fetchone()
    if row is None:
        return None
    return dict(
        zip(["id", "text", "metadata", "parent_id", "pending", "updated_at"], row, strict=True)
    )


def set_vector(conn: psycopg.Connection[Any], doc_type: str, key: str) -> None:
    conn.execute(
        "update pgrag.chunks set embedding = array_fill(0.1, array[384])::vector, "
        "embedding_model = 'm', embedded_at = now() where doc_type = %s and source_key = %s",
        (doc_type, key),
    )


@pytest.fixture
def shop(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    load_tiny_shop(conn)
    return conn


def test_customer_profile_keeps_relationships(shop: psycopg.Connection[Any]) -> None:
    p = chunk(shop, "customer_profile", "1")
    assert p is not None
    text = p["text"]
    first = text.splitlines()[0]
    assert first == (
        "Customer John Smith (customer id 1) is a VIP customer, registered in 2022, "
        "based in Boston, USA."
    )
    assert "3 orders, total spent $240.00, last order 2024-02-02." in text
    assert "Buys Books, Electronics." in text
    assert "2 returned items: Wireless Mouse (completed, order 10), " in text
    assert "Bluetooth Headphones (requested, order 12)" in text
    # most recent first, capped at 2, then the rest counted
    assert "- Order 12 on 2024-02-02 (delivered, $75.00)" in text
    assert "- Order 11 on 2024-01-20 (shipped, $80.00)" in text
    assert "Order 10 on" not in text
    assert text.endswith("... and 1 more orders.")
    m = p["metadata"]
    assert m["customer_id"] == 1 and m["segment"] == "VIP" and m["registration_year"] == 2022
    assert m["order_ids"] == [10, 11, 12] and m["categories"] == ["Books", "Electronics"]
    assert m["has_returns"] is True and m["return_count"] == 2
    assert m["total_orders"] == 3 and float(m["total_spent"]) == 240.0
    assert m["last_order_date"] == "2024-02-02"
    assert p["pending"] is True


def test_order_detail_is_a_child_with_customer_context(shop: psycopg.Connection[Any]) -> None:
    o = chunk(shop, "order_detail", "11")
    parent = chunk(shop, "customer_profile", "1")
    assert o is not None and parent is not None
    assert o["parent_id"] == parent["id"]
    assert o["text"].splitlines() == [
        "Order 11 by John Smith (customer id 1, VIP customer) on 2024-01-20: status shipped, "
        "total $80.00.",
        "Items: Bluetooth Headphones x1 at $80.00.",
    ]
    assert o["metadata"] == {
        "order_id": 11,
        "customer_id": 1,
        "customer_name": "John Smith",
        "segment": "VIP",
        "order_date": "2024-01-20",
        "status": "shipped",
        "total": 80.0,
        "categories": ["Electronics"],
        "has_returns": False,
    }
    assert documents.verify(shop) == []


def test_metadata_types_compare_correctly(shop: psycopg.Connection[Any]) -> None:
    rows = shop.execute(
        "select source_key from pgrag.chunks where doc_type = 'customer_profile' "
        "and (metadata->>'total_spent')::numeric > 100 "
        "and (metadata->>'last_order_date')::date >= date '2024-01-01' "
        'and metadata @> \'{"categories": ["Electronics"]}\''
    ).fetchall()
    assert rows == [("1",)]


def test_item_update_rebuilds_its_order_and_customer_in_the_same_statement(
    shop: psycopg.Connection[Any],
) -> None:
    for key in ("1", "2"):
        set_vector(shop, "customer_profile", key)
    for key in ("10", "11", "12", "20"):
        set_vector(shop, "order_detail", key)
    shop.execute("update shop.order_items set quantity = 3 where order_item_id = 102")
    p1 = chunk(shop, "customer_profile", "1")
    assert p1 is not None and "total spent $400.00" in p1["text"] and p1["pending"]
    o11 = chunk(shop, "order_detail", "11")
    assert o11 is not None and "Bluetooth Headphones x3" in o11["text"] and o11["pending"]
    # the customer's other orders: their text depends on their own rows only (no "order n of
    # m", no cumulative spend): not rendered, they keep their vectors
    for key in ("10", "12"):
        sibling = chunk(shop, "order_detail", key)
        assert sibling is not None and not sibling["pending"], key
    other = chunk(shop, "customer_profile", "2")  # another customer: untouched, keeps its vector
    assert other is not None and not other["pending"]
    assert documents.verify(shop) == []


def test_unchanged_text_keeps_its_vector(shop: psycopg.Connection[Any]) -> None:
    set_vector(shop, "customer_profile", "2")
    shop.execute("update shop.customers set email = 'new@example.com' where customer_id = 2")
    p = chunk(shop, "customer_profile", "2")
    assert p is not None and not p["pending"]


def test_moved_order_rebuilds_old_and_new_customer(shop: psycopg.Connection[Any]) -> None:
    shop.execute("update shop.orders set customer_id = 2 where order_id = 12")
    p1, p2 = chunk(shop, "customer_profile", "1"), chunk(shop, "customer_profile", "2")
    assert p1 is not None and p2 is not None
    assert "2 orders" in p1["text"] and p1["metadata"]["order_ids"] == [10, 11]
    assert "2 orders" in p2["text"] and p2["metadata"]["order_ids"] == [12, 20]
    o12 = chunk(shop, "order_detail", "12")
    assert o12 is not None and o12["parent_id"] == p2["id"] and "by Ana Lima" in o12["text"]
    assert documents.verify(shop) == []


def test_inserts_and_deletes(shop: psycopg.Connection[Any]) -> None:
    shop.execute(
        "insert into shop.customers values (4, 'Zoe Park', 'z@e.com', 'New', '2024-09-09', "
        "'Seoul', 'Korea')"
    )
    shop.execute("insert into shop.orders values (40, 4, '2024-10-01', 'pending')")
    shop.execute("insert into shop.order_items values (400, 40, 1, 2, 25.00, 'none')")
    p4 = chunk(shop, "customer_profile", "4")
    o40 = chunk(shop, "order_detail", "40")
    assert p4 is not None and o40 is not None and o40["parent_id"] == p4["id"]
    assert "1 orders, total spent $50.00" in p4["text"]
    shop.execute("delete from shop.customers where customer_id = 1")  # cascades to its orders
    assert chunk(shop, "customer_profile", "1") is None
    assert chunk(shop, "order_detail", "10") is None
    assert documents.verify(shop) == []


def test_truncate_and_multi_row_statements(shop: psycopg.Connection[Any]) -> None:
    shop.execute("update shop.order_items set return_status = 'none'")  # five rows, one statement
    p1 = chunk(shop, "customer_profile", "1")
    assert p1 is not None and "No returns." in p1["text"]
    shop.execute("truncate shop.order_items")
    # A transaction that truncates a watched table holds an ACCESS EXCLUSIVE lock that other
    # transactions' renders may be waiting for: it renders nothing itself and hands its
    # documents (every one of the types) to the worker, which renders them once it commits.
    queued = shop.execute("select doc_type, keys from pgrag.render_queue order by id").fetchall()
    assert ("customer_profile", None) in queued and ("order_detail", None) in queued
    shop.execute("select pgrag.render_queued()")  # what the worker does
    assert documents.verify(shop) == []
    o10 = chunk(shop, "order_detail", "10")
    assert o10 is not None and "Items: no items." in o10["text"]


def test_product_rename_reaches_every_document_that_mentions_it(
    shop: psycopg.Connection[Any],
) -> None:
    shop.execute("update shop.products set name = 'Ergonomic Mouse' where product_id = 1")
    p1 = chunk(shop, "customer_profile", "1")
    assert p1 is not None and "Ergonomic Mouse (completed, order 10)" in p1["text"]
    assert documents.verify(shop) == []


def test_notify_is_sent_when_text_changes(shop_committed: str) -> None:
    with (
        psycopg.connect(shop_committed, autocommit=True) as listener,
        psycopg.connect(shop_committed, autocommit=True) as writer,
    ):
        listener.execute("listen pgrag_chunks")
        writer.execute("update shop.order_items set quantity = 5 where order_item_id = 200")
        # one wake-up per transaction (pgrag._notify: at most one of the transactions
        # committing at once notifies; the workers look again after each batch)
        assert notified_before_a_marker(listener, writer) == [""]
        writer.execute("update shop.customers set email = 'x@y.z' where customer_id = 2")
        assert notified_before_a_marker(listener, writer) == []  # text unchanged: no wake-up


def notified_before_a_marker(
    listener: psycopg.Connection[Any], writer: psycopg.Connection[Any]
) -> list[str]:
    """The payloads on pgrag_chunks before a marker ``writer`` sends now: notifications are
    delivered in commit order, so what the writer's earlier commits sent has all arrived when
    the marker does (a condition, not a time window)."""
    writer.execute("select pg_notify('pgrag_chunks', 'test marker')")
    got: list[str] = []
    for n in listener.notifies(timeout=PATIENCE_S):
        if n.payload == "test marker":
            return got
        got.append(n.payload)
    raise AssertionError(f"the marker never arrived (before it: {got})")


@pytest.fixture
def shop_committed(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        load_tiny_shop(conn)
    return db_url


def test_rebuild_and_verify_find_and_fix_drift(shop: psycopg.Connection[Any]) -> None:
    shop.execute("set pgrag.sync = off")
    shop.execute("update shop.customers set name = 'Johnny Smith' where customer_id = 1")
    shop.execute("reset pgrag.sync")
    shop.execute("delete from pgrag.chunks where doc_type = 'order_detail' and source_key = '20'")
    shop.execute(
        "insert into pgrag.chunks (doc_type, source_key, text) values ('order_detail', '999', 'x')"
    )
    problems = {(m.doc_type, m.source_key, m.problem) for m in documents.verify(shop)}
    assert ("customer_profile", "1", "stale text") in problems
    assert ("order_detail", "20", "missing") in problems
    assert ("order_detail", "999", "extra") in problems
    assert ("order_detail", "10", "stale text") in problems
    seen: list[tuple[str, int, int]] = []
    stats = documents.rebuild(shop, batch_size=2, progress=lambda *a: seen.append(a))
    assert [s.doc_type for s in stats] == ["customer_profile", "order_detail"]
    assert stats[1].documents == 4
    assert ("order_detail", 4, 4) in seen
    assert documents.verify(shop) == []


def test_list_and_drop_remove_only_their_own(shop: psycopg.Connection[Any]) -> None:
    types = {t.name: t for t in documents.list_types(shop)}
    assert types["order_detail"].parent_type == "customer_profile"
    assert types["customer_profile"].key_type == "integer"
    assert "shop.order_items" in types["customer_profile"].watches
    with pytest.raises(DocumentError, match="parent of order_detail"):
        documents.drop(shop, "customer_profile")
    assert documents.drop(shop, "order_detail") == 4
    triggers = shop.execute(
        "select count(*) from pg_trigger where tgname like 'pgrag_order_detail_%'"
    ).fetchone()
    assert triggers == (0,)
    assert shop.execute("select count(*) from shop.orders").fetchone() == (4,)
    assert chunk(shop, "customer_profile", "1") is not None
    shop.execute("update shop.orders set status = 'delivered' where order_id = 11")  # no error


def test_a_query_source_gets_its_own_view_and_redeclare_replaces(
    shop: psycopg.Connection[Any],
) -> None:
    documents.declare(
        shop,
        "product_card",
        "select product_id as source_key, name || ' is in ' || category as text, "
        "jsonb_build_object('category', category) as metadata from shop.products",
        {"shop.products": "select product_id from changed"},
        metadata_schema={"category": "text"},
    )
    documents.refresh(shop, "product_card")
    assert chunk(shop, "product_card", "3") is not None
    documents.declare(
        shop,
        "product_card",
        "select product_id as source_key, upper(name) as text from shop.products",
        {"shop.products": "select product_id from changed"},
    )
    shop.execute("update shop.products set price = 31 where product_id = 3")
    c = chunk(shop, "product_card", "3")
    assert c is not None and c["text"] == "COOKBOOK"
    assert documents.drop(shop, "product_card") == 3
    assert shop.execute("select to_regclass('pgrag.doc_product_card')").fetchone() == (None,)


BAD_DECLARATIONS = [
    (dict(source="select 1 as source_key"), "lacks required column(s) text"),
    (dict(source="shop.no_such_view"), "neither an existing view or table nor a SELECT"),
    (
        dict(source="select customer_id as source_key, name as text from shop.nope"),
        "does not compile",
    ),
    (
        dict(source="select 1 as source_key, name as text from shop.customers"),
        "yields source_key 1 more than once",
    ),
    (dict(watches={"shop.missing": "select 1 from changed"}), "not an existing table"),
    (dict(watches={"shop.orders": "select no_such_column from changed"}), "does not compile"),
    (dict(parent="no_such_type"), "parent type no_such_type of card does not exist"),
    (dict(parent="customer_profile"), "has no parent_key column"),
    (dict(metadata_schema={"x": "float"}), "unknown types"),
    (dict(name="Bad Name"), "invalid document type name"),
]


@pytest.mark.parametrize(("change", "message"), BAD_DECLARATIONS)
def test_bad_declarations_fail_before_anything_is_created(
    shop: psycopg.Connection[Any], change: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {
        "name": "card",
        "source": "select customer_id as source_key, name as text from shop.customers",
        "watches": {"shop.customers": "select customer_id from changed"},
        "parent": None,
        "metadata_schema": None,
    }
    args.update(change)
    before = shop.execute(
        "select (select count(*) from pg_trigger where tgname like 'pgrag_%'), "
        "(select count(*) from pgrag.doc_types), (select count(*) from pg_class "
        "where relname like 'doc_%')"
    ).fetchone()
    with pytest.raises(DocumentError, match=re.escape(message)):
        documents.declare(
            shop,
            args["name"],
            args["source"],
            args["watches"],
            parent=args["parent"],
            metadata_schema=args["metadata_schema"],
        )
    after = shop.execute(
        "select (select count(*) from pg_trigger where tgname like 'pgrag_%'), "
        "(select count(*) from pgrag.doc_types), (select count(*) from pg_class "
        "where relname like 'doc_%')"
    ).fetchone()
    assert before == after


def test_a_failing_render_is_recorded_and_never_fails_the_write(
    shop: psycopg.Connection[Any],
) -> None:
    documents.declare(
        shop,
        "fragile",
        "select customer_id as source_key, (100 / (city <> 'Madrid')::int)::text as text "
        "from shop.customers where city is not null",
        {"shop.customers": "select customer_id from changed"},
    )
    documents.refresh(shop, "fragile")
    shop.execute("update shop.customers set city = 'Paris' where customer_id = 2")
    assert shop.execute("select count(*) from pgrag.render_errors").fetchone() == (0,)
    before = chunk(shop, "fragile", "2")
    assert before is not None
    # Madrid: a division by zero in the view, for this one document; the others render
    shop.execute(
        "update shop.customers set city = case customer_id when 2 then 'Madrid' else 'Rome' end "
        "where customer_id in (2, 3)"
    )
    row = shop.execute("select city from shop.customers where customer_id = 2").fetchone()
    assert row == ("Madrid",)  # the application's write went through
    assert chunk(shop, "fragile", "2") == before  # the document kept its last render
    errors = shop.execute(
        "select doc_type, source_key, sqlstate, message from pgrag.render_errors"
    ).fetchall()
    assert errors == [("fragile", "2", "22012", "division by zero")]
    problems = [m for m in documents.verify(shop, "fragile") if m.source_key == "2"]
    assert [m.problem for m in problems] == ["render failed (22012): division by zero"]
    # raise, to see it: PR004 naming the type and the key
    with pytest.raises(DocumentError) as err, mapped_database_errors(), shop.transaction():
        shop.execute("select pgrag.refresh('fragile', array['2'], on_error => 'raise')")
    assert err.value.__cause__.sqlstate == "PR004"  # type: ignore[union-attr]
    assert "fragile document 2" in str(err.value) and "division by zero" in str(err.value)
    # fixed: rendered, and its error is gone
    shop.execute("update shop.customers set city = 'Madrid!' where customer_id = 2")
    assert shop.execute("select count(*) from pgrag.render_errors").fetchone() == (0,)
    assert documents.verify(shop, "fragile") == []
    assert json.dumps(documents.list_types(shop)[0].metadata_schema)  # still readable


def test_a_null_text_is_a_render_failure_not_a_missing_document(
    shop: psycopg.Connection[Any],
) -> None:
    """A source row whose text is NULL cannot be stored (23502, recorded); verify called it
    missing and sent the user to a rebuild, which cannot help."""
    documents.declare(
        shop,
        "nulltext",
        "select customer_id as source_key, case when customer_id <> 2 then name end as text "
        "from shop.customers",
        {"shop.customers": "select customer_id from changed"},
    )
    documents.refresh(shop, "nulltext")
    errors = shop.execute(
        "select source_key, sqlstate from pgrag.render_errors where doc_type = 'nulltext'"
    ).fetchall()
    assert errors == [("2", "23502")]
    problems = documents.verify(shop, "nulltext")
    assert [(m.source_key, m.problem) for m in problems] == [
        ("2", "render failed (23502): the source gives this document a NULL text")
    ]


@pytest.mark.parametrize("mode", ["commit", "queue"])
def test_a_renamed_table_never_fails_the_write_nor_leaves_a_document_stale(
    db_url: str, mode: str
) -> None:
    """Key queries are text, and a watched table's generated functions carry its name: after a
    rename (found trying pgrag on a schema of its own) a write to another watched table failed
    at commit, and a write to the renamed table left its document stale without a word. Now the
    write commits, the type goes whole to the worker, and a warning names cause and fix."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        _renamed_tables(conn, db_url, mode)


def _renamed_tables(conn: psycopg.Connection[Any], url: str, mode: str) -> None:
    conn.execute("create table public.a (id int primary key, name text)")
    conn.execute(
        "create table public.b (id int primary key, a_id int references public.a, note text)"
    )
    conn.execute("insert into public.a values (1, 'one'); insert into public.b values (10, 1, 'x')")
    documents.declare(
        conn,
        "a_doc",
        "select a.id as source_key, a.name || ' ' || coalesce((select string_agg(b.note, ',' "
        "order by b.id) from public.b where b.a_id = a.id), '') as text from public.a",
        {
            "public.a": "select id from changed",
            "public.b": "select x.id from changed c join public.a x on x.id = c.a_id",
        },
    )
    documents.refresh(conn, "a_doc")
    if mode == "queue":
        conn.execute("select pgrag.set_sync('a_doc', 'queue')")
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))

    def text() -> str:  # the worker's renders, until the queue is empty
        for _ in range(5):
            taken = conn.execute("select entries from pgrag.render_queued(1000)").fetchone()
            if taken == (0,):
                break
        found = chunk(conn, "a_doc", "1")
        assert found is not None
        return str(found["text"])

    # a table the key query names, renamed: the write to b commits
    conn.execute("alter table public.a rename to a2")
    conn.execute("insert into public.b values (11, 1, 'y')")
    assert conn.execute("select count(*) from public.b").fetchone() == (2,)
    assert text() == "one x,y"  # (queue mode: the worker's render met the failure)
    # the worker's whole-type render counts the type's documents in its lag (it counted 0)
    whole = conn.execute(
        "select documents from pgrag.render_lag where doc_type = 'a_doc' "
        "order by rendered_at desc limit 1"
    ).fetchone()
    assert whole == (1,)
    failed = "key query of document type a_doc for table public.b failed"
    assert any(failed in n and 'relation "public.a" does not exist' in n for n in notices), notices
    # the watched table itself, renamed: its functions carry the old name
    notices.clear()
    conn.execute("alter table public.b rename to b2")
    conn.execute("insert into public.b2 values (12, 1, 'z')")
    assert text() == "one x,y,z"
    assert any("pgrag_docs.keys_a_doc_" in n and "is missing" in n for n in notices), notices
    # the fixes the hint names: `pgrag db upgrade` regenerates the functions under the new
    # name (what is left is the key query naming public.a) ...
    migrate.upgrade(url)
    notices.clear()
    conn.execute("insert into public.b2 values (13, 1, 'w')")
    assert text() == "one x,y,z,w"
    assert notices and not any("is missing" in n for n in notices), notices
    # ... and the type declared again with the tables' current names
    documents.declare(
        conn,
        "a_doc",
        "select a.id as source_key, a.name || ' ' || coalesce((select string_agg(b.note, ',' "
        "order by b.id) from public.b2 b where b.a_id = a.id), '') as text from public.a2 a",
        {
            "public.a2": "select id from changed",
            "public.b2": "select x.id from changed c join public.a2 x on x.id = c.a_id",
        },
    )
    if mode == "queue":
        conn.execute("select pgrag.set_sync('a_doc', 'queue')")
    notices.clear()
    conn.execute("insert into public.b2 values (14, 1, 'v')")
    assert text() == "one x,y,z,w,v"
    assert not notices
    assert documents.verify(conn, "a_doc") == []


def test_a_key_the_source_yields_twice_is_a_render_error_not_a_silent_pick(
    shop: psycopg.Connection[Any],
) -> None:
    """A source that starts yielding one key twice (a join the data made ambiguous) is an
    error of that document, recorded; its chunk keeps its last render (it is not overwritten
    with either row)."""
    shop.execute("create table shop.nick (customer_id int, nick text)")
    shop.execute("insert into shop.nick values (2, 'Ace')")
    documents.declare(
        shop,
        "nicknamed",
        "select n.customer_id as source_key, n.nick as text from shop.nick n",
        {"shop.nick": "select customer_id from changed"},
    )
    documents.refresh(shop, "nicknamed")
    shop.execute("insert into shop.nick values (2, 'Deuce')")
    assert chunk(shop, "nicknamed", "2")["text"] == "Ace"  # type: ignore[index]
    shop.execute("insert into shop.nick values (3, 'Trey'), (3, 'Tres')")  # a new one, twice
    assert chunk(shop, "nicknamed", "3") is None
    errors = shop.execute(
        "select source_key, sqlstate, message from pgrag.render_errors order by source_key"
    ).fetchall()
    assert errors == [
        ("2", "PR004", "the source of nicknamed yields source_key 2 more than once"),
        ("3", "PR004", "the source of nicknamed yields source_key 3 more than once"),
    ]


def test_concurrent_writers_of_one_document_lose_nothing(shop_committed: str) -> None:
    """Two transactions change items of the same customer at once; the chunk ends up with both.

    The second neither waits for the first nor blocks it: documents are rendered at commit
    (each commit re-renders from a snapshot that sees the other's committed change)."""
    import threading

    first = psycopg.connect(shop_committed)
    second = psycopg.connect(shop_committed)
    try:
        first.execute("update shop.order_items set quantity = 7 where order_item_id = 101")
        done = threading.Event()

        def other() -> None:
            second.execute("update shop.order_items set quantity = 9 where order_item_id = 102")
            second.commit()
            done.set()

        t = threading.Thread(target=other, daemon=True)
        t.start()
        wait_for(
            lambda: done.is_set() or waits_on_lock(shop_committed, second.info.backend_pid),
            "the second committed, or waits for a lock",
        )
        assert done.is_set()  # no document lock is held before commit: it does not wait
        t.join(PATIENCE_S)
        first.commit()  # renders customer 1 again, now with the second's committed change
    finally:
        first.close()
        second.close()
    with psycopg.connect(shop_committed) as conn:
        text = conn.execute(
            "select text from pgrag.chunks where doc_type = 'customer_profile' and source_key = '1'"
        ).fetchone()
        assert text is not None
        assert "Cookbook x7" not in text[0]  # order 10 is past the 2 most recent orders
        assert "Bluetooth Headphones x9" in text[0]
        o10 = conn.execute(
            "select text from pgrag.chunks where doc_type = 'order_detail' and source_key = '10'"
        ).fetchone()
        assert o10 is not None and "Cookbook x7" in o10[0]
        assert documents.verify(conn) == []


def test_comparison_types_render_rows_apart_and_stay_in_sync(shop: psycopg.Connection[Any]) -> None:
    from pgrag.lab.sample_documents import declare_sample_documents

    types = declare_sample_documents(shop, recent_orders=2, comparisons=True)
    assert types == ("customer_profile", "order_detail", "table_row", "join_row")
    shop.execute("select pgrag.refresh('table_row')")
    shop.execute("select pgrag.refresh('join_row')")
    counts = dict(
        shop.execute(
            "select doc_type, count(*) from pgrag.chunks where doc_type in "
            "('table_row', 'join_row') group by 1"
        ).fetchall()
    )
    assert counts == {"table_row": 3 + 3 + 4 + 5, "join_row": 5}  # every row apart; every item
    row = chunk(shop, "join_row", "100")
    assert row is not None and row["text"].startswith("Customer John Smith (id 1, VIP) order 10")
    shop.execute("update shop.products set name = 'Optical Mouse' where product_id = 1")
    row = chunk(shop, "join_row", "100")
    assert row is not None and "Optical Mouse" in row["text"]
    assert documents.verify(shop) == []


def test_a_session_with_other_date_settings_renders_the_same_text(
    shop: psycopg.Connection[Any],
) -> None:
    shop.execute("set datestyle = 'SQL, DMY'")
    shop.execute("set timezone = 'Asia/Tokyo'")
    shop.execute("update shop.orders set status = 'delivered' where order_id = 11")
    assert documents.verify(shop) == []
    shop.execute("reset datestyle")  # (psycopg reads timestamps in ISO only)
    shop.execute("reset timezone")
    o11 = chunk(shop, "order_detail", "11")
    assert o11 is not None and "on 2024-01-20: status delivered" in o11["text"]
    assert documents.verify(shop) == []


def test_the_parsers_shop_schemas_match_the_declared_ones(shop: psycopg.Connection[Any]) -> None:
    from tests.shop_fixture import SHOP_SCHEMAS

    declared = {t.name: t.metadata_schema for t in documents.list_types(shop)}
    assert declared == SHOP_SCHEMAS


def test_a_concurrent_move_reaches_the_document_it_moved_to(shop_committed: str) -> None:
    """A re-assigns order 12 to customer 2; B, at the same time, edits order 12's item.

    B's key query ran before A committed and named customer 1 only; after waiting for A, B
    asks again and also re-renders customer 2, which now holds order 12 with B's change.
    """
    import threading

    first = psycopg.connect(shop_committed)
    second = psycopg.connect(shop_committed)
    try:
        first.execute("update shop.orders set customer_id = 2 where order_id = 12")
        errors: list[BaseException] = []

        def other() -> None:
            try:
                second.execute("update shop.order_items set quantity = 5 where order_item_id = 103")
                second.commit()
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=other, daemon=True)
        t.start()
        # B's statement ran (its key query saw order 12 under customer 1) and it committed or
        # waits for A: either way, A commits only now
        wait_for(
            lambda: not t.is_alive() or waits_on_lock(shop_committed, second.info.backend_pid),
            "B committed, or waits for a lock",
        )
        first.commit()
        t.join(PATIENCE_S)
        assert not t.is_alive() and errors == []
    finally:
        first.close()
        second.close()
    with psycopg.connect(shop_committed) as conn:
        p2 = conn.execute(
            "select text from pgrag.chunks where doc_type = 'customer_profile' and source_key = '2'"
        ).fetchone()
        assert p2 is not None and "Bluetooth Headphones x5" in p2[0]
        assert documents.verify(conn) == []


def _waits_on_a_lock(watcher: psycopg.Connection[Any], pid: int) -> bool:
    row = watcher.execute(
        "select wait_event_type = 'Lock' from pg_stat_activity where pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("sync", ["immediate", "commit"])
def test_a_document_lock_no_longer_deadlocks_with_a_later_row_lock(
    shop_committed: str, sync: str
) -> None:
    """docs/reliability.md, Deadlocks: A updates an item of customer 1, B updates customer 1's
    row, A then updates customer 1's row too. Rendering per statement (pgrag.sync = immediate),
    A's first statement holds customer 1's document lock to commit, B's trigger waits for it
    while holding the row A's second statement needs: a deadlock that exists only because of
    pgrag, which is why rendering at commit became the default. At commit, the same
    interleaving is ordinary row locking: A waits for B's commit, and both documents land."""
    import threading

    a = psycopg.connect(shop_committed, autocommit=False)
    b = psycopg.connect(shop_committed, autocommit=False)
    watcher = psycopg.connect(shop_committed, autocommit=True)
    outcome: dict[str, BaseException] = {}
    b_statement_done = threading.Event()
    b_may_commit = threading.Event()
    a_done = threading.Event()
    try:
        for c in (a, b):
            c.execute("set deadlock_timeout = '100ms'")
            c.execute("select set_config('pgrag.sync', %s, false)", (sync,))
            c.commit()

        def run_b() -> None:
            try:
                b.execute("update shop.customers set name = 'Jon Smith' where customer_id = 1")
                b_statement_done.set()
                b_may_commit.wait(PATIENCE_S)
                b.commit()
            except psycopg.Error as exc:
                outcome["b"] = exc
                b.rollback()
                b_statement_done.set()

        def run_a_second() -> None:
            try:
                a.execute("update shop.customers set segment = 'VIP' where customer_id = 1")
                a.commit()
            except psycopg.Error as exc:
                outcome["a"] = exc
                a.rollback()
            a_done.set()

        a.execute("update shop.order_items set quantity = 3 where order_item_id = 102")
        tb = threading.Thread(target=run_b, daemon=True)
        tb.start()
        wait_for(
            lambda: b_statement_done.is_set() or _waits_on_a_lock(watcher, b.info.backend_pid),
            "B finished its statement or waits for a lock",
        )
        # immediate: B waits for customer 1's document lock; commit: B's update is done
        assert b_statement_done.is_set() == (sync == "commit")
        ta = threading.Thread(target=run_a_second, daemon=True)
        ta.start()
        wait_for(
            lambda: (
                a_done.is_set() or "b" in outcome or _waits_on_a_lock(watcher, a.info.backend_pid)
            ),
            "A's second statement ran, or waits for a lock",
        )
        b_may_commit.set()
        ta.join(PATIENCE_S)
        tb.join(PATIENCE_S)
        assert not ta.is_alive() and not tb.is_alive()
    finally:
        b_may_commit.set()
        for c in (a, b, watcher):
            c.close()

    if sync == "immediate":
        assert len(outcome) == 1, outcome  # one of the two is the deadlock's victim
        (victim,) = outcome.values()
        assert isinstance(victim, psycopg.errors.DeadlockDetected), victim
    else:
        assert outcome == {}
        with psycopg.connect(shop_committed) as conn:
            row = conn.execute(
                "select text from pgrag.chunks "
                "where doc_type = 'customer_profile' and source_key = '1'"
            ).fetchone()
            assert row is not None
            assert "Jon Smith" in row[0] and "total spent $400.00" in row[0]
            assert documents.verify(conn) == []
