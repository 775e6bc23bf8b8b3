"""Synthetic chunks for search benchmarks: clustered unit vectors, texts and selective metadata.

Real sentence embeddings are clustered, and uniform random vectors in 384 dimensions have no
nearest neighbours worth the name, so the vectors are a Gaussian mixture (200 centres, noise
larger than the centres' spread: hard, low-contrast neighbourhoods, as the shop's real
questions against its real chunks; docs/benchmarks.md compares the two). Texts are drawn from
per-cluster vocabularies; metadata keys select 100%, 10%, 1% and 0.1% of the rows independently
of the vectors and of the physical order. Used by ``bench/search_bench.py`` and
``pgrag bench search`` (``pgrag/lab/sweep.py``).
"""

from __future__ import annotations

import sys
import time
from typing import Any, LiteralString

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from pgrag import filter_index
from pgrag.lab import quantized

DIM = 384
CLUSTERS = 200
VOCAB_PER_CLUSTER = 20
DOC_TYPE = "synthetic"
SELECTIVITIES: dict[str, dict[str, Any]] = {
    "100%": {"all": True},
    "10%": {"p10": True},
    "1%": {"p1": True},
    "0.1%": {"p01": True},
}
SCHEMA = {
    "all": "boolean",
    "p10": "boolean",
    "p1": "boolean",
    "p01": "boolean",
    "topic": "integer",
    "bucket": "integer",
}

_HNSW: LiteralString = "select indexdef from pg_indexes where indexname = 'chunks_embedding_hnsw'"
# The rows go through a temporary table: COPY cannot compute a column, and each chunk's
# tsvector is written with it (pgrag.text_tsvector), as a render writes it, not by an UPDATE
# after the load that would leave a second version of every row.
_STAGE: LiteralString = (
    "create temporary table synthetic_rows on commit drop as "
    "select doc_type, source_key, text, metadata, embedding, embedding_model "
    "from pgrag.chunks with no data"
)
_COPY: LiteralString = (
    "copy synthetic_rows (doc_type, source_key, text, metadata, embedding, embedding_model) "
    "from stdin (format binary)"
)
_FROM_STAGE: LiteralString = (
    "insert into pgrag.chunks (doc_type, source_key, text, metadata, embedding, "
    "embedding_model, tsv) "
    "select doc_type, source_key, text, metadata, embedding, embedding_model, "
    "pgrag.text_tsvector(text) from synthetic_rows"
)


def rows(n: int, seed: int = 7) -> tuple[np.ndarray[Any, Any], list[str], list[dict[str, Any]]]:
    """Vectors (n x DIM, unit length), texts and metadata for n chunks."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLUSTERS, DIM)).astype(np.float32)
    cluster = rng.integers(0, CLUSTERS, size=n)
    vecs = centers[cluster] + rng.normal(scale=1.2, size=(n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    pick = rng.permutation(n)
    words = rng.integers(0, VOCAB_PER_CLUSTER, size=(n, 4))
    noise = rng.integers(0, CLUSTERS * VOCAB_PER_CLUSTER, size=(n, 4))
    texts: list[str] = []
    metas: list[dict[str, Any]] = []
    for i in range(n):
        c = int(cluster[i])
        own = " ".join(f"w{c}x{w}" for w in words[i])
        other = " ".join(f"w{w // VOCAB_PER_CLUSTER}x{w % VOCAB_PER_CLUSTER}" for w in noise[i])
        texts.append(f"synthetic chunk {i} about topic {c}: {own} {other}")
        p = int(pick[i])
        meta: dict[str, Any] = {"all": True, "topic": c, "bucket": p % 1000}
        if p % 10 == 0:
            meta["p10"] = True
        if p % 100 == 0:
            meta["p1"] = True
        if p % 1000 == 0:
            meta["p01"] = True
        metas.append(meta)
    return vecs, texts, metas


def queries(n: int, seed: int = 11) -> tuple[np.ndarray[Any, Any], list[str]]:
    """Query vectors from the same mixture (same centres) and two-word texts of their cluster."""
    centers = np.random.default_rng(7).normal(size=(CLUSTERS, DIM)).astype(np.float32)
    q = np.random.default_rng(seed)
    cluster = q.integers(0, CLUSTERS, size=n)
    vecs = centers[cluster] + q.normal(scale=1.2, size=(n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    texts = [f"w{c}x{q.integers(0, 20)} w{c}x{q.integers(0, 20)}" for c in cluster]
    return vecs, texts


def seed_questions(conn: psycopg.Connection[Any], n: int = 50, seed: int = 13) -> None:
    """Put n held-out query vectors (another seed than the benchmarks' queries) into the query
    cache as questions of the store's model, so ``pgrag tune`` sizes ef_search on new points
    like a store's real questions, not on chunk vectors, which the graph already holds."""
    vecs, texts = queries(n, seed)
    with conn.cursor() as cur:
        cur.executemany(
            "insert into pgrag.query_cache (model, query_hash, query, embedding) "
            "values ('synthetic', sha256(convert_to(%(q)s, 'UTF8')), %(q)s, "
            "%(v)s::real[]::vector) on conflict (model, query_hash) do update "
            "set embedding = excluded.embedding, created_at = now()",
            [{"q": f"held-out question {i}: {texts[i]}", "v": vecs[i].tolist()} for i in range(n)],
        )


def loaded(conn: psycopg.Connection[Any]) -> int:
    """How many synthetic chunks the store holds (0 when it holds anything else too)."""
    row = conn.execute(
        "select count(*) filter (where doc_type = 'synthetic'), count(*) from pgrag.chunks"
    ).fetchone()
    assert row is not None
    return int(row[0]) if row[0] == row[1] else 0


def load(url: str, n: int, *, seed: int = 7, quiet: bool = False) -> float:
    """Replace every chunk with n synthetic ones, then rebuild the HNSW index; seconds taken."""
    started = time.perf_counter()
    vecs, texts, metas = rows(n, seed)
    store(url, vecs, texts, metas, quiet=quiet)
    if not quiet:
        print(f"indexed in {time.perf_counter() - started:.1f} s total", file=sys.stderr)
    return time.perf_counter() - started


def store(
    url: str,
    vecs: Any,
    texts: list[str],
    metas: list[dict[str, Any]],
    *,
    quiet: bool = True,
) -> None:
    """Replace every chunk with these (type ``synthetic``, keys 0..n-1), then rebuild the HNSW
    index in memory with its own definition, so m / ef_construction stay the migration's."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        register_vector(conn)
        hnsw = conn.execute(_HNSW).fetchone()
        if hnsw is None:
            raise RuntimeError("the HNSW index is missing: migrate the database (pgrag db upgrade)")
        conn.execute("drop index pgrag.chunks_embedding_hnsw")
        for index in filter_index.list_indexes(conn):  # none slows the load down
            conn.execute(sql.SQL("drop index {}").format(sql.Identifier("pgrag", index.name)))
        for kind in quantized.present(conn):  # (a sweep's --quantized builds it again)
            quantized.drop(conn, kind)
        conn.execute("delete from pgrag.chunks")
        conn.execute("update pgrag.settings set embedding_model = 'synthetic'")
        register(conn)
        conn.execute(_STAGE)
        with conn.cursor().copy(_COPY) as cp:
            cp.set_types(["text", "text", "text", "jsonb", "vector", "text"])
            for i in range(len(texts)):
                cp.write_row((DOC_TYPE, str(i), texts[i], Jsonb(metas[i]), vecs[i], "synthetic"))
        conn.execute(_FROM_STAGE)
        conn.commit()
        if not quiet:
            n = len(texts)
            print(f"loaded {n:,} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        # 1M x 384-d needs ~4 GB to build in memory; a spilled build is several times slower
        conn.execute("select set_config('maintenance_work_mem', '6GB', false)")
        conn.execute("select set_config('max_parallel_maintenance_workers', '2', false)")
        conn.execute(str(hnsw[0]).encode())
        conn.commit()
        conn.autocommit = True
        conn.execute("vacuum analyze pgrag.chunks")


def register(conn: psycopg.Connection[Any]) -> None:
    """A document type row for the synthetic chunks, with their metadata schema (filters on
    them compile against it). Not declared through pgrag.declare_document: the chunks are
    written directly, with their vectors, and no view renders them."""
    conn.execute(
        "insert into pgrag.doc_types (name, source, owns_source, key_type, metadata_schema) "
        "values ('synthetic', 'pgrag.chunks'::regclass, false, 'text', %s) "
        "on conflict (name) do update set metadata_schema = excluded.metadata_schema",
        (Jsonb(SCHEMA),),
    )


def declare_stats(conn: psycopg.Connection[Any]) -> None:
    """The synthetic type's row (``register``) and exact statistics over the matches."""
    register(conn)
    conn.execute(
        "select pgrag.declare_stats('synthetic', $q$select jsonb_build_object("
        "'chunks', count(*), 'topics', count(distinct (metadata->>'topic')), "
        "'mean_bucket', avg((metadata->>'bucket')::integer)) from hits$q$)"
    )
