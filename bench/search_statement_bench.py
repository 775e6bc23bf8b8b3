"""The search statement run by the SQL function (pgrag.search) against the same statement sent
by the client, as pgrag's Python client did before the statement moved into SQL. Prints markdown.

    python bench/search_statement_bench.py [--rows 100000] [--queries 200] [--skip-load]

Against PGRAG_DATABASE_URL (default: the embedded server): loads ``--rows`` synthetic chunks
(pgrag/lab/synthetic.py; replaces every chunk of that database), then for each filter (100%, 10%,
1%, 0.1% of the chunks) and mode (vector, hybrid) runs each query both ways, alternating which
goes first, and reports p50 / p95 of each and their ratio:

- ``function``: ``pgrag.search(...)`` through ``pgrag.search.search``: one round trip, the
  statement planned and run inside the function (argument checks, filter compiled in SQL, the
  planner's estimate, the HNSW settings).
- ``client``: what the Python client did before the statement moved into SQL, in one round
  trip (a pipeline): the HNSW settings, the planner's estimate of the filter (the old statement
  ran it as ``pgrag.estimate_rows``: an EXPLAIN), and the statement, with the values bound.
  The statement text, the settings and the compiled filter are pgrag._search_plan's, fetched
  before the clock starts (the old client built them in Python: about 0.05 ms, measured with
  the old builder, left out here).

Both return the same rows (checked on every query). Say the load average with the figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import psycopg.rows

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import synthetic_store  # noqa: E402
from pgrag.lab import synthetic  # noqa: E402
from pgrag.search import (  # noqa: E402
    SearchResult,
    VectorParam,
    _adapt_vector_param,
    _result,
    _Row,
    search,
)

MODES = ("vector", "hybrid")


def _plan(conn: psycopg.Connection[Any], mode: str, text: str, q: Any, flt: Any) -> Any:
    row = conn.execute(
        "select * from pgrag._search_plan(%s, %s, %s::real[]::vector, 'synthetic', 10, "
        "%s::jsonb, null, null, null, null, null, null, null)",
        (mode, text if mode != "vector" else None, q.tolist(), psycopg.types.json.Jsonb(flt)),
    ).fetchone()
    assert row is not None
    return row


def _where(conn: psycopg.Connection[Any], flt: Any) -> str:
    row = conn.execute(
        "select pgrag._filter_sql(%s::jsonb, pgrag._filter_schema(null), "
        "pgrag._filter_index_keys())",
        (psycopg.types.json.Jsonb(flt),),
    ).fetchone()
    assert row is not None
    return str(row[0])


def bound(statement: str) -> str:
    """The server's statement with its $1..$8 placeholders as the driver's %(p1)s..%(p8)s."""
    sql = statement.replace("%", "%%")
    for n in range(8, 0, -1):
        sql = sql.replace(f"${n}", f"%(p{n})s")
    return sql


def _client(conn: psycopg.Connection[Any], plan: Any, where: str, text: str, q: Any) -> list[int]:
    k, match, exact, rrf_k, fts_limit, statement, kc, ef, max_scan, _ = plan
    with (
        conn.transaction(),
        conn.pipeline(),
        conn.cursor(row_factory=psycopg.rows.class_row(_Row)) as cur,
    ):
        _adapt_vector_param(cur.adapters)
        conn.execute(
            "select set_config('hnsw.iterative_scan', 'relaxed_order', true), "
            "set_config('hnsw.ef_search', %s, true), set_config('hnsw.max_scan_tuples', %s, true)",
            (str(ef), str(max_scan)),
        )
        if where != "true":  # (the modes measured here both search vectors)
            conn.execute(
                b"explain (format json) select from pgrag.chunks c where "
                + where.replace("%", "%%").encode()
            )
        sql = bound(statement)
        params = {"p1": text, "p2": VectorParam(q), "p3": k, "p4": kc, "p5": exact}
        params |= {"p6": rrf_k, "p7": fts_limit, "p8": match}
        sql = "select h.*, null::jsonb as stats, null::jsonb as stats_cached from (" + sql + ") h"
        cur.execute(sql.replace("%(p2)s", "%(p2)s::vector").encode(), params, prepare=False)
        res: SearchResult = _result(cur.fetchall(), {}, None, "vector")  # as the client did
        return [h.id for h in res.hits]


def main() -> None:
    args, url = synthetic_store(__doc__)
    qvecs, qtexts = synthetic.queries(args.queries)
    load_before = os.getloadavg()
    print(f"## The search statement: SQL function vs client-sent, {args.rows:,} chunks\n")
    print(f"{args.queries} queries per row, k = 10, interleaved (alternating first).\n")
    print("| filter | mode | function p50 | function p95 | client p50 | client p95 | p95 ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with psycopg.connect(url, autocommit=True) as conn:
        for label, flt in synthetic.SELECTIVITIES.items():
            for mode in MODES:
                fn_ms: list[float] = []
                cl_ms: list[float] = []
                for i, (q_raw, text) in enumerate(zip(qvecs, qtexts, strict=True)):
                    q = np.asarray(q_raw, dtype=np.float32)
                    plan = _plan(conn, mode, text, q, flt)
                    where = _where(conn, flt)
                    got: dict[str, list[int]] = {}
                    for way in ("client", "function") if i % 2 else ("function", "client"):
                        t0 = time.perf_counter()
                        if way == "client":
                            got[way] = _client(conn, plan, where, text, q)
                            cl_ms.append((time.perf_counter() - t0) * 1000)
                        else:
                            res = search(conn, text, vector=q, model="synthetic", filter=flt,
                                         mode=mode, k=10)  # type: ignore[arg-type]  # fmt: skip
                            fn_ms.append((time.perf_counter() - t0) * 1000)
                            got[way] = [h.id for h in res.hits]
                    assert got["client"] == got["function"], (label, mode, i)
                f50, f95 = statistics.median(fn_ms), float(np.percentile(fn_ms, 95))
                c50, c95 = statistics.median(cl_ms), float(np.percentile(cl_ms, 95))
                print(
                    f"| {label} | {mode} | {f50:.2f} | {f95:.2f} | {c50:.2f} | {c95:.2f} "
                    f"| {f95 / c95:.2f}x |"
                )
    after = os.getloadavg()
    print(f"\nLoad average (1 min) {load_before[0]:.2f} before, {after[0]:.2f} after.")


if __name__ == "__main__":
    main()
