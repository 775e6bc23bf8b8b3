"""The chunking-strategy benchmark (``pgrag bench strategies``): one sample shop, five ways to
retrieve from it, one question set, the same credit rule (pgrag/lab/eval/runner.py).

``run_strategy_bench(url)`` loads the sample shop with the comparison document types
(``table_row``, ``join_row``; sql/sample/shop_comparison_documents.sql), renders and embeds
each type once (timing both), generates the shop's question set with SQL ground truth, and
evaluates each strategy at k = 10 (P/R/F1/hit rate at 5 come from the first five of the same
rankings). ``markdown(bench)`` prints the tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from pgrag.errors import mapped_database_errors
from pgrag.lab.eval.metrics import Report, evaluate
from pgrag.lab.eval.questions import Question, generate_shop_questions, labels, qrels
from pgrag.lab.eval.runner import EvalResult, chunk_counts, named_queries, run_eval
from pgrag.lab.strategies import BENCH_STRATEGIES, Strategy, get_strategy

if TYPE_CHECKING:
    from pgrag.embed.base import Embedder

SHOP_TYPES = ("customer_profile", "order_detail", "table_row", "join_row")
EMBED_BATCH = 64


def strategy_types(strategy: Strategy) -> tuple[str, ...]:
    """The document types a strategy searches (hybrid: the shop's profiles and orders)."""
    return strategy.doc_types or ("customer_profile", "order_detail")


@dataclass(frozen=True)
class IndexCost:
    """Rendering and embedding one document type."""

    doc_type: str
    chunks: int
    render_s: float | None  # None: reused, not rendered in this run
    embed_s: float
    embedded: int  # texts sent to the model in this run


@dataclass(frozen=True)
class StrategyRow:
    strategy: str
    description: str
    chunks: int
    index_s: float | None
    at5: Report
    result: EvalResult  # k = 10


@dataclass(frozen=True)
class StrategyBench:
    customers: int
    seed: int
    question_count: int
    scored: int  # questions with at least one relevant document
    index: tuple[IndexCost, ...]
    rows: tuple[StrategyRow, ...]
    embedding_model: str
    seconds: float
    ceiling: Report | None = None  # a perfect ranking at 5: the relevant documents first

    def to_json(self) -> dict[str, Any]:
        from pgrag.lab.eval.runner import by_label_json

        return {
            "customers": self.customers,
            "seed": self.seed,
            "questions": self.question_count,
            "scored": self.scored,
            "embedding_model": self.embedding_model,
            "seconds": round(self.seconds, 1),
            "index": [c.__dict__ for c in self.index],
            "ceiling_at5": None
            if self.ceiling is None
            else {"precision": self.ceiling.mean.precision, "recall": self.ceiling.mean.recall},
            "strategies": [
                {
                    "strategy": r.strategy,
                    "description": r.description,
                    "chunks": r.chunks,
                    "index_s": r.index_s,
                    "at5": {
                        "precision": r.at5.mean.precision,
                        "recall": r.at5.mean.recall,
                        "f1": r.at5.mean.f1,
                        "hit_rate": r.at5.mean.hit_rate,
                    },
                    "at5_by_label": by_label_json(r.at5),
                    "at10": r.result.to_json(),
                }
                for r in self.rows
            ],
        }


# ---------------------------------------------------------------- embedding one type


def embed_type(
    conn: psycopg.Connection[Any],
    embedder: Embedder,
    doc_type: str,
    *,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """Embed the chunks of one type that wait for a vector, through the model (no content
    cache read), in batches; returns (texts embedded, seconds). ``conn`` is autocommit."""
    from pgvector.psycopg import register_vector

    q = {name: _sql(body) for name, body in named_queries("eval_runs.sql").items()}
    register_vector(conn)
    started = time.perf_counter()
    with mapped_database_errors():
        conn.execute(q["check_embedder"], {"model": embedder.name, "dim": embedder.dimension})
        rows = conn.execute(q["waiting_chunks"], {"doc_type": doc_type}).fetchall()
        done = 0
        for start in range(0, len(rows), EMBED_BATCH):
            batch = rows[start : start + EMBED_BATCH]
            texts: dict[bytes, str] = {}
            for r in batch:
                texts.setdefault(bytes(r[2]), str(r[1]))
            vectors = dict(zip(texts, embedder.embed(list(texts.values())), strict=True))
            conn.execute(
                q["store_embeddings"],
                {
                    "model": embedder.name,
                    "ids": [int(r[0]) for r in batch],
                    "hashes": [bytes(r[2]) for r in batch],
                    "vectors": [vectors[bytes(r[2])] for r in batch],
                },
            )
            done += len(texts)
            if on_batch is not None:
                on_batch(len(batch))
    return done, time.perf_counter() - started


def _sql(body: str) -> Any:
    from psycopg import sql

    return sql.SQL(body)  # type: ignore[arg-type,unused-ignore]  # our own file


# ---------------------------------------------------------------- the benchmark


def _shop_ready(conn: psycopg.Connection[Any], customers: int) -> bool:
    """Schema shop holds ``customers`` customers and the four shop types have chunks."""
    row = conn.execute("select to_regclass('shop.customers') is not null").fetchone()
    if not row or not row[0]:
        return False
    n = conn.execute("select count(*) from shop.customers").fetchone()
    counts = chunk_counts(conn)
    return bool(n and n[0] == customers and all(t in counts for t in SHOP_TYPES))


def run_strategy_bench(
    url: str,
    *,
    customers: int = 200,
    seed: int = 42,
    limit_per_template: int = 20,
    strategies: Sequence[str] = BENCH_STRATEGIES,
    reuse: bool = False,
    embedder: str | Embedder | None = None,
    say: Callable[[str], None] = print,
    bar: Callable[[str, int], Any] | None = None,
    questions_out: Callable[[Sequence[Question]], None] | None = None,
    load: Callable[[psycopg.Connection[Any]], None] | None = None,
) -> StrategyBench:
    """Load (or, with ``reuse``, keep) the sample shop with its comparison types, render and
    embed each type, generate the question set and evaluate ``strategies`` on it.

    ``bar(description, total)`` returns a tqdm-like progress bar (``update``, ``close``).
    ``load(conn)`` replaces the sample generator (tests load a hand-written tiny shop with it);
    ``customers`` is then only a label.
    """
    from pgrag import migrate
    from pgrag.connection import connect_once
    from pgrag.embed.registry import get_embedder
    from pgrag.lab.sample import load_sample, validate
    from pgrag.lab.sample_documents import declare_sample_documents
    from pgrag.search import query_cache_for
    from pgrag.vocabulary import forget_vocabulary

    if load is None:
        validate(customers, seed)
    chosen = [get_strategy(s) for s in strategies]  # (ConfigError naming the known ones)
    started = time.perf_counter()
    model = embedder if embedder is not None and not isinstance(embedder, str) else None
    model = model or get_embedder(embedder if isinstance(embedder, str) else None)
    migrate.upgrade(url)
    costs: list[IndexCost] = []
    with connect_once(url) as conn:
        reused = reuse and _shop_ready(conn, customers)
        if reused:
            say(f"reusing the sample shop ({customers} customers) and its chunks")
        elif load is not None:
            load(conn)
            declare_sample_documents(conn, comparisons=True)
        else:
            loaded = load_sample(conn, customers=customers, seed=seed, progress=bar is not None)
            say(
                f"sample shop: {loaded.customers:,} customers, {loaded.orders:,} orders, "
                f"{loaded.order_items:,} items"
            )
            declare_sample_documents(conn, comparisons=True)
        forget_vocabulary()
        from pgrag import documents

        for doc_type in SHOP_TYPES:
            render_s: float | None = None
            if not reused:
                t = time.perf_counter()
                documents.rebuild(conn, doc_type)
                render_s = time.perf_counter() - t
            waiting = chunk_counts(conn).get(doc_type, (0, 0))[1]
            progress = bar(f"embed {doc_type}", waiting) if bar is not None and waiting else None
            embedded, embed_s = embed_type(
                conn, model, doc_type, on_batch=progress.update if progress else None
            )
            if progress is not None:
                progress.close()
            chunks = chunk_counts(conn)[doc_type][0]
            costs.append(IndexCost(doc_type, chunks, render_s, embed_s, embedded))
            render = "kept" if render_s is None else f"rendered in {render_s:.1f} s"
            say(
                f"{doc_type}: {chunks:,} chunks, {render}, {embedded:,} texts embedded in "
                f"{embed_s:.1f} s"
            )
        questions = generate_shop_questions(conn, limit_per_template=limit_per_template, seed=seed)
        if questions_out is not None:
            questions_out(questions)
        judged = qrels(questions)
        scored = sum(1 for q in questions if q.relevant)
        say(f"{len(questions)} questions ({scored} with relevant documents)")
        cache = query_cache_for(model)
        by_type = {c.doc_type: c for c in costs}
        rows: list[StrategyRow] = []
        for strat in chosen:
            types = strategy_types(strat)
            progress = bar(strat.name, len(questions)) if bar is not None else None
            result = run_eval(
                conn,
                questions,
                strat,
                k=10,
                question_set=f"shop-{customers}-seed{seed}",
                embedder=cache,
                llm=None,
                progress=_ticker(progress),
            )
            if progress is not None:
                progress.close()
            at5 = evaluate(judged, result.run, 5, labels=labels(questions))
            renders = [by_type[t].render_s for t in types]
            index_s = (
                None
                if any(r is None for r in renders)
                else sum(by_type[t].embed_s + (by_type[t].render_s or 0.0) for t in types)
            )
            rows.append(
                StrategyRow(strat.name, strat.description, result.chunks, index_s, at5, result)
            )
            say(
                f"{strat.name}: P@5 {at5.mean.precision:.1%}, R@5 {at5.mean.recall:.1%}, "
                f"nDCG@10 {result.report.mean.ndcg:.3f}, p95 {result.latency_ms.p95:.1f} ms"
            )
    return StrategyBench(
        customers=customers,
        seed=seed,
        question_count=len(questions),
        scored=scored,
        index=tuple(costs),
        rows=tuple(rows),
        embedding_model=model.name,
        seconds=time.perf_counter() - started,
        ceiling=ceiling(questions),
    )


def ceiling(questions: Sequence[Question]) -> Report:
    """The scores at 5 of a perfect ranking (every relevant document first): P@5 cannot reach
    100% when a question has fewer than 5 relevant documents, nor R@5 when it has more."""
    perfect = {q.id: [r.doc_id for r in q.relevant] for q in questions}
    return evaluate(qrels(questions), perfect, 5, labels=labels(questions))


def _ticker(bar: Any) -> Callable[[int, int], None] | None:
    if bar is None:
        return None

    def tick(_done: int, _total: int) -> None:
        bar.update(1)

    return tick


# ---------------------------------------------------------------- markdown


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _faith(r: EvalResult) -> str:
    f = r.faithfulness
    return "n/a" if f.mean is None else f"{f.mean:.3f} ({f.checked})"


def strategy_table(rows: Sequence[StrategyRow]) -> list[str]:
    lines = [
        "| strategy | chunks | index s (render + embed) | P@5 | R@5 | F1@5 | hit@5 | MRR@10 "
        "| nDCG@10 | mean ms | p95 ms | faithfulness (answers) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m5, m10 = r.at5.mean, r.result.report.mean
        index = "reused" if r.index_s is None else f"{r.index_s:.1f}"
        lines.append(
            f"| {r.strategy} | {r.chunks:,} | {index} | {_pct(m5.precision)} | "
            f"{_pct(m5.recall)} | {_pct(m5.f1)} | {_pct(m5.hit_rate)} | {m10.mrr:.3f} | "
            f"{m10.ndcg:.3f} | {r.result.latency_ms.mean:.1f} | {r.result.latency_ms.p95:.1f} | "
            f"{_faith(r.result)} |"
        )
    return lines


def breakdown_table(rows: Sequence[StrategyRow], label: str, metric: str = "recall") -> list[str]:
    """``metric``@5 per value of ``label`` (complexity or category), one column per strategy."""
    values: dict[str, int] = {}
    for r in rows:
        for value, m in r.at5.by_label.get(label, {}).items():
            values[value] = m.count
    head = f"| {label} (questions) | " + " | ".join(r.strategy for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for value, count in sorted(values.items()):
        cells = []
        for r in rows:
            got = r.at5.by_label.get(label, {}).get(value)
            cells.append("" if got is None else _pct(getattr(got, metric)))
        lines.append(f"| {value} ({count}) | " + " | ".join(cells) + " |")
    return lines


def markdown(bench: StrategyBench) -> str:
    out = [
        f"sample shop: {bench.customers:,} customers (seed {bench.seed}); "
        f"{bench.question_count} questions, {bench.scored} with relevant documents; "
        f"model {bench.embedding_model}; {bench.seconds:.0f} s in all",
        "",
        *strategy_table(bench.rows),
        "",
        *(
            []
            if bench.ceiling is None
            else [
                f"A perfect ranking would score P@5 {_pct(bench.ceiling.mean.precision)}, "
                f"R@5 {_pct(bench.ceiling.mean.recall)}, F1@5 {_pct(bench.ceiling.mean.f1)} "
                "on these questions.",
                "",
            ]
        ),
        "Recall@5 by complexity:",
        "",
        *breakdown_table(bench.rows, "complexity"),
        "",
        "Recall@5 by category:",
        "",
        *breakdown_table(bench.rows, "category"),
        "",
        "| document type | chunks | render s | embed s | texts embedded |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in bench.index:
        render = "kept" if c.render_s is None else f"{c.render_s:.1f}"
        out.append(f"| {c.doc_type} | {c.chunks:,} | {render} | {c.embed_s:.1f} | {c.embedded:,} |")
    return "\n".join(out) + "\n"


def result_markdown(
    results: Mapping[str, EvalResult],
    at5: Mapping[str, Report],
    index_s: Mapping[str, float] | None = None,
) -> str:
    """A strategy table for results computed elsewhere (e.g. bench/northwind_eval.py)."""
    rows = [
        StrategyRow(name, name, r.chunks, (index_s or {}).get(name), at5[name], r)
        for name, r in results.items()
    ]
    return "\n".join(strategy_table(rows)) + "\n"


__all__ = [
    "IndexCost",
    "StrategyBench",
    "StrategyRow",
    "embed_type",
    "markdown",
    "run_strategy_bench",
]
