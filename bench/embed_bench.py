"""Embedding throughput and query latency, side by side in one run. Prints markdown.

    python bench/embed_bench.py [--texts 1000] [--batch-size 64] [--queries 40]

Against the database of PGRAG_DATABASE_URL (default: the embedded server), in a scratch
database `pgrag_bench_embed` it creates and drops. On the same texts, all in one process:
1. raw model throughput: the default embedder (all-MiniLM-L6-v2, PyTorch, CPU) called on the
   same batches the worker makes, no database;
2. pgrag's pipeline: the chunks inserted, then ``Worker.drain()`` (claim, cache lookup, embed,
   store with the HNSW index, release) until the queue is empty; the ratio to step 1, and the
   share of the pipeline's time spent outside the model. Steps 1 and 2 alternate over
   ``--rounds`` slices of the texts, so machine noise hits both alike;
3. the int8 ONNX build of the same model on the same batches, and its cosine to PyTorch;
4. single-query embedding latency through QueryCache: cold (model + cache write), cached in
   process memory, cached in Postgres only (a new QueryCache, as another process sees it).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from pgrag import migrate
from pgrag.connection import resolve_url
from pgrag.embed import QueryCache
from pgrag.embed.onnx import OnnxEmbedder
from pgrag.embed.sentence_transformers import SentenceTransformerEmbedder
from pgrag.worker import Worker

DB = "pgrag_bench_embed"
TOPICS = [
    "garden hoses",
    "winter boots",
    "espresso machines",
    "road bikes",
    "desk lamps",
    "yoga mats",
    "board games",
    "kitchen knives",
]


def corpus(n: int) -> list[str]:
    """Document-like texts of 15 to 150 words, all distinct (no content-cache hits)."""
    rng = np.random.default_rng(42)
    out = []
    for i in range(n):
        lines = [
            f"Customer {i}: segment {['VIP', 'Regular', 'New'][i % 3]}, since {2015 + i % 10}."
        ]
        for j in range(int(rng.integers(1, 9))):
            t = TOPICS[int(rng.integers(len(TOPICS)))]
            lines.append(
                f"Order {i * 10 + j} on 2024-{1 + j % 12:02d}-{1 + i % 28:02d}: {t}, "
                f"{int(rng.integers(1, 5))} items, {rng.uniform(5, 500):.2f} EUR, "
                f"status {['delivered', 'returned', 'shipped'][int(rng.integers(3))]}."
            )
        out.append(" ".join(lines))
    return out


def with_db(url: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def raw_throughput(embedder: Any, texts: list[str], batch: int) -> float:
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        embedder.embed(texts[i : i + batch])
    return len(texts) / (time.perf_counter() - started)


class TimedEmbedder:
    """The worker's embedder, timed: what the pipeline spends outside the model."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.seconds = 0.0

    def embed(self, texts: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    base = resolve_url(None)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
    url = with_db(base, DB)
    try:
        migrate.upgrade(url)
        texts = corpus(args.texts)
        st = SentenceTransformerEmbedder()
        st.load()
        onnx = OnnxEmbedder()
        onnx.load()
        raw_throughput(st, texts[:128], args.batch_size)  # warm-up
        raw_throughput(onnx, texts[:128], args.batch_size)

        # Raw and pipeline alternate round by round on the same texts, so both see the same
        # machine (other processes, turbo, autovacuum) and neither gets the quiet minutes.
        timed = TimedEmbedder(st)
        raw_s = pipe_s = 0.0
        written = 0
        step = max(args.batch_size, args.texts // args.rounds)
        with Worker(url, timed, batch_size=args.batch_size) as w:
            for r, start in enumerate(range(0, len(texts), step)):
                part = texts[start : start + step]
                with (
                    psycopg.connect(url) as conn,
                    conn.cursor().copy(
                        "copy pgrag.chunks (doc_type, source_key, text) from stdin"
                    ) as copy,
                ):
                    for i, t in enumerate(part):
                        copy.write_row(("bench", str(start + i), t))
                for phase in ("raw", "pipe") if r % 2 == 0 else ("pipe", "raw"):
                    if phase == "raw":
                        raw_s += len(part) / raw_throughput(st, part, args.batch_size)
                    else:
                        result = w.drain()
                        pipe_s += result.seconds
                        written += result.written
        assert written == len(texts)
        raw = len(texts) / raw_s
        pipeline = len(texts) / pipe_s
        outside_model = 1 - timed.seconds / pipe_s
        onnx_tps = raw_throughput(onnx, texts, args.batch_size)
        a = st.embed(texts[:200])
        b = onnx.embed(texts[:200])
        cos = (a * b).sum(axis=1)

        questions = [
            f"Which {t} orders were returned by {s} customers in {y}?"
            for t in TOPICS
            for s in ("VIP", "New")
            for y in (2023, 2024, 2025)
        ]
        questions = questions[: args.queries]
        with psycopg.connect(url, autocommit=True) as conn:
            cache = QueryCache(st)
            cold = [cache.embed(conn, q).seconds for q in questions]
            memory = [cache.embed(conn, q).seconds for q in questions]
            other = QueryCache(st)
            database = [other.embed(conn, q).seconds for q in questions]
            assert all(other.embed(conn, q).source == "memory" for q in questions)

        ms = 1000.0
        print(
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()},"
            f" PostgreSQL 18 embedded; {args.texts} texts of 15-150 words, batches of "
            f"{args.batch_size}.\n"
        )
        print("| measure | value |")
        print("|---|---|")
        print(f"| raw model (PyTorch, same batches, no database) | {raw:.1f} texts/s |")
        print(f"| pgrag pipeline (claim, embed, store, HNSW) | {pipeline:.1f} texts/s |")
        print(f"| pipeline / raw | {100 * pipeline / raw:.1f} % |")
        print(
            f"| pipeline time outside the model (claim, cache, store, release) | "
            f"{100 * outside_model:.1f} % |"
        )
        print(
            f"| ONNX int8 (same batches) | {onnx_tps:.1f} texts/s ({onnx_tps / raw:.2f}x PyTorch) |"
        )
        print(
            f"| cosine ONNX vs PyTorch (200 texts) | mean {cos.mean():.5f}, min {cos.min():.5f} |"
        )
        for label, xs in (
            ("cold (model + cache write)", cold),
            ("cached, process memory", memory),
            ("cached, Postgres (new process)", database),
        ):
            print(
                f"| query latency, {label} | p50 {pct(xs, 50) * ms:.3f} ms, "
                f"p95 {pct(xs, 95) * ms:.3f} ms |"
            )
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(
                sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB))
            )


if __name__ == "__main__":
    main()
