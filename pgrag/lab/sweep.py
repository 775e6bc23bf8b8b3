"""``pgrag bench search``: the search speed/recall sweep, as markdown and PNG plots.

For each store size (synthetic chunks, ``pgrag/lab/synthetic.py``, one database per size on the
server) and each filter selectivity (100%, 10%, 1%, 0.1%), side by side in one run:

- bare pgvector (``where filter order by embedding <=> q limit k``) at ef_search 20, 40, 100,
  200, 400, with and without the iterative scan: rows returned, recall@k against exact search,
  p50 / p95 / p99 latency;
- pgrag's filtered vector search with its defaults (and ``pgrag tune``'s stored ef_search, if
  any): the same columns plus the scan it chose;
- at each filter, the full hybrid statement with exact statistics, and the end-to-end stage
  breakdown: question embedding (default model, cold query cache), that statement, rerank
  (pass-through unless a cross-encoder is set).

The index and the table are prewarmed into shared_buffers first (``pg_prewarm``), and the
report says how large they and shared_buffers are.

Exact search (the index disabled) is the ground truth. Writes ``search-sweep.md`` and one PNG
per size into the output directory (``docs/`` by default).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from pgrag.errors import MissingDependency
from pgrag.lab import quantized, synthetic
from pgrag.limits import check_query_vector

if TYPE_CHECKING:
    from pgrag.search import SearchResult

# up to 400: a store tuned at 1,000,000 chunks searches at 150-300 (docs/benchmarks.md)
EF_VALUES: tuple[int, ...] = (20, 40, 100, 200, 400)

_FILTERED: LiteralString = (
    "select id from pgrag.chunks where metadata @> %(f)s::jsonb "
    "order by embedding <=> %(v)s::vector limit %(k)s"
)
# The bare statement returning what pgrag's search returns (each hit's text, metadata and its
# parent's text): a RAG application needs the texts, which ids alone do not give it.
_FILTERED_COLUMNS: LiteralString = (
    "select c.id, c.doc_type, c.source_key, c.text, c.metadata, b.distance, c.parent_id, "
    "p.source_key, p.text "
    "from (select id, embedding <=> %(v)s::vector as distance from pgrag.chunks "
    "where metadata @> %(f)s::jsonb order by embedding <=> %(v)s::vector limit %(k)s) b "
    "join pgrag.chunks c on c.id = b.id left join pgrag.chunks p on p.id = c.parent_id "
    "order by b.distance, b.id"
)
# The ef_search pgrag's search of a filter runs with (its plan's choice).
_PLAN_EF: LiteralString = (
    "select ef from pgrag._search_plan('vector', null, %(v)s::vector, 'synthetic', %(k)s, "
    "%(f)s::jsonb, null, null, null, null, null, null, null)"
)
COLUMNS_ENGINE = "pgvector, pgrag's columns"


def quantized_engine(kind: str) -> str:
    """The engine name of the rows that walk a quantized index (pgrag/lab/quantized.py)."""
    return f"pgvector, {kind} index, {quantized.CANDIDATES} re-ranked"


_INDEX_OPTIONS: LiteralString = (
    "select reloptions from pg_class where oid = 'pgrag.chunks_embedding_hnsw'::regclass"
)
# `+ 0` keeps the planner off the HNSW index whatever the settings: the exact answer.
_EXACT: LiteralString = (
    "select id from pgrag.chunks where metadata @> %(f)s::jsonb "
    "order by (embedding <=> %(v)s::vector) + 0 limit %(k)s"
)
_SETTINGS: LiteralString = (
    "select set_config('hnsw.ef_search', %(ef)s, true), "
    "set_config('hnsw.iterative_scan', %(it)s, true)"
)

_MEMORY: LiteralString = (
    "select current_setting('shared_buffers'), "
    "pg_size_pretty(pg_relation_size('pgrag.chunks_embedding_hnsw')), "
    "pg_size_pretty(pg_relation_size('pgrag.chunks')), "
    "coalesce(nullif(current_setting('pgrag.ef_search', true), ''), 'unset'), "
    "coalesce(current_setting('huge_pages_status', true), 'unknown')"
)
# every HNSW index of the chunks (the store's and any filter index), then the table
_PREWARM: LiteralString = (
    "select sum(pg_prewarm(x.indexrelid)) + pg_prewarm('pgrag.chunks'::regclass) "
    "from pg_index x join pg_class i on i.oid = x.indexrelid join pg_am a on a.oid = i.relam "
    "where x.indrelid = 'pgrag.chunks'::regclass and a.amname = 'hnsw'"
)
# the filters that get a filter index with --filter-indexes: 0.1% is below exact_threshold
FILTER_INDEXED: tuple[str, ...] = ("10%", "1%")

Progress = Callable[[str, int, int], None]
# the warm-up pass's query vector: another seed than the timed queries' and the questions'
WARM_UP_SEED = 17


@dataclass(frozen=True)
class Row:
    """One configuration at one selectivity."""

    engine: str  # "pgvector" or "pgrag"
    selectivity: str
    ef_search: int | None  # None: pgrag's own choice
    iterative: bool
    rows_mean: float
    rows_min: int
    recall: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    scan: str = ""


@dataclass(frozen=True)
class SizeReport:
    rows: int
    queries: int
    k: int
    results: tuple[Row, ...]
    # filter -> stage -> percentile (stage_breakdown), one entry per selectivity; its "hits"
    # stage holds statistics-cache hits per stage and "of" (the statements per stage)
    stages: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    embedder: str = ""
    memory: str = ""  # shared_buffers, index and table sizes, whether they were prewarmed
    tuned: str = ""  # what pgrag tune chose before the run, if it ran
    load_seconds: float | None = None
    index: str = ""  # the HNSW build parameters
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load average, before and after
    filter_indexes: str = ""  # which filters had a filter index (pgrag/filter_index.py)
    # filter -> pgrag's first search of its shape on the sweep's connection (the warm-up)
    pgrag_first_ms: dict[str, float] = field(default_factory=dict)
    quantized: str = ""  # the quantized index whose rows the run has (set_quantized)


def _pct(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 2)


def _row(
    engine: str,
    label: str,
    ef: int | None,
    it: bool,
    got: list[list[int]],
    truth: list[list[int]],
    times: list[float],
    scan: str = "",
) -> Row:
    counts = [len(g) for g in got]
    recalls = [len(set(g) & set(t)) / max(len(t), 1) for g, t in zip(got, truth, strict=True)]
    return Row(
        engine=engine,
        selectivity=label,
        ef_search=ef,
        iterative=it,
        rows_mean=round(statistics.fmean(counts), 2),
        rows_min=min(counts),
        recall=round(statistics.fmean(recalls), 3),
        p50_ms=_pct(times, 50),
        p95_ms=_pct(times, 95),
        p99_ms=_pct(times, 99),
        scan=scan,
    )


def _ids(
    conn: psycopg.Connection[Any],
    v: Any,
    flt: dict[str, Any],
    k: int,
    stmt: LiteralString = _FILTERED,
) -> list[int]:
    # never prepared: a generic plan cached while one setting held would outlive it (settings
    # do not invalidate cached plans), and an application's ad-hoc query is planned each time.
    # The vector goes in pgvector's binary form, as pgrag's search sends it: as a list of
    # Python floats, psycopg spent 0.8 ms dumping it, which counted against bare pgvector.
    from pgrag.search import VectorParam, _adapt_vector_param

    with conn.cursor() as cur:
        _adapt_vector_param(cur.adapters)
        params = {"f": json.dumps(flt), "v": VectorParam(check_query_vector(v)), "k": k}
        rows = cur.execute(stmt, params, prepare=False).fetchall()
    return [int(r[0]) for r in rows]


def _top_level(conn: psycopg.Connection[Any]) -> None:
    """SET LOCAL inside a savepoint outlives it: the settings below need their own transaction."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("the sweep needs a connection outside any transaction")


def exact(conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int) -> list[int]:
    """Ground truth: every matching vector compared (the index disabled)."""
    _top_level(conn)
    with conn.transaction():
        conn.execute("set local enable_indexscan = off")
        return _ids(conn, v, flt, k, _EXACT)


def bare(
    conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int, ef: int, iterative: bool
) -> tuple[float, list[int]]:
    _top_level(conn)
    with conn.transaction():
        conn.execute(_SETTINGS, {"ef": str(ef), "it": "relaxed_order" if iterative else "off"})
        t = time.perf_counter()
        ids = _ids(conn, v, flt, k)
        return (time.perf_counter() - t) * 1000, ids


def bare_columns(
    conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int, ef: int
) -> tuple[float, list[int]]:
    """The bare statement returning pgrag's columns, at pgrag's ef_search, iterative."""
    from pgrag.search import VectorParam

    params = {"f": json.dumps(flt), "v": VectorParam(check_query_vector(v)), "k": k}
    return _timed_iterative(conn, _FILTERED_COLUMNS, params, ef)


@functools.cache
def _quantized_statement(kind: str) -> bytes:
    """The quantized rows' statement, composed once (composing it inside the timing cost
    about 10 µs a query, which the other bare rows do not pay)."""
    return quantized.reranked(kind, synthetic.DIM, filtered=True).as_bytes(None)


def bare_quantized(
    conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int, ef: int, kind: str
) -> tuple[float, list[int]]:
    """The bare statement over the quantized index, its candidates re-ranked exactly, with
    the iterative scan (a filter leaves fewer than the candidates otherwise)."""
    from pgrag.search import VectorParam

    params = {
        "f": json.dumps(flt),
        "q": VectorParam(check_query_vector(v)),
        "k": k,
        "c": max(quantized.CANDIDATES, k),
    }
    return _timed_iterative(conn, _quantized_statement(kind), params, ef)


def _timed_iterative(
    conn: psycopg.Connection[Any], stmt: LiteralString | bytes, params: dict[str, Any], ef: int
) -> tuple[float, list[int]]:
    """A bare statement in a transaction of its own, at ``ef`` with the iterative scan: its
    milliseconds (the statement and its rows alone, the settings outside) and its ids."""
    from pgrag.search import _adapt_vector_param

    _top_level(conn)
    with conn.transaction():
        conn.execute(_SETTINGS, {"ef": str(ef), "it": "relaxed_order"})
        with conn.cursor() as cur:
            _adapt_vector_param(cur.adapters)
            t = time.perf_counter()
            rows = cur.execute(stmt, params, prepare=False).fetchall()
            ms = (time.perf_counter() - t) * 1000
    return ms, [int(r[0]) for r in rows]


def _plan_ef(conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int) -> int:
    """The ef_search pgrag's plan chooses for a vector search of this filter."""
    from pgrag.search import VectorParam, _adapt_vector_param

    _top_level(conn)
    with conn.transaction(), conn.cursor() as cur:
        _adapt_vector_param(cur.adapters)
        params = {"f": json.dumps(flt), "v": VectorParam(check_query_vector(v)), "k": k}
        row = cur.execute(_PLAN_EF, params).fetchone()
    return int(row[0]) if row and row[0] else 40


def pgrag_vector(
    conn: psycopg.Connection[Any], v: Any, flt: dict[str, Any], k: int
) -> SearchResult:
    """pgrag's filtered vector search with its defaults, as the sweep runs it."""
    from pgrag.search import exclusive, search

    with exclusive(conn):  # (the sweep's own connection)
        return search(conn, vector=v, model="synthetic", filter=flt, k=k, mode="vector")


def tune_on_questions(url: str, k: int) -> str:
    """``pgrag tune`` (target recall 0.95) on 50 held-out questions; what it chose, as a note."""
    from pgrag import tune

    with psycopg.connect(url) as conn:
        synthetic.seed_questions(conn)
        conn.commit()
        res = tune.tune(conn, k=k)
    ladder = ", ".join(f"{p.ef_search}: {p.recall:.3f}" for p in res.points)
    chosen = f"stored ef_search {res.chosen}" if res.chosen else "no ef_search reached 0.95"
    return f"`pgrag tune` on {res.queries} held-out {res.source} ({ladder}): {chosen}"


def worker_tuning(url: str, progress: Progress | None = None) -> str:
    """What the worker does after embedding a store (``Worker._maybe_tune``: measure ef_search
    when none was or the store doubled; when no value reached the target and the store has
    outgrown its graph, rebuild the store index for its size and measure again), as a note
    with the measurement searches now use."""
    from pgrag import filter_index, tune

    rebuilt = ""
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        measured = tune.maybe_tune(conn)
        if (
            measured is not None
            and measured.chosen is None
            and filter_index.graph_behind(conn) is not None
        ):
            started = time.perf_counter()
            done, _ = filter_index.rebuild_and_tune(
                url, tuned_by="worker", progress=_relabel(progress, "store index rebuild")
            )
            rebuilt = (
                f"; the worker then rebuilt the store index for the store's size (m {done.m}, "
                f"ef_construction {done.ef_construction}, {time.perf_counter() - started:,.0f} s"
                f", {done.size_bytes / 2**20:,.0f} MB) and measured again"
            )
        row = conn.execute(
            "select ef_search, recall, chunks, source, best_ef_search, target "
            "from pgrag.tuning order by id desc limit 1"
        ).fetchone()
    if row is None:
        return "not tuned (fewer vectors than the worker's minimum)"
    chosen = (
        f"ef_search {row[0]}, recall {row[1]:.3f}"
        if row[0] is not None
        else f"no ef_search reached {row[5]:g}; the closest, {row[4]} (recall {row[1]:.3f}), "
        "stored: the index graph is the limit"
    )
    return (
        f"out of the box (the worker's measurement after embedding, on {row[3]} of the store, "
        f"at {row[2]:,} chunks){rebuilt}: {chosen}"
    )


def set_filter_indexes(url: str, wanted: bool, progress: Progress | None = None) -> str:
    """With ``wanted``, a filter index for each FILTER_INDEXED filter (built unless present);
    without, none at all (a previous run's are dropped). What the store has, as a note."""
    from pgrag import filter_index

    if not wanted:
        with psycopg.connect(url) as conn:
            names = [i.name for i in filter_index.list_indexes(conn)]
        for name in names:
            filter_index.drop(url, name)
        return "none (every filter walks the store's index)"
    notes = []
    for label in FILTER_INDEXED:
        started = time.perf_counter()
        index, built = filter_index.add(
            url,
            synthetic.SELECTIVITIES[label],
            maintenance_work_mem="4GB",
            progress=_relabel(progress, f"filter index {label}"),
        )
        took = f", built in {time.perf_counter() - started:.0f} s" if built else ""
        notes.append(
            f"{label} `{index.filter_json}` ({index.rows:,} chunks, "
            f"{index.size_bytes / 2**20:,.0f} MB{took})"
        )
    return "; ".join(notes) + " (the planner picks them for the bare pgvector statement too)"


def set_quantized(url: str, kind: str | None) -> str:
    """With ``kind``, its quantized index (built unless present), the others dropped; without,
    none at all (they take shared_buffers from the plain index). What the store has, as a note."""
    with psycopg.connect(url, autocommit=True) as conn:
        dropped = [other for other in quantized.present(conn) if other != kind]
        for other in dropped:
            quantized.drop(conn, other)
        if kind is None:
            # (said in the report: building it again takes tens of minutes at 1,000,000)
            return "".join(f"none (the {d} index of an earlier run dropped)" for d in dropped)
        size, took = quantized.ensure_index(conn, kind, synthetic.DIM, maintenance_work_mem="4GB")
    expr = quantized.KINDS[kind][0].format(v="embedding", d=synthetic.DIM)
    return (
        f"an HNSW index over `{expr}` ({quantized.KINDS[kind][1]}, the store index's m and "
        f"ef_construction), {size}, {took}; its rows walk it for {quantized.CANDIDATES} "
        "candidates (the iterative scan on) and re-rank them by the exact cosine distance in "
        "the same statement"
    )


def _relabel(progress: Progress | None, label: str) -> Progress | None:
    if progress is None:
        return None
    return lambda _phase, done, total: progress(label, done, total)


def prewarm(conn: psycopg.Connection[Any]) -> str:
    """Load the HNSW index and the chunks into shared_buffers (pg_prewarm, when the role may
    create it), as a server that has been serving searches has them; says what it did."""
    row = conn.execute(_MEMORY).fetchone()
    assert row is not None
    facts = (
        f"shared_buffers {row[0]} (huge pages {row[4]}), HNSW index {row[1]}, "
        f"chunks table {row[2]}; "
        f"stored pgrag.ef_search {row[3]}"
    )
    try:
        with conn.transaction():
            conn.execute("create extension if not exists pg_prewarm")
            conn.execute(_PREWARM).fetchone()
    except psycopg.Error as exc:
        conn.rollback()
        return f"{facts}; not prewarmed ({str(exc).splitlines()[0]})"
    conn.commit()
    return f"{facts}; indexes and table prewarmed into shared_buffers (pg_prewarm) before the run"


def sweep_size(
    url: str,
    *,
    queries: int = 50,
    k: int = 10,
    ef_values: Sequence[int] = EF_VALUES,
    stages: bool = True,
    progress: Progress | None = None,
    quantized_kind: str | None = None,
) -> SizeReport:
    """The sweep on one loaded synthetic store; with ``quantized_kind``, rows over that
    quantized index too (set_quantized builds it)."""
    qvecs, _ = synthetic.queries(queries)
    warm = synthetic.queries(1, seed=WARM_UP_SEED)[0][0]
    load_before = os.getloadavg()[0]
    results: list[Row] = []
    first: dict[str, float] = {}
    with psycopg.connect(url) as conn:
        register_vector(conn)
        n = synthetic.loaded(conn)
        idx = conn.execute(_INDEX_OPTIONS).fetchone()
        conn.rollback()
        memory = prewarm(conn)
        configs = [(ef, it) for ef in ef_values for it in (False, True)]
        steps = len(synthetic.SELECTIVITIES) * (1 + queries)
        done = 0
        for label, flt in synthetic.SELECTIVITIES.items():
            truth = [exact(conn, qvecs[i], flt, k) for i in range(queries)]
            done += 1
            if progress:
                progress(f"{n:,} chunks", done, steps)
            # round robin per query, not engine after engine: a load spike on this shared
            # machine falls on every configuration alike, so their ratios hold; and the order
            # rotates from query to query, so that no configuration always runs first (on a
            # graph region the query has not warmed) or always after eight others
            plan_ef = _plan_ef(conn, qvecs[0], flt, k)
            Key = tuple[int, bool] | str | None
            got: dict[Key, list[list[int]]] = {c: [] for c in configs}
            times: dict[Key, list[float]] = {c: [] for c in configs}
            scans: set[str] = set()
            got[None], times[None] = [], []
            got["columns"], times["columns"] = [], []
            # the quantized index's rows: "q<ef_search>"
            quant: list[Key] = [
                f"q{ef}" for ef in ef_values if quantized_kind and ef >= quantized.CANDIDATES
            ]
            for q in quant:
                got[q], times[q] = [], []
            rota: list[Key] = [*configs, "columns", *quant, None]
            # one untimed pass first, on a vector of its own: every configuration's first
            # statement on this connection (psycopg's, the server's and pgrag's plans) is not
            # its steady state; pgrag's first search of the filter's shape is reported apart
            first[label] = _warm_up(conn, rota, warm, flt, k, plan_ef, quantized_kind)
            for i in range(queries):
                shift = i % len(rota)
                for c in rota[shift:] + rota[:shift]:
                    if c == "columns":
                        ms, ids = bare_columns(conn, qvecs[i], flt, k, plan_ef)
                        times[c].append(ms)
                        got[c].append(ids)
                        continue
                    if isinstance(c, str):
                        assert quantized_kind is not None
                        ms, ids = bare_quantized(conn, qvecs[i], flt, k, int(c[1:]), quantized_kind)
                        times[c].append(ms)
                        got[c].append(ids)
                        continue
                    if isinstance(c, tuple):
                        ms, ids = bare(conn, qvecs[i], flt, k, c[0], c[1])
                        times[c].append(ms)
                        got[c].append(ids)
                        continue
                    # called outside any transaction, as an application calls it: the
                    # search runs its kept plan in a transaction of its own, its settings and
                    # statement in one round trip (docs/search.md, "The client's plans"),
                    # which the timing holds whole; bare()'s BEGIN, settings and COMMIT are
                    # the harness's, outside its timing
                    _top_level(conn)
                    t = time.perf_counter()
                    res = pgrag_vector(conn, qvecs[i], flt, k)
                    times[None].append((time.perf_counter() - t) * 1000)
                    got[None].append([h.id for h in res.hits])
                    scans.add(res.scan)
                done += 1
                if progress:
                    progress(f"{n:,} chunks", done, steps)
            for ef, it in configs:
                results.append(
                    _row("pgvector", label, ef, it, got[(ef, it)], truth, times[(ef, it)])
                )
            results.append(
                _row(COLUMNS_ENGINE, label, plan_ef, True, got["columns"], truth,
                     times["columns"])
            )  # fmt: skip
            for c in quant:
                assert isinstance(c, str)
                results.append(
                    _row(quantized_engine(quantized_kind or ""), label, int(c[1:]), True,
                         got[c], truth, times[c])
                )  # fmt: skip
            results.append(
                _row(
                    "pgrag",
                    label,
                    None,
                    True,
                    got[None],
                    truth,
                    times[None],
                    ", ".join(sorted(scans)),
                )
            )
    index = ", ".join(idx[0]) if idx and idx[0] else "m=16, ef_construction=64"
    name, breakdown = (
        stage_breakdown(url, queries, k, synthetic.SELECTIVITIES) if stages else ("", {})
    )
    return SizeReport(
        rows=n,
        queries=queries,
        k=k,
        results=tuple(results),
        stages=breakdown,
        embedder=name,
        index=index,
        memory=memory,
        load_average=(round(load_before, 1), round(os.getloadavg()[0], 1)),
        pgrag_first_ms=first,
    )


def _warm_up(
    conn: psycopg.Connection[Any],
    rota: Sequence[Any],
    v: Any,
    flt: dict[str, Any],
    k: int,
    plan_ef: int,
    quantized_kind: str | None,
) -> float:
    """Each configuration of ``rota`` once on ``v``, untimed; pgrag's search's milliseconds."""
    ms = 0.0
    for c in rota:
        if c == "columns":
            bare_columns(conn, v, flt, k, plan_ef)
        elif isinstance(c, str):
            assert quantized_kind is not None
            bare_quantized(conn, v, flt, k, int(c[1:]), quantized_kind)
        elif isinstance(c, tuple):
            bare(conn, v, flt, k, c[0], c[1])
        else:
            _top_level(conn)
            t = time.perf_counter()
            pgrag_vector(conn, v, flt, k)
            ms = (time.perf_counter() - t) * 1000
    return ms


def stage_breakdown(
    url: str, queries: int, k: int, filters: Mapping[str, dict[str, Any]]
) -> tuple[str, dict[str, dict[str, dict[str, float]]]]:
    """The full search at each filter: the hybrid statement with exact statistics on
    in-distribution query vectors (``statement``), then end to end, question → embedding
    (default model, cold query cache) → the same statement → rerank. The model loads once."""
    from pgrag.embed.registry import get_embedder
    from pgrag.rerank import Reranker

    embedder = get_embedder(None)
    embedder.embed(["warm up the model"])  # loading the model is not a query's cost
    reranker = Reranker()
    with psycopg.connect(url) as conn:
        synthetic.declare_stats(conn)
    out = {
        label: _stages(url, queries, k, flt, embedder, reranker) for label, flt in filters.items()
    }
    note = "" if reranker.configured else " (rerank: pass-through, no cross-encoder configured)"
    return embedder.name + note, out


def _stages(
    url: str, queries: int, k: int, flt: dict[str, Any], embedder: Any, reranker: Any
) -> dict[str, dict[str, float]]:
    from pgrag import stats_cache
    from pgrag.search import search, stats

    qvecs, qtexts = synthetic.queries(queries)
    per: dict[str, list[float]] = {
        "statement": [],
        "cached": [],
        "embed": [],
        "search": [],
        "rerank": [],
        "total": [],
    }
    stamp = time.time_ns()
    cached: dict[str, list[bool]] = {"statement": [], "cached": [], "end to end": []}

    def statement(conn: psycopg.Connection[Any], i: int, stage: str) -> float:
        t = time.perf_counter()
        res = search(
            conn,
            f"which chunks are about {qtexts[i]}?",
            vector=qvecs[i],
            model="synthetic",
            filter=flt,
            k=k,
            stats=True,
        )
        ms = (time.perf_counter() - t) * 1000
        conn.rollback()
        cached[stage].append(_all_cached(res))
        return ms

    with psycopg.connect(url) as conn:
        register_vector(conn)
        # the statistics computed by every statement, then cached (pgrag/stats_cache.py):
        # one committed call computes the filter's result, every later statement reuses it
        stats_cache.set_cached(conn, synthetic.DOC_TYPE, False)
        conn.commit()
        per["statement"] = [statement(conn, i, "statement") for i in range(queries)]
        stats_cache.set_cached(conn, synthetic.DOC_TYPE, True)
        conn.commit()
        # a result computed while an older transaction of the server runs is not stored (the
        # horizon): wait for them, and the hits column says if one stayed
        stats_cache.start_horizon(url, 60.0)
        stats(conn, filter=flt)
        conn.commit()
        per["cached"] = [statement(conn, i, "cached") for i in range(queries)]
        for i in range(queries):
            # a word of its own keeps the query cache cold; numbers alone would match "topic N"
            question = f"which chunks are about {qtexts[i]}? (sweep{stamp}n{i})"
            t = time.perf_counter()
            vec = embedder.embed([question])[0]  # never asked before: the cache is cold
            e = (time.perf_counter() - t) * 1000
            res = search(conn, question, vector=vec, filter=flt, k=k, stats=True)
            conn.rollback()
            cached["end to end"].append(_all_cached(res))
            s = (time.perf_counter() - t) * 1000 - e
            t2 = time.perf_counter()
            reranker.rerank(question, res.hits)
            r = (time.perf_counter() - t2) * 1000
            per["embed"].append(e)
            per["search"].append(s)
            per["rerank"].append(r)
            per["total"].append((time.perf_counter() - t) * 1000)
        stats_cache.set_cached(conn, synthetic.DOC_TYPE, False)
        conn.commit()
    times = {
        stage: {"p50": _pct(v, 50), "p95": _pct(v, 95), "p99": _pct(v, 99)}
        for stage, v in per.items()
    }
    return times | {"hits": _cache_hits(cached)}


def _all_cached(res: SearchResult) -> bool:
    """Every type's statistics came from the statistics cache."""
    return bool(res.stats_cached and all(res.stats_cached.values()))


def _cache_hits(cached: Mapping[str, list[bool]]) -> dict[str, float]:
    """How many statements of each stage were statistics-cache hits (SearchResult.stats_cached):
    none with the cache off, every one after (a write by another session, or a session where
    the cache is unusable, would make some recompute, and the report shows it)."""
    return {stage: float(sum(hits)) for stage, hits in cached.items()} | {
        "of": float(len(cached["cached"]))
    }


def cache_warnings(rep: SizeReport) -> list[str]:
    """One line per filter whose cached or end-to-end stage had statements that recomputed
    their statistics: their timings mix computed and cached statistics."""
    out = []
    for label, st in rep.stages.items():
        h = st.get("hits", {})
        missed = [s for s in ("cached", "end to end") if h.get(s, 0) < h.get("of", 0)]
        if missed:
            out.append(
                f"{rep.rows:,} chunks, {label}: some {' and '.join(missed)} statements "
                "recomputed their statistics (another session wrote to the store, or the "
                "statistics cache is unusable there): those timings mix both; see the hits column"
            )
    return out


# ---------------------------------------------------------------- stores


def size_database(
    base_url: str, rows: int, hnsw_m: int | None = None, hnsw_ef_construction: int | None = None
) -> str:
    """The URL of database ``pgrag_bench_<rows>`` (``..._m<m>_efc<efc>`` with HNSW build
    parameters) on base_url's server, created and migrated."""
    from pgrag import migrate

    name = f"pgrag_bench_{rows}"
    if hnsw_m is not None or hnsw_ef_construction is not None:
        name += f"_m{hnsw_m or 16}_efc{hnsw_ef_construction or 64}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(base_url, dbname=name)
    migrate.upgrade(url, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction)
    return url


def ensure_loaded(url: str, rows: int, reload: bool = False) -> float | None:
    """Load ``rows`` synthetic chunks unless exactly those are there; seconds, or None."""
    with psycopg.connect(url) as conn:
        have = synthetic.loaded(conn)
    if have == rows and not reload:
        return None
    return synthetic.load(url, rows, quiet=True)


# ---------------------------------------------------------------- output


def _stem(out_name: str) -> str:
    return out_name.removesuffix(".md")


@dataclass(frozen=True)
class Comparison:
    """pgrag's row at one filter against the fastest bare row at its recall."""

    selectivity: str
    recall: float
    pgrag_p95: float
    bare: str  # e.g. "ef 100, iterative"
    bare_p95: float | None
    ratio: float | None
    # the bare statement returning pgrag's columns at pgrag's ef_search (None: not run)
    columns_p95: float | None = None
    columns_ratio: float | None = None


def compare_at_recall(results: Sequence[Row], slack: float = 0.005) -> list[Comparison]:
    """For each filter, pgrag's p95 over the fastest bare configuration reaching its recall."""
    out = []
    for mine in (r for r in results if r.engine == "pgrag"):
        rivals = [
            r
            for r in results
            if r.engine == "pgvector"
            and r.selectivity == mine.selectivity
            and r.recall >= mine.recall - slack
        ]
        best = min(rivals, key=lambda r: r.p95_ms, default=None)
        same = next(
            (
                r
                for r in results
                if r.engine == COLUMNS_ENGINE and r.selectivity == mine.selectivity
            ),
            None,
        )
        columns = (
            (same.p95_ms, round(mine.p95_ms / same.p95_ms, 2))
            if same is not None and same.p95_ms > 0
            else (None, None)
        )
        if best is None:
            out.append(
                Comparison(mine.selectivity, mine.recall, mine.p95_ms, "", None, None, *columns)
            )
            continue
        name = f"ef {best.ef_search}, {'iterative' if best.iterative else 'no iterative'}"
        ratio = round(mine.p95_ms / best.p95_ms, 2) if best.p95_ms > 0 else None
        out.append(
            Comparison(
                mine.selectivity, mine.recall, mine.p95_ms, name, best.p95_ms, ratio, *columns
            )
        )
    return out


def markdown(reports: Sequence[SizeReport], command: str, stem: str = "search-sweep") -> str:
    out = [
        "# Search sweep: recall and latency against ef_search, filters and iterative scan",
        "",
        f"Generated by `{command}` (do not edit by hand). Synthetic 384-d chunks "
        "(`pgrag/lab/synthetic.py`); recall@k against exact search; latencies in ms on this "
        "machine, side by side in one run, interleaved (each query runs every configuration "
        "in turn, the order rotating from query to query). pgvector rows run the bare statement "
        "`where metadata @> filter order by embedding <=> q limit k`; the pgrag row runs "
        "`pgrag.search.search(mode='vector')` with its defaults. Each bare statement is timed "
        "inside a transaction begun before it, after its `set_config` of ef_search and the "
        "iterative scan; pgrag's call is timed whole, called outside any transaction as an "
        "application calls it (its settings and statement in one round trip). With "
        "`--quantized`, rows over a quantized index (`pgrag/lab/quantized.py`) walk it for "
        f"{quantized.CANDIDATES} candidates and re-rank them exactly, as pgvector's README "
        "describes.",
        "",
    ]
    for rep in reports:
        out += [
            f"## {rep.rows:,} chunks, {rep.queries} queries, k = {rep.k}",
            "",
            f"HNSW index: {rep.index}. Machine load average (1 min) "
            f"{rep.load_average[0]:g} before, {rep.load_average[1]:g} after "
            f"({os.cpu_count()} CPUs): latencies are this machine's under that load. "
            f"Memory: {rep.memory}."
            + (f" Tuning: {rep.tuned}." if rep.tuned else "")
            + (f" Filter indexes: {rep.filter_indexes}." if rep.filter_indexes else "")
            + (f" Quantized index: {rep.quantized}." if rep.quantized else "")
            + (f" Load and index build: {rep.load_seconds:.0f} s." if rep.load_seconds else ""),
            "",
            f"![recall and p95 latency at {rep.rows:,} chunks](img/{stem}-{rep.rows}.png)",
            "",
            "| filter | engine | ef_search | iterative scan | rows (mean / min) | recall@k "
            "| p50 | p95 | p99 | scan |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rep.results:
            ef = "pgrag" if r.ef_search is None else str(r.ef_search)
            out.append(
                f"| {r.selectivity} | {r.engine} | {ef} | {'yes' if r.iterative else 'no'} "
                f"| {r.rows_mean:g} / {r.rows_min} | {r.recall:.3f} | {r.p50_ms:.2f} "
                f"| {r.p95_ms:.2f} | {r.p99_ms:.2f} | {r.scan} |"
            )
        out += [
            "",
            "pgrag against bare pgvector at the same recall: for each filter, the fastest bare "
            "configuration (by p95) whose recall is at least pgrag's (to 0.005), and the ratio of "
            "p95s (pgrag / bare; target 1.2 or less). Beside it, the bare statement returning "
            f"what pgrag returns (`{COLUMNS_ENGINE}` rows: each hit's text, metadata and its "
            "parent's text, at the ef_search pgrag's plan chose, iterative).",
            "",
            "| filter | pgrag recall | pgrag p95 | bare at that recall | bare p95 | ratio "
            "| same columns p95 | ratio |",
            "|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for c in compare_at_recall(rep.results):
            columns = (
                f"{c.columns_p95:.2f} | {c.columns_ratio:.2f}x"
                if c.columns_p95 is not None and c.columns_ratio is not None
                else " | "
            )
            out.append(
                f"| {c.selectivity} | {c.recall:.3f} | {c.pgrag_p95:.2f} | {c.bare} "
                f"| {c.bare_p95:.2f} | {c.ratio:.2f}x | {columns} |"
                if c.bare_p95 is not None and c.ratio is not None
                else f"| {c.selectivity} | {c.recall:.3f} | {c.pgrag_p95:.2f} | none reached it "
                f"| | | {columns} |"
            )
        if rep.pgrag_first_ms:
            out += [
                "",
                "Before the timed queries, every configuration ran once, untimed, on a vector "
                "of its own (its first statement on the connection plans it). pgrag's first "
                "search of each filter's shape, which plans the search and prepares its "
                'statement for the connection (docs/search.md, "The client\'s plans"): '
                + ", ".join(f"{f} {ms:.2f} ms" for f, ms in rep.pgrag_first_ms.items())
                + ".",
            ]
        if rep.stages:
            out += [
                "",
                "The full search at each filter: `statement` is the hybrid statement with exact "
                "statistics (`search(mode='hybrid', stats=True)`: filter, HNSW, full text, fusion, "
                "the declared statistics over every matching chunk) on in-distribution query "
                "vectors, computing the statistics every time; `cached`, the same statements "
                "with the statistics cache on (`pgrag stats-cache on`), after one call computed "
                "the filter's result; then end to end with the cache on, with "
                f"{rep.embedder}, the query cache cold: embed, the same statement (`search`), "
                "rerank, total. Milliseconds. `hits`: how many statements found their "
                "statistics in the cache (`SearchResult.stats_cached`), with it off, on, end to "
                "end.",
                "",
                "| filter | statement p50 | statement p95 | cached p50 | cached p95 | embed p50 "
                "| embed p95 | search p95 | total p50 | total p95 | total p99 | hits |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            ]
            for label, st in rep.stages.items():
                h = st.get("hits", {})
                hit_stages = ("statement", "cached", "end to end")
                hits = "/".join(str(int(h[stage])) for stage in hit_stages if stage in h)
                hits += f" of {int(h['of'])}" if "of" in h else ""
                out.append(
                    f"| {label} | {st['statement']['p50']:.2f} | {st['statement']['p95']:.2f} "
                    f"| {st['cached']['p50']:.2f} | {st['cached']['p95']:.2f} "
                    f"| {st['embed']['p50']:.2f} | {st['embed']['p95']:.2f} "
                    f"| {st['search']['p95']:.2f} | {st['total']['p50']:.2f} "
                    f"| {st['total']['p95']:.2f} | {st['total']['p99']:.2f} | {hits} |"
                )
        out.append("")
    return "\n".join(out)


def plot(rep: SizeReport, path: Path) -> None:
    """Recall and p95 latency against ef_search, one line per filter and scan mode."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependency(
            "matplotlib is not installed: pip install 'pgrag-relational[bench]' for the plots"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = dict(zip(synthetic.SELECTIVITIES, ("C0", "C1", "C2", "C3"), strict=True))
    for label in synthetic.SELECTIVITIES:
        for it, style in ((False, "--"), (True, "-")):
            rows = [
                r
                for r in rep.results
                if r.engine == "pgvector" and r.selectivity == label and r.iterative == it
            ]
            efs = [r.ef_search for r in rows]
            name = f"{label}{' iterative' if it else ''}"
            ax_r.plot(efs, [r.recall for r in rows], style, color=colors[label], label=name)
            ax_t.plot(efs, [r.p95_ms for r in rows], style, color=colors[label], label=name)
        ours = [r for r in rep.results if r.engine == "pgrag" and r.selectivity == label]
        for r in ours:
            ax_r.axhline(r.recall, color=colors[label], linestyle=":", linewidth=1)
    ax_r.set(xlabel="ef_search", ylabel=f"recall@{rep.k}", ylim=(0, 1.02), xscale="log")
    ax_t.set(xlabel="ef_search", ylabel="p95 latency (ms)", xscale="log", yscale="log")
    ax_r.set_title(f"{rep.rows:,} chunks: recall (dotted: pgrag's default)")
    ax_t.set_title("bare pgvector p95 latency")
    ax_r.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    base_url: str,
    sizes: Sequence[int],
    *,
    out_dir: Path,
    queries: int = 50,
    k: int = 10,
    reload: bool = False,
    hnsw_m: int | None = None,
    hnsw_ef_construction: int | None = None,
    command: str = "pgrag bench search",
    out_name: str = "search-sweep.md",
    progress: Progress | None = None,
    tune: bool = False,
    filter_indexes: bool = False,
    quantized_kind: str | None = None,
) -> list[SizeReport]:
    """Load (or reuse) each size, sweep it, write the markdown and the plots. With ``tune``,
    ``pgrag tune`` first sizes ef_search on held-out questions (``synthetic.seed_questions``);
    with ``filter_indexes``, the 10% and 1% filters get a filter index, else none has one; with
    ``quantized_kind``, rows over that quantized index beside the plain one's."""
    reports = []
    for n in sizes:
        url = size_database(base_url, n, hnsw_m, hnsw_ef_construction)
        seconds = ensure_loaded(url, n, reload)
        indexes = set_filter_indexes(url, filter_indexes, progress)
        quantized_note = set_quantized(url, quantized_kind)
        tuned = tune_on_questions(url, k) if tune else worker_tuning(url, progress)
        rep = sweep_size(
            url, queries=queries, k=k, progress=progress, quantized_kind=quantized_kind
        )
        reports.append(
            dataclasses.replace(
                rep,
                tuned=tuned,
                load_seconds=seconds,
                filter_indexes=indexes,
                quantized=quantized_note,
            )
        )
        plot(reports[-1], out_dir / "img" / f"{_stem(out_name)}-{n}.png")
    (out_dir / out_name).write_text(markdown(reports, command, _stem(out_name)) + "\n")
    return reports
