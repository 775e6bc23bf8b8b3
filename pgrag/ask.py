"""Question → answer: parse → embed (query cache) → one-statement search (+ exact stats when the
question asks for numbers) → dedup → rerank → grounded answer, with per-stage timings.

``ask(client_or_conn, question)`` returns an ``AskResult``; the CLI's ``pgrag ask`` and the demo
print it. Nothing here builds SQL beyond two small catalog reads (the categories and a customer
name's id), both cached or GIN-served; the search itself is ``pgrag.search.search``.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from pgrag import search as search_mod
from pgrag.answer import Answer, Context, LLMConfig, answer
from pgrag.limits import check_question
from pgrag.parse import ParsedQuery, parse_question
from pgrag.rerank import Reranker
from pgrag.search import SearchHit

if TYPE_CHECKING:
    from pgrag.embed.base import Embedder
    from pgrag.embed.cache import QueryCache

CATALOG_TTL_S = 300.0
DEFAULT_TOP_N = 5

_CATEGORIES: LiteralString = (
    "select coalesce(array_agg(distinct x order by x), '{}') from pgrag.chunks c, "
    "jsonb_array_elements_text(case when jsonb_typeof(c.metadata->'categories') = 'array' "
    "then c.metadata->'categories' else '[]' end) x"
)
_SCHEMAS: LiteralString = "select name, metadata_schema from pgrag.doc_types"
# Categories come from the chunks this session may see (row-level security): cache them per
# role and tenant, so that one tenant's category names never steer another tenant's parse.
_WHO: LiteralString = "select current_user, coalesce(current_setting('pgrag.tenant', true), '')"
_NAME_TO_ID: LiteralString = (
    "select distinct (metadata->>'customer_id')::integer from pgrag.chunks "
    "where (metadata @> %(by_name)s or metadata @> %(by_customer_name)s) "
    "and jsonb_typeof(metadata->'customer_id') = 'number' limit 2"
)


@dataclass(frozen=True)
class AskResult:
    question: str
    parsed: ParsedQuery
    filter: dict[str, Any]  # the filter searched (the parse's, plus a resolved customer id)
    hits: tuple[SearchHit, ...]  # after dedup and rerank: what the answer was given
    retrieved: tuple[SearchHit, ...]  # everything the search returned
    stats: dict[str, Any] | None
    answer: Answer
    scan: str
    timings: dict[str, float]  # ms: parse, embed, search, rerank, generate, total
    cache_hit: bool | None  # the question's vector came from the query cache
    notes: tuple[str, ...]
    stats_cached: dict[str, bool] | None = None  # per type: statistics from the stats cache


_catalog: dict[tuple[str, ...], tuple[float, list[str], dict[str, dict[str, str]]]] = {}
_catalog_lock = threading.Lock()


def _catalog_for(conn: psycopg.Connection[Any]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Category names and document-type schemas of this database as this session sees them
    (cached for 5 minutes per role and tenant)."""
    who = conn.execute(_WHO).fetchone()
    key = (str(conn.info.host), str(conn.info.port), str(conn.info.dbname), *map(str, who or ()))
    with _catalog_lock:
        hit = _catalog.get(key)
    if hit is not None and time.monotonic() - hit[0] < CATALOG_TTL_S:
        return hit[1], hit[2]
    row = conn.execute(_CATEGORIES).fetchone()
    categories = list(row[0]) if row and row[0] else []
    schemas = {str(r[0]): dict(r[1]) for r in conn.execute(_SCHEMAS).fetchall()}
    with _catalog_lock:
        _catalog[key] = (time.monotonic(), categories, schemas)
    return categories, schemas


def forget_catalog() -> None:
    with _catalog_lock:
        _catalog.clear()


def _resolve_name(
    conn: psycopg.Connection[Any], parsed: ParsedQuery, schemas: Mapping[str, Mapping[str, str]]
) -> tuple[dict[str, Any], str | None]:
    """The parse's filter, with ``customer_id`` added when the name matches exactly one id."""
    flt = dict(parsed.filter)
    name = parsed.customer_name
    if name is None or "customer_id" in flt:
        return flt, None
    if not all("customer_id" in schemas.get(t, {}) for t in parsed.doc_types):
        return flt, None
    rows = conn.execute(
        _NAME_TO_ID,
        {"by_name": Jsonb({"name": name}), "by_customer_name": Jsonb({"customer_name": name})},
    ).fetchall()
    if len(rows) == 1:
        flt["customer_id"] = int(rows[0][0])
        return flt, f"{name} is customer {rows[0][0]}"
    if not rows:
        return flt, f"no customer named {name} was found; searched without a customer filter"
    return flt, f"several customers are named {name}; searched without a customer filter"


def contexts_of(hits: Sequence[SearchHit]) -> list[Context]:
    out = []
    for h in hits:
        text = h.text
        if h.parent_text:
            first = h.parent_text.split("\n", 1)[0]
            text = f"{text}\n(parent {h.parent_source_key}: {first})"
        out.append(Context(h.id, text, h.doc_type, h.source_key, h.score))
    return out


class AskArgs(TypedDict, total=False):
    """``ask``'s keyword arguments, for the Client's typed ``**kwargs``."""

    k: int
    top_n: int
    filter: Mapping[str, Any] | None
    doc_types: Sequence[str] | None
    stats: bool | None
    llm: LLMConfig | None
    use_env_llm: bool
    reranker: Reranker | None
    embedder: str | Embedder | QueryCache | None
    today: dt.date | None


def ask(
    conn: psycopg.Connection[Any],
    question: str,
    *,
    k: int = 10,
    top_n: int = DEFAULT_TOP_N,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    stats: bool | None = None,
    llm: LLMConfig | None = None,
    use_env_llm: bool = True,
    reranker: Reranker | None = None,
    embedder: str | Embedder | QueryCache | None = None,
    today: dt.date | None = None,
) -> AskResult:
    """Answer ``question`` from the store. ``filter`` / ``doc_types`` replace the parsed ones;
    ``stats`` forces exact statistics on or off (default: when the parse says numbers are asked
    for). ``llm`` defaults to ``LLMConfig.from_env()`` (extractive answer when none)."""
    check_question(question)
    started = time.perf_counter()
    categories, schemas = _catalog_for(conn)
    parsed = parse_question(question, categories=categories, today=today, schemas=schemas or None)
    notes = list(parsed.notes)
    if filter is not None:
        flt: dict[str, Any] = dict(filter)
    else:
        flt, note = _resolve_name(conn, parsed, schemas)
        if note:
            notes.append(note)
    types = list(doc_types) if doc_types is not None else list(parsed.doc_types) or None
    if types is not None:
        types = [t for t in types if t in schemas] or None
    parse_ms = (time.perf_counter() - started) * 1000
    found = search_mod.search(
        conn,
        parsed.search_text,
        filter=flt,
        doc_types=types,
        k=k,
        stats=parsed.needs_stats if stats is None else stats,
        embedder=embedder,
    )
    t = time.perf_counter()
    ranked = (reranker or Reranker(top_n=top_n)).rerank(question, found.hits)
    kept = tuple(r.hit for r in ranked.hits)
    rerank_ms = (time.perf_counter() - t) * 1000
    if llm is None and use_env_llm:
        llm = LLMConfig.from_env()
    t = time.perf_counter()
    result = answer(question, contexts_of(kept), found.stats, llm=llm)
    generate_ms = (time.perf_counter() - t) * 1000
    timings = {
        "parse_ms": round(parse_ms, 3),
        "embed_ms": found.timings.get("embed_ms", 0.0),
        "search_ms": found.timings.get("search_ms", 0.0),
        "rerank_ms": round(rerank_ms, 3),
        "generate_ms": round(generate_ms, 3),
        "total_ms": round((time.perf_counter() - started) * 1000, 3),
    }
    return AskResult(
        question=question,
        parsed=parsed,
        filter=flt,
        hits=kept,
        retrieved=found.hits,
        stats=found.stats,
        answer=result,
        scan=found.scan,
        timings=timings,
        cache_hit=found.cache_hit,
        stats_cached=found.stats_cached,
        notes=tuple(notes),
    )


__all__ = ["AskResult", "ask", "contexts_of", "forget_catalog"]
