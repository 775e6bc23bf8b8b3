"""The statistics cache: a cached result is used only when it equals what the query returns.

Every test compares the statistics a search gets with the declared query run afresh over the
same snapshot (``reference``), through the writes, snapshots and transactions that could make
a cached result stale (sql/idempotent/40_stats_int.sql has the three conditions).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgrag import migrate, stats_cache
from pgrag import search as s
from pgrag.db import connect
from pgrag.errors import DocumentError
from pgrag.lab import synthetic

from .conftest import PATIENCE_S, run_pgrag, start_horizon, wait_for, waits_on_lock
from .shop_fixture import load_tiny_shop
from .stats_reference import declared_stats
from .test_security import as_role

VIP = {"segment": "VIP"}
DELIVERED = {"status": "delivered"}


@pytest.fixture
def shop_url(db_url: str) -> Iterator[str]:
    """The tiny shop, committed, with both types' statistics cached (sql/sample/shop_stats.sql)."""
    with psycopg.connect(db_url) as conn:
        load_tiny_shop(conn)
    start_horizon(db_url)
    yield db_url


def stats(conn: psycopg.Connection[Any], flt: dict[str, Any]) -> dict[str, Any]:
    """What a search reports (the cache used when it may)."""
    return s.stats(conn, filter=flt)


def reference(conn: psycopg.Connection[Any], flt: dict[str, Any]) -> dict[str, Any]:
    """The declared queries run afresh over the same snapshot, never the cache."""
    types = [r[0] for r in conn.execute("select doc_type from pgrag.doc_stats")]
    return {t: declared_stats(conn, t, containment=flt) for t in types}


def cached_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(doc_type, snapshot) of every cached result: unchanged between two calls = a hit."""
    return conn.execute(
        "select doc_type, snap::text, computed_at from pgrag.stats_cache order by 1, 2"
    ).fetchall()


def revenue(result: dict[str, Any]) -> float:
    return float(result["customer_profile"]["revenue"])


def test_a_repeated_filter_is_served_from_the_cache_until_a_write(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        first = stats(conn, VIP)
        assert first == reference(conn, VIP)
        stored = cached_rows(conn)
        assert [r[0] for r in stored] == ["customer_profile", "order_detail"]
        assert stats(conn, VIP) == first and cached_rows(conn) == stored  # a hit: not recomputed
        # a vector stored by the worker changes no statistics: still a hit
        conn.execute("update pgrag.chunks set embedding_model = 'x', embedded_at = now()")
        assert stats(conn, VIP) == first and cached_rows(conn) == stored
        # a write to a table the query reads: recomputed, and exact
        conn.execute(
            "update shop.order_items set quantity = quantity + 1 where order_item_id = 102"
        )
        after = stats(conn, VIP)
        assert after == reference(conn, VIP) and revenue(after) == revenue(first) + 80
        assert cached_rows(conn) != stored


def test_the_first_store_on_a_new_server_waits_for_a_quiet_snapshot(db_url: str) -> None:
    """The horizon's first start (a new install, a restart, a restored dump) drops the recorded
    writes it cannot vouch for, so a result computed before it, while another transaction
    ran, is not stored; the next one is, and it is exact."""
    with psycopg.connect(db_url) as conn:
        load_tiny_shop(conn)
    with (
        psycopg.connect(db_url, autocommit=True) as conn,
        psycopg.connect(db_url, autocommit=True) as other,
    ):
        other.execute("begin")
        other.execute("select pg_current_xact_id()")  # running, with an xid, at the snapshot
        conn.execute("select pg_current_xact_id()")  # a later one ended: the first in progress
        first = stats(conn, VIP)
        assert first == reference(conn, VIP) and cached_rows(conn) == []
        other.execute("commit")
        start_horizon(db_url)  # (the horizon stands; this waits out other tests' transactions)
        assert stats(conn, VIP) == first
        stored = cached_rows(conn)
        assert [r[0] for r in stored] == ["customer_profile", "order_detail"]
        assert stats(conn, VIP) == first and cached_rows(conn) == stored  # a hit


@pytest.mark.parametrize(
    "write",
    [
        "insert into shop.orders values (13, 1, '2024-03-01', 'delivered')",
        "delete from shop.order_items where order_item_id = 103",
        "update shop.orders set status = 'cancelled' where order_id = 12",
        "truncate shop.order_items",
        "update shop.customers set segment = 'Regular' where customer_id = 1",
    ],
)
def test_every_kind_of_write_invalidates(shop_url: str, write: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        for flt in (VIP, DELIVERED):
            stats(conn, flt)
        conn.execute(write)
        for flt in (VIP, DELIVERED):
            assert stats(conn, flt) == reference(conn, flt)


def test_a_transaction_sees_its_own_writes_and_a_rollback_leaves_the_cache_exact(
    shop_url: str,
) -> None:
    with psycopg.connect(shop_url) as conn:
        before = stats(conn, VIP)
        conn.commit()
        conn.execute("update shop.order_items set unit_price = 1000 where order_item_id = 102")
        conn.execute("select pgrag.sync_now()")  # render now, as the commit would
        inside = stats(conn, VIP)
        assert inside == reference(conn, VIP) and revenue(inside) == revenue(before) + 920
        conn.rollback()
        assert stats(conn, VIP) == before == reference(conn, VIP)


def test_a_transaction_that_writes_after_computing_leaves_no_stale_result(shop_url: str) -> None:
    with psycopg.connect(shop_url) as a, psycopg.connect(shop_url, autocommit=True) as b:
        # without a transaction id when it computes, then with one
        for first_write in (None, "update shop.products set name = name where product_id = 3"):
            if first_write:
                a.execute(first_write)  # a table the statistics do not read
            stats(a, VIP)  # computed and stored by a
            a.execute("update shop.order_items set quantity = quantity + 1")
            a.commit()
            assert stats(b, VIP) == reference(b, VIP)


def test_snapshots_never_mix(shop_url: str) -> None:
    with (
        psycopg.connect(shop_url) as old,
        psycopg.connect(shop_url, autocommit=True) as new,
    ):
        old.execute("set transaction isolation level repeatable read")
        before = stats(old, VIP)  # the old snapshot's result, cached
        new.execute("update shop.order_items set quantity = 5 where order_item_id = 100")
        # a newer snapshot does not get the older result ...
        current = stats(new, VIP)
        assert current == reference(new, VIP) and current != before
        # ... and the older snapshot does not get the newer one
        assert stats(old, VIP) == before == reference(old, VIP)
        old.commit()
        assert stats(old, VIP) == current


def test_a_read_only_transaction_computes_without_storing(shop_url: str) -> None:
    with psycopg.connect(shop_url) as conn:
        conn.execute("set transaction read only")
        assert stats(conn, VIP) == reference(conn, VIP)
        assert cached_rows(conn) == []


def test_redeclaring_the_query_drops_its_results_and_rereads_its_tables(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        stats(conn, VIP)
        conn.execute(
            "select pgrag.declare_stats('customer_profile', $q$select jsonb_build_object("
            "'products', (select count(*) from shop.products), 'customers', count(*)) "
            "from hits$q$)"
        )
        deps = conn.execute(
            "select cache_deps::text[] from pgrag.doc_stats where doc_type = 'customer_profile'"
        ).fetchone()
        assert deps == (["pgrag.chunks", "pgrag.doc_stats", "shop.products"],)
        assert stats(conn, VIP)["customer_profile"] == {"products": 3, "customers": 1}
        conn.execute("insert into shop.products values (4, 'Lamp', 'Home', 20)")
        assert stats(conn, VIP)["customer_profile"] == {"products": 4, "customers": 1}


@pytest.mark.parametrize(
    ("query", "cause"),
    [
        ("select jsonb_build_object('n', count(*), 'at', now()) from hits", "now()"),
        ("select jsonb_build_object('d', current_date, 'n', count(*)) from hits", "CURRENT_DATE"),
        ("select jsonb_build_object('r', random()) from hits", "volatile"),
        ("select jsonb_build_object('n', shop.my_count()) from hits", "a function of yours"),
        ("select jsonb_build_object('n', count(*)) from hits, shop.mv", "materialized view"),
    ],
)
def test_a_query_that_can_change_with_no_write_is_not_cached(
    shop_url: str, query: str, cause: str
) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute(
            "create function shop.my_count() returns bigint language sql stable "
            "return (select count(*) from shop.orders)"
        )
        conn.execute("create materialized view shop.mv as select 1 as one")
        conn.execute("select pgrag.cache_stats('order_detail', false)")
        conn.execute("select pgrag.declare_stats('order_detail', %s)", (query,))
        with pytest.raises(DocumentError, match=f"cannot be cached: .*{cause}"):
            stats_cache.set_cached(conn, "order_detail")
        # and redeclaring a cached type with such a query is refused, nothing changed
        with pytest.raises(psycopg.Error, match="cannot be cached"):
            conn.execute("select pgrag.declare_stats('customer_profile', %s)", (query,))
        assert "orders" in str(
            conn.execute(
                "select stats_sql from pgrag.doc_stats where doc_type = 'customer_profile'"
            ).fetchone()
        )


def test_a_table_whose_trigger_is_gone_or_disabled_is_never_served_stale(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        stats(conn, VIP)
        conn.execute("alter table shop.order_items disable trigger pgrag_stats_changed")
        conn.execute("update shop.order_items set quantity = 9")
        assert stats(conn, VIP) == reference(conn, VIP)
        conn.execute("alter table shop.order_items enable always trigger pgrag_stats_changed")
        # a table dropped and recreated under the same name has no trigger: computed every time
        conn.execute("alter table shop.order_items rename to order_items_old")
        conn.execute("create table shop.order_items (like shop.order_items_old including all)")
        conn.execute("insert into shop.order_items select * from shop.order_items_old")
        conn.execute("drop table shop.order_items_old cascade")
        stats(conn, VIP)
        conn.execute("delete from shop.order_items where order_item_id = 102")
        assert stats(conn, VIP) == reference(conn, VIP)
        # cache_stats again puts the trigger on the new table
        tables = stats_cache.set_cached(conn, "customer_profile")
        assert "shop.order_items" in tables
        stats(conn, VIP)
        conn.execute("delete from shop.order_items where order_item_id = 103")
        assert stats(conn, VIP) == reference(conn, VIP)


def test_removing_the_statistics_removes_the_triggers_no_type_needs(shop_url: str) -> None:
    def watched(conn: psycopg.Connection[Any]) -> list[str]:
        rows = conn.execute(
            "select tgrelid::regclass::text from pg_trigger "
            "where tgname = 'pgrag_stats_changed' order by 1"
        ).fetchall()
        return [r[0] for r in rows]

    with psycopg.connect(shop_url, autocommit=True) as conn:
        both = [
            "pgrag.chunks",
            "pgrag.doc_stats",
            "shop.customers",
            "shop.order_items",
            "shop.orders",
        ]
        assert watched(conn) == both
        conn.execute("select pgrag.declare_stats('customer_profile', null)")
        assert watched(conn) == [
            "pgrag.chunks",
            "pgrag.doc_stats",
            "shop.order_items",
            "shop.orders",
        ]
        conn.execute("select pgrag.drop_document('order_detail')")
        # the triggers on pgrag's own tables stay: dropping one would lock out every search
        assert watched(conn) == ["pgrag.chunks", "pgrag.doc_stats"]


def test_statistics_run_and_cache_as_their_declarer_whoever_asks(shop_url: str) -> None:
    """The statistics run as the role that declared them (pgrag_docs.stats_<type>): a writer
    that may not read shop.orders gets the declarer's numbers, the declarer's cached ones."""
    with psycopg.connect(shop_url, autocommit=True) as conn:
        first = stats(conn, VIP)  # cached by the superuser, who declared them
        stored = cached_rows(conn)
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
        conn.execute("drop role if exists pgrag_cache_probe")
        conn.execute(f"create role pgrag_cache_probe in role {writer[0]}")
        try:
            conn.execute("set role pgrag_cache_probe")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select count(*) from shop.orders")
            assert stats(conn, VIP) == first
            conn.execute("reset role")
            assert cached_rows(conn) == stored  # served from the declarer's results
            roles = conn.execute("select distinct role_name from pgrag.stats_cache").fetchall()
            assert roles == [("postgres",)] or len(roles) == 1
        finally:
            conn.execute("reset role")
            conn.execute("drop role pgrag_cache_probe")


def test_pruning_moves_the_horizon_and_keeps_results_exact(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        stats(conn, VIP)
        for i in range(3):
            conn.execute(
                "update shop.order_items set quantity = %s where order_item_id = 100", (i + 1,)
            )
        assert stats(conn, VIP) == reference(conn, VIP)  # recomputed, stored anew
        conn.execute("select pgrag._prune_stats_changes()")
        horizon, left = conn.execute(
            "select (select pruned_below from pgrag.stats_cache_horizon), "
            "(select count(*) from pgrag.stats_changes)"
        ).fetchone() or (None, None)
        assert horizon is not None and str(horizon) != "0" and left == 0
        assert stats(conn, VIP) == reference(conn, VIP)
        conn.execute("update shop.order_items set quantity = 7 where order_item_id = 100")
        assert stats(conn, VIP) == reference(conn, VIP)


def test_search_reports_cached_statistics_equal_to_computed_ones(shop_url: str) -> None:
    with connect(shop_url) as client:
        first = client.search("returned mouse", mode="text", filter=VIP, stats=True)
        again = client.search("headphones", mode="text", filter=VIP, stats=True)
        assert first.stats == again.stats
        # each result says which types' statistics were cache hits
        assert first.stats_cached == {"customer_profile": False, "order_detail": False}
        assert again.stats_cached == {"customer_profile": True, "order_detail": True}
        assert client.search("mouse", mode="text", filter=VIP).stats_cached is None
        with client.connection() as conn:
            assert first.stats == reference(conn, VIP)
        types = {t.doc_type: t for t in client.stats_cache()}
        assert types["customer_profile"].cached and types["customer_profile"].results == 1
        assert "shop.orders" in types["order_detail"].tables
        assert client.cache_stats("order_detail", False) == []
        assert not {t.doc_type: t for t in client.stats_cache()}["order_detail"].cached
        off = client.search(
            "mouse", mode="text", filter=VIP, stats=True, doc_types=["order_detail"]
        )
        assert off.stats_cached == {"order_detail": False}
        with client.connection() as conn:
            conn.execute("update shop.order_items set quantity = quantity + 1")
        written = client.search("mouse", mode="text", filter=VIP, stats=True)
        assert written.stats_cached == {"customer_profile": False, "order_detail": False}
        with client.connection() as conn:
            assert written.stats == reference(conn, VIP)


def test_the_cli_says_which_statistics_were_cache_hits(shop_url: str) -> None:
    env = {"PGRAG_DATABASE_URL": shop_url}
    args = ("search", "mouse", "--mode", "text", "--stats", "--filter", '{"segment": "VIP"}')
    first = run_pgrag(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert "statistics computed: customer_profile, order_detail" in first.stdout
    again = run_pgrag(*args, "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["stats_cached"] == {
        "customer_profile": True,
        "order_detail": True,
    }


def test_the_cli_turns_the_cache_on_and_off(shop_url: str) -> None:
    env = {"PGRAG_DATABASE_URL": shop_url}
    off = run_pgrag("stats-cache", "off", "order_detail", env=env)
    assert off.returncode == 0, off.stderr
    listed = run_pgrag("stats-cache", "list", env=env)
    assert "order_detail: not cached" in listed.stdout
    assert "customer_profile: cached" in listed.stdout
    on = run_pgrag("stats-cache", "on", "order_detail", env=env)
    assert on.returncode == 0 and "shop.order_items" in on.stdout
    bad = run_pgrag("stats-cache", "on", "nope", env=env)
    assert bad.returncode != 0 and "nope has no declared statistics" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_downgrade_of_0008_restores_0007_exactly(empty_db_url: str) -> None:
    """Below head a database has pgrag's tables only: the cache's triggers on the tables its
    statistics read go with pgrag's functions, and 0008's tables with its downgrade."""
    from .test_migrations import same_but_the_tsvectors_place, schema_dump

    migrate.upgrade(empty_db_url, "0007")
    at_0007 = schema_dump(empty_db_url)
    migrate.upgrade(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        synthetic.declare_stats(conn)  # statistics over pgrag.chunks alone
        assert stats_cache.set_cached(conn, "synthetic") == ["pgrag.chunks", "pgrag.doc_stats"]
        s.stats(conn, filter={})
        conn.execute("delete from pgrag.doc_stats")  # rows 0008's downgrade would drop
        conn.execute("delete from pgrag.doc_types")
    assert "pgrag_stats_changed" in schema_dump(empty_db_url)
    migrate.downgrade(empty_db_url, "0007")
    assert same_but_the_tsvectors_place(schema_dump(empty_db_url), at_0007)


# ---- a type whose statistics read a table no document watches: only the cache's trigger
# ---- records its writes (the shop's tables re-render chunks, which would hide a miss)

BONUS_STATS = (
    "select jsonb_build_object('bonus', (select sum(b.amount) from shop.bonus b "
    "where b.customer_id in (select h.source_key::integer from hits h)), 'n', count(*)) "
    "from hits"
)


@pytest.fixture
def bonus_url(shop_url: str) -> str:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute("create table shop.bonus (customer_id integer, amount numeric)")
        conn.execute("insert into shop.bonus values (1, 10)")
        conn.execute("select pgrag.declare_stats('customer_profile', %s)", (BONUS_STATS,))
    return shop_url


def bonus(conn: psycopg.Connection[Any]) -> Any:
    return stats(conn, VIP)["customer_profile"]["bonus"]


def test_a_table_only_the_statistics_read_invalidates_them(bonus_url: str) -> None:
    with psycopg.connect(bonus_url, autocommit=True) as conn:
        assert "shop.bonus" in str(
            conn.execute(
                "select cache_deps from pgrag.doc_stats where doc_type = 'customer_profile'"
            ).fetchone()
        )
        assert bonus(conn) == 10
        for write, expected in [
            ("insert into shop.bonus values (1, 5)", 15),
            ("update shop.bonus set amount = 1", 2),
            (
                "delete from shop.bonus where amount = 1 and ctid = "
                "(select min(ctid) from shop.bonus)",
                1,
            ),
            ("truncate shop.bonus", None),
            ("copy shop.bonus from program 'echo 1,7' (format csv)", 7),
        ]:
            conn.execute(write)
            assert bonus(conn) == expected == reference(conn, VIP)["customer_profile"]["bonus"]


def test_a_redeclared_query_is_never_served_an_older_snapshots_result(bonus_url: str) -> None:
    with (
        psycopg.connect(bonus_url) as old,
        psycopg.connect(bonus_url, autocommit=True) as other,
    ):
        old.execute("set transaction isolation level repeatable read")
        old.execute("select 1")  # its snapshot: before the redeclaration
        other.execute(
            "select pgrag.declare_stats('customer_profile', "
            "$q$select jsonb_build_object('n', count(*)) from hits$q$)"
        )
        assert "bonus" in stats(old, VIP)["customer_profile"]  # the old query, cached by old
        old.commit()
        assert stats(other, VIP)["customer_profile"] == {"n": 1}


def test_a_write_while_the_trigger_was_disabled_is_not_missed(bonus_url: str) -> None:
    with psycopg.connect(bonus_url, autocommit=True) as conn:
        assert bonus(conn) == 10
        conn.execute("alter table shop.bonus disable trigger pgrag_stats_changed")
        conn.execute("update shop.bonus set amount = 99")
        conn.execute("alter table shop.bonus enable always trigger pgrag_stats_changed")
        assert bonus(conn) == 99
        # ENABLE without ALWAYS (as pg_restore --disable-triggers leaves it): computed each time
        conn.execute("alter table shop.bonus enable trigger pgrag_stats_changed")
        assert bonus(conn) == 99
        conn.execute("alter table shop.bonus disable trigger pgrag_stats_changed")
        conn.execute("update shop.bonus set amount = 3")
        assert bonus(conn) == 3
        listed = {t.doc_type: t for t in stats_cache.status(conn)}
        assert listed["customer_profile"].cached and not listed["customer_profile"].triggers_ok
        assert listed["order_detail"].triggers_ok
        out = run_pgrag("stats-cache", "list", env={"PGRAG_DATABASE_URL": bonus_url})
        assert "customer_profile: cached, but a table's trigger is missing" in out.stdout
        stats_cache.set_cached(conn, "customer_profile")  # puts it back
        assert {t.doc_type: t for t in stats_cache.status(conn)}["customer_profile"].triggers_ok


def test_the_transaction_that_computed_and_then_wrote_is_never_reused(bonus_url: str) -> None:
    with psycopg.connect(bonus_url) as a, psycopg.connect(bonus_url, autocommit=True) as b:
        a.execute("update shop.products set name = name")  # a has an id before it computes
        b.execute("insert into shop.bonus values (2, 1)")  # commits: a's snapshot sees it
        assert bonus(a) == 10  # computed and stored by a ...
        a.execute("update shop.bonus set amount = 20 where customer_id = 1")  # ... then a writes
        a.commit()
        assert bonus(b) == 20 == reference(b, VIP)["customer_profile"]["bonus"]


def test_a_result_older_than_the_pruning_horizon_is_not_used(bonus_url: str) -> None:
    with (
        psycopg.connect(bonus_url) as w,
        psycopg.connect(bonus_url) as t,
        psycopg.connect(bonus_url, autocommit=True) as other,
    ):
        other.execute("select pgrag._prune_stats_changes()")  # the horizon, set: t will not
        w.execute("update shop.bonus set amount = 50")  # not committed yet
        t.execute("set transaction isolation level repeatable read")
        assert bonus(t) == 10  # stored by t, whose snapshot does not see w
        w.commit()
        pruned = other.execute("select pgrag._prune_stats_changes()").fetchone()
        assert pruned is not None and pruned[0] >= 1  # w's row went
        t.commit()
        assert bonus(other) == 50


def test_session_settings_the_output_depends_on_are_part_of_the_key(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute("select pgrag.cache_stats('order_detail', false)")
        conn.execute(
            "select pgrag.declare_stats('order_detail', $q$select jsonb_build_object("
            "'first', min(o.order_date::timestamptz)) from hits h "
            "join shop.orders o on o.order_id = h.source_key::integer$q$)"
        )
        stats_cache.set_cached(conn, "order_detail")
        conn.execute("set timezone = 'UTC'")
        utc = stats(conn, VIP)["order_detail"]["first"]
        conn.execute("set timezone = 'Pacific/Kiritimati'")
        assert stats(conn, VIP)["order_detail"]["first"] != utc
        assert stats(conn, VIP) == reference(conn, VIP)


@pytest.mark.parametrize(
    ("setup", "query", "cause"),
    [
        (
            "create table shop.extra (n integer); "
            "create table shop.extra_2025 () inherits (shop.extra)",
            "select jsonb_build_object('n', (select sum(n) from shop.extra)) from hits",
            "inheritance children",
        ),
        (
            "",
            "select jsonb_build_object('n', count(*)) from hits h "
            "join pgrag.chunks c2 on c2.id = h.id where c2.embedded_at is null",
            "pgrag.chunks.embedded_at",
        ),
        (
            "",
            "select jsonb_build_object('n', (select count(*) from shop.orders "
            "tablesample system (50))) from hits",
            "TABLESAMPLE",
        ),
        (
            "create table shop.secret (n integer); "
            "alter table shop.secret enable row level security",
            "select jsonb_build_object('n', (select count(*) from shop.secret)) from hits",
            "row-level security",
        ),
    ],
)
def test_more_queries_that_cannot_be_cached(
    shop_url: str, setup: str, query: str, cause: str
) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        if setup:
            conn.execute(setup)
        conn.execute("select pgrag.cache_stats('order_detail', false)")
        conn.execute("select pgrag.declare_stats('order_detail', %s)", (query,))
        with pytest.raises(DocumentError, match=f"cannot be cached: .*{cause}"):
            stats_cache.set_cached(conn, "order_detail")


def test_changes_after_caching_that_alter_the_result_turn_it_off(bonus_url: str) -> None:
    with psycopg.connect(bonus_url, autocommit=True) as conn:
        assert bonus(conn) == 10
        # a child table added later is read by the query, and has no trigger
        conn.execute("create table shop.bonus_2025 () inherits (shop.bonus)")
        conn.execute("insert into shop.bonus_2025 values (1, 5)")
        assert bonus(conn) == 15
        conn.execute("drop table shop.bonus_2025")
        # a server that is not the one that computed it (a dump restored elsewhere)
        assert bonus(conn) == 10
        conn.execute("update pgrag.stats_cache set server_started = '2000-01-01'")
        conn.execute("alter table shop.bonus disable trigger pgrag_stats_changed")
        conn.execute("update shop.bonus set amount = 11")
        conn.execute("alter table shop.bonus enable always trigger pgrag_stats_changed")
        conn.execute(
            "update pgrag.stats_cache set triggers = pgrag._stats_triggers_state(d.cache_deps) "
            "from pgrag.doc_stats d where d.doc_type = stats_cache.doc_type"
        )
        assert bonus(conn) == 11
        # a logical replication subscription: its apply process fires no statement trigger
        conn.execute(
            "create subscription pgrag_probe connection 'dbname=none' publication p "
            "with (connect = false, slot_name = none)"
        )
        try:
            with pytest.raises(DocumentError, match="logical replication"):
                stats_cache.set_cached(conn, "order_detail")
            conn.execute("update shop.bonus set amount = 12")
            assert bonus(conn) == 12
        finally:
            conn.execute("drop subscription pgrag_probe")


def test_serializable_transactions_neither_read_nor_store(shop_url: str) -> None:
    with psycopg.connect(shop_url) as conn:
        conn.execute("set transaction isolation level serializable")
        assert stats(conn, VIP) == reference(conn, VIP)
        conn.commit()
        assert cached_rows(conn) == []


def blocked_by(url: str, pid: int, other: psycopg.Connection[Any]) -> bool:
    """Whether the backend ``pid`` waits for a lock ``other``'s session holds."""
    with psycopg.connect(url, autocommit=True) as watcher:
        row = watcher.execute(
            "select %s = any(pg_blocking_pids(%s))", (other.info.backend_pid, pid)
        ).fetchone()
    return bool(row and row[0])


def test_a_result_being_stored_by_an_open_transaction_does_not_hold_others_up(
    shop_url: str,
) -> None:
    with psycopg.connect(shop_url) as a, psycopg.connect(shop_url) as b:
        stats(a, VIP)  # stored, not committed: a holds the key
        got: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: got.update(b=stats(b, VIP)), daemon=True)
        thread.start()
        wait_for(
            lambda: not thread.is_alive() or blocked_by(shop_url, b.info.backend_pid, a),
            "b's statistics ended, or b waits for a",
        )
        waited = thread.is_alive()
        a.rollback()  # (lets b go on if it waited)
        thread.join(PATIENCE_S)
        assert not waited, "b waited for the transaction storing the same result"
        assert got["b"] == reference(b, VIP)  # computed, not stored
        b.commit()
        assert cached_rows(b) == []


def test_a_result_for_a_type_dropped_meanwhile_is_no_error_and_is_pruned(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute(
            "select pgrag._stats_cache_put('gone', '\\x00', 'true', '{}', "
            "pg_current_snapshot(), null, 'x')"
        )
        conn.execute("select pgrag._prune_stats_changes()")
        assert cached_rows(conn) == []


def test_the_writer_role_caches_its_own_and_sees_only_its_own(shop_url: str) -> None:
    """A type and statistics the writer declares run and cache as the writer; row-level
    security keeps each role to its own cached results; privileges revoked after caching are
    not bypassed by a cached result."""
    with psycopg.connect(shop_url, autocommit=True) as conn:
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
        stats(conn, VIP)  # the superuser's results (it declared the shop's statistics)
        conn.execute(
            f"create table shop.owned (k integer primary key, n integer); "
            f"insert into shop.owned values (1, 5); alter table shop.owned owner to {writer[0]}; "
            f"grant usage on schema shop to {writer[0]}"
        )
        # the writer's own login (pgrag runs no other role's declared SQL in a superuser's
        # session, SET ROLE or not)
        with psycopg.connect(as_role(shop_url, writer[0]), autocommit=True) as w:
            w.execute(
                "select pgrag.declare_document('owned', $$select o.k as source_key, "
                "'owned ' || o.n as text, jsonb_build_object('segment', 'VIP') as metadata "
                'from shop.owned o$$, \'{"shop.owned": "select k from changed"}\', '
                'metadata_schema => \'{"segment": "text"}\')'
            )
            w.execute("select pgrag.refresh('owned')")
            w.execute(
                "select pgrag.declare_stats('owned', $q$select jsonb_build_object("
                "'n', (select sum(n) from shop.owned)) from hits$q$)"
            )
            assert "shop.owned" in stats_cache.set_cached(w, "owned")
            assert s.stats(w, filter=VIP, doc_types=["owned"]) == {"owned": {"n": 5}}
            mine = w.execute("select doc_type, role_name from pgrag.stats_cache").fetchall()
            assert mine == [("owned", writer[0])]  # the superuser's rows are not the writer's
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                w.execute(
                    "insert into pgrag.stats_cache (doc_type, role_name, condition_hash, "
                    "condition, snap, server_started, triggers) values ('order_detail', "
                    "'postgres', '\\x00', 'true', pg_current_snapshot(), now(), '')"
                )
            # privileges revoked after caching: the cached result is not served
            conn.execute(f"alter table shop.owned owner to {conn.info.user}")
            conn.execute(f"revoke all on shop.owned from {writer[0]}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                s.stats(w, filter=VIP, doc_types=["owned"])


def sql_bonus(conn: psycopg.Connection[Any]) -> Any:
    """The bonus through the SQL API, whose condition text the slow statement's matches."""
    row = conn.execute("select pgrag.stats(%s)", (Jsonb(VIP),)).fetchone()
    assert row is not None
    return row[0]["customer_profile"]["bonus"]


HOLD_KEY = 7_061_728  # an advisory lock the "slow" statement waits for (no other use)


def _while_a_slow_statement_computes(url: str, write: list[str]) -> Any:
    """Run the bonus statistics in a statement that first waits for an advisory lock this
    session holds (its snapshot taken before), commit ``write`` from another session while it
    waits (seen in pg_stat_activity), then let it go on; the held statement's result."""
    out: dict[str, Any] = {}
    with (
        psycopg.connect(url, autocommit=True) as holder,
        psycopg.connect(url, autocommit=True) as a,
    ):
        holder.execute("select pg_advisory_lock(%s)", (HOLD_KEY,))

        def held() -> None:
            row = a.execute(
                "select pg_advisory_xact_lock(%s), pgrag.stats(%s)", (HOLD_KEY, Jsonb(VIP))
            ).fetchone()
            out["stats"] = row[1]["customer_profile"] if row else None

        thread = threading.Thread(target=held, daemon=True)
        thread.start()
        try:
            wait_for(
                lambda: waits_on_lock(url, a.info.backend_pid),
                "the statistics statement waits for the held lock",
            )
            with psycopg.connect(url, autocommit=True) as b:
                for statement in write:
                    b.execute(statement)
        finally:
            holder.execute("select pg_advisory_unlock(%s)", (HOLD_KEY,))
            thread.join(PATIENCE_S)
    assert not thread.is_alive(), "the statistics statement did not end"
    return out["stats"]


def test_a_trigger_cycled_while_a_result_was_computed_is_seen(bonus_url: str) -> None:
    with psycopg.connect(bonus_url, autocommit=True) as conn:
        # the horizon set, so that the slow statement's result is stored (the first store
        # after install starts the horizon over and keeps nothing older)
        conn.execute("select pgrag._prune_stats_changes()")
    stale = _while_a_slow_statement_computes(
        bonus_url,
        [
            "alter table shop.bonus disable trigger pgrag_stats_changed",
            "update shop.bonus set amount = 77",
            "alter table shop.bonus enable always trigger pgrag_stats_changed",
        ],
    )
    assert stale["bonus"] == 10  # computed in the snapshot before the write ...
    with psycopg.connect(bonus_url, autocommit=True) as conn:
        assert sql_bonus(conn) == 77  # ... and not served after it


def test_a_horizon_reset_during_a_computation_loses_no_write(bonus_url: str) -> None:
    with (
        psycopg.connect(bonus_url) as holder,
        psycopg.connect(bonus_url, autocommit=True) as conn,
    ):
        holder.execute("update shop.products set name = name")  # an open xid: an old xmin
        conn.execute("update pgrag.stats_cache_horizon set server_started = null")  # a restart
        stale = _while_a_slow_statement_computes(bonus_url, ["update shop.bonus set amount = 33"])
        assert stale["bonus"] == 10
        assert sql_bonus(conn) == 33 == reference(conn, VIP)["customer_profile"]["bonus"]
        holder.rollback()
