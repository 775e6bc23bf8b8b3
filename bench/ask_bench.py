"""The question pipeline at scale: ``ask`` (vocabulary, parse, search, rerank, answer) against
the search statement alone, on the same questions, interleaved. Prints markdown.

    python bench/ask_bench.py [--rows 100000] [--queries 200] [--skip-load]

Against PGRAG_DATABASE_URL (default: the embedded server): ``--rows`` synthetic chunks
(pgrag/lab/synthetic.py; replaces every chunk of that database) unless ``--skip-load``. Each
question's vector is put in the query cache first, so no model runs: what is timed is pgrag's
own work. ``search`` is ``pgrag.search.search`` with the question (hybrid, k = 10): the
statement every ask ran before the question layer was rebuilt, its parse (about 0.3 ms) aside.
``ask`` is the whole pipeline with an extractive answer. Also: reading the vocabulary once (it
is then cached five minutes per role and tenant). Say the load average with the figures.
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

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: see below

from bench.common import synthetic_store  # noqa: E402
from pgrag.ask import ask  # noqa: E402
from pgrag.embed.cache import QueryCache  # noqa: E402
from pgrag.lab import synthetic  # noqa: E402
from pgrag.search import search  # noqa: E402

try:  # (absent from releases before the question layer was rebuilt: run this file with
    # PYTHONPATH=<an older checkout> to time that release's ask on the same store)
    from pgrag.vocabulary import load_vocabulary
except ImportError:  # pragma: no cover
    load_vocabulary = None  # type: ignore[assignment]


class _Cached:
    """The synthetic store's model: every question's vector is in the query cache already."""

    name = "synthetic"
    dimension = synthetic.DIM

    def embed(self, texts: Any) -> np.ndarray[Any, Any]:
        del texts
        raise AssertionError("every question's vector is cached: the model must not run")


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    args, url = synthetic_store(__doc__)
    vecs, texts = synthetic.queries(args.queries)
    questions = [f"How many chunks about {t} are there in topic {i % 200}?" for i, t in
                 enumerate(texts)]  # fmt: skip
    before = os.getloadavg()
    cache = QueryCache(_Cached())
    with psycopg.connect(url, autocommit=True) as conn:
        synthetic.register(conn)
        rows = conn.execute("select count(*) from pgrag.chunks").fetchone()
        assert rows is not None
        conn.cursor().executemany(
            "insert into pgrag.query_cache (model, query_hash, query, embedding) "
            "values ('synthetic', sha256(convert_to(%(q)s, 'UTF8')), %(q)s, "
            "%(v)s::real[]::vector) on conflict (model, query_hash) do update "
            "set embedding = excluded.embedding, created_at = now()",
            [{"q": q, "v": v.tolist()} for q, v in zip(questions, vecs, strict=True)],
        )
        started = time.perf_counter()
        if load_vocabulary is not None:
            load_vocabulary(conn, fresh=True)
        vocabulary_ms = (time.perf_counter() - started) * 1000
        times: dict[str, list[float]] = {"search": [], "ask": []}
        parse: list[float] = []
        for i, question in enumerate(questions):
            order = ["search", "ask"] if i % 2 == 0 else ["ask", "search"]
            for name in order:
                t = time.perf_counter()
                if name == "search":
                    search(conn, question, embedder=cache, k=10)
                else:
                    r = ask(conn, question, embedder=cache, use_env_llm=False)
                    parse.append(r.timings["parse_ms"])
                times[name].append((time.perf_counter() - t) * 1000)
    after = os.getloadavg()
    import pgrag

    print(f"## The question pipeline at {rows[0]:,} chunks ({Path(pgrag.__file__).parent})\n")
    print(f"{args.queries} questions, k = 10, vectors from the query cache, interleaved.\n")
    print("| path | p50 ms | p95 ms |")
    print("|---|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {_p(values, 95):.2f} |")
    print(f"| (parse, inside ask) | {statistics.median(parse):.2f} | {_p(parse, 95):.2f} |")
    print(f"\nReading the vocabulary once: {vocabulary_ms:,.0f} ms (then cached).")
    print(
        f"Load average (1/5/15 min) before {before[0]:.2f} / {before[1]:.2f} / {before[2]:.2f}, "
        f"after {after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f}."
    )


if __name__ == "__main__":
    main()
