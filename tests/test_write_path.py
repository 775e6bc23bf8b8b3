"""The write path (issue 18, and issue 15 points 10 to 12): per-document locks, each key query
once, renders that never fail the application's write, the queue mode, TRUNCATE without
deadlocks, bulk statements of any size.

The interleavings are forced with locks and observed in pg_stat_activity (a session waiting on
a lock), never with sleeps; the waits have a bound only so that a broken build fails instead of
hanging.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgrag import documents
from pgrag.worker import Worker

from .conftest import PATIENCE_S, wait_for, waits_on_lock
from .hostile import HashEmbedder
from .shop_fixture import load_tiny_shop


@pytest.fixture
def shop(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        load_tiny_shop(conn)
    return db_url


def profile(url: str, key: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select text from pgrag.chunks where doc_type = 'customer_profile' and source_key = %s",
            (key,),
        ).fetchone()
    assert row is not None
    return str(row[0])


class Background:
    """One statement (or a few) on its own connection in a thread: done, or failed."""

    def __init__(self, url: str, *statements: str, autocommit: bool = True) -> None:
        self.conn = psycopg.connect(url, autocommit=autocommit)
        self.pid = self.conn.info.backend_pid
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(statements,), daemon=True)
        self.thread.start()

    def _run(self, statements: tuple[str, ...]) -> None:
        try:
            for s in statements:
                self.conn.execute(s.encode())
            if not self.conn.autocommit:
                self.conn.commit()
        except BaseException as exc:  # read by the test
            self.error = exc
        finally:
            self.done.set()

    def finish(self) -> None:
        self.thread.join(PATIENCE_S)
        assert not self.thread.is_alive()
        self.conn.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def holder(shop: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(shop)
    yield conn
    conn.close()


def test_writers_of_different_documents_do_not_wait_for_each_other(
    shop: str, holder: psycopg.Connection[Any]
) -> None:
    # A renders customer 1 and holds its document locks until it commits
    holder.execute("update shop.customers set segment = 'Regular' where customer_id = 1")
    holder.execute("select pgrag.sync_now()")
    # B writes customer 2 (another document of the same types): it commits at once
    other = Background(shop, "update shop.customers set segment = 'VIP' where customer_id = 2")
    wait_for(lambda: other.done.is_set() or waits_on_lock(shop, other.pid), "B done or waiting")
    assert other.done.is_set(), "B waited for A: renders of different documents serialized"
    other.finish()
    # C writes customer 1: it waits for A's commit, then renders on A's change
    same = Background(shop, "update shop.customers set name = 'Jon Smith' where customer_id = 1")
    wait_for(lambda: same.done.is_set() or waits_on_lock(shop, same.pid), "C done or waiting")
    assert not same.done.is_set(), "C rendered customer 1 while A held it"
    holder.commit()
    same.finish()
    text = profile(shop, "1")
    assert "Jon Smith" in text and "a Regular customer" in text
    with psycopg.connect(shop) as conn:
        assert documents.verify(conn) == []


def test_a_move_committed_while_waiting_is_found_again(
    shop: str, holder: psycopg.Connection[Any]
) -> None:
    """A moves order 12 from customer 1 to customer 2 and renders both (holding their locks).
    B changes order 12's item: at B's commit its key query still sees order 12 at customer 1
    (A has not committed), B waits for customer 1's lock; A commits; B, seeing that a
    transaction committed meanwhile, runs its key query again, finds customer 2 and renders it
    with its change (A rendered customer 2 without it)."""
    holder.execute("update shop.orders set customer_id = 2 where order_id = 12")
    holder.execute("select pgrag.sync_now()")
    item = Background(shop, "update shop.order_items set quantity = 5 where order_item_id = 103")
    wait_for(lambda: waits_on_lock(shop, item.pid), "B waiting for customer 1's document lock")
    holder.commit()
    item.finish()
    assert "Bluetooth Headphones x5" in profile(shop, "2")
    with psycopg.connect(shop) as conn:
        assert documents.verify(conn) == []


def test_a_move_committed_after_the_statement_is_found_at_commit(
    shop: str, holder: psycopg.Connection[Any]
) -> None:
    """The statement's trigger finds order 12's item at customer 1 (its key query runs there);
    before it commits, another transaction moves order 12 to customer 2 and commits, rendering
    customer 2 without the first one's uncommitted change. At the first one's commit, a
    transaction having committed since its statement, the key query runs again and finds
    customer 2."""
    holder.execute("update shop.order_items set quantity = 5 where order_item_id = 103")
    with psycopg.connect(shop, autocommit=True) as other:
        other.execute("update shop.orders set customer_id = 2 where order_id = 12")
    assert "Bluetooth Headphones x5" not in profile(shop, "2")
    holder.commit()
    assert "Bluetooth Headphones x5" in profile(shop, "2")
    with psycopg.connect(shop) as conn:
        assert documents.verify(conn) == []


@pytest.mark.parametrize("sync", ["commit", "queue"])
def test_truncate_while_another_commits_does_not_deadlock(
    shop: str, holder: psycopg.Connection[Any], sync: str
) -> None:
    """Issue 15, point 10: B truncates order_items and stays open; A updates an order and
    commits: its render of the customer reads order_items and waits for B's lock. B commits.
    Before: B's commit waited for A's document lock, 40P01 every time. Now B, which holds an
    ACCESS EXCLUSIVE lock, renders nothing itself: its documents go to the worker."""
    holder.execute("select set_config('pgrag.sync', %s, false)", (sync,))
    holder.execute("set deadlock_timeout = '50ms'")
    holder.execute("truncate shop.order_items")
    a = Background(
        shop,
        f"set pgrag.sync = {sync}",
        "set deadlock_timeout = '50ms'",
        "update shop.orders set status = 'cancelled' where order_id = 10",
    )
    if sync == "commit":
        wait_for(lambda: waits_on_lock(shop, a.pid), "A's render waiting for B's table lock")
    holder.commit()
    a.finish()  # no DeadlockDetected
    with Worker(shop, HashEmbedder()) as w:
        w.drain()
    with psycopg.connect(shop) as conn:
        assert documents.verify(conn) == []
        order = conn.execute(
            "select text from pgrag.chunks where doc_type = 'order_detail' and source_key = '10'"
        ).fetchone()
    assert order is not None and "status cancelled" in order[0] and "no items" in order[0]


def test_lock_table_while_another_commits_does_not_deadlock(
    shop: str, holder: psycopg.Connection[Any]
) -> None:
    """B locks order_items ACCESS EXCLUSIVE, changes an item of order 10 and stays open; A
    updates order 10 and commits: its render reads order_items and waits for B's lock, holding
    the locks of order 10's documents. B commits: holding an ACCESS EXCLUSIVE lock, it hands
    its documents to the worker instead of waiting for them."""
    holder.execute("set deadlock_timeout = '50ms'")
    holder.execute("lock table shop.order_items in access exclusive mode")
    holder.execute("update shop.order_items set quantity = 7 where order_id = 10")
    a = Background(
        shop,
        "set deadlock_timeout = '50ms'",
        "update shop.orders set status = 'cancelled' where order_id = 10",
    )
    wait_for(lambda: waits_on_lock(shop, a.pid), "A's render waiting for B's table lock")
    holder.commit()
    a.finish()  # no DeadlockDetected
    with psycopg.connect(shop) as conn:
        queued = conn.execute("select count(*) from pgrag.render_queue").fetchone()
    assert queued is not None and queued[0] > 0  # B's documents, for the worker
    with Worker(shop, HashEmbedder()) as w:
        w.drain()
    with psycopg.connect(shop) as conn:
        assert documents.verify(conn) == []


def test_each_key_query_runs_once_per_statement(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        load_tiny_shop(conn)
        conn.execute("set track_functions = 'all'")
        calls = (
            "select coalesce(sum(calls), 0) from pg_stat_xact_user_functions "
            "where schemaname = 'pgrag_docs' and funcname like %s"
        )
        moved = "select pgrag._committed_between(%s, pg_current_snapshot())"
        with conn.transaction():
            before = conn.execute("select pg_current_snapshot()").fetchone()
            conn.execute("update shop.order_items set quantity = 4 where order_item_id = 103")
            conn.execute("select pgrag.sync_now()")
            # both key queries ran inside their triggers, once, over the statement's rows:
            # order_detail's reads `changed` alone; customer_profile's reads shop.orders, and
            # unless a transaction (autovacuum's ANALYZE, say) committed between the statement
            # and the render, the commit does not ask it again over the recorded rows
            keys = conn.execute(calls, ("keys_customer_profile_%",)).fetchone()
            syncs = conn.execute(calls, ("sync_%",)).fetchone()
            stores = conn.execute(calls, ("store_%",)).fetchone()
            meanwhile = conn.execute(moved, before).fetchone()
        assert syncs == (2,) and stores == (2,)
        assert keys == (0,) or meanwhile == (True,)
        with conn.transaction():
            conn.execute("update shop.order_items set quantity = 5 where order_item_id = 103")
            with psycopg.connect(db_url, autocommit=True) as other:  # commits meanwhile
                other.execute("update shop.customers set segment = 'VIP' where customer_id = 3")
            conn.execute("select pgrag.sync_now()")
            # it may have moved the row to another customer: asked again at the render
            keys = conn.execute(calls, ("keys_customer_profile_%",)).fetchone()
        assert keys is not None and keys[0] >= 1
        with conn.transaction():  # rows of more than one entry: the key query runs at commit
            conn.execute(
                "insert into shop.order_items (order_item_id, order_id, product_id, quantity, "
                "unit_price) select 100000 + g, 12, 2, 1, 80 from generate_series(1, 1001) g"
            )
            conn.execute("select pgrag.sync_now()")
            keys = conn.execute(calls, ("keys_customer_profile_%",)).fetchone()
        assert keys is not None and keys[0] >= 1
        reads: dict[str, str] = dict(
            conn.execute(
                "select doc_type || ' ' || source_table::text, coalesce(reads::text, 'null') "
                "from pgrag.doc_watches where source_table = 'shop.order_items'::regclass"
            ).fetchall()
        )
    assert reads == {
        "customer_profile shop.order_items": "{shop.orders}",
        "order_detail shop.order_items": "{}",
    }


def test_queue_mode_renders_in_the_worker(shop: str) -> None:
    with psycopg.connect(shop, autocommit=True) as conn:
        documents.set_sync(conn, "customer_profile", "queue")
        before = profile(shop, "1")
        conn.execute("update shop.customers set name = 'Johnny Smith' where customer_id = 1")
        assert profile(shop, "1") == before  # committed; the document waits for the worker
        queued = conn.execute("select doc_type, keys from pgrag.render_queue").fetchall()
        assert queued == [("customer_profile", ["1"])]
        # order_detail is still rendered at commit
        row = conn.execute(
            "select text from pgrag.chunks where doc_type = 'order_detail' and source_key = '10'"
        ).fetchone()
        assert row is not None and "Johnny Smith" in row[0]
        with Worker(shop, HashEmbedder()) as w:
            r = w.drain()
        assert r.rendered_entries == 1 and "Johnny Smith" in profile(shop, "1")
        st = conn.execute("select render_queued, render_lag, render_errors from pgrag.status()")
        row = st.fetchone()
        assert row is not None and row[0] == 0 and row[2] == 0
        assert row[1]["documents"] == 1 and row[1]["p50_ms"] >= 0
        assert documents.verify(conn) == []
        # a session may force either mode
        conn.execute("set pgrag.sync = commit")
        conn.execute("update shop.customers set name = 'John Smith' where customer_id = 1")
        assert "John Smith" in profile(shop, "1")


def test_a_bulk_statement_records_its_rows_in_batches(shop: str) -> None:
    """Issue 15, point 11: the rows of a statement were one array (`array_agg(r)::text`),
    past PostgreSQL's 1 GB for a 300,000-row update of 2 KB rows. They go in entries of 1,000
    rows (bench/sync_bench.py runs the million-row update)."""
    with psycopg.connect(shop) as conn:
        conn.execute(
            "insert into shop.order_items select 1000 + g, 10 + g % 3, 1, 1, 1.00, 'none' "
            "from generate_series(1, 4500) g"
        )
        entries = conn.execute(
            "select count(*), max(length(changed)) from pgrag.sync_queue "
            "where doc_type = 'customer_profile'"
        ).fetchone()
        assert entries is not None and entries[0] == 5  # 4,500 rows: 5 entries
        conn.commit()
        assert documents.verify(conn) == []


def test_the_keys_of_recorded_rows_come_out_once_per_document(shop: str) -> None:
    """pgrag._keys_of_rows over entries of two types, each from two tables in several entries
    (a batch per table, so a type's keys come from several key queries): each type's keys are
    its documents, each once and sorted, as the key queries give them over all the rows at
    once; a type the commit renders whole is passed over. (A type's keys are merged into the
    result once, when its entries end: merged batch by batch, the result was sorted again at
    every batch, quadratic in a statement's rows, docs/benchmarks.md.)"""
    with psycopg.connect(shop) as conn:
        conn.execute(
            """declare entries no scroll cursor for
               with items as (select i.order_item_id as n, i::text as r from shop.order_items i),
                    orders as (select o.order_id as n, o::text as r from shop.orders o),
                    rows as (select 'shop.order_items'::regclass as t, n, r from items
                             union all select 'shop.orders'::regclass, n, r from orders)
               select d.doc_type, rows.t as source_table, array_agg(rows.r order by rows.n)::text
                      as rows
                 from rows, (values ('customer_profile'), ('order_detail'), ('gone')) d(doc_type)
                group by d.doc_type, rows.t, rows.n % 3
                order by 1, 2"""
        )
        got = conn.execute("""select pgrag._keys_of_rows('entries', '{"gone": null}')""").fetchone()
        assert got is not None
        expected = conn.execute(
            """select jsonb_build_object(
                   'customer_profile', (select jsonb_agg(distinct o.customer_id::text
                                                         order by o.customer_id::text)
                                          from shop.orders o),
                   'order_detail', (select jsonb_agg(distinct o.order_id::text
                                                     order by o.order_id::text)
                                      from shop.orders o))"""
        ).fetchone()
        assert expected is not None
    assert got[0] == expected[0]
    assert len(got[0]["order_detail"]) > 3  # (the tiny shop has orders in every entry)


def test_a_transaction_of_many_statements_renders_each_document_once(shop: str) -> None:
    """Each statement's keys are appended to the transaction's pending set (pgrag.pending, a
    line each) and merged once at commit: merged at every statement, a transaction's 4,000th
    single-row update cost 2.5 ms where its first cost 0.1 (docs/benchmarks.md). Many
    statements, the same documents several times, two types: every document rendered, once."""
    with psycopg.connect(shop) as conn:
        items = conn.execute(
            "select order_item_id, order_id from shop.order_items order by 1"
        ).fetchall()
        assert len(items) >= 5
        for _round in range(3):
            for item, _order in items:
                conn.execute(
                    "update shop.order_items set quantity = quantity + 1 where order_item_id = %s",
                    (item,),
                )
        pending = conn.execute("select current_setting('pgrag.pending', true)").fetchone()
        assert pending is not None and pending[0].count("\n") >= 3 * len(items) - 1
        merged = conn.execute(
            "select pgrag._todo_of_lines(current_setting('pgrag.pending', true))"
        ).fetchone()
        assert merged is not None
        orders = sorted({str(o) for _i, o in items})
        assert merged[0]["order_detail"] == orders  # each once, sorted as text
        conn.commit()
        assert documents.verify(conn) == []
        # the same document 3,000 times: the lines, merged when they reach 32 KB, stay small,
        # and no key spills to pgrag.sync_queue (its entries here are the rows of the type
        # whose key query reads other tables)
        conn.execute(
            sql.SQL(
                "do $$ begin for i in 1..3000 loop update shop.order_items "
                "set quantity = quantity + 1 where order_item_id = {}; end loop; end $$"
            ).format(sql.Literal(int(items[0][0])))
        )
        held = conn.execute(
            "select octet_length(current_setting('pgrag.pending', true)), "
            "(select count(*) from pgrag.sync_queue "
            " where xid = pg_current_xact_id() and changed is null)"
        ).fetchone()
        assert held is not None and held[0] < 32100 and held[1] == 0
        conn.commit()
        assert documents.verify(conn) == []
    with psycopg.connect(shop) as conn:
        assert conn.execute(
            "select pgrag._todo_of_lines(%s)",
            ('{"a": ["2", "1"]}\n{"b": null}\n{"a": ["1", "3"]}\n\n{"b": ["x"]}',),
        ).fetchone() == ({"a": ["1", "2", "3"], "b": None},)
        assert conn.execute("select pgrag._todo_of_lines(null)").fetchone() == ({},)
        # lines that share no type (a commit's statement writes one a type) are joined as they
        # are, with no query; a type in two lines with other keys is merged, each key once
        assert conn.execute(
            "select pgrag._todo_of_lines(%s)", ('{"a": ["2", "1"]}\n{"b": null}\n{"c": []}',)
        ).fetchone() == ({"a": ["2", "1"], "b": None, "c": []},)
        assert conn.execute(
            "select pgrag._todo_of_lines(%s)", ('{"a": ["1"]}\n{"a": ["1"]}\n{"b": ["9"]}',)
        ).fetchone() == ({"a": ["1"], "b": ["9"]},)
        assert conn.execute(
            "select pgrag._todo_merge(%s, %s)", ('{"a": ["2"], "b": ["1"]}', '{"a": ["1"]}')
        ).fetchone() == ({"a": ["1", "2"], "b": ["1"]},)
        assert conn.execute(
            "select pgrag._todo_merge(%s, %s)", ('{"a": ["2"]}', '{"b": null}')
        ).fetchone() == ({"a": ["2"], "b": None},)


def test_documents_whose_locks_are_held_elsewhere_are_named_not_waited_for(shop: str) -> None:
    """pgrag._lock_documents without waiting (a commit's keys found after its locks) takes
    what is free and names the documents of each lock held elsewhere: a key's, every key of a
    bucket held for a bulk render, a whole type. With waiting it takes them all, in order."""
    many = [str(k) for k in range(1000, 1040)]  # over 32 keys: each bucket exclusive
    with psycopg.connect(shop) as holder, psycopg.connect(shop) as conn:
        holder.execute(
            "select pgrag._lock_documents(%s::jsonb, true)",
            (json.dumps({"t": ["1"], "u": None, "v": [many[0]]}),),
        )
        got = conn.execute(
            "select pgrag._lock_documents(%s::jsonb, false)",
            (json.dumps({"t": ["1", "2"], "u": ["5"], "v": many, "w": ["7"]}),),
        ).fetchone()
        bucket = conn.execute(
            "select array_agg(k order by k) from unnest(%s::text[]) k "
            "where hashtext(k) & 255 = hashtext(%s) & 255",
            (many, many[0]),
        ).fetchone()
        assert got is not None and bucket is not None
        assert {t: (sorted(v) if v is not None else None) for t, v in got[0].items()} == {
            "t": ["1"],
            "u": None,
            "v": sorted(bucket[0]),
        }
        conn.rollback()
        holder.rollback()
        conn.execute(
            "select pgrag._lock_documents(%s::jsonb, true)",
            (json.dumps({"t": ["1", "2"], "u": None, "v": many}),),
        )
        held = conn.execute(
            "select count(*) filter (where mode = 'ShareLock'), "
            "count(*) filter (where mode = 'ExclusiveLock') from pg_locks "
            "where pid = pg_backend_pid() and locktype = 'advisory'"
        ).fetchone()
        buckets = conn.execute(
            "select count(distinct hashtext(k) & 255) from unnest(%s::text[]) k", (many,)
        ).fetchone()
        # shared: t's type lock and its two keys' buckets (one, if they share it), v's type
        # lock; exclusive: u's type, t's two keys, v's buckets
        assert held is not None and buckets is not None
        assert held[1] == 1 + 2 + buckets[0] and held[0] in (3, 4)


def test_an_oversized_document_is_cut_and_says_so(shop: str) -> None:
    """Issue 15, point 12: a 1.8 MB text failed the application's INSERT ("string is too long
    for tsvector"). It is stored cut to pgrag's limit, and the chunk says how long it was."""
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute(
            "create table shop.notes (id integer primary key, body text not null); "
            "select pgrag.declare_document('note', 'select id as source_key, body as text "
            'from shop.notes\', \'{"shop.notes": "select id from changed"}\')'
        )
        words = " ".join(f"w{i:07d}" for i in range(200_000))  # 1.8 MB of distinct words
        conn.execute("insert into shop.notes values (1, %s), (2, 'short')", (words,))
        rows = conn.execute(
            "select source_key, length(text), truncated_from, tsv is not null "
            "from pgrag.chunks where doc_type = 'note' order by 1"
        ).fetchall()
        limit = conn.execute("select pgrag._limit('document_chars')").fetchone()
        assert limit is not None
        assert rows == [("1", limit[0], len(words), True), ("2", 5, None, True)]
        assert documents.verify(conn) == []


def test_a_failing_document_does_not_stop_a_rebuild(shop: str) -> None:
    """Issue 15, point 12: `pgrag rebuild` stopped at a document it could not render, without
    naming it, and left the rest of its batch stale."""
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute(
            "select pgrag.declare_document('fragile', 'select customer_id as source_key, "
            "(100 / (customer_id <> 2)::int)::text as text from shop.customers', "
            '\'{"shop.customers": "select customer_id from changed"}\')'
        )
        (stats,) = documents.rebuild(conn, "fragile")
        assert stats.errors == 1 and stats.documents >= 3
        stored = conn.execute(
            "select count(*) from pgrag.chunks where doc_type = 'fragile'"
        ).fetchone()
        assert stored == (stats.documents - 1,)
        problems = [(m.source_key, m.problem) for m in documents.verify(conn, "fragile")]
        assert problems == [("2", "render failed (22012): division by zero")]


def test_a_commit_writes_the_tsvector_unless_asked_to_leave_it_to_the_worker(shop: str) -> None:
    """A render at a writer's commit writes each changed chunk's tsvector with its text, a
    worker running or not (one row version a change: docs/benchmarks.md, "The tsvector at
    commit again"). A session that sets pgrag.tsvector = worker leaves it NULL for the worker
    while one fills tsvectors in, as it leaves the vector; a full-text search matches and ranks
    the new text at once, exactly as once the worker has filled it in; a refresh, which runs
    outside the writer's commit, writes it itself (and one found missing), as every commit does
    when no worker has run lately. Any other value of the setting is the default."""
    from pgrag.search import search

    chunk = (
        "select tsv is null from pgrag.chunks "
        "where doc_type = 'customer_profile' and source_key = '2'"
    )
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("set pgrag.tsvector = worker")
        conn.execute("update shop.customers set name = 'Ana Lima-Santos' where customer_id = 2")
        assert conn.execute(chunk).fetchone() == (False,)  # no worker yet: nothing would fill it
        conn.execute("reset pgrag.tsvector")  # ('' now, no longer unset: the default too)
        conn.execute("select pgrag.index_text()")  # what a worker does (and says it does)
        conn.execute("update shop.customers set name = 'Ana Lima-Souza' where customer_id = 2")
        assert conn.execute(chunk).fetchone() == (False,)  # the default: written at commit
        conn.execute("set pgrag.tsvector = 'workers'")  # (not a value it knows: the default)
        conn.execute("update shop.customers set name = 'Ana Lima-Silva' where customer_id = 2")
        assert conn.execute(chunk).fetchone() == (False,)
        conn.execute("set pgrag.tsvector = 'worker'")
        conn.execute("update shop.customers set name = 'Ana Zyxwvut' where customer_id = 2")
        assert "Zyxwvut" in profile(shop, "2")
        assert conn.execute(chunk).fetchone() == (True,)

        def found() -> list[tuple[str, str, float | None]]:
            hits = search(conn, "zyxwvut", mode="text").hits
            return [(h.doc_type, h.source_key, h.text_score) for h in hits]

        before = found()
        assert ("customer_profile", "2") in [h[:2] for h in before]
        filled = conn.execute("select pgrag.index_text()").fetchone()
        assert filled is not None and filled[0] >= 1
        assert conn.execute(chunk).fetchone() == (False,)
        assert conn.execute(
            "select count(*) from pgrag.chunks where tsv is distinct from pgrag.text_tsvector(text)"
        ).fetchone() == (0,)
        assert found() == before  # the same hits, the same ranks and scores

        conn.execute("set pgrag.sync = off")
        conn.execute("update shop.customers set name = 'Ana Qwertzu' where customer_id = 2")
        conn.execute("reset pgrag.sync")
        documents.refresh(conn, "customer_profile", ["2"])
        documents.refresh(conn, "order_detail")  # (its orders name the customer too)
        assert "Qwertzu" in profile(shop, "2")
        assert conn.execute(chunk).fetchone() == (False,)  # written with the text
        assert documents.verify(conn) == []
        # a tsvector missing from a chunk whose text did not change: a refresh writes it
        conn.execute("update pgrag.chunks set tsv = null where doc_type = 'customer_profile'")
        documents.refresh(conn, "customer_profile")
        left = "select count(*) from pgrag.chunks where tsv is null"
        assert conn.execute(left).fetchone() == (0,)
        # no worker lately: commits write the tsvector themselves
        conn.execute("update pgrag.settings set text_indexed_at = now() - interval '2 minutes'")
        conn.execute("update shop.customers set name = 'Ana Lima' where customer_id = 2")
        assert conn.execute(chunk).fetchone() == (False,)


def test_the_worker_fills_in_the_tsvectors_a_commit_left(shop: str) -> None:
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("set pgrag.tsvector = worker")
        conn.execute("select pgrag.index_text()")  # a worker ran: commits leave them to it
        conn.execute("update shop.customers set segment = 'VIP'")
        waiting = "select count(*) from pgrag.chunks where tsv is null"
        left = conn.execute(waiting).fetchone()
        assert left is not None and left[0] > 0
        with Worker(shop, HashEmbedder()) as w:
            result = w.drain()
        assert result.indexed >= left[0]
        assert conn.execute(waiting).fetchone() == (0,)


def test_only_a_small_commit_leaves_tsvectors_and_only_a_commit_does(shop: str) -> None:
    """A commit of more than 100 documents writes their tsvectors itself (left to the worker,
    each search would compute them all until it caught up: 1-2 s a search at 33,000); a session
    that sets pgrag.defer_tsv itself changes nothing; and the worker's stamp never waits for
    the settings row (a commit's render waited behind it: found by review)."""
    waiting = "select count(*) from pgrag.chunks where doc_type = 'note' and tsv is null"
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute(
            "create table shop.notes (id integer primary key, body text not null); "
            "select pgrag.declare_document('note', 'select id as source_key, body as text "
            'from shop.notes\', \'{"shop.notes": "select id from changed"}\')'
        )
        conn.execute("insert into shop.notes select g, 'note ' || g from generate_series(1, 150) g")
        conn.execute("set pgrag.tsvector = worker")
        conn.execute("select pgrag.index_text()")  # a worker is running
        conn.execute("update shop.notes set body = body || ' again' where id <= 100")
        assert conn.execute(waiting).fetchone() == (100,)  # small: left to the worker
        conn.execute("select pgrag.index_text()")
        conn.execute("update shop.notes set body = body || ' and again'")
        assert conn.execute(waiting).fetchone() == (0,)  # 150 documents: written with them
        conn.execute("set pgrag.defer_tsv = on")
        conn.execute("set pgrag.sync = off")
        conn.execute("update shop.notes set body = body || '!'")
        documents.refresh(conn, "note")
        assert conn.execute(waiting).fetchone() == (0,)
        conn.execute("reset pgrag.defer_tsv")
        conn.execute("reset pgrag.sync")
        assert documents.verify(conn) == []
    with psycopg.connect(shop) as holder, psycopg.connect(shop, autocommit=True) as worker:
        worker.execute("update pgrag.settings set text_indexed_at = null")  # a stamp is due
        holder.execute("select 1 from pgrag.settings for share")  # as store_embeddings does
        worker.execute("set lock_timeout = '5s'")  # waiting would fail, not hang
        assert worker.execute("select pgrag.index_text()").fetchone() == (0,)
        holder.rollback()
        assert worker.execute("select pgrag.index_text()").fetchone() == (0,)
        stamped = worker.execute("select text_indexed_at is not null from pgrag.settings")
        assert stamped.fetchone() == (True,)  # the next call, with the row free


def test_the_worker_moves_the_gin_pending_lists_so_that_no_commit_does(shop: str) -> None:
    """A commit's chunks add their metadata's (and full text's) entries to the pending lists of
    the store's GIN indexes; an insert that finds one past gin_pending_list_limit moves all of
    it into its index, in some writer's commit (0.1-0.8 s at 100,000 customers,
    docs/benchmarks.md). The worker moves them after each text batch, with
    pgrag.clean_pending_lists: a definer, since only the indexes' owner may clean them, which
    any writer may call."""
    role = f"pgrag_t_cpl_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(shop, autocommit=True) as conn:
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
        conn.execute(
            sql.SQL("create role {} in role {}").format(
                sql.Identifier(role), sql.Identifier(writer[0])
            )
        )
        conn.execute("alter table pgrag.chunks set (autovacuum_enabled = off)")  # (it cleans)
        items = [r[0] for r in conn.execute("select order_item_id from shop.order_items")]

        def write() -> None:
            for item in items:
                conn.execute(
                    "update shop.order_items set quantity = quantity + 1 where order_item_id = %s",
                    (item,),
                )

        write()
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select gin_clean_pending_list('pgrag.chunks_metadata_gin')")
        moved = conn.execute("select pgrag.clean_pending_lists()").fetchone()
        again = conn.execute("select pgrag.clean_pending_lists()").fetchone()
        conn.execute("reset role")
        assert moved is not None and moved[0] > 0 and again == (0,)
        write()
        with Worker(shop, HashEmbedder()) as w:
            w.index_text_batch()
        assert conn.execute("select pgrag.clean_pending_lists()").fetchone() == (0,)
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def test_a_worker_that_cannot_move_the_pending_lists_says_so_once_and_goes_on(
    shop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database upgraded from an earlier build of this revision has no
    pgrag.clean_pending_lists (or a DBA revoked it): the worker fills in the full text still,
    and warns once, not at every batch."""
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("drop function pgrag.clean_pending_lists()")
        conn.execute("update shop.order_items set quantity = quantity + 1")
        with Worker(shop, HashEmbedder()) as w, caplog.at_level("WARNING", logger="pgrag"):
            w.index_text_batch()
            w.index_text_batch()
        warned = [r for r in caplog.records if "pending lists" in r.getMessage()]
        assert len(warned) == 1 and "pgrag db upgrade" in warned[0].getMessage()
        left = conn.execute("select count(*) from pgrag.chunks where tsv is null").fetchone()
        assert left == (0,)
