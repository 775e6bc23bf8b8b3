"""One SQL statement per search: filters, HNSW, full text, rank fusion, parents and exact stats.

The statement (docs/search.md) is a chain of CTEs:

- ``matched``: the chunks matching the filter with their distances, up to ``exact_threshold``
  of them (only when there is a filter, and not when the planner expects ``COUNT_SKIP_FACTOR``
  times that many: ``pgrag.estimate_rows``); ``counted``: how many;
- ``vec_index``: at the threshold or above, the HNSW index with pgvector's iterative scan
  (``hnsw.iterative_scan = relaxed_order``), which keeps walking the graph until enough rows pass
  the filter; materialized and re-sorted because relaxed order may be slightly out of order;
- ``path``: ``exact`` below the threshold, or when the index came back with fewer than ``kc``
  rows (it stopped at ``hnsw.max_scan_tuples``); otherwise ``index``;
- ``vec_exact``: when the path is exact, every matching vector is compared: those of
  ``matched`` when it holds them all (one pass over the filter's rows), else all over again
  (``+ 0`` on the distance keeps the planner off the HNSW index);
- ``fts``: ``tsv @@ pgrag.search_tsquery(text, match, pgrag.common_lexemes())`` ranked by
  ``ts_rank`` (``match = any`` leaves out the words in most chunks of a large store);
- ``fused``: reciprocal rank fusion, ``1 / (rrf_k + rank)`` summed over both lists;
- ``stats``: ``pgrag.doc_type_stats`` of every searched document type with declared statistics,
  over *every* chunk matching the filter (not the top k; ``pgrag.doc_type_stats_lookup``, one
  pass over them or the statistics cache's result, and whether it was a cache hit), plus the
  embedder check;
- the final SELECT joins each hit to its chunk and its parent chunk.

The per-query HNSW settings go through ``set_config(..., true)`` in the same transaction and
the same pipeline (one network round trip for both statements).

Builders (``build_statement``) return ``sql.Composed`` and do no I/O; ``search`` (sync) and
``asearch`` (async) run them. The SQL functions ``pgrag.search`` / ``hybrid_search`` /
``text_search`` in ``sql/idempotent/30_search.sql`` run the same statement shape with a
containment filter.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, LiteralString

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import class_row

from pgrag.errors import ConfigError, InvalidFilter, NotMigrated, from_database
from pgrag.filters import CompiledFilter, compile_filter, inline_params, union_schema
from pgrag.limits import check_names, check_query_vector, check_question

if TYPE_CHECKING:
    from psycopg.abc import AdaptContext

    from pgrag.db import Client
    from pgrag.embed.base import Embedder
    from pgrag.embed.cache import QueryCache, QueryVector

Mode = Literal["hybrid", "vector", "text"]
Match = Literal["all", "any"]

MODES: tuple[Mode, ...] = ("hybrid", "vector", "text")
MATCHES: tuple[Match, ...] = ("all", "any")
DEFAULT_K = 10
MAX_K = 10_000
RRF_K = 60
EXACT_THRESHOLD = 2_000
# No count when the planner expects this many times exact_threshold matching rows (the index
# runs; an exact scan still follows if the index comes back short).
COUNT_SKIP_FACTOR = 5
FTS_LIMIT = 10_000
MIN_EF_SEARCH = 40
MIN_MAX_SCAN_TUPLES = 20_000
SCHEMA_TTL_S = 30.0

_C = "c"  # the chunks alias every filter is compiled against
METADATA = sql.Identifier(_C, "metadata")
DOC_TYPE = sql.Identifier(_C, "doc_type")

# One statement before the search, in the same transaction and pipeline.
SETTINGS: LiteralString = (
    "select set_config('hnsw.iterative_scan', 'relaxed_order', true), "
    "set_config('hnsw.ef_search', (case when %(ef_tuned)s "
    "and current_setting('pgrag.ef_search', true) ~ '^[0-9]{1,4}$' "
    "then greatest(%(ef_search)s::integer, "
    "least(current_setting('pgrag.ef_search', true)::integer, 1000)) "
    "else %(ef_search)s::integer end)::text, true), "
    "set_config('hnsw.max_scan_tuples', %(max_scan_tuples)s, true)"
)


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


@dataclass(frozen=True)
class _Row:
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
    stats: dict[str, Any] | None
    stats_cached: dict[str, bool] | None


@dataclass(frozen=True)
class SearchRequest:
    """A validated search: what ``build_statement`` needs and the statement's parameters."""

    mode: Mode
    has_filter: bool
    with_stats: bool
    check_model: bool
    where: sql.Composable
    params: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- builders (no I/O)


def _vector_ctes(where: sql.Composable, has_filter: bool) -> sql.Composed:
    # Without a filter the count is skipped and the index runs at once; it may still come
    # back short (row-level security filters a reader's search: a small tenant in a large
    # store), and then every visible vector is compared, as behind a filter.
    skip = (
        sql.SQL("pgrag.estimate_rows(%(filter_sql)s) >= %(count_skip_rows)s")
        if has_filter
        else sql.SQL("true")
    )
    return sql.SQL(
        """
est as materialized (select {skip} as skip),
matched as materialized (
    select c.id, c.embedding <=> (select v from q) as distance
    from pgrag.chunks c
    where {where} and c.embedding is not null and not (select skip from est)
    limit %(exact_threshold)s),
counted as materialized (
    select case when (select skip from est) then %(exact_threshold)s::bigint
                else (select count(*) from matched) end as n),
vec_index as materialized (
    select c.id, c.embedding <=> (select v from q) as distance
    from pgrag.chunks c
    where {where} and c.embedding is not null and (select n from counted) >= %(exact_threshold)s
    order by c.embedding <=> (select v from q)
    limit %(kc)s),
path as materialized (
    select case when (select n from counted) >= %(exact_threshold)s
                 and (select count(*) from vec_index) >= %(kc)s
                then 'index' else 'exact' end as scan),
vec_exact as (
    (select m.id, m.distance
     from matched m
     where (select n from counted) < %(exact_threshold)s
     order by m.distance, m.id
     limit %(kc)s)
    union all
    (select c.id, c.embedding <=> (select v from q) as distance
     from pgrag.chunks c
     where {where} and c.embedding is not null
       and (select n from counted) >= %(exact_threshold)s and (select scan from path) = 'exact'
     order by (c.embedding <=> (select v from q)) + 0, c.id
     limit %(kc)s)),
vec as (
    select u.id, u.distance, row_number() over (order by u.distance, u.id)::integer as rank
    from (select * from vec_exact
          union all
          select * from vec_index where (select scan from path) = 'index') u),"""
    ).format(where=where, skip=skip)


def _text_ctes(where: sql.Composable) -> sql.Composed:
    return sql.SQL(
        """
tq as materialized (select pgrag.search_tsquery(%(text)s, %(match)s, pgrag.common_lexemes()) as q),
fts_rows as (
    select c.id, c.tsv
    from pgrag.chunks c
    where c.tsv @@ (select q from tq) and {where}
    limit %(fts_limit)s),
fts_scored as (
    select r.id, ts_rank(r.tsv, (select q from tq)) as score from fts_rows r),
fts as (
    select r.id, r.score, row_number() over (order by r.score desc, r.id)::integer as rank
    from fts_scored r
    order by rank
    limit %(kc)s),"""
    ).format(where=where)


_FUSED: dict[Mode, sql.SQL] = {
    "vector": sql.SQL(
        """
fused as (
    select v.id, 1 - v.distance as score, v.distance, v.rank as vector_rank,
           null::integer as text_rank, null::real as text_score
    from vec v order by v.rank limit %(k)s),"""
    ),
    "text": sql.SQL(
        """
fused as (
    select f.id, f.score::double precision as score, null::double precision as distance,
           null::integer as vector_rank, f.rank as text_rank, f.score as text_score
    from fts f order by f.rank limit %(k)s),"""
    ),
    "hybrid": sql.SQL(
        """
fused as (
    select coalesce(v.id, f.id) as id,
           coalesce(1.0 / (%(rrf_k)s + v.rank), 0) + coalesce(1.0 / (%(rrf_k)s + f.rank), 0)
               as score,
           v.distance, v.rank as vector_rank, f.rank as text_rank, f.score as text_score
    from vec v full outer join fts f on f.id = v.id
    order by 2 desc, 1 limit %(k)s),"""
    ),
}


def _stats_cte(req: SearchRequest) -> sql.Composed:
    guard = (
        sql.SQL("pgrag.check_embedder(%(model)s, %(dim)s)")
        if req.check_model
        else sql.SQL("pgrag.check_dimension(%(dim)s)")
    )
    if req.mode == "text":
        guard = sql.SQL("null")
    if not req.with_stats:
        return sql.SQL(
            "\nguard as materialized (select {guard} as ok),"
            "\nstats as (select null::jsonb as stats, null::jsonb as stats_cached from guard),"
        ).format(guard=guard)
    doc_types = sql.SQL(
        "where %(doc_types)s::text[] is null or s.doc_type = any(%(doc_types)s::text[])"
    )
    return sql.SQL(
        """
guard as materialized (select {guard} as ok),
stats as (
    select coalesce(jsonb_object_agg(s.doc_type, l.stats), '{{}}'::jsonb) as stats,
           coalesce(jsonb_object_agg(s.doc_type, l.cached), '{{}}'::jsonb) as stats_cached
    from pgrag.doc_stats s cross join guard
    cross join lateral pgrag.doc_type_stats_lookup(s.doc_type, %(filter_sql)s) l
    {doc_types}),"""
    ).format(guard=guard, doc_types=doc_types)


def build_statement(req: SearchRequest) -> sql.Composed:
    """The one search statement for ``req`` (no I/O). Parameters: ``req.params``."""
    parts: list[sql.Composable] = [sql.SQL("with")]
    if req.mode != "text":
        parts.append(sql.SQL("\nq as materialized (select %(qvec)s::vector as v),"))
        parts.append(_vector_ctes(req.where, req.has_filter))
    if req.mode != "vector":
        parts.append(_text_ctes(req.where))
    parts.append(_FUSED[req.mode])
    parts.append(_stats_cte(req))
    scan = sql.SQL("'text'::text" if req.mode == "text" else "(select scan from path)")
    parts.append(
        sql.SQL(
            """
hits as (
    select c.id, c.doc_type, c.source_key, c.text, c.metadata,
           f.score::double precision as score, f.distance::double precision as distance,
           f.vector_rank, f.text_rank, f.text_score::real as text_score,
           c.parent_id, p.source_key as parent_source_key, p.text as parent_text
    from fused f
    join pgrag.chunks c on c.id = f.id
    left join pgrag.chunks p on p.id = c.parent_id)
select h.*, {scan} as scan, st.stats, st.stats_cached
from stats st
left join hits h on true
order by h.score desc nulls last, h.id"""
        ).format(scan=scan)
    )
    return sql.Composed(parts)


# ---------------------------------------------------------------- validation


def _check_int(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} = {value!r} is out of range: use {low} to {high:,}")
    return value


def make_request(
    *,
    mode: Mode,
    text: str | None,
    vector: Sequence[float] | np.ndarray[Any, Any] | None,
    model: str | None,
    filter: Mapping[str, Any] | None,
    schema: Mapping[str, str] | None,
    doc_types: Sequence[str] | None,
    k: int,
    stats: bool,
    match: Match,
    candidates: int | None,
    ef_search: int | None,
    exact_threshold: int,
    rrf_k: int,
    fts_limit: int,
    context: AdaptContext | None = None,
    split_keys: Collection[str] = (),
) -> SearchRequest:
    """Validate a search and compile its filter; ``schema`` is the searched types' metadata,
    ``split_keys`` the store's filter indexes' keys (``compile_filter``). ``context`` (the
    connection) quotes the filter's literal text for its encoding and settings; without one
    psycopg quotes for libpq's last connection."""
    if mode not in MODES:
        raise ConfigError(f"search mode {mode!r} is unknown: use one of {', '.join(MODES)}")
    if match not in MATCHES:
        raise ConfigError(f"text match {match!r} is unknown: use all (every word) or any")
    _check_int("k", k, 1, MAX_K)
    if doc_types is not None:
        doc_types = check_names(doc_types, "doc_types")
    _check_int("exact_threshold", exact_threshold, 0, 100_000_000)
    _check_int("rrf_k", rrf_k, 1, 100_000)
    _check_int("fts_limit", fts_limit, 1, 100_000_000)
    kc = max(candidates if candidates is not None else (2 * k if mode == "vector" else 4 * k), k)
    _check_int("candidates", kc, 1, MAX_K * 4)
    ef = max(ef_search if ef_search is not None else 2 * kc, kc, MIN_EF_SEARCH)
    _check_int("ef_search", ef, 1, 1000)
    params: dict[str, Any] = {
        "k": k,
        "kc": kc,
        "exact_threshold": exact_threshold,
        "rrf_k": rrf_k,
        "fts_limit": fts_limit,
        "match": match,
        "text": text,
        "model": model,
        "doc_types": list(doc_types) if doc_types is not None else None,
        "ef_search": ef,
        "ef_tuned": ef_search is None,  # pgrag tune's database default may raise it
        "max_scan_tuples": str(max(MIN_MAX_SCAN_TUPLES, 200 * kc)),
    }
    if mode != "text":
        if vector is None:
            raise ConfigError(
                f"a {mode} search needs a query vector: pass vector=... or a question and an "
                "embedder, or search with mode='text'"
            )
        arr = check_query_vector(vector)
        params["qvec"] = VectorParam(arr)
        params["dim"] = int(arr.size)
    if mode != "vector" and not (text and text.strip()):
        raise ConfigError(f"a {mode} search needs a search text: pass the question")
    compiled = compile_filter(
        filter or None,
        schema or {},
        column=METADATA,
        doc_type_column=DOC_TYPE,
        split_keys=split_keys,
    )
    where: sql.Composable = compiled
    has_filter = bool(filter)
    if doc_types is not None:
        if not doc_types:
            raise ConfigError("doc_types is empty: pass None to search every document type")
        where = sql.SQL("({}) and {} = any({}::text[])").format(
            compiled, DOC_TYPE, sql.Placeholder("doc_types")
        )
        has_filter = True
    params.update(compiled.params)
    # the filter as SQL text with literal values, for the planner's estimate and the statistics
    # (pgrag.estimate_rows, pgrag.doc_type_stats_where): values quoted by psycopg
    params["filter_sql"] = inline_params(where, params, context)
    params["count_skip_rows"] = COUNT_SKIP_FACTOR * exact_threshold
    return SearchRequest(
        mode=mode,
        has_filter=has_filter,
        with_stats=stats,
        check_model=model is not None,
        where=where,
        params=params,
    )


# ---------------------------------------------------------------- metadata schemas (cached)

_SCHEMAS: dict[tuple[str, str, str], tuple[float, dict[str, dict[str, str]], frozenset[str]]] = {}
_SCHEMAS_LOCK = threading.Lock()
# the declared types' schemas, and a last row: the filter indexes' keys (split_keys)
_SCHEMA_QUERY: LiteralString = (
    "select name, metadata_schema from pgrag.doc_types "
    "union all select null, to_jsonb(pgrag.filter_index_keys())"
)


def _db_key(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> tuple[str, str, str]:
    info = conn.info
    return (str(info.host), str(info.port), str(info.dbname))


def _cached_schemas(
    key: tuple[str, str, str],
) -> tuple[dict[str, dict[str, str]], frozenset[str]] | None:
    with _SCHEMAS_LOCK:
        hit = _SCHEMAS.get(key)
    if hit is None or time.monotonic() - hit[0] > SCHEMA_TTL_S:
        return None
    return hit[1], hit[2]


def _store_schemas(
    key: tuple[str, str, str], rows: list[tuple[Any, ...]]
) -> tuple[dict[str, dict[str, str]], frozenset[str]]:
    schemas = {str(r[0]): dict(r[1]) for r in rows if r[0] is not None}
    split = frozenset(str(k) for r in rows if r[0] is None for k in r[1])
    with _SCHEMAS_LOCK:
        _SCHEMAS[key] = (time.monotonic(), schemas, split)
    return schemas, split


def forget_schemas() -> None:
    """Drop the cached document-type schemas and filter-index keys (they refresh by themselves
    after 30 s)."""
    with _SCHEMAS_LOCK:
        _SCHEMAS.clear()


def schema_for(
    schemas: Mapping[str, Mapping[str, str]], doc_types: Sequence[str] | None
) -> dict[str, str]:
    """The union of the metadata schemas of ``doc_types`` (all declared types when None)."""
    names = list(schemas) if doc_types is None else list(doc_types)
    unknown = [n for n in names if n not in schemas]
    if unknown:
        known = ", ".join(sorted(schemas)) or "none"
        raise InvalidFilter(
            f"document type {unknown[0]} is not declared (declared: {known}): "
            "pick a declared type, or run `pgrag documents list`"
        )
    return union_schema(schemas[n] for n in names)


# ---------------------------------------------------------------- embedding

_CACHES: dict[str, QueryCache] = {}
_CACHES_LOCK = threading.Lock()


def query_cache_for(embedder: str | Embedder | None = None) -> QueryCache:
    """A process-wide QueryCache for an embedder spec (None: PGRAG_EMBEDDER or the default)."""
    from pgrag.embed.base import ENV_EMBEDDER, get_embedder
    from pgrag.embed.cache import QueryCache

    if embedder is not None and not isinstance(embedder, str):
        return QueryCache(embedder)
    import os

    spec = embedder or os.environ.get(ENV_EMBEDDER) or "sentence-transformers"
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
    scan = rows[0].scan if rows and rows[0].scan else ("text" if mode == "text" else "index")
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


def search(
    target: Client | psycopg.Connection[Any],
    query: str | None = None,
    *,
    vector: Sequence[float] | np.ndarray[Any, Any] | None = None,
    model: str | None = None,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    k: int = DEFAULT_K,
    mode: Mode = "hybrid",
    stats: bool = False,
    match: Match | None = None,
    candidates: int | None = None,
    ef_search: int | None = None,
    exact_threshold: int = EXACT_THRESHOLD,
    rrf_k: int = RRF_K,
    fts_limit: int = FTS_LIMIT,
    embedder: str | Embedder | QueryCache | None = None,
    schema: Mapping[str, str] | None = None,
) -> SearchResult:
    """Search the chunks in one statement; see the module docstring.

    ``query`` is the question (full text, and embedded through the query cache when no
    ``vector`` is given: ``embedder`` is a QueryCache, an Embedder or a spec, default
    PGRAG_EMBEDDER / the bundled model). ``vector`` with ``model`` (its model's name) skips the
    embedding; the store refuses a vector of another model (ModelMismatch) or dimension.
    ``filter`` is the JSON filter language (pgrag.filters), ``doc_types`` limits the types,
    ``stats`` adds each type's exact statistics over every matching chunk.
    """
    from pgrag.db import Client

    if isinstance(target, Client):
        with target.connection() as conn:
            return search(
                conn,
                query,
                vector=vector,
                model=model,
                filter=filter,
                doc_types=doc_types,
                k=k,
                mode=mode,
                stats=stats,
                match=match,
                candidates=candidates,
                ef_search=ef_search,
                exact_threshold=exact_threshold,
                rrf_k=rrf_k,
                fts_limit=fts_limit,
                embedder=embedder,
                schema=schema,
            )
    conn = target
    if query is not None:
        check_question(query)
    started = time.perf_counter()
    qv: QueryVector | None = None
    timings: dict[str, float] = {}
    try:
        if filter and schema is None:  # a bad filter fails before the model loads
            schema = filter_schema(conn, filter, doc_types)
        if mode != "text" and vector is None and query:
            qv = _query_cache(embedder).embed(conn, query)
            vector, model = qv.vector, qv.model
            timings["embed_ms"] = _ms(qv.seconds)
        req = _request_sync(
            conn,
            mode=mode,
            text=query,
            vector=vector,
            model=model,
            filter=filter,
            schema=schema,
            doc_types=doc_types,
            k=k,
            stats=stats,
            match=match or ("all" if mode == "text" else "any"),
            candidates=candidates,
            ef_search=ef_search,
            exact_threshold=exact_threshold,
            rrf_k=rrf_k,
            fts_limit=fts_limit,
        )
        statement = build_statement(req)
        t0 = time.perf_counter()
        with (
            conn.transaction() if conn.autocommit else contextlib.nullcontext(),
            conn.pipeline(),
            conn.cursor(row_factory=class_row(_Row)) as cur,
        ):
            _adapt_vector_param(cur.adapters)
            if req.mode != "text":
                conn.execute(SETTINGS, req.params)
            # never prepared: a generic plan cannot use a filter index (a partial index) and
            # plans without the filter's values; planning is part of every search anyway
            cur.execute(statement, req.params, prepare=False)
            rows = cur.fetchall()
        timings["search_ms"] = _ms(time.perf_counter() - t0)
    except psycopg.Error as exc:
        raise _database_error(exc) from exc
    timings["total_ms"] = _ms(time.perf_counter() - started)
    return _result(rows, timings, qv, mode)


def _query_cache(embedder: str | Embedder | QueryCache | None) -> QueryCache:
    from pgrag.embed.cache import QueryCache

    if isinstance(embedder, QueryCache):
        return embedder
    return query_cache_for(embedder)


def filter_schema(
    conn: psycopg.Connection[Any], filter: Mapping[str, Any], doc_types: Sequence[str] | None
) -> dict[str, str]:
    """The searched types' metadata schema, checked against ``filter`` (InvalidFilter if not).

    Schemas are cached per database for a short while; a filter that fails against the cached
    ones is checked once more against fresh ones (a type may just have been declared).
    """
    return _filter_info_sync(conn, filter, doc_types, None)[0]


def _checked(
    entry: tuple[dict[str, dict[str, str]], frozenset[str]],
    filter: Mapping[str, Any],
    doc_types: Sequence[str] | None,
    schema: Mapping[str, str] | None,
) -> tuple[dict[str, str], frozenset[str]]:
    use = dict(schema) if schema is not None else schema_for(entry[0], doc_types)
    compile_filter(filter, use)
    return use, entry[1]


def _filter_info_sync(
    conn: psycopg.Connection[Any],
    filter: Mapping[str, Any],
    doc_types: Sequence[str] | None,
    schema: Mapping[str, str] | None,
) -> tuple[dict[str, str], frozenset[str]]:
    """(schema, the filter indexes' keys) for a filtered search; ``schema`` if given."""
    key = _db_key(conn)
    entry = _cached_schemas(key)
    if entry is not None:
        try:
            return _checked(entry, filter, doc_types, schema)
        except InvalidFilter:
            if schema is not None:
                raise
    try:
        rows = conn.execute(_SCHEMA_QUERY).fetchall()
    except psycopg.errors.UndefinedFunction as exc:
        raise _stale_functions() from exc
    entry = _store_schemas(key, rows)
    return _checked(entry, filter, doc_types, schema)


def _request_sync(conn: psycopg.Connection[Any], **kw: Any) -> SearchRequest:
    if kw["filter"]:
        kw["schema"], kw["split_keys"] = _filter_info_sync(
            conn, kw["filter"], kw["doc_types"], kw["schema"]
        )
    return make_request(**kw, context=conn)


async def _filter_info_async(
    conn: psycopg.AsyncConnection[Any],
    filter: Mapping[str, Any],
    doc_types: Sequence[str] | None,
    schema: Mapping[str, str] | None,
) -> tuple[dict[str, str], frozenset[str]]:
    """``_filter_info_sync`` for an async connection."""
    key = _db_key(conn)
    entry = _cached_schemas(key)
    if entry is not None:
        try:
            return _checked(entry, filter, doc_types, schema)
        except InvalidFilter:
            if schema is not None:
                raise
    try:
        cur = await conn.execute(_SCHEMA_QUERY)
    except psycopg.errors.UndefinedFunction as exc:
        raise _stale_functions() from exc
    entry = _store_schemas(key, await cur.fetchall())
    return _checked(entry, filter, doc_types, schema)


def _stale_functions() -> NotMigrated:
    return NotMigrated(
        "this database's pgrag functions are older than this pgrag (no "
        "pgrag.filter_index_keys()): run `pgrag db upgrade`, which refreshes them"
    )


async def _request_async(conn: psycopg.AsyncConnection[Any], **kw: Any) -> SearchRequest:
    if kw["filter"]:
        kw["schema"], kw["split_keys"] = await _filter_info_async(
            conn, kw["filter"], kw["doc_types"], kw["schema"]
        )
    return make_request(**kw, context=conn)


async def asearch(
    conn: psycopg.AsyncConnection[Any],
    query: str | None = None,
    *,
    vector: Sequence[float] | np.ndarray[Any, Any] | None = None,
    model: str | None = None,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    k: int = DEFAULT_K,
    mode: Mode = "hybrid",
    stats: bool = False,
    match: Match | None = None,
    candidates: int | None = None,
    ef_search: int | None = None,
    exact_threshold: int = EXACT_THRESHOLD,
    rrf_k: int = RRF_K,
    fts_limit: int = FTS_LIMIT,
    embedder: str | Embedder | QueryCache | None = None,
    schema: Mapping[str, str] | None = None,
) -> SearchResult:
    """``search`` on an async connection: the same statement, the same results."""
    if query is not None:
        check_question(query)
    started = time.perf_counter()
    qv: QueryVector | None = None
    timings: dict[str, float] = {}
    try:
        if filter and schema is None:  # a bad filter fails before the model loads
            schema = (await _filter_info_async(conn, filter, doc_types, None))[0]
        if mode != "text" and vector is None and query:
            qv = await _query_cache(embedder).aembed(conn, query)
            vector, model = qv.vector, qv.model
            timings["embed_ms"] = _ms(qv.seconds)
        req = await _request_async(
            conn,
            mode=mode,
            text=query,
            vector=vector,
            model=model,
            filter=filter,
            schema=schema,
            doc_types=doc_types,
            k=k,
            stats=stats,
            match=match or ("all" if mode == "text" else "any"),
            candidates=candidates,
            ef_search=ef_search,
            exact_threshold=exact_threshold,
            rrf_k=rrf_k,
            fts_limit=fts_limit,
        )
        statement = build_statement(req)
        t0 = time.perf_counter()
        async with (
            conn.transaction(),
            conn.pipeline(),
            conn.cursor(row_factory=class_row(_Row)) as cur,
        ):
            _adapt_vector_param(cur.adapters)
            if req.mode != "text":
                await conn.execute(SETTINGS, req.params)
            await cur.execute(statement, req.params, prepare=False)  # as in search()
            rows = await cur.fetchall()
        timings["search_ms"] = _ms(time.perf_counter() - t0)
    except psycopg.Error as exc:
        raise _database_error(exc) from exc
    timings["total_ms"] = _ms(time.perf_counter() - started)
    return _result(rows, timings, qv, mode)


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
        raise _database_error(exc) from exc


# Exact statistics of every chunk matching the request's filter, per document type.
STATS_STATEMENT: LiteralString = (
    "select coalesce(jsonb_object_agg(s.doc_type, "
    "pgrag.doc_type_stats_where(s.doc_type, %(filter_sql)s)), '{}'::jsonb) "
    "from pgrag.doc_stats s "
    "where %(doc_types)s::text[] is null or s.doc_type = any(%(doc_types)s::text[])"
)


def stats(
    target: Client | psycopg.Connection[Any],
    *,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    schema: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Exact statistics for a filter without a search: ``{doc_type: {...}}``."""
    from pgrag.db import Client

    if isinstance(target, Client):
        with target.connection() as conn:
            return stats(conn, filter=filter, doc_types=doc_types, schema=schema)
    try:
        req = _request_sync(
            target,
            mode="text",
            text="stats",
            vector=None,
            model=None,
            filter=filter,
            schema=schema,
            doc_types=doc_types,
            k=1,
            stats=True,
            match="all",
            candidates=None,
            ef_search=None,
            exact_threshold=EXACT_THRESHOLD,
            rrf_k=RRF_K,
            fts_limit=FTS_LIMIT,
        )
        row = target.execute(STATS_STATEMENT, req.params).fetchone()
    except psycopg.Error as exc:
        raise _database_error(exc) from exc
    return dict(row[0]) if row and row[0] else {}


def context(
    target: Client | psycopg.Connection[Any], chunk_id: int, *, max_children: int = 20
) -> list[ContextRow]:
    """A chunk with its parent, children and siblings (``pgrag.context``)."""
    from pgrag.db import Client

    if isinstance(target, Client):
        with target.connection() as conn:
            return context(conn, chunk_id, max_children=max_children)
    try:
        with target.cursor(row_factory=class_row(ContextRow)) as cur:
            return cur.execute(
                "select * from pgrag.context(%s, %s)", (chunk_id, max_children)
            ).fetchall()
    except psycopg.Error as exc:
        raise _database_error(exc) from exc


__all__ = [
    "CompiledFilter",
    "ContextRow",
    "Match",
    "Mode",
    "SearchHit",
    "SearchRequest",
    "SearchResult",
    "asearch",
    "build_statement",
    "STATS_STATEMENT",
    "context",
    "declare_stats",
    "forget_schemas",
    "make_request",
    "query_cache_for",
    "schema_for",
    "search",
    "stats",
]
