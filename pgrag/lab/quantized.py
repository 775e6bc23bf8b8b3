"""A quantized HNSW index beside the store's plain one, and the bare statement that walks it.

Issue 19's "beyond pgvector's graph walk": an HNSW index over a smaller form of each vector
(``halfvec``: 16-bit floats, half the size; ``bit``: one bit per dimension,
``binary_quantize``, hamming distance), whose candidates are re-ranked by the exact cosine
distance in the same statement, as pgvector's README describes:

    select id from (select id, embedding from pgrag.chunks where <filter>
                    order by <quantized embedding> <op> <quantized query> limit <candidates>) c
    order by embedding <=> query limit k

Used by ``pgrag bench search --quantized`` (a row beside the plain index's, interleaved) and
``bench/quantized_bench.py`` (unfiltered, several candidate counts). The index is built with
the store index's m and ef_construction and named ``pgrag.chunks_embedding_<kind>_hnsw``: a
benchmark's, which pgrag's own search never reads.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

# kind -> (the quantized expression over a vector, its HNSW operator class, its distance operator)
KINDS: dict[str, tuple[str, str, str]] = {
    "halfvec": ("({v})::halfvec({d})", "halfvec_cosine_ops", "<=>"),
    "bit": ("binary_quantize({v})::bit({d})", "bit_hamming_ops", "<~>"),
}
# candidates the quantized walk hands to the exact re-rank: at 1,000,000 chunks 40 and 100 gave
# the same recall (docs/benchmarks.md, "halfvec with an exact re-rank")
CANDIDATES = 40


def index_name(kind: str) -> str:
    return f"chunks_embedding_{kind}_hnsw"


def present(conn: psycopg.Connection[Any]) -> list[str]:
    """The kinds whose quantized index the store has."""
    return [
        kind
        for kind in KINDS
        if conn.execute("select to_regclass(%s)", (f"pgrag.{index_name(kind)}",)).fetchone()
        != (None,)
    ]


def drop(conn: psycopg.Connection[Any], kind: str) -> None:
    conn.execute(sql.SQL("drop index if exists pgrag.{}").format(sql.Identifier(index_name(kind))))


def dimension(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("select embedding_dim from pgrag.settings").fetchone()
    return int(row[0]) if row and row[0] else 384


def ensure_index(
    conn: psycopg.Connection[Any], kind: str, dim: int, maintenance_work_mem: str = "2GB"
) -> tuple[str, str]:
    """The quantized index over ``dim``-dimension vectors (the dimension its statement casts
    the query to: ``reranked``), built now if missing (``conn`` in autocommit): its size, and
    the build's seconds or 'existing'."""
    expr, ops, _ = KINDS[kind]
    name = index_name(kind)
    took = "existing"
    if kind not in present(conn):
        m, efc = conn.execute(
            "select hnsw_m, hnsw_ef_construction from pgrag.settings"
        ).fetchone() or (16, 64)
        conn.execute(
            "select set_config('maintenance_work_mem', %s, false)", (maintenance_work_mem,)
        )
        t = time.perf_counter()
        conn.execute(
            sql.SQL(
                "create index {} on pgrag.chunks using hnsw (({}) {}) "
                "with (m = {}, ef_construction = {})"
            ).format(
                sql.Identifier(name),
                sql.SQL(expr.format(v="embedding", d=dim)),
                sql.SQL(ops),
                sql.Literal(m),
                sql.Literal(efc),
            )
        )
        took = f"built in {time.perf_counter() - t:.0f} s"
    size = conn.execute(
        "select pg_size_pretty(pg_relation_size(%s::regclass))", (f"pgrag.{name}",)
    ).fetchone()
    return (size[0] if size else "?"), took


def reranked(kind: str, dim: int, filtered: bool) -> sql.Composed:
    """The bare statement: %(q)s the query vector, %(c)s the candidates, %(k)s the rows, and
    with ``filtered`` %(f)s the metadata filter (jsonb containment, as the sweep's)."""
    expr, _, op = KINDS[kind]
    return sql.SQL(
        "select id from (select id, embedding from pgrag.chunks {} order by {} {} {} "
        "limit %(c)s) c order by embedding <=> %(q)s::vector, id limit %(k)s"
    ).format(
        sql.SQL("where metadata @> %(f)s::jsonb" if filtered else ""),
        sql.SQL(expr.format(v="embedding", d=dim)),
        sql.SQL(op),
        sql.SQL(expr.format(v="%(q)s::vector", d=dim)),
    )
