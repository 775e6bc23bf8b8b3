"""Sync triggers: what they add to writes, by sync mode; bulk statements; full rebuild.

    python bench/sync_bench.py [--customers 100000] [--updates 300] [--bulk 100000]
                               [--wide 1000000]

Against the database of PGRAG_DATABASE_URL (default: the embedded server), in a scratch
database `pgrag_bench_sync` it creates and drops. Steps, all in one run:
1. load the sample shop (N customers, ~10 orders each), declare its documents, full rebuild
   (throughput in documents per second);
2. single-row UPDATE of a random order_items row, autocommit, in turn with pgrag.sync = off
   (the triggers record nothing: the write without pgrag's render), commit (the default) and
   queue, the same number of rows each, interleaved row by row;
3. one INSERT ... SELECT of --bulk order items into existing orders, off / commit (rendered at
   its commit) / queue (recorded for the worker), rolled back each time;
4. with --wide N: an UPDATE of every row of a table of N rows of 2 KB (the statement that
   failed at 300,000 rows with "array size exceeds the maximum allowed"), off / queue /
   commit, with the backend's peak anonymous memory (from /proc).
Prints markdown with the load average. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TextIndexer  # noqa: E402
from pgrag import documents, migrate  # noqa: E402
from pgrag.connection import resolve_url  # noqa: E402
from pgrag.lab.sample import load_sample  # noqa: E402
from pgrag.lab.sample_documents import declare_sample_documents  # noqa: E402

DB = "pgrag_bench_sync"
MODES = ("off", "commit", "queue")


def with_db(url: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def set_mode(conn: psycopg.Connection[Any], mode: str) -> None:
    conn.execute("select set_config('pgrag.sync', %s, false)", (mode,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--customers", type=int, default=100_000)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--bulk", type=int, default=100_000)
    ap.add_argument("--wide", type=int, default=0, help="rows of the wide-row UPDATE (0: skip)")
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
            declare_sample_documents(conn)
            rebuilt = documents.rebuild(conn)
            conn.execute("vacuum analyze")
            with TextIndexer(url):  # the worker's part in the write path (bench/common.py)
                lat = single_updates(conn, args.updates)
                conn.execute("delete from pgrag.render_queue")  # queue mode's, no worker here
                bulk = bulk_insert(conn, args.bulk)
                wide = wide_update(conn, args.wide) if args.wide else {}
        report(args, stats, load_s, rebuilt, lat, bulk, wide)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))


def single_updates(conn: psycopg.Connection[Any], n: int) -> dict[str, list[float]]:
    """n updates per mode, the modes in turn row by row (after 20 warm-up rows each)."""
    ids = [
        r[0]
        for r in conn.execute(
            "select order_item_id from shop.order_items order by random() limit %s",
            ((n + 20) * len(MODES),),
        )
    ]
    out: dict[str, list[float]] = {m: [] for m in MODES}
    for i, item in enumerate(ids):
        mode = MODES[i % len(MODES)]
        set_mode(conn, mode)
        t = time.perf_counter()
        conn.execute(
            "update shop.order_items set quantity = quantity %% 9 + 1 where order_item_id = %s",
            (item,),
        )
        if i >= 20 * len(MODES):
            out[mode].append(time.perf_counter() - t)
    set_mode(conn, "")
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
    out: dict[str, float] = {}
    for mode in ("off", "commit", "queue", "off"):  # off twice: first and last, warm caches
        with conn.transaction(force_rollback=True):
            set_mode(conn, mode)
            t = time.perf_counter()
            conn.execute(insert, (n,))
            conn.execute("select pgrag.sync_now()")  # what the commit would render
            out[mode] = min(out.get(mode, float("inf")), time.perf_counter() - t)
    set_mode(conn, "")
    conn.execute("drop table bench_targets")
    return out


class PeakMemory:
    """The peak anonymous memory (RssAnon, not shared buffers) of a backend, sampled."""

    def __init__(self, pid: int) -> None:
        self.path = Path(f"/proc/{pid}/status")
        self.peak_kb = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for line in self.path.read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.02)

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def wide_update(conn: psycopg.Connection[Any], rows: int) -> dict[str, tuple[float, float]]:
    """UPDATE of every row of a table of 2 KB rows, watched by a type whose key query reads
    another table (so the statement's rows are recorded): seconds and peak MB per mode."""
    conn.execute(
        "create schema bench; create table bench.wide (id integer primary key, n integer not "
        "null, pad text not null); alter table bench.wide alter column pad set storage main"
    )
    conn.execute(
        "insert into bench.wide select g, 0, (select string_agg(md5((g * 64 + k)::text), '') "
        "from generate_series(1, 60) k) from generate_series(1, %s) g",
        (rows,),
    )
    conn.execute("vacuum analyze bench.wide")
    conn.execute(
        "select pgrag.declare_document('wide_row', 'select id as source_key, "
        "format(''row %s: n = %s'', id, n) as text from bench.wide', "
        '\'{"bench.wide": "select w.id from changed c join bench.wide w on w.id = c.id"}\')'
    )
    out: dict[str, tuple[float, float]] = {}
    pid = conn.info.backend_pid
    for mode in ("off", "queue", "commit"):
        with conn.transaction(force_rollback=True), PeakMemory(pid) as mem:
            set_mode(conn, mode)
            t = time.perf_counter()
            conn.execute("update bench.wide set n = n + 1")
            conn.execute("select pgrag.sync_now()")
            seconds = time.perf_counter() - t
        out[mode] = (seconds, mem.peak_kb / 1024)
        print(f"wide update, {mode}: {seconds:.1f} s", flush=True)
    set_mode(conn, "")
    return out


def report(
    args: argparse.Namespace,
    stats: Any,
    load_s: float,
    rebuilt: list[documents.RebuildStats],
    lat: dict[str, list[float]],
    bulk: dict[str, float],
    wide: dict[str, tuple[float, float]],
) -> None:
    load = os.getloadavg()
    print(
        f"sample: {stats.customers:,} customers, {stats.orders:,} orders, "
        f"{stats.order_items:,} items (loaded in {load_s:.0f} s); load average at the end "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| full rebuild | documents | seconds | documents/s |")
    print("|---|---|---|---|")
    for r in rebuilt:
        print(f"| {r.doc_type} | {r.documents:,} | {r.seconds:.1f} | {r.per_second:,.0f} |")
    print()
    n = len(lat["off"])
    print(f"| single-row UPDATE of order_items ({n} each, interleaved) | p50 | p95 | mean |")
    print("|---|---|---|---|")
    for mode in MODES:
        xs = lat[mode]
        print(
            f"| pgrag.sync = {mode} | {pct(xs, 0.5):.2f} ms | {pct(xs, 0.95):.2f} ms "
            f"| {statistics.mean(xs) * 1000:.2f} ms |"
        )
    for mode in ("commit", "queue"):
        print(
            f"| added by {mode} | {pct(lat[mode], 0.5) - pct(lat['off'], 0.5):.2f} ms "
            f"| {pct(lat[mode], 0.95) - pct(lat['off'], 0.95):.2f} ms "
            f"| {(statistics.mean(lat[mode]) - statistics.mean(lat['off'])) * 1000:.2f} ms |"
        )
    print(f"\n| bulk INSERT of {args.bulk:,} order items (one statement) | seconds | ratio |")
    print("|---|---|---|")
    for mode, what in (
        ("off", "pgrag.sync = off (records nothing)"),
        ("commit", "commit (chunks true at commit)"),
        ("queue", "queue (recorded for the worker)"),
    ):
        print(f"| {what} | {bulk[mode]:.2f} | {bulk[mode] / bulk['off']:.1f}x |")
    if wide:
        print(
            f"\n| UPDATE of {args.wide:,} rows of 2 KB (one statement) | seconds | ratio "
            "| backend peak memory |"
        )
        print("|---|---|---|---|")
        for mode, (secs, mb) in wide.items():
            print(f"| {mode} | {secs:.1f} | {secs / wide['off'][0]:.1f}x | {mb:,.0f} MB |")


if __name__ == "__main__":
    main()
