"""Searches from Python: the one search statement, planned by the server, run in one round trip.

The statement lives in SQL, once (``pgrag._search_statement`` in sql/idempotent/30_search_int.sql,
docs/search.md): filters (the filter language, compiled by ``pgrag._filter_sql``), HNSW or an
exact scan, full text, reciprocal rank fusion, parents. ``pgrag._search_plan`` decides it for a
search's arguments (checked against pgrag's limits, defaults filled in: ``pgrag._search_default``,
``pgrag._limit``), with the settings it runs under. This module keeps that plan per connection
and shape for a minute and runs it itself for each new question: the settings and the statement
in one round trip, the statement prepared by psycopg like any query it runs often (``_Plans``,
docs/search.md "The client's plans"). Where it cannot (a connection inside a transaction, exact
statistics asked for) it calls the SQL API with bound parameters, as a SQL user would:
``pgrag.search(...)``, joined with ``pgrag.stats_detail(...)`` for statistics, in one statement
(one snapshot, one round trip).

A search's arguments are one value, ``SearchOptions``. ``search`` (sync) and ``asearch``
(async) drive the same plan (``_plan``: a generator that does no I/O and asks its driver to
check a filter, embed the question, and run the statement), so the two cannot drift.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    LiteralString,
    NamedTuple,
    NoReturn,
    TypedDict,
    Unpack,
)

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import args_row, class_row, tuple_row

from pgrag.errors import ConfigError, NotMigrated, from_database
from pgrag.filters import filter_param
from pgrag.limits import check_connection, check_names, check_query_vector, check_question

if TYPE_CHECKING:
    from pgrag.embed.base import Embedder
    from pgrag.embed.cache import QueryCache, QueryVector

Mode = Literal["hybrid", "vector", "text"]
Match = Literal["any", "all", "phrase"]

MODES: tuple[Mode, ...] = ("hybrid", "vector", "text")
MATCHES: tuple[Match, ...] = ("any", "all", "phrase")


class VectorParam:
    """A query vector as a statement parameter: sent in pgvector's binary form (no text to
    format and parse: 0.2 ms less per search at 384 dimensions), typed by the statement's
    ``::vector`` cast, so it needs no registered vector type."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, np.dtype[np.float32]]) -> None:
        self.array = array


class _VectorParamDumper(Dumper):
    format = Format.BINARY
    oid = 0  # unknown: the server types it from the cast (pgvector's own receive function)

    def dump(self, obj: VectorParam) -> bytes:
        return struct.pack(">HH", obj.array.size, 0) + obj.array.astype(">f4").tobytes()


class _VectorParamTextDumper(Dumper):
    """pgvector's text form, for cursors that write values into the SQL (ClientCursor)."""

    oid = 0

    def dump(self, obj: VectorParam) -> bytes:
        # repr of each float32 widened to float64: exact, so both forms give the same vector
        return ("[" + ",".join(map(repr, obj.array.tolist())) + "]").encode()


def _adapt_vector_param(adapters: psycopg.adapt.AdaptersMap) -> None:
    adapters.register_dumper(VectorParam, _VectorParamTextDumper)
    adapters.register_dumper(VectorParam, _VectorParamDumper)  # the last one: %s sends binary


_adapt_vector_param(psycopg.adapters)  # connections made from now on; search() adds it to
# its cursor for connections made before pgrag was imported


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class SearchHit:
    """One chunk found, with every score and its parent's text (children only)."""

    id: int
    doc_type: str
    source_key: str
    text: str
    metadata: dict[str, Any]
    score: float  # hybrid: RRF; vector: 1 - cosine distance; text: ts_rank
    distance: float | None  # cosine distance (None when only full text found it)
    vector_rank: int | None
    text_rank: int | None
    text_score: float | None
    parent_id: int | None
    parent_source_key: str | None
    parent_text: str | None


@dataclass(frozen=True)
class SearchResult:
    hits: tuple[SearchHit, ...]
    stats: dict[str, Any] | None  # {doc_type: {...}} when asked for
    scan: str  # "exact", "index" (HNSW), or "text" (no vector search)
    timings: dict[str, float]  # milliseconds: embed_ms, search_ms, total_ms
    cache_hit: bool | None  # the query vector came from the query cache (None: no embedding)
    cache_source: str | None  # "memory", "database" or "model"
    model: str | None  # the embedding model of the query vector
    # {doc_type: True} when that type's statistics came from the statistics cache (pgrag
    # stats-cache), False when computed by this search; None without stats
    stats_cached: dict[str, bool] | None = None


class _Row(NamedTuple):
    """A row of the search statement (pgrag.search_hit's columns, in order), made by
    ``args_row``: a frozen dataclass per row cost 65 µs of a search of 10 rows."""

    id: int | None
    doc_type: str | None
    source_key: str | None
    text: str | None
    metadata: dict[str, Any] | None
    score: float | None
    distance: float | None
    vector_rank: int | None
    text_rank: int | None
    text_score: float | None
    parent_id: int | None
    parent_source_key: str | None
    parent_text: str | None
    scan: str | None
    stats: dict[str, Any] | None = None  # (not in the statement pgrag._search_plan makes)
    stats_cached: dict[str, bool] | None = None


# ---------------------------------------------------------------- the statement (no I/O)

# pgrag.search's arguments, in its order; None is SQL NULL: pgrag's default.
_ARGS: LiteralString = (
    "%(text)s::text, %(qvec)s::vector, %(k)s::integer, %(filter)s::jsonb, %(doc_types)s::text[], "
    "%(mode)s::text, %(match)s::text, %(candidates)s::integer, %(ef_search)s::integer, "
    "%(exact_threshold)s::integer, %(rrf_k)s::integer, %(fts_limit)s::integer, %(model)s::text"
)
_SEARCH: LiteralString = (
    "select h.*, null::jsonb as stats, null::jsonb as stats_cached from pgrag.search("
    + _ARGS
    + ") h"
)
# With exact statistics: each searched type's statistics over every chunk matching the filter,
# and the hits, in one statement (one snapshot); one row with NULL hit columns when none is hit.
_WITH_STATS: LiteralString = (
    "select h.*, st.stats, st.stats_cached from ("
    "select coalesce(jsonb_object_agg(d.doc_type, d.stats), '{}'::jsonb) as stats, "
    "coalesce(jsonb_object_agg(d.doc_type, d.cached), '{}'::jsonb) as stats_cached "
    "from pgrag.stats_detail(%(filter)s::jsonb, %(doc_types)s::text[]) d) st "
    "left join lateral "
)
_SEARCH_WITH_STATS: LiteralString = (
    _WITH_STATS + "pgrag.search(" + _ARGS + ") h on true order by h.score desc nulls last, h.id"
)
# pgrag.ranked's arguments, in its order: ranking by a numeric key instead of by similarity.
_RANKED_ARGS: LiteralString = (
    "%(by)s::text, %(filter)s::jsonb, %(doc_types)s::text[], %(descending)s::boolean, "
    "%(k)s::integer"
)
_RANKED: LiteralString = (
    "select h.*, null::jsonb as stats, null::jsonb as stats_cached from pgrag.ranked("
    + _RANKED_ARGS
    + ") h"
)
_RANKED_WITH_STATS: LiteralString = (
    _WITH_STATS
    + "pgrag.ranked("
    + _RANKED_ARGS
    + ") h on true "
    + "order by case when %(descending)s::boolean then -h.score else h.score end nulls last, h.id"
)


class SearchArgs(TypedDict, total=False):
    """The keyword arguments of a search (``SearchOptions``'s fields), for typed ``**kwargs``."""

    vector: Sequence[float] | np.ndarray[Any, Any] | None
    model: str | None
    filter: Mapping[str, Any] | None
    doc_types: Sequence[str] | None
    k: int | None
    mode: Mode
    stats: bool
    match: Match | None
    candidates: int | None
    ef_search: int | None
    exact_threshold: int | None
    rrf_k: int | None
    fts_limit: int | None
    embedder: str | Embedder | QueryCache | None


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """Everything a search takes but its question (``pgrag.search`` in SQL, docs/search.md).

    ``vector`` with ``model`` (its model's name) skips the embedding; the store refuses a
    vector of another model (ModelMismatch) or dimension. ``filter`` is the filter language
    (docs/filters-and-answers.md), ``doc_types`` limits the types, ``stats`` adds each type's
    exact statistics over every matching chunk. ``embedder`` embeds the question (a
    QueryCache, an Embedder or a spec; default PGRAG_EMBEDDER, else the bundled model). The
    tuning arguments left None take pgrag's defaults (``pgrag._search_default``).
    """

    vector: Sequence[float] | np.ndarray[Any, Any] | None = None
    model: str | None = None
    filter: Mapping[str, Any] | None = None
    doc_types: Sequence[str] | None = None
    k: int | None = None
    mode: Mode = "hybrid"
    stats: bool = False
    match: Match | None = None
    candidates: int | None = None
    ef_search: int | None = None
    exact_threshold: int | None = None
    rrf_k: int | None = None
    fts_limit: int | None = None
    embedder: str | Embedder | QueryCache | None = None

    @classmethod
    def of(cls, options: SearchOptions | None, args: SearchArgs) -> SearchOptions:
        """``options`` (default: all defaults) with ``args`` put over it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ConfigError(
                f"unknown search argument(s) {', '.join(unknown)}: use {', '.join(sorted(known))}"
            )
        return replace(options or cls(), **args)


# pgrag._search_plan's arguments, in its order, and what of its plan the client runs.
_PLAN: LiteralString = (
    "select statement, settings, prepare, keep_s, counts from pgrag._search_plan("
    "%(mode)s::text, %(text)s::text, %(qvec)s::vector, %(model)s::text, %(k)s::integer, "
    "%(filter)s::jsonb, %(doc_types)s::text[], %(match)s::text, %(candidates)s::integer, "
    "%(ef_search)s::integer, %(exact_threshold)s::integer, %(rrf_k)s::integer, "
    "%(fts_limit)s::integer)"
)
# The plan's settings, local to the statement's transaction: the implicit one that a pipeline
# in autocommit runs up to its sync, which holds them and the statement (one round trip, no
# BEGIN or COMMIT to send; psycopg's transaction() inside a pipeline waited for the server
# three more times: 0.45 against 0.14 ms for a trivial statement). Written as literals, one
# statement per plan (set_config over jsonb_each_text of a parameter cost 35 µs more),
# prepared with the plan's statement (_prepare): parsed and planned each time it cost 30-40 µs
# of a 0.5 ms search (0.1% of 100,000 chunks, docs/benchmarks.md).
_SET_LOCAL = sql.SQL("set_config({}, {}, true)")


def _settings_statement(settings: Mapping[str, str]) -> sql.Composed:
    return sql.SQL("select {}").format(
        sql.SQL(", ").join(
            _SET_LOCAL.format(sql.Literal(name), sql.Literal(value))
            for name, value in sorted(settings.items())
        )
    )


# What the plan depends on besides the store's state: every argument but the question and the
# vector, and the vector's dimension (the plan checked it against the store's).
_SHAPE: tuple[str, ...] = (
    "mode",
    "k",
    "match",
    "candidates",
    "ef_search",
    "exact_threshold",
    "rrf_k",
    "fts_limit",
    "model",
)


def _statement(o: SearchOptions, text: str | None) -> tuple[LiteralString, dict[str, Any]]:
    """The statement and its parameters (no I/O). Checks here only what must not reach the
    server (text it cannot hold, a malformed vector) or must fail before an embedder runs; the
    server checks the rest, for SQL callers alike."""
    if o.mode not in MODES:
        raise ConfigError(f"search mode {o.mode!r} is unknown: use one of {', '.join(MODES)}")
    if o.mode != "text" and o.vector is None:
        raise ConfigError(
            f"a {o.mode} search needs a query vector: pass vector=... or a question and an "
            "embedder, or search with mode='text'"
        )
    if o.mode != "vector" and not (text and text.strip()):
        raise ConfigError(f"a {o.mode} search needs a search text: pass the question")
    params: dict[str, Any] = {
        "text": text,
        "qvec": None if o.vector is None else VectorParam(check_query_vector(o.vector)),
        "k": o.k,
        "filter": filter_param(o.filter),
        "doc_types": None if o.doc_types is None else check_names(o.doc_types, "doc_types"),
        "mode": o.mode,
        "match": o.match,
        "candidates": o.candidates,
        "ef_search": o.ef_search,
        "exact_threshold": o.exact_threshold,
        "rrf_k": o.rrf_k,
        "fts_limit": o.fts_limit,
        "model": o.model,
    }
    return (_SEARCH_WITH_STATS if o.stats else _SEARCH), params


# ---------------------------------------------------------------- embedding

_CACHES: dict[str, QueryCache] = {}
_CACHES_LOCK = threading.Lock()


def query_cache_for(embedder: str | Embedder | None = None) -> QueryCache:
    """A process-wide QueryCache for an embedder spec (None: PGRAG_EMBEDDER or the default)."""
    from pgrag.config import ENV_EMBEDDER, env
    from pgrag.embed.cache import QueryCache
    from pgrag.embed.registry import get_embedder

    if embedder is not None and not isinstance(embedder, str):
        return QueryCache(embedder)
    spec = embedder or env(ENV_EMBEDDER) or "sentence-transformers"
    with _CACHES_LOCK:
        cache = _CACHES.get(spec)
        if cache is None:
            cache = QueryCache(get_embedder(spec))
            _CACHES[spec] = cache
        return cache


# ---------------------------------------------------------------- running it


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _result(
    rows: list[_Row], timings: dict[str, float], qv: QueryVector | None, mode: Mode
) -> SearchResult:
    hits = tuple(
        SearchHit(
            id=int(r.id),
            doc_type=str(r.doc_type),
            source_key=str(r.source_key),
            text=str(r.text),
            metadata=dict(r.metadata or {}),
            score=float(r.score or 0.0),
            distance=r.distance,
            vector_rank=r.vector_rank,
            text_rank=r.text_rank,
            text_score=r.text_score,
            parent_id=r.parent_id,
            parent_source_key=r.parent_source_key,
            parent_text=r.parent_text,
        )
        for r in rows
        if r.id is not None
    )
    scan = next((r.scan for r in rows if r.scan), "text" if mode == "text" else "index")
    return SearchResult(
        hits=hits,
        stats=rows[0].stats if rows else None,
        stats_cached=rows[0].stats_cached if rows else None,
        scan=scan,
        timings=timings,
        cache_hit=None if qv is None else qv.cache_hit,
        cache_source=None if qv is None else qv.source,
        model=None if qv is None else qv.model,
    )


def _database_error(exc: psycopg.Error) -> Exception:
    mapped = from_database(exc)
    if mapped is not None:
        return mapped
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction):
        return NotMigrated(
            f"this database lacks pgrag's search functions ({str(exc).splitlines()[0]}): "
            "run `pgrag db upgrade`"
        )
    return exc


def _raise_database_error(exc: psycopg.Error) -> NoReturn:
    """``exc`` as pgrag's error (``_database_error``), or itself: never raised ``from`` itself
    (a cause that is the exception itself made a loop of every walk along the causes: a
    replica's check of a failed read spun there)."""
    mapped = _database_error(exc)
    if mapped is exc:
        raise exc
    raise mapped from exc


_CHECK_FILTER: LiteralString = "select pgrag.check_filter(%(filter)s::jsonb, %(doc_types)s::text[])"


@dataclass(frozen=True)
class _Embed:  # the driver embeds the question with this cache; sends back a QueryVector
    cache: QueryCache
    question: str


@dataclass(frozen=True)
class _Execute:  # the driver runs the statement, never prepared (docs/search.md, "The
    # statement": psycopg's rollback then deallocates every statement of the session, pgrag's
    # own included; a pooler may not keep them; and a migration that changes pgrag.search_hit
    # would fail a prepared call at every search); sends back its rows, as _Row unless
    # ``rows`` is False (tuples)
    statement: LiteralString
    params: dict[str, Any]
    rows: bool = True

    def row_factory(self) -> Any:
        return args_row(_Row) if self.rows else tuple_row


@dataclass(frozen=True)
class _Search:  # the driver runs the search by the connection's kept plan for its shape
    # (``_Plans``), or ``fallback`` where it cannot; sends back its rows as _Row
    shape: tuple[Any, ...]
    params: dict[str, Any]
    fallback: _Execute


@dataclass(frozen=True)
class _KeptPlan:
    statement: str  # $1 the question, $2 the vector
    settings: bytes  # the statement that sets its settings (_settings_statement)
    prepare: bool  # (False: too long to be held prepared, pgrag._search_plan)
    until: float  # time.monotonic()
    # the statement counts the filter's matches first, in the role that keeps their count
    # (pgrag._search_plan's counts): a search that walked the index found exact_threshold of
    # them, and the plan is made again with the count as the filter's estimate
    counts: bool


class _Plans:
    """The plans of ``pgrag._search_plan`` each connection keeps, per shape, for the time the
    plan says (``keep_s``: a minute; 0 on a partitioned store, whose plan names the session's
    tenants): a search of a kept shape sends its settings and statement in one round trip,
    and skips the planning (0.1-0.2 ms in the server, docs/benchmarks.md). Nothing in a plan
    is the role's to guard: it is the filter compiled, the tuned settings and the estimate's
    choice, and the statement runs under the role and row-level security of its session
    whenever it runs. A connection keeps the last ``keep`` shapes."""

    keep = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_conn: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[Any, ...], _KeptPlan]]
        self._by_conn = weakref.WeakKeyDictionary()

    def get(self, conn: Any, shape: tuple[Any, ...]) -> _KeptPlan | None:
        with self._lock:
            plans = self._by_conn.get(conn)
            plan = None if plans is None else plans.get(shape)
            if plan is None or plan.until <= time.monotonic():
                return None
            plans.move_to_end(shape)  # type: ignore[union-attr]
            return plan

    def put(self, conn: Any, shape: tuple[Any, ...], row: tuple[Any, ...]) -> _KeptPlan:
        """The plan of a ``_PLAN`` row, kept unless it says not to."""
        statement, settings, prepare, keep_s, counts = row
        plan = _KeptPlan(
            statement,
            _settings_statement(settings).as_bytes(None),
            bool(prepare),
            time.monotonic() + keep_s,
            bool(counts),
        )
        if keep_s <= 0:
            return plan
        with self._lock:
            plans = self._by_conn.setdefault(conn, OrderedDict())
            plans[shape] = plan
            plans.move_to_end(shape)
            while len(plans) > self.keep:
                plans.popitem(last=False)
        return plan

    def forget(self, conn: Any, shape: tuple[Any, ...]) -> None:
        with self._lock:
            plans = self._by_conn.get(conn)
            if plans is not None:
                plans.pop(shape, None)

    def learned(
        self, conn: Any, shape: tuple[Any, ...], kept: _KeptPlan, rows: Sequence[_Row]
    ) -> None:
        """Forget a plan that counted a filter's matches first where the search walked the
        index (it found exact_threshold of them): the next plan reads the count it kept."""
        if kept.counts and rows and rows[0].scan == "index":
            self.forget(conn, shape)


_PLANS = _Plans()


def _shape(params: Mapping[str, Any]) -> tuple[Any, ...]:
    flt, qvec, doc_types = params["filter"], params["qvec"], params["doc_types"]
    return (
        *(params[name] for name in _SHAPE),
        None if doc_types is None else tuple(doc_types),
        None if flt is None else flt.dumps(flt.obj),
        None if qvec is None else qvec.array.size,
    )


def _prepare(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], kept: _KeptPlan) -> bool:
    """Whether the plan's statements (its settings and its search) are prepared: at once,
    since a kept plan is run again (its first five runs, each planned as psycopg's threshold
    would have them, were the p95 of a 50-query sweep), unless the plan says it is too long to
    hold or the connection prepares nothing (``prepare_threshold=None``: behind a pooler in
    transaction mode)."""
    return kept.prepare and conn.prepare_threshold is not None


def _bound(step: _Search) -> tuple[Any, Any]:
    """The plan's statement's parameters: $1 the question, $2 the vector."""
    return step.params["text"], step.params["qvec"]


# The connection a block of code uses alone (``exclusive``); None: none.
_EXCLUSIVE: ContextVar[object | None] = ContextVar("pgrag_exclusive_connection", default=None)


@contextlib.contextmanager
def exclusive(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Iterator[None]:
    """Inside the block, searches on ``conn`` run by the connection's kept plans (docs/search.md,
    "The client's plans"): the caller says that nothing else uses the connection meanwhile
    (no other thread, no other asyncio task). A kept plan is a pipeline of several messages,
    which another user of the connection would interleave with: psycopg lets threads share a
    connection statement by statement, and without this a search is one statement. The
    ``Client`` searches this way on its pooled connections."""
    token = _EXCLUSIVE.set(conn)
    try:
        yield
    finally:
        _EXCLUSIVE.reset(token)


def _may_plan_here(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """The client runs a kept plan only on a connection its caller uses alone (``exclusive``)
    and outside any transaction: the plan's settings are local to the transaction the search
    runs in, its own (one inside the caller's would outlast the search)."""
    return (
        _EXCLUSIVE.get() is conn
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        and conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    )


# A kept plan that fails may be stale (a declaration or a migration since): planned again and
# run once more, for these classes of error only (not a cancel or a lost connection).
_STALE_PLAN_CLASSES = ("0A", "22", "42")


def _stale(exc: psycopg.Error) -> bool:
    return (exc.sqlstate or "")[:2] in _STALE_PLAN_CLASSES


# A search's own transaction left open by an error (not a connection lost mid-statement).
_UNFINISHED = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)

# "cached plan must not change result type" (0A000: a column the statement returns changed
# type): the prepared statement would fail again under the same text. psycopg forgets its own
# prepared statements when it sees this command (as at a rollback), and prepares them again.
_DEALLOCATE: LiteralString = "deallocate all"


_Step = _Embed | _Execute | _Search


def _plan(query: str | None, o: SearchOptions) -> Generator[_Step, Any, SearchResult]:
    """A search, without I/O: it yields what it needs done and is sent the results."""
    if query is not None:
        check_question(query)
    started = time.perf_counter()
    qv: QueryVector | None = None
    timings: dict[str, float] = {}
    if o.mode != "text" and o.vector is None and query:
        cache = _query_cache(o.embedder)
        if o.filter and not cache.embedder_ready():  # a bad filter fails before a model loads
            yield _Execute(_CHECK_FILTER, _check_filter_params(o.filter, o.doc_types), rows=False)
        qv = yield _Embed(cache, query)
        assert qv is not None
        o = replace(o, vector=qv.vector, model=qv.model)
        timings["embed_ms"] = _ms(qv.seconds)
    statement, params = _statement(o, query)
    t0 = time.perf_counter()
    fallback = _Execute(statement, params)
    rows = yield fallback if o.stats else _Search(_shape(params), params, fallback)
    timings["search_ms"] = _ms(time.perf_counter() - t0)
    timings["total_ms"] = _ms(time.perf_counter() - started)
    return _result(rows, timings, qv, o.mode)


def search(
    conn: psycopg.Connection[Any],
    query: str | None = None,
    options: SearchOptions | None = None,
    **args: Unpack[SearchArgs],
) -> SearchResult:
    """Search the chunks in one statement (``pgrag.search``, docs/search.md): ``query`` is the
    question (full text, and embedded unless a vector is given); the rest is ``options``
    (a ``SearchOptions``) and/or its fields as keywords."""
    check_connection(conn, "search")
    return _drive(conn, _plan(query, SearchOptions.of(options, args)))


class RankedArgs(TypedDict, total=False):
    """``ranked``'s keyword arguments."""

    filter: Mapping[str, Any] | None
    doc_types: Sequence[str] | None
    descending: bool
    k: int | None
    stats: bool


def ranked(conn: psycopg.Connection[Any], by_key: str, **args: Unpack[RankedArgs]) -> SearchResult:
    """The ``k`` chunks matching ``filter`` with the largest (``descending``, the default) or
    smallest values of the numeric metadata key ``by_key`` (``pgrag.ranked``), with the types'
    exact statistics under the filter when ``stats``: one statement."""
    return _drive(conn, _ranked_plan(by_key, **args))


async def aranked(
    conn: psycopg.AsyncConnection[Any], by_key: str, **args: Unpack[RankedArgs]
) -> SearchResult:
    """``ranked`` on an async connection."""
    return await _adrive(conn, _ranked_plan(by_key, **args))


def _ranked_plan(
    by_key: str,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    descending: bool = True,
    k: int | None = None,
    stats: bool = False,
) -> Generator[_Step, Any, SearchResult]:
    started = time.perf_counter()
    params = {
        "by": by_key,
        "filter": None if filter is None else filter_param(filter),
        "doc_types": None if doc_types is None else check_names(doc_types, "doc_types"),
        "descending": descending,
        "k": k,
    }
    rows = yield _Execute(_RANKED_WITH_STATS if stats else _RANKED, params)
    elapsed = _ms(time.perf_counter() - started)
    return _result(rows, {"search_ms": elapsed, "total_ms": elapsed}, None, "text")


def _drive(
    conn: psycopg.Connection[Any], plan: Generator[_Step, Any, SearchResult]
) -> SearchResult:
    """Run a plan's steps on ``conn``: each step's I/O, its result sent back to the plan."""
    try:
        step = next(plan)
        while True:
            if isinstance(step, _Embed):
                step = plan.send(step.cache.embed(conn, step.question))
            elif isinstance(step, _Search) and _may_plan_here(conn):
                step = plan.send(_search_by_plan(conn, step))
            else:
                step = plan.send(
                    _execute(conn, step.fallback if isinstance(step, _Search) else step)
                )
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except psycopg.Error as exc:
        _raise_database_error(exc)


def _execute(conn: psycopg.Connection[Any], step: _Execute) -> list[Any]:
    with conn.cursor(row_factory=step.row_factory()) as cur:
        _adapt_vector_param(cur.adapters)
        cur.execute(step.statement, step.params, prepare=False)
        return cur.fetchall()


def _search_by_plan(conn: psycopg.Connection[Any], step: _Search) -> list[_Row]:
    """The search by the connection's kept plan for its shape (planned first when there is
    none), in a transaction of its own: one round trip with a kept plan. A kept plan that
    fails as a stale one would is planned again and run once more."""
    kept = _PLANS.get(conn, step.shape)
    try:
        return _run_plan(conn, step, kept)
    except psycopg.Error as exc:
        if kept is None or not _stale(exc) or not _may_plan_here(conn):
            raise
        if isinstance(exc, psycopg.errors.FeatureNotSupported):
            conn.execute(_DEALLOCATE)
            if not conn.autocommit:
                conn.commit()  # (the connection was outside any transaction before the search)
    _PLANS.forget(conn, step.shape)
    return _run_plan(conn, step, None)


def _run_plan(conn: psycopg.Connection[Any], step: _Search, kept: _KeptPlan | None) -> list[_Row]:
    # (a connection not in autocommit is put in it for the search: psycopg's BEGIN there waited
    # for the server before the pipeline went on, one more round trip)
    manual = not conn.autocommit
    if manual:
        conn.autocommit = True
    try:
        with conn.pipeline():
            if kept is None:
                with conn.cursor(row_factory=tuple_row) as plan_cur:
                    _adapt_vector_param(plan_cur.adapters)
                    row = plan_cur.execute(_PLAN, step.params, prepare=False).fetchone()
                assert row is not None
                kept = _PLANS.put(conn, step.shape, row)
            conn.cursor(row_factory=tuple_row).execute(kept.settings, prepare=_prepare(conn, kept))
            cur = psycopg.RawCursor(conn, row_factory=args_row(_Row))
            _adapt_vector_param(cur.adapters)
            cur.execute(kept.statement, _bound(step), prepare=_prepare(conn, kept))
    except BaseException:
        if conn.info.transaction_status in _UNFINISHED:
            conn.rollback()
        raise
    finally:
        # (a connection lost with the server, closed or still ACTIVE, is left as it is: setting
        # it raised over the server's error, which told the replica's reader to go elsewhere)
        if manual and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = False
    rows = cur.fetchall()
    _PLANS.learned(conn, step.shape, kept, rows)
    return rows


async def asearch(
    conn: psycopg.AsyncConnection[Any],
    query: str | None = None,
    options: SearchOptions | None = None,
    **args: Unpack[SearchArgs],
) -> SearchResult:
    """``search`` on an async connection: the same plan, the same statement, the same results."""
    return await _adrive(conn, _plan(query, SearchOptions.of(options, args)))


async def _adrive(
    conn: psycopg.AsyncConnection[Any], plan: Generator[_Step, Any, SearchResult]
) -> SearchResult:
    """``_drive`` on an async connection."""
    try:
        step = next(plan)
        while True:
            if isinstance(step, _Embed):
                step = plan.send(await step.cache.aembed(conn, step.question))
            elif isinstance(step, _Search) and _may_plan_here(conn):
                step = plan.send(await _asearch_by_plan(conn, step))
            else:
                step = plan.send(
                    await _aexecute(conn, step.fallback if isinstance(step, _Search) else step)
                )
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except psycopg.Error as exc:
        _raise_database_error(exc)


async def _aexecute(conn: psycopg.AsyncConnection[Any], step: _Execute) -> list[Any]:
    async with conn.cursor(row_factory=step.row_factory()) as cur:
        _adapt_vector_param(cur.adapters)
        await cur.execute(step.statement, step.params, prepare=False)
        return await cur.fetchall()


async def _asearch_by_plan(conn: psycopg.AsyncConnection[Any], step: _Search) -> list[_Row]:
    """``_search_by_plan`` on an async connection."""
    kept = _PLANS.get(conn, step.shape)
    try:
        return await _arun_plan(conn, step, kept)
    except psycopg.Error as exc:
        if kept is None or not _stale(exc) or not _may_plan_here(conn):
            raise
        if isinstance(exc, psycopg.errors.FeatureNotSupported):
            await conn.execute(_DEALLOCATE)
            if not conn.autocommit:
                await conn.commit()
    _PLANS.forget(conn, step.shape)
    return await _arun_plan(conn, step, None)


async def _arun_plan(
    conn: psycopg.AsyncConnection[Any], step: _Search, kept: _KeptPlan | None
) -> list[_Row]:
    manual = not conn.autocommit
    if manual:
        await conn.set_autocommit(True)
    try:
        async with conn.pipeline():
            if kept is None:
                async with conn.cursor(row_factory=tuple_row) as plan_cur:
                    _adapt_vector_param(plan_cur.adapters)
                    await plan_cur.execute(_PLAN, step.params, prepare=False)
                    row = await plan_cur.fetchone()
                assert row is not None
                kept = _PLANS.put(conn, step.shape, row)
            await conn.cursor(row_factory=tuple_row).execute(
                kept.settings, prepare=_prepare(conn, kept)
            )
            cur = psycopg.AsyncRawCursor(conn, row_factory=args_row(_Row))
            _adapt_vector_param(cur.adapters)
            await cur.execute(kept.statement, _bound(step), prepare=_prepare(conn, kept))
    except BaseException:
        if conn.info.transaction_status in _UNFINISHED:
            await conn.rollback()
        raise
    finally:
        if manual and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            await conn.set_autocommit(False)
    rows = await cur.fetchall()
    _PLANS.learned(conn, step.shape, kept, rows)
    return rows


def _check_filter_params(
    filter: Mapping[str, Any], doc_types: Sequence[str] | None
) -> dict[str, Any]:
    return {
        "filter": filter_param(filter),
        "doc_types": None if doc_types is None else check_names(doc_types, "doc_types"),
    }


def _query_cache(embedder: str | Embedder | QueryCache | None) -> QueryCache:
    from pgrag.embed.cache import QueryCache

    if isinstance(embedder, QueryCache):
        return embedder
    return query_cache_for(embedder)


# ---------------------------------------------------------------- stats and context


@dataclass(frozen=True)
class ContextRow:
    relation: str  # "chunk", "parent", "child" or "sibling"
    id: int
    doc_type: str
    source_key: str
    parent_id: int | None
    text: str
    metadata: dict[str, Any]


def declare_stats(conn: psycopg.Connection[Any], doc_type: str, stats_sql: str | None) -> None:
    """Declare (None: remove) a document type's exact statistics (``pgrag.declare_stats``)."""
    try:
        conn.execute("select pgrag.declare_stats(%s, %s)", (doc_type, stats_sql))
    except psycopg.Error as exc:
        _raise_database_error(exc)


_STATS: LiteralString = "select pgrag.stats(%(filter)s::jsonb, %(doc_types)s::text[])"
_CONTEXT: LiteralString = "select * from pgrag.context(%s, %s)"


def stats(
    conn: psycopg.Connection[Any],
    *,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Exact statistics for a filter without a search: ``{doc_type: {...}}`` (``pgrag.stats``)."""
    try:
        row = conn.execute(_STATS, _check_filter_params(filter or {}, doc_types)).fetchone()
    except psycopg.Error as exc:
        _raise_database_error(exc)
    return dict(row[0]) if row and row[0] else {}


async def astats(
    conn: psycopg.AsyncConnection[Any],
    *,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``stats`` on an async connection."""
    try:
        cur = await conn.execute(_STATS, _check_filter_params(filter or {}, doc_types))
        row = await cur.fetchone()
    except psycopg.Error as exc:
        _raise_database_error(exc)
    return dict(row[0]) if row and row[0] else {}


def context(
    conn: psycopg.Connection[Any], chunk_id: int, *, max_children: int = 20
) -> list[ContextRow]:
    """A chunk with its parent, children and siblings (``pgrag.context``)."""
    try:
        with conn.cursor(row_factory=class_row(ContextRow)) as cur:
            return cur.execute(_CONTEXT, (chunk_id, max_children)).fetchall()
    except psycopg.Error as exc:
        _raise_database_error(exc)


async def acontext(
    conn: psycopg.AsyncConnection[Any], chunk_id: int, *, max_children: int = 20
) -> list[ContextRow]:
    """``context`` on an async connection."""
    try:
        async with conn.cursor(row_factory=class_row(ContextRow)) as cur:
            await cur.execute(_CONTEXT, (chunk_id, max_children))
            return await cur.fetchall()
    except psycopg.Error as exc:
        _raise_database_error(exc)


__all__ = [
    "ContextRow",
    "Match",
    "Mode",
    "RankedArgs",
    "SearchArgs",
    "SearchHit",
    "SearchOptions",
    "SearchResult",
    "acontext",
    "aranked",
    "asearch",
    "astats",
    "context",
    "declare_stats",
    "exclusive",
    "query_cache_for",
    "ranked",
    "search",
    "stats",
]
