"""Deterministic full text: the search statement's text leg ranking every match (ORDER BY
ts_rank, id, then the fts_limit best) against the release before, which ranked the first
fts_limit matches in physical order. Prints markdown with p50 / p95 of each, interleaved.

    python bench/fts_rank_bench.py [--rows 100000] [--queries 200] [--skip-load]

Against PGRAG_DATABASE_URL (default: the embedded server): loads ``--rows`` synthetic chunks
(pgrag/lab/synthetic.py; replaces every chunk of that database) unless ``--skip-load``, then runs
each question's hybrid and text statements both ways, alternating which goes first. The
statements are pgrag._search_plan's; the old one is the same text with the old text leg put
back. Say the load average with the figures (it is printed).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import synthetic_store  # noqa: E402
from bench.search_statement_bench import bound  # noqa: E402
from pgrag.lab import synthetic  # noqa: E402
from pgrag.search import VectorParam, _adapt_vector_param  # noqa: E402

NEW = """fts_scored as (
    select c.id, ts_rank(c.tsv, (select q from tq)) as score
    from pgrag.chunks c
    where c.tsv @@ (select q from tq) and {where}
    order by 2 desc, c.id
    limit $7),"""
OLD = """fts_rows as (
    select c.id, c.tsv
    from pgrag.chunks c
    where c.tsv @@ (select q from tq) and {where}
    limit $7),
fts_scored as (
    select r.id, ts_rank(r.tsv, (select q from tq)) as score from fts_rows r),"""


def _run(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any], ef: int) -> float:
    sql = bound(statement).replace("%(p2)s", "%(p2)s::vector")
    with conn.transaction(), conn.cursor() as cur:
        _adapt_vector_param(cur.adapters)
        cur.execute(
            "select set_config('hnsw.iterative_scan', 'relaxed_order', true), "
            "set_config('hnsw.ef_search', %s, true)",
            (str(ef),),
        )
        started = time.perf_counter()
        cur.execute(sql.encode(), params, prepare=False)
        cur.fetchall()
        return (time.perf_counter() - started) * 1000


def main() -> None:
    args, url = synthetic_store(__doc__)
    qvecs, qtexts = synthetic.queries(args.queries)
    before = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("select count(*) from pgrag.chunks").fetchone()
        assert rows is not None
        for i, (q, text) in enumerate(zip(qvecs, qtexts, strict=True)):
            for mode in ("hybrid", "text"):
                plan = conn.execute(
                    "select statement, k, kc, exact_threshold, rrf_k, fts_limit, match, ef, "
                    "pgrag._filter_sql(null, null) from pgrag._search_plan(%s, %s, "
                    "%s::real[]::vector, null, 10, %s::jsonb, null, null, null, null, null, "
                    "null, null)",
                    (mode, text, q.tolist() if mode != "text" else None, Jsonb({})),
                ).fetchone()
                assert plan is not None
                statement, k, kc, exact, rrf_k, fts_limit, match, ef, where = plan
                new_part = NEW.format(where=where)
                assert new_part in statement, "the statement's text leg changed: update NEW"
                variants = {"ranked (now)": statement, "first matches (before)": statement.replace(
                    new_part, OLD.format(where=where))}  # fmt: skip
                params = {"p1": text, "p2": VectorParam(q) if mode != "text" else None, "p3": k}
                params |= {"p4": kc, "p5": exact, "p6": rrf_k, "p7": fts_limit, "p8": match}
                order = list(variants) if i % 2 == 0 else list(reversed(variants))
                for name in order:
                    ms = _run(conn, variants[name], params, ef or 40)
                    times.setdefault((mode, name), []).append(ms)
    after = os.getloadavg()
    print(f"## Full-text ranking: every match ranked vs the first matches, {rows[0]:,} chunks\n")
    print(f"{args.queries} questions per row, k = 10, match any, no filter, interleaved.\n")
    print("| mode | text leg | p50 ms | p95 ms |")
    print("|---|---|---:|---:|")
    for (mode, name), values in times.items():
        p95 = statistics.quantiles(values, n=20)[18]
        print(f"| {mode} | {name} | {statistics.median(values):.2f} | {p95:.2f} |")
    print(
        f"\nLoad average (1/5/15 min) before {before[0]:.2f} / {before[1]:.2f} / {before[2]:.2f}, "
        f"after {after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f}."
    )


if __name__ == "__main__":
    main()
