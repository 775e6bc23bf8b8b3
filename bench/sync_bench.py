"""Sync triggers: what they add to writes, and full-rebuild throughput. Prints markdown.

    python bench/sync_bench.py [--customers 100000] [--updates 300] [--bulk 100000]

Against the database of PGRAG_DATABASE_URL (default: the embedded server), in a scratch
database `pgrag_bench_sync` it creates and drops. Steps, all in one run:
1. load the sample shop (N customers, ~10 orders each), declare its documents, full rebuild
   (throughput in documents per second);
2. single-row UPDATE of an order_items row, p50/p95 over --updates statements, with pgrag's
   triggers and with them disabled (the reference), the same rows in the same order;
3. one INSERT ... SELECT of --bulk order items into existing orders, with triggers and without
   (rolled back each time), plus "without triggers + refresh of the same documents afterwards",
   which is what keeping chunks true costs either way.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from pgrag import documents, migrate
from pgrag.db import resolve_url
from pgrag.sample import load_sample
from pgrag.sample_documents import declare_sample_documents

DB = "pgrag_bench_sync"
TABLES = ("shop.customers", "shop.orders", "shop.order_items", "shop.products")


def with_db(url: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def set_triggers(conn: psycopg.Connection[Any], enabled: bool) -> None:
    for table in TABLES:
        schema, name = table.split(".")
        conn.execute(
            sql.SQL("alter table {} {} trigger user").format(
                sql.Identifier(schema, name), sql.SQL("enable" if enabled else "disable")
            )
        )


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--customers", type=int, default=100_000)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--bulk", type=int, default=100_000)
    ap.add_argument(
        "--sync",
        choices=["commit", "immediate"],
        default="commit",
        help="pgrag.sync: render at commit (the default) or per statement (before 0007)",
    )
    args = ap.parse_args()

    admin = resolve_url(None)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
        c.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
    url = with_db(admin, DB)
    try:
        migrate.upgrade(url)
        t0 = time.perf_counter()
        stats = load_sample(url, customers=args.customers, progress=False)
        load_s = time.perf_counter() - t0
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("select set_config('pgrag.sync', %s, false)", (args.sync,))
            declare_sample_documents(conn)
            rebuilt = documents.rebuild(conn)
            conn.execute("vacuum analyze")
            lat_on, lat_off = single_updates(conn, args.updates)
            per_trigger = trigger_breakdown(conn, 50)
            bulk = bulk_insert(conn, args.bulk)
        report(args, stats, load_s, rebuilt, lat_on, lat_off, bulk)
        print("\n| trigger (EXPLAIN ANALYZE, 50 single-row updates) | median |")
        print("|---|---|")
        for name, times in sorted(per_trigger.items()):
            print(f"| {name} | {statistics.median(times):.2f} ms |")
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))


def single_updates(conn: psycopg.Connection[Any], n: int) -> tuple[list[float], list[float]]:
    ids = [
        r[0]
        for r in conn.execute(
            "select order_item_id from shop.order_items order by random() limit %s", (n,)
        )
    ]
    on: list[float] = []
    off: list[float] = []
    # Toggling triggers is DDL and throws away every cached plan, so each side runs as one
    # phase (after a warm-up), the same rows in the same order.
    for enabled, out in ((True, on), (False, off)):
        set_triggers(conn, enabled)
        for item in ids[:20] + ids:
            t = time.perf_counter()
            conn.execute(
                "update shop.order_items set quantity = quantity %% 9 + 1 where order_item_id = %s",
                (item,),
            )
            out.append(time.perf_counter() - t)
        del out[:20]
    set_triggers(conn, True)
    return on, off


def trigger_breakdown(conn: psycopg.Connection[Any], n: int) -> dict[str, list[float]]:
    """Time spent in each pgrag trigger, as EXPLAIN ANALYZE reports it (rolled back)."""
    ids = [
        r[0]
        for r in conn.execute(
            "select order_item_id from shop.order_items order by random() limit %s", (n,)
        )
    ]
    out: dict[str, list[float]] = {}
    for item in ids:
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "explain (analyze) update shop.order_items set quantity = quantity %% 9 + 1 "
                "where order_item_id = %s",
                (item,),
            ).fetchall()
        for (line,) in plan:
            if line.startswith("Trigger pgrag_"):
                name, _, rest = line.partition(": time=")
                out.setdefault(name.removeprefix("Trigger "), []).append(float(rest.split()[0]))
    return out


def bulk_insert(conn: psycopg.Connection[Any], n: int) -> dict[str, float]:
    """n new items spread over the newest n/2.5 orders, in one INSERT ... SELECT."""
    conn.execute(
        "create temporary table bench_targets as select order_id, customer_id from shop.orders "
        "order by order_id desc limit greatest(1, %s / 5 * 2)",
        (n,),
    )
    insert = (
        "insert into shop.order_items "
        "select m.base + g, t.order_id, 1 + g %% 50, 1, 9.99, 'none' "
        "from generate_series(1, %s) g "
        "cross join (select max(order_item_id) as base from shop.order_items) m "
        "join (select order_id, row_number() over () - 1 as i from bench_targets) t "
        "  on t.i = g %% (select count(*) from bench_targets)"
    )
    keys = {
        "customer_profile": "select distinct customer_id::text from bench_targets",
        "order_detail": "select o.order_id::text from shop.orders o "
        "where o.customer_id in (select customer_id from bench_targets)",
    }
    out: dict[str, float] = {}
    for label, enabled in (("without", False), ("with", True)):
        set_triggers(conn, enabled)
        with conn.transaction(force_rollback=True):
            t = time.perf_counter()
            conn.execute(insert, (n,))
            conn.execute("select pgrag.sync_now()")  # what the commit would render
            out[label] = time.perf_counter() - t
            if not enabled:  # what the triggers would have done, set-based, afterwards
                t = time.perf_counter()
                for doc_type, key_sql in keys.items():
                    found = [r[0] for r in conn.execute(key_sql)]  # type: ignore[call-overload]
                    documents.refresh(conn, doc_type, found)
                out["refresh"] = time.perf_counter() - t
    set_triggers(conn, True)
    conn.execute("drop table bench_targets")
    return out


def report(
    args: argparse.Namespace,
    stats: Any,
    load_s: float,
    rebuilt: list[documents.RebuildStats],
    on: list[float],
    off: list[float],
    bulk: dict[str, float],
) -> None:
    print(
        f"sample: {stats.customers:,} customers, {stats.orders:,} orders, "
        f"{stats.order_items:,} items (loaded in {load_s:.0f} s)\n"
    )
    print("| full rebuild | documents | seconds | documents/s |")
    print("|---|---|---|---|")
    for r in rebuilt:
        print(f"| {r.doc_type} | {r.documents:,} | {r.seconds:.1f} | {r.per_second:,.0f} |")
    print()
    print(f"| single-row UPDATE of order_items ({len(on)} each) | p50 | p95 |")
    print("|---|---|---|")
    print(f"| without pgrag triggers | {pct(off, 0.5):.2f} ms | {pct(off, 0.95):.2f} ms |")
    print(f"| with pgrag triggers | {pct(on, 0.5):.2f} ms | {pct(on, 0.95):.2f} ms |")
    print(
        f"| added by the triggers | {pct(on, 0.5) - pct(off, 0.5):.2f} ms "
        f"| {pct(on, 0.95) - pct(off, 0.95):.2f} ms |"
    )
    print(f"\nmean added: {(statistics.mean(on) - statistics.mean(off)) * 1000:.2f} ms\n")
    print(f"| bulk INSERT of {args.bulk:,} order items (one statement) | seconds | ratio |")
    print("|---|---|---|")
    print(f"| without triggers | {bulk['without']:.2f} | 1.0x |")
    print(
        f"| with triggers (chunks true at commit) | {bulk['with']:.2f} "
        f"| {bulk['with'] / bulk['without']:.1f}x |"
    )
    both = bulk["without"] + bulk["refresh"]
    print(
        f"| without triggers, then refresh of the same documents | {both:.2f} "
        f"| {both / bulk['without']:.1f}x |"
    )


if __name__ == "__main__":
    main()
