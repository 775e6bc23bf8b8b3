"""Two HNSW graphs over the same synthetic chunks, side by side: recall, latency, insert cost.

    python bench/graph_bench.py URL_A URL_B [--queries 50] [--ef 20 40 70 100 200]
                                            [--writes 200]

The measurement behind the store index's default graph (``config.DEFAULT_HNSW_M`` and
``DEFAULT_HNSW_EF_CONSTRUCTION``, docs/search.md "The graph"). URL_A and URL_B name two
databases holding the same synthetic chunks (``pgrag bench search --rows N`` makes
``pgrag_bench_<N>``; with ``--hnsw-m 32 --hnsw-ef-construction 200``,
``pgrag_bench_<N>_m32_efc200``), each with its own store index. For each held-out synthetic
question (not a graph node) the truth is the exact top 10 (the index disabled); then every
configuration runs on it in turn, the order rotating from question to question: bare pgvector
at each ef_search on each graph (no filter, no iterative scan), and pgrag's own search with its
defaults (``pgrag.search.search(mode='vector')``, the ef_search each store was tuned to).
Then ``--writes`` single-row updates of a chunk's vector per database, alternating, each rolled
back: what the worker pays per vector it stores, its index entries included. Prints markdown
with recall@10, p50 and p95 and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import LiteralString

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from pgrag.lab import synthetic
from pgrag.lab.sweep import prewarm
from pgrag.search import search

K = 10
_BARE: LiteralString = "select id from pgrag.chunks order by embedding <=> %(q)s limit %(k)s"
_EXACT: LiteralString = "select id from pgrag.chunks order by (embedding <=> %(q)s) + 0 limit %(k)s"
_GRAPH: LiteralString = (
    "select i.reloptions, pg_relation_size(i.oid), s.ef_search "
    "from pg_class i, pgrag.settings s where i.oid = 'pgrag.chunks_embedding_hnsw'::regclass"
)
_WRITE: LiteralString = "update pgrag.chunks set embedding = %(v)s where id = %(id)s"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("urls", nargs=2, metavar="URL")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--ef", type=int, nargs="+", default=[20, 40, 70, 100, 200])
    ap.add_argument("--writes", type=int, default=200)
    args = ap.parse_args()
    conns = [psycopg.connect(u, autocommit=True) for u in args.urls]
    names: list[str] = []
    for c in conns:
        register_vector(c)
        if not synthetic.loaded(c):
            print(f"{c.info.dbname}: no synthetic chunks: run `pgrag bench search` first")
            return 2
        row = c.execute(_GRAPH).fetchone()
        assert row is not None
        opts = dict(o.split("=") for o in (row[0] or []))
        names.append(
            f"m {opts.get('m', '16')} / ef_construction {opts.get('ef_construction', '64')}"
        )
        print(
            f"- {c.info.dbname}: {synthetic.loaded(c):,} chunks, {names[-1]}, index "
            f"{row[1] / 2**20:,.0f} MB, the store's tuned ef_search {row[2]}; {prewarm(c)}"
        )
    load_before = os.getloadavg()
    qs, _ = synthetic.queries(args.queries)
    truth: list[list[set[int]]] = []
    for c in conns:
        rows = []
        for q in qs:
            with c.transaction():
                c.execute("set local enable_indexscan = off")
                rows.append({r[0] for r in c.execute(_EXACT, {"q": q, "k": K}).fetchall()})
        truth.append(rows)
    # (graph, ef) for bare pgvector; (graph, None) for pgrag's search with its defaults
    configs: list[tuple[int, int | None]] = [(g, ef) for g in range(2) for ef in [*args.ef, None]]
    times: dict[tuple[int, int | None], list[float]] = {c: [] for c in configs}
    recall: dict[tuple[int, int | None], list[float]] = {c: [] for c in configs}
    for i, q in enumerate(qs):
        shift = i % len(configs)
        for cfg in configs[shift:] + configs[:shift]:
            g, ef = cfg
            c = conns[g]
            if ef is None:
                t = time.perf_counter()
                hits = search(c, vector=q, model="synthetic", k=K, mode="vector").hits
                ids = [h.id for h in hits]
                ms = (time.perf_counter() - t) * 1000
            else:
                with c.transaction():
                    c.execute("select set_config('hnsw.ef_search', %s, true)", (str(ef),))
                    t = time.perf_counter()
                    ids = [r[0] for r in c.execute(_BARE, {"q": q, "k": K}).fetchall()]
                    ms = (time.perf_counter() - t) * 1000
            times[cfg].append(ms)
            recall[cfg].append(len(truth[g][i] & set(ids)) / K)
    # the worker's write: one chunk's vector replaced (a new heap tuple: an entry in every
    # index, the HNSW insert among them), rolled back
    rng = np.random.default_rng(3)
    ids_of = [
        [r[0] for r in c.execute("select id from pgrag.chunks order by id limit 5000").fetchall()]
        for c in conns
    ]
    writes: list[list[float]] = [[], []]
    for i in range(args.writes):
        v = rng.standard_normal(qs.shape[1]).astype(np.float32)
        v /= np.linalg.norm(v)
        for g in (i % 2, 1 - i % 2):
            c = conns[g]
            with c.transaction(force_rollback=True):
                t = time.perf_counter()
                c.execute(_WRITE, {"v": v, "id": ids_of[g][i % len(ids_of[g])]})
                writes[g].append((time.perf_counter() - t) * 1000)
    load_after = os.getloadavg()
    print(
        f"\n`python bench/graph_bench.py ... --queries {args.queries}`: load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n"
    )
    print("| graph | search | recall@10 | p50 ms | p95 ms |")
    print("|---|---|---:|---:|---:|")
    for cfg in configs:
        g, ef = cfg
        what = f"bare, ef_search {ef}" if ef is not None else "pgrag, its defaults"
        print(
            f"| {names[g]} | {what} | {statistics.fmean(recall[cfg]):.3f} | "
            f"{statistics.median(times[cfg]):.2f} | {pct(times[cfg], 0.95):.2f} |"
        )
    print("\n| graph | vector write (UPDATE, rolled back) p50 ms | p95 ms |")
    print("|---|---:|---:|")
    for g in range(2):
        print(f"| {names[g]} | {statistics.median(writes[g]):.2f} | {pct(writes[g], 0.95):.2f} |")
    for c in conns:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
