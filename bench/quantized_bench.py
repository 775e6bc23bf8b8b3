"""Quantized HNSW indexes with an exact re-rank, against the store's plain index, same chunks.

    PGRAG_DATABASE_URL=... python bench/quantized_bench.py [--kind halfvec|bit]
                                                          [--queries 50] [--candidates 40 100]

Issue 19's "beyond pgvector's graph walk", unfiltered, at several candidate counts: the
quantized index and its re-ranking statement are ``pgrag/lab/quantized.py``'s (``pgrag bench
search --quantized`` puts one row of it beside the plain index's, under every filter).

PGRAG_DATABASE_URL names a loaded synthetic store (``pgrag bench search`` makes one per size:
``pgrag_bench_<rows>``). The quantized index is built there once, with the store index's m and
ef_construction, and left for later runs (``--drop`` removes it); its size and build time are
reported. For each held-out synthetic query the truth is the exact top 10 (the index disabled);
every configuration runs on it in turn, the order rotating from query to query, at ef_search
40, 100 and 200 (the iterative scan off: no filter here). Prints markdown with recall@10, p50
and p95 and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, LiteralString

import psycopg
from pgvector.psycopg import register_vector

from pgrag.connection import resolve_url
from pgrag.lab import quantized, synthetic

EF = (40, 100, 200)
K = 10
_PLAIN: LiteralString = "select id from pgrag.chunks order by embedding <=> %(q)s limit %(k)s"
_EXACT: LiteralString = "select id from pgrag.chunks order by (embedding <=> %(q)s) + 0 limit %(k)s"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def timed(
    conn: psycopg.Connection[Any], stmt: Any, params: dict[str, Any], ef: int
) -> tuple[float, list[int]]:
    with conn.transaction():
        conn.execute("select set_config('hnsw.ef_search', %s, true)", (str(ef),))
        t = time.perf_counter()
        ids = [r[0] for r in conn.execute(stmt, params, prepare=False).fetchall()]
        return (time.perf_counter() - t) * 1000, ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(quantized.KINDS), default="halfvec")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--candidates", type=int, nargs="+", default=[40, 100])
    ap.add_argument("--drop", action="store_true", help="drop the quantized index and exit")
    args = ap.parse_args()
    url = resolve_url(os.environ.get("PGRAG_DATABASE_URL"))
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        if args.drop:
            quantized.drop(conn, args.kind)
            return 0
        rows = synthetic.loaded(conn)
        if not rows:
            print(
                "no synthetic chunks here: run `pgrag bench search --rows N` first", file=sys.stderr
            )
            return 2
        dim = quantized.dimension(conn)
        size, took = quantized.ensure_index(conn, args.kind, dim)
        plain_row = conn.execute(
            "select pg_size_pretty(pg_relation_size('pgrag.chunks_embedding_hnsw'::regclass))"
        ).fetchone()
        plain = plain_row[0] if plain_row else "?"

        load_before = os.getloadavg()[0]
        qs, _ = synthetic.queries(args.queries)
        truth: list[set[int]] = []
        for q in qs:
            with conn.transaction():
                conn.execute("set local enable_indexscan = off")
                truth.append({r[0] for r in conn.execute(_EXACT, {"q": q, "k": K}).fetchall()})
        configs: list[tuple[str, int, int]] = [("plain", ef, K) for ef in EF] + [
            (args.kind, ef, c) for ef in EF for c in args.candidates if c <= ef
        ]
        quant = quantized.reranked(args.kind, dim, filtered=False)
        times: dict[tuple[str, int, int], list[float]] = {c: [] for c in configs}
        recall: dict[tuple[str, int, int], list[float]] = {c: [] for c in configs}
        for i, q in enumerate(qs):
            shift = i % len(configs)
            for c in configs[shift:] + configs[:shift]:
                kind, ef, cand = c
                stmt = _PLAIN if kind == "plain" else quant
                ms, ids = timed(conn, stmt, {"q": q, "k": K, "c": cand}, ef)
                times[c].append(ms)
                recall[c].append(len(truth[i] & set(ids)) / K)
    print(
        f"`python bench/quantized_bench.py --kind {args.kind} --queries {args.queries}` on "
        f"{rows:,} synthetic chunks: plain HNSW index {plain}, {args.kind} index {size} "
        f"({took}); load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after\n"
    )
    print("| index | ef_search | candidates re-ranked | recall@10 | p50 ms | p95 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in configs:
        kind, ef, cand = c
        print(
            f"| {kind} | {ef} | {cand if kind != 'plain' else ''} | "
            f"{statistics.fmean(recall[c]):.3f} | {statistics.median(times[c]):.2f} | "
            f"{pct(times[c], 0.95):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
