"""Search benchmark: filtered vector, hybrid + stats, and end-to-end latency, with recall.

    python bench/search_bench.py --rows 100000 [--database-url URL] [--queries 200]

Fills ``pgrag.chunks`` of a *fresh migrated database* (it deletes every chunk) with the
synthetic chunks of ``pgrag/lab/synthetic.py`` (clustered 384-d unit vectors, metadata keys
selecting 100%, 10%, 1% and 0.1% of the rows). Then, per selectivity, side by side in the same run:

- bare pgvector: ``where filter order by embedding <=> q limit 10`` with default settings;
- pgrag's filtered vector search (``pgrag.search.search(mode="vector")``);
- exact search (no index) as the ground truth for recall@10;

and the full hybrid statement with exact stats, and end to end with the default embedder and a
cold query cache. Prints markdown (docs/benchmarks.md, section Search).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from pgrag.lab.sweep import bare, exact, pgrag_vector
from pgrag.lab.synthetic import SELECTIVITIES, declare_stats, load, queries


def exact_ids(
    conn: psycopg.Connection[Any], vec: np.ndarray[Any, Any], flt: Any, k: int
) -> list[int]:
    return exact(conn, vec, flt, k)


def p(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def run(url: str, rows: int, nq: int, skip_load: bool, k: int = 10) -> None:
    from pgrag.db import connect
    from pgrag.search import search

    if not skip_load:
        load(url, rows)
    qvecs, qtexts = queries(nq)
    print(f"## Filtered vector search, {rows:,} chunks, {nq} queries, k = {k}\n")
    print(
        "| filter matches | bare pgvector: rows returned (mean) | bare recall@10 | bare p95 ms "
        "| pgrag rows (min) | pgrag recall@10 | pgrag p50 ms | pgrag p95 ms | pgrag scan |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with connect(url) as client, client.connection() as conn:
        register_vector(conn)
        conn.rollback()  # exact and bare set planner options in transactions of their own
        for label, flt in SELECTIVITIES.items():
            bare_n, bare_r, bare_t, our_n, our_r, our_t, scans = [], [], [], [], [], [], set()
            for i in range(nq):
                truth = exact_ids(conn, qvecs[i], flt, k)
                conn.rollback()
                # both timed inside a transaction begun before (the BEGIN and the bare
                # statement's SET are the harness's), as pgrag bench search times them
                ms, got = bare(conn, qvecs[i], flt, k, ef=40, iterative=False)
                bare_t.append(ms)
                bare_n.append(len(got))
                bare_r.append(len(set(got) & set(truth)) / max(len(truth), 1))
                with conn.transaction(force_rollback=True):
                    ms, res = timed(
                        lambda i=i, flt=flt: pgrag_vector(conn, qvecs[i], flt, k)  # type: ignore[misc]
                    )
                our_t.append(ms)
                ids = [h.id for h in res.hits]
                our_n.append(len(ids))
                our_r.append(len(set(ids) & set(truth)) / max(len(truth), 1))
                scans.add(res.scan)
            print(
                f"| {label} | {statistics.mean(bare_n):.1f} | {statistics.mean(bare_r):.3f} "
                f"| {p(bare_t, 95):.2f} | {min(our_n)} | {statistics.mean(our_r):.3f} "
                f"| {p(our_t, 50):.2f} | {p(our_t, 95):.2f} | {', '.join(sorted(scans))} |"
            )
        print(f"\n## Hybrid statement (vector + full text + RRF + parents), {rows:,} chunks\n")
        print("| filter matches | p50 ms | p95 ms | with exact stats p50 ms | with stats p95 ms |")
        print("|---|---:|---:|---:|---:|")
        declare_stats(conn)
        conn.commit()
        for label, flt in SELECTIVITIES.items():
            plain: list[float] = []
            with_stats: list[float] = []
            for i in range(nq):
                for want, times in ((False, plain), (True, with_stats)):
                    ms, _ = timed(
                        lambda i=i, flt=flt, want=want: search(  # type: ignore[misc]
                            conn,
                            qtexts[i],
                            vector=qvecs[i],
                            model="synthetic",
                            filter=flt,
                            k=k,
                            stats=want,
                        )
                    )
                    conn.rollback()
                    times.append(ms)
            print(
                f"| {label} | {p(plain, 50):.2f} | {p(plain, 95):.2f} "
                f"| {p(with_stats, 50):.2f} | {p(with_stats, 95):.2f} |"
            )
    end_to_end(url, nq)


def end_to_end(url: str, nq: int) -> None:
    """Question → embedding (default model, query cache cold) → hybrid search with stats.

    The store's vectors are synthetic, so the model check is skipped (model=None): the point
    is the time of the embedding plus the statement.
    """
    from pgrag.db import connect
    from pgrag.embed.registry import get_embedder
    from pgrag.search import search

    embedder = get_embedder(None)
    embedder.embed(["warm up the model"])  # loading the model is not a query's cost
    embed_times: list[float] = []
    totals: dict[str, list[float]] = {"no stats": [], "stats": []}
    with connect(url) as client, client.connection() as conn:
        for i in range(nq):
            for label, want in (("no stats", False), ("stats", True)):
                question = f"{label}: which chunks talk about topic {i}, words w{i % 200}x{i % 20}?"
                t = time.perf_counter()
                vec = embedder.embed([question])[0]  # cold: a question never asked before
                e = (time.perf_counter() - t) * 1000
                search(conn, question, vector=vec, filter={"p1": True}, k=10, stats=want)
                conn.rollback()
                totals[label].append((time.perf_counter() - t) * 1000)
                embed_times.append(e)
    print(f"\n## End to end ({embedder.name}, cold query cache, 1% filter), {nq} questions\n")
    print("| stage | p50 ms | p95 ms |")
    print("|---|---:|---:|")
    print(f"| embed the question | {p(embed_times, 50):.2f} | {p(embed_times, 95):.2f} |")
    for label, times in totals.items():
        print(f"| embed + hybrid statement ({label}) | {p(times, 50):.2f} | {p(times, 95):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--database-url",
        default=None,
        help="a fresh migrated database (default: "
        "the embedded server's pgrag_search_bench database)",
    )
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--skip-load", action="store_true", help="reuse the rows already loaded")
    args = ap.parse_args()
    url = args.database_url
    if url is None:
        url = bench_database()
    run(url, args.rows, args.queries, args.skip_load)


def bench_database() -> str:
    """A database ``pgrag_search_bench`` on the embedded server, migrated (created if absent)."""
    from psycopg import sql

    from pgrag import migrate
    from pgrag.connection import resolve_url

    base = resolve_url(None)
    with psycopg.connect(base, autocommit=True) as conn:
        if not conn.execute(
            "select 1 from pg_database where datname = 'pgrag_search_bench'"
        ).fetchone():
            conn.execute(sql.SQL("create database {}").format(sql.Identifier("pgrag_search_bench")))
    url = psycopg.conninfo.make_conninfo(base, dbname="pgrag_search_bench")
    migrate.upgrade(url)
    return url


if __name__ == "__main__":
    main()
