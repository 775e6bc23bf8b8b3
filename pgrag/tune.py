"""Size HNSW's ``ef_search`` to the store: the smallest value that reaches a recall target.

Recall of an HNSW top-k depends on the data and the index, not on k alone: on 384-d sentence
embeddings ef_search 40 (pgvector's default) gives recall@10 ~0.9 at 100,000 chunks and ~0.5 on
the same kind of data at 1,000,000 (docs/benchmarks.md). ``tune`` measures it on the store
itself: it takes query vectors (real questions from ``pgrag.query_cache`` when there are enough,
otherwise chunk vectors, which then do not count themselves), computes the exact top-k with the
index disabled, walks a ladder of ef_search values through the index (with the iterative scan
pgrag searches with) and picks the smallest value whose mean recall reaches the target.

The choice is the store's: ``pgrag.settings.ef_search``, and each measurement is a row of
``pgrag.tuning`` (``pgrag status`` shows the last). Every search that does not pass
``ef_search`` itself uses ``max(N, 2 x candidates)`` (``pgrag._search_plan``), at once, in every
session. An administrator's ``ALTER DATABASE / ROLE ... SET pgrag.ef_search = N`` overrides it.

Out of the box: the worker (and ``pgrag embed``) tunes after it embedded, when the store has
1,000 vectors or more and grew or shrank twofold since the last measurement, or its model changed
(``maybe_tune``): a store built and searched with defaults answers at the target recall.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import numpy as np
import psycopg
from psycopg import sql

from pgrag.errors import ConfigError, PgragError

# Steps of 10 up to 150, then about 10% to 300 (the walk's cost grows with ef_search: a coarser
# step stores up to 25% more than the target needs; at 1,000,000 chunks tune went from 120,
# short, to 150)
_FINE = tuple(range(40, 160, 10))  # 40, 50, ... 150
LADDER: tuple[int, ...] = (*_FINE, 170, 190, 210, 240, 270, 300, 350, 400, 500, 600, 800, 1000)
SETTING = "pgrag.ef_search"
MIN_QUESTIONS = 20
# The worker tunes a store of this many vectors or more (smaller graphs reach the target at
# the search's floor), again when it doubles or halves, or when the model changes.
AUTO_MIN_CHUNKS = 1_000
AUTO_FACTOR = 2.0
# Chunk vectors are nodes of the graph, a question is not: they overstate recall. At 100,000
# synthetic chunks, 0.958 on chunks at ef_search 50 was 0.91 on held-out questions; 0.99 on
# chunks chose 120, where questions get 0.95 to 0.99 (docs/search.md). The worker asks that
# much of chunk vectors, and of real questions from the query cache the promise (0.95) with a
# margin: 0.95 measured on 50 questions was 0.928 on the next 50.
AUTO_TARGET = 0.97
AUTO_CHUNK_TARGET = 0.99
# How many query vectors the worker's measurement takes, and how many real questions it
# needs before it trusts them over chunk vectors. 50 could not tell 0.95 from 0.99: at 100,000
# synthetic chunks, 50 chunk vectors measured 0.996 at ef_search 60, 300 others 0.966, and
# held-out questions got 0.928 (50) and 0.954 (300) there (docs/benchmarks.md, 2026-12-04).
# 300 exact searches: about 20 s at 100,000 chunks, 2-3 minutes at 1,000,000, once per
# doubling of the store.
AUTO_QUERIES = 300
AUTO_MIN_QUESTIONS = 100
# pg_try_advisory_lock key: one tuning at a time per database (several workers may finish).
TUNE_LOCK_KEY = 7_061_727_261_671

_QUESTIONS: LiteralString = (
    "select q.embedding::real[] from pgrag.query_cache q, pgrag.settings s "
    "where q.model = s.embedding_model and vector_dims(q.embedding) = s.embedding_dim "
    "order by q.created_at desc limit %(n)s"
)
_CHUNKS: LiteralString = (
    "select id, embedding::real[] from pgrag.chunks where embedding is not null "
    "order by md5(id::text || %(seed)s::text) limit %(n)s"
)
# `+ 0` keeps the planner off the HNSW index whatever the settings: the exact answer.
_EXACT: LiteralString = (
    "select id, embedding <=> %(v)s::real[]::vector from pgrag.chunks "
    "where embedding is not null "
    "order by (embedding <=> %(v)s::real[]::vector) + 0 limit %(n)s"
)
_INDEX: LiteralString = (
    "select id, d from (select id, embedding <=> %(v)s::real[]::vector as d from pgrag.chunks "
    "where embedding is not null order by d limit %(n)s) s order by d"
)
# A hit at the k-th exact distance or closer is right whichever of tied chunks it is: identical
# texts have identical vectors, and the index may return another of the tie than exact search.
_TIE = 1e-6
_SETTINGS: LiteralString = (
    "select set_config('hnsw.iterative_scan', 'relaxed_order', true), "
    "set_config('hnsw.ef_search', %(ef)s, true), "
    "set_config('enable_seqscan', 'off', true)"  # a small store would be scanned, not searched
)


@dataclass(frozen=True)
class TunePoint:
    """Recall and latency of the index at one ef_search."""

    ef_search: int
    recall: float
    p50_ms: float
    p95_ms: float


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` measured and chose; ``chosen`` is None when no value reached the target."""

    chunks: int
    queries: int
    source: str  # "questions" (pgrag.query_cache) or "chunks"
    k: int
    target: float
    points: tuple[TunePoint, ...]
    chosen: int | None
    applied: bool
    previous: int | None

    @property
    def closest(self) -> TunePoint:
        """The smallest ef_search within 0.005 of the best recall measured: what the worker
        stores when none reached the target (``store_best``)."""
        top = max(p.recall for p in self.points)
        return min((p for p in self.points if p.recall >= top - 0.005), key=lambda p: p.ef_search)


def override(conn: psycopg.Connection[Any]) -> int | None:
    """An ``ALTER DATABASE / ROLE ... SET pgrag.ef_search`` for this database or role (it
    overrides the store's tuned value in new sessions), or None."""
    row = conn.execute(
        "select pgrag._ef_search_value(split_part(c, '=', 2)) "
        "from pg_db_role_setting s, unnest(s.setconfig) c "
        "where s.setdatabase in (0, (select oid from pg_database "
        "                            where datname = current_database())) "
        "  and s.setrole in (0, (select oid from pg_roles where rolname = current_user)) "
        "  and c like 'pgrag.ef\\_search=%%' "
        "order by s.setrole desc, s.setdatabase desc limit 1"
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def current_setting(conn: psycopg.Connection[Any]) -> int | None:
    """The tuned ef_search this session's searches use (an administrator's pgrag.ef_search
    setting, else the store's), or None."""
    row = conn.execute("select pgrag._tuned_ef_search()").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _query_vectors(
    conn: psycopg.Connection[Any], n: int, seed: int, min_questions: int
) -> tuple[str, list[np.ndarray[Any, Any]], list[int | None]]:
    rows = conn.execute(_QUESTIONS, {"n": n}).fetchall()
    if len(rows) >= min(n, min_questions):
        return "questions", [np.asarray(r[0], dtype=np.float32) for r in rows], [None] * len(rows)
    rows = conn.execute(_CHUNKS, {"n": n, "seed": seed}).fetchall()
    return (
        "chunks",
        [np.asarray(r[1], dtype=np.float32) for r in rows],
        [int(r[0]) for r in rows],
    )


def _ids(
    conn: psycopg.Connection[Any], stmt: LiteralString, v: Any, n: int
) -> list[tuple[int, float]]:
    """(id, distance) of the nearest ``n``."""
    # never prepared: a cached generic plan would outlive the settings it was planned under
    rows = conn.execute(stmt, {"v": v.tolist(), "n": n}, prepare=False).fetchall()
    return [(int(r[0]), float(r[1])) for r in rows]


def _exact(conn: psycopg.Connection[Any], v: Any, n: int) -> list[tuple[int, float]]:
    with conn.transaction():
        conn.execute("set local enable_indexscan = off")
        return _ids(conn, _EXACT, v, n)


def _recall(truth: list[tuple[int, float]], got: list[tuple[int, float]]) -> float:
    """Recall of ``got`` against the exact ``truth`` (both without the query's own chunk),
    counting a hit within the k-th exact distance as right (ties between duplicates)."""
    if not truth:
        return 1.0
    ids, kth = {i for i, _ in truth}, truth[-1][1]
    hits = sum(1 for i, d in got[: len(truth)] if i in ids or d <= kth + _TIE)
    return min(hits, len(truth)) / len(truth)


class TuneStopped(PgragError):
    """``tune`` was asked to stop (the worker's stop event) before it finished."""


def tune(
    conn: psycopg.Connection[Any],
    *,
    k: int = 10,
    target: float = 0.95,
    queries: int = 50,
    ladder: Sequence[int] = LADDER,
    apply: bool = True,
    seed: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
    tuned_by: str = "pgrag tune",
    chunk_target: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    store_best: bool = False,
    min_questions: int = MIN_QUESTIONS,
) -> TuneResult:
    """Measure recall@k against exact search along ``ladder``; unless ``apply`` is False,
    record the measurement (``pgrag.tuning``) and make the smallest ef_search reaching
    ``target`` the store's (``pgrag.settings.ef_search``). ``chunk_target``: the target
    instead when the query vectors are the store's own chunks (they overstate recall).
    ``should_stop``: asked before each query; true ends the run with TuneStopped, recording
    nothing. ``store_best``: when no value reaches the target, store the one that came closest
    (the smallest within 0.005 of the best recall) rather than nothing: the graph is the limit,
    and the best it gives beats the search's floor (the worker's choice). ``min_questions``:
    fewer questions in the query cache than that (or than ``queries``), chunk vectors."""

    def check_stop() -> None:
        if should_stop is not None and should_stop():
            raise TuneStopped("tuning stopped before it finished: nothing recorded")

    if not 1 <= k <= 1000:
        raise ConfigError(f"k = {k} is out of range: use 1 to 1,000")
    if not 0 < target <= 1:
        raise ConfigError(f"target recall {target} is out of range: use a number in (0, 1]")
    if not 1 <= queries <= 10_000:
        raise ConfigError(f"queries = {queries} is out of range: use 1 to 10,000")
    steps = sorted(set(ladder))
    if not steps or steps[0] < 1 or steps[-1] > 1000:
        raise ConfigError("ef_search values must be within 1 to 1,000")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        # each measurement sets planner options for its own transaction only: SET LOCAL in a
        # savepoint of an open transaction would outlive it and disable the index for the rest
        raise ConfigError("tune needs a connection outside a transaction: commit or roll back")
    with conn.transaction():
        row = conn.execute("select pgrag._vectors()").fetchone()
        chunks = int(row[0]) if row else 0
        previous = current_setting(conn)
        source, vecs, own = _query_vectors(conn, queries, seed, min_questions)
    if source == "chunks" and chunk_target is not None:
        target = chunk_target
    if chunks <= k:
        raise PgragError(
            f"the store has {chunks} chunks with vectors: tuning needs more than k = {k}; "
            "embed first (pgrag embed)"
        )
    truths: list[list[tuple[int, float]]] = []
    for i, (v, self_id) in enumerate(zip(vecs, own, strict=True)):
        check_stop()
        truths.append([x for x in _exact(conn, v, k + 1) if x[0] != self_id][:k])
        if progress:
            progress("exact", i + 1, len(vecs))
    points: list[TunePoint] = []
    chosen: int | None = None
    for j, ef in enumerate(steps):
        recalls, times = [], []
        for v, self_id, truth in zip(vecs, own, truths, strict=True):
            check_stop()
            with conn.transaction():
                conn.execute(_SETTINGS, {"ef": str(ef)})
                t = time.perf_counter()
                got = _ids(conn, _INDEX, v, k + 1)
                times.append((time.perf_counter() - t) * 1000)
            got = [x for x in got if x[0] != self_id][:k]
            recalls.append(_recall(truth, got))
        point = TunePoint(
            ef_search=ef,
            recall=statistics.fmean(recalls),
            p50_ms=float(np.percentile(times, 50)),
            p95_ms=float(np.percentile(times, 95)),
        )
        points.append(point)
        if progress:
            progress("ef_search", j + 1, len(steps))
        if point.recall >= target:
            chosen = ef
            break
    result = TuneResult(
        chunks=chunks,
        queries=len(vecs),
        source=source,
        k=k,
        target=target,
        points=tuple(points),
        chosen=chosen,
        applied=apply and chosen is not None,
        previous=previous,
    )
    if apply:
        _record(conn, result, tuned_by, store_best)
    return result


def _record(
    conn: psycopg.Connection[Any], result: TuneResult, tuned_by: str, store_best: bool
) -> None:
    """The measurement into pgrag.tuning and, when a value reached the target (or
    ``store_best``), the store's ef_search, in one transaction."""
    best = result.closest
    reached = next((p for p in result.points if p.ef_search == result.chosen), None)
    with conn.transaction():
        conn.execute(
            "insert into pgrag.tuning (model, chunks, k, target, ef_search, recall, "
            "best_ef_search, queries, source, tuned_by) "
            "select s.embedding_model, %(chunks)s, %(k)s, %(target)s, %(ef)s, %(recall)s, "
            "%(best)s, %(queries)s, %(source)s, %(by)s from pgrag.settings s",
            {
                "chunks": result.chunks,
                "k": result.k,
                "target": result.target,
                "ef": result.chosen,
                "recall": round((reached or best).recall, 4),
                "best": best.ef_search,
                "queries": result.queries,
                "source": result.source,
                "by": tuned_by,
            },
        )
        stored = result.chosen if result.chosen is not None or not store_best else best.ef_search
        if stored is not None:
            conn.execute("update pgrag.settings set ef_search = %s", (stored,))


def maybe_tune(
    conn: psycopg.Connection[Any],
    *,
    min_chunks: int = AUTO_MIN_CHUNKS,
    should_stop: Callable[[], bool] | None = None,
) -> TuneResult | None:
    """Tune (as the worker) when the store has ``min_chunks`` vectors or more and none was
    measured yet, or it grew or shrank ``AUTO_FACTOR``-fold since, or its model changed; None
    when nothing needed it, another session is tuning, or ``should_stop`` ended it. Cheap when
    nothing is due: two index-only counts and the last measurement."""
    if not _due(conn, min_chunks):
        return None
    got = conn.execute("select pg_try_advisory_lock(%s)", (TUNE_LOCK_KEY,)).fetchone()
    if not got or not got[0]:
        return None
    try:
        if not _due(conn, min_chunks):  # another worker measured it while we looked
            return None
        return auto_tune(conn, tuned_by="worker", should_stop=should_stop)
    except TuneStopped:
        return None
    finally:
        conn.execute("select pg_advisory_unlock(%s)", (TUNE_LOCK_KEY,))


def auto_tune(
    conn: psycopg.Connection[Any],
    *,
    tuned_by: str,
    should_stop: Callable[[], bool] | None = None,
) -> TuneResult:
    """The measurement the worker takes (``maybe_tune``, and after it rebuilt the store index):
    ``AUTO_QUERIES`` query vectors, real questions when the cache holds ``AUTO_MIN_QUESTIONS``,
    their targets, and the closest value stored when none reaches them."""
    return tune(
        conn,
        target=AUTO_TARGET,
        chunk_target=AUTO_CHUNK_TARGET,
        queries=AUTO_QUERIES,
        min_questions=AUTO_MIN_QUESTIONS,
        tuned_by=tuned_by,
        should_stop=should_stop,
        store_best=True,
    )


def _due(conn: psycopg.Connection[Any], min_chunks: int) -> bool:
    with conn.transaction():
        row = conn.execute(
            "select pgrag._vectors(), s.embedding_model, t.chunks, t.model "
            "from pgrag.settings s "
            "left join lateral (select chunks, model from pgrag.tuning "
            "                   order by id desc limit 1) t on true"
        ).fetchone()
    if row is None:
        return False
    n, model, last_chunks, last_model = int(row[0]), row[1], row[2], row[3]
    if n < min_chunks:
        return False
    return not (  # measured for this model, at a size within the factor: not due
        last_chunks is not None
        and last_model == model
        and last_chunks / AUTO_FACTOR < n < last_chunks * AUTO_FACTOR
    )


def store(conn: psycopg.Connection[Any], ef_search: int | None) -> None:
    """Make ``ef_search`` the store's value for pgrag searches (None: remove it, and a database
    default ``pgrag.ef_search`` an earlier release's tune stored, when this role owns the
    database)."""
    if ef_search is not None and not 1 <= ef_search <= 1000:
        raise ConfigError(f"ef_search = {ef_search} is out of range: use 1 to 1,000")
    try:
        with conn.transaction():
            conn.execute("update pgrag.settings set ef_search = %s", (ef_search,))
            if ef_search is None:
                row = conn.execute(
                    "select current_database(), pg_has_role(d.datdba, 'USAGE') "
                    "from pg_database d where d.datname = current_database()"
                ).fetchone()
                if row and row[1]:
                    conn.execute(
                        sql.SQL("alter database {} reset pgrag.ef_search").format(
                            sql.Identifier(str(row[0]))
                        )
                    )
                conn.execute("select set_config('pgrag.ef_search', '', false)")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PgragError(
            f"cannot store ef_search: {str(exc).strip().splitlines()[0]}; run pgrag tune as "
            "the writer role or the owner, or set it per role: ALTER ROLE <role> SET "
            "pgrag.ef_search = N"
        ) from exc
