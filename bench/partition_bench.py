"""Partitioned vs unpartitioned vector store: tenant-filtered and global search, same data.

    python bench/partition_bench.py [--rows 1000000] [--partitions 16] [--queries 50]
                                    [--skip-load]
    python bench/partition_bench.py --pgrag-stores ONE_TABLE_URL PARTITIONED_URL [--queries 50]

With ``--pgrag-stores``: pgrag's own store, the same chunks (ids, vectors, tenants) in a
database whose store is one table and in one converted with ``pgrag db upgrade
--tenant-partitions list``, searched through ``pgrag.vector_search`` as the reader role of a
tenant (row-level security and all) and as the writer (every tenant), interleaved query by
query; recall against the exact top 10 of the chunks that session sees.

The measurement behind docs/scaling.md's "Partitioned chunk stores": whether a store
partitioned by tenant, each partition with its own HNSW index, answers a tenant's search
better than one table and one HNSW index filtered by tenant. Plain pgvector tables in a
scratch database ``pgrag_bench_partitions`` (PGRAG_DATABASE_URL, default the embedded server),
not pgrag's store: pgrag cannot partition its store yet, and this says whether it should.

- ``flat``: one table (id, tenant, embedding), an HNSW index (m 16, ef_construction 64, pgrag's
  defaults) and a btree on tenant;
- ``parted``: the same rows in a table partitioned by list (tenant), ``--partitions``
  partitions, each with its own HNSW index (same parameters).

Vectors are pgrag's synthetic mixture (pgrag/lab/synthetic.py), tenants assigned round robin
(1/16 of the rows each, independent of the vectors). For each query a tenant is drawn; the
truth is the exact top 10 of that tenant's rows. Each query runs on both tables, interleaved,
at several ef_search values (pgvector 0.8's iterative scan, relaxed order, on the flat table:
without it a filtered HNSW search returns too few rows). Prints markdown with recall, p50 and
p95, and the plans' shape (partition pruning), with the load average.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from pgrag.cli.main import store_line
from pgrag.connection import resolve_url
from pgrag.lab import synthetic
from pgrag.server import with_database

DB = "pgrag_bench_partitions"
EF = (40, 100, 200)
K = 10


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def load(url: str, rows: int, parts: int) -> dict[str, float]:
    vecs, _, _ = synthetic.rows(rows)
    took: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("create extension if not exists vector")
        register_vector(c)
        c.execute("drop table if exists flat, parted")
        c.execute(
            "create table flat (id bigint primary key, tenant int not null, embedding vector(384))"
        )
        c.execute(
            "create table parted (id bigint, tenant int not null, embedding vector(384), "
            "primary key (tenant, id)) partition by list (tenant)"
        )
        for t in range(parts):
            c.execute(
                sql.SQL("create table {} partition of parted for values in ({})").format(
                    sql.Identifier(f"parted_{t}"), sql.Literal(t)
                )
            )
        t0 = time.perf_counter()
        with c.cursor().copy("copy flat (id, tenant, embedding) from stdin (format binary)") as cp:
            cp.set_types(["int8", "int4", "vector"])
            for i in range(rows):
                cp.write_row((i, i % parts, vecs[i]))
        c.execute("insert into parted select * from flat")
        print(f"loaded {rows:,} rows twice in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        c.execute("set maintenance_work_mem = '6GB'")
        c.execute("set max_parallel_maintenance_workers = 2")
        for table in ("flat", "parted"):
            t0 = time.perf_counter()
            c.execute(
                sql.SQL(
                    "create index on {} using hnsw (embedding vector_cosine_ops) "
                    "with (m = 16, ef_construction = 64)"
                ).format(sql.Identifier(table))
            )
            took[table] = time.perf_counter() - t0
            print(f"{table}: HNSW built in {took[table]:.0f} s", file=sys.stderr)
        c.execute("create index on flat (tenant)")
        c.execute("vacuum analyze flat")
        c.execute("vacuum analyze parted")
    return took


def sizes(conn: psycopg.Connection[Any]) -> dict[str, float]:
    out = {}
    for table in ("flat", "parted"):
        row = conn.execute(
            "select coalesce(sum(pg_relation_size(i.indexrelid)), 0) / 1048576.0 "
            "from pg_index i join pg_class c on c.oid = i.indexrelid "
            "join pg_am a on a.oid = c.relam "
            "where a.amname = 'hnsw' and (i.indrelid = %s::regclass or i.indrelid in "
            "(select inhrelid from pg_inherits where inhparent = %s::regclass))",
            (table, table),
        ).fetchone()
        out[table] = float(row[0]) if row else 0.0
    return out


def _as_role(url: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(url, options=f"-c role={role}")


def pgrag_stores(one: str, parted: str, n_queries: int) -> None:
    """pgrag.vector_search on a one-table store and on the same chunks partitioned by tenant."""
    qvecs, _ = synthetic.queries(n_queries)
    with psycopg.connect(one) as c:
        tenants = [r[0] for r in c.execute("select distinct tenant from pgrag.chunks order by 1")]
        shapes = {}
        for name, url in (("one table", one), ("partitioned", parted)):
            with psycopg.connect(url) as s:
                row = s.execute("select store from pgrag.status()").fetchone()
                shapes[name] = row[0] if row else None
    rng = np.random.default_rng(5)
    picked = [tenants[int(i)] for i in rng.integers(0, len(tenants), size=n_queries)]
    truth: list[set[int]] = []
    truth_all: list[set[int]] = []
    with psycopg.connect(one) as c:
        register_vector(c)
        c.execute("set enable_indexscan = off")
        c.execute("set max_parallel_workers_per_gather = 0")
        for q, t in zip(qvecs, picked, strict=True):
            truth.append(
                {
                    r[0]
                    for r in c.execute(
                        "select id from pgrag.chunks where tenant = %s and embedding is not null "
                        "order by embedding <=> %s limit %s",
                        (t, q, K),
                    )
                }
            )
            truth_all.append(
                {
                    r[0]
                    for r in c.execute(
                        "select id from pgrag.chunks where embedding is not null "
                        "order by embedding <=> %s limit %s",
                        (q, K),
                    )
                }
            )
    conns: dict[tuple[str, str], psycopg.Connection[Any]] = {}
    for store, url in (("one table", one), ("partitioned", parted)):
        for scope, role in (("tenant", "pgrag_reader"), ("global", "pgrag_writer")):
            conn = psycopg.connect(_as_role(url, role), autocommit=True)
            register_vector(conn)
            conns[(scope, store)] = conn
    results: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
    load_before = os.getloadavg()
    order = [
        (scope, store) for scope in ("tenant", "global") for store in ("one table", "partitioned")
    ]
    for ef in EF:
        for rounds in range(2):  # the first round warms the caches; the second is measured
            for n, (q, t) in enumerate(zip(qvecs, picked, strict=True)):
                for scope, store in order if n % 2 == 0 else order[::-1]:
                    conn = conns[(scope, store)]
                    if scope == "tenant":
                        conn.execute("select set_config('pgrag.tenant', %s, false)", (t,))
                    started = time.perf_counter()
                    ids = {
                        r[0]
                        for r in conn.execute(
                            "select id from pgrag.vector_search(%s, %s, ef_search => %s)",
                            (q, K, ef),
                        )
                    }
                    took = time.perf_counter() - started
                    if rounds == 0:
                        continue
                    lat, rec = results.setdefault((scope, store, ef), ([], []))
                    want = (truth if scope == "tenant" else truth_all)[n]
                    lat.append(took)
                    rec.append(len(ids & want) / K)
    load_after = os.getloadavg()
    for conn in conns.values():
        conn.close()
    print(
        f"`python bench/partition_bench.py --pgrag-stores ONE PARTED --queries {n_queries}`: "
        f"pgrag.vector_search, k = {K}, {os.cpu_count()} cores, load average "
        f"{load_before[0]:.2f} before and {load_after[0]:.2f} after; stores: "
        + "; ".join(f"{k}: {store_line(v)}" for k, v in shapes.items())
        + ".\n"
    )
    print_table(results, "store", ("one table", "partitioned"))


def print_table(
    results: dict[tuple[str, str, int], tuple[list[float], list[float]]],
    column: str,
    names: tuple[str, str],
) -> None:
    """The markdown table of both runs: recall and latency per search, store and ef_search."""
    print(f"| search | {column} | ef_search | recall | p50 ms | p95 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for scope in ("tenant", "global"):
        for ef in EF:
            for name in names:
                lat, rec = results[(scope, name, ef)]
                print(
                    f"| {scope} | {name} | {ef} | {statistics.mean(rec):.3f} | "
                    f"{pct(lat, 0.5):.2f} | {pct(lat, 0.95):.2f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--pgrag-stores", nargs=2, metavar=("ONE_TABLE_URL", "PARTITIONED_URL"))
    args = ap.parse_args()
    if args.pgrag_stores:
        one, parted = args.pgrag_stores
        pgrag_stores(one, parted, args.queries)
        return

    admin = resolve_url(os.environ.get("PGRAG_DATABASE_URL"))
    url = with_database(admin, DB)
    build: dict[str, float] = {}
    if not args.skip_load:
        with psycopg.connect(admin, autocommit=True) as a:
            a.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
            a.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
        build = load(url, args.rows, args.partitions)

    qvecs, _ = synthetic.queries(args.queries)
    rng = np.random.default_rng(5)
    tenants = [int(t) for t in rng.integers(0, args.partitions, size=args.queries)]
    with psycopg.connect(url, autocommit=True) as c:
        register_vector(c)
        c.execute("set max_parallel_workers_per_gather = 0")
        truth: list[set[int]] = []
        truth_all: list[set[int]] = []
        with c.transaction():
            c.execute("set local enable_indexscan = off")
            c.execute("set local enable_bitmapscan = on")
            for q, t in zip(qvecs, tenants, strict=True):
                rows = c.execute(
                    "select id from flat where tenant = %s order by embedding <=> %s limit %s",
                    (t, q, K),
                ).fetchall()
                truth.append({r[0] for r in rows})
                rows = c.execute(
                    "select id from flat order by embedding <=> %s limit %s", (q, K)
                ).fetchall()
                truth_all.append({r[0] for r in rows})
        plans = {}
        for name, stmt, args_ in (
            (
                "tenant, parted",
                "select id from parted where tenant = %s order by embedding <=> %s limit 10",
                (tenants[0], qvecs[0]),
            ),
            (
                "tenant, flat",
                "select id from flat where tenant = %s order by embedding <=> %s limit 10",
                (tenants[0], qvecs[0]),
            ),
            (
                "global, parted",
                "select id from parted order by embedding <=> %s limit 10",
                (qvecs[0],),
            ),
        ):
            c.execute("set hnsw.iterative_scan = relaxed_order")
            lines = [r[0] for r in c.execute(b"explain (costs off) " + stmt.encode(), args_)]
            shape = " / ".join(x.strip() for x in lines[:4])
            plans[name] = re.sub(r"'\[[^\]]*\]'::vector", "$query", shape)
        results: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
        load_before = os.getloadavg()
        cases = [
            (
                "tenant",
                "flat",
                "select id from flat where tenant = %s order by embedding <=> %s limit 10",
            ),
            (
                "tenant",
                "parted",
                "select id from parted where tenant = %s order by embedding <=> %s limit 10",
            ),
            ("global", "flat", "select id from flat order by embedding <=> %s limit 10"),
            ("global", "parted", "select id from parted order by embedding <=> %s limit 10"),
        ]
        for ef in EF:
            c.execute(sql.SQL("set hnsw.ef_search = {}").format(sql.Literal(ef)))
            for n, (q, t) in enumerate(zip(qvecs, tenants, strict=True)):
                for scope, table, stmt in cases if n % 2 == 0 else cases[::-1]:
                    # the iterative scan for the filtered flat search (without it a filtered
                    # HNSW search returns too few rows); the others walk one graph each
                    mode = "relaxed_order" if (scope, table) == ("tenant", "flat") else "off"
                    c.execute(sql.SQL("set hnsw.iterative_scan = {}").format(sql.Literal(mode)))
                    params: tuple[Any, ...] = (t, q) if scope == "tenant" else (q,)
                    started = time.perf_counter()
                    ids = {r[0] for r in c.execute(stmt.encode(), params)}
                    took = time.perf_counter() - started
                    lat, rec = results.setdefault((scope, table, ef), ([], []))
                    want = (truth if scope == "tenant" else truth_all)[n]
                    lat.append(took)
                    rec.append(len(ids & want) / K)
        load_after = os.getloadavg()
        index_mb = sizes(c)
        row = c.execute("show shared_buffers").fetchone()
        buffers = str(row[0]) if row else "?"

    print(
        f"`python bench/partition_bench.py --rows {args.rows} --partitions {args.partitions} "
        f"--queries {args.queries}`: k = {K}, {os.cpu_count()} cores, load average "
        f"{load_before[0]:.2f} before and {load_after[0]:.2f} after, shared_buffers {buffers}. "
        "HNSW indexes: flat "
        f"{index_mb['flat']:,.0f} MB, partitioned {index_mb['parted']:,.0f} MB in all"
        + (f"; built in {build['flat']:.0f} s and {build['parted']:.0f} s" if build else "")
        + ".\n"
    )
    print_table(results, "table", ("flat", "parted"))
    print()
    for name, plan in plans.items():
        print(f"- {name}: `{plan}`")


if __name__ == "__main__":
    main()
