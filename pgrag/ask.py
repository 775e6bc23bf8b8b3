"""Question → answer: parse (from the store's vocabulary) → embed (query cache) → one-statement
search, or a ranking by a numeric key (+ exact stats when the question asks for numbers) →
rerank → grounded answer, with per-stage timings.

``ask(conn, question)`` returns an ``AskResult``; the CLI's ``pgrag ask`` and the demo print it.
The answer is "Cannot find that information in the provided data" when a name the question uses
is nowhere in the data, or when the filter parsed from the question matches no document.
Nothing here builds SQL beyond the vocabulary (``pgrag.vocabulary``, cached) and one GIN-served
full-text probe for a name no metadata holds; the search itself is ``pgrag.search``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString, TypedDict, Unpack

import psycopg
from psycopg.types.json import Jsonb

from pgrag import search as search_mod
from pgrag.answer import Answer, Context, LLMConfig, answer, not_found_answer
from pgrag.errors import ConfigError, DocumentError
from pgrag.filters import check_filter
from pgrag.limits import check_connection, check_question
from pgrag.parse import NOT_FILTERED, Link, ParsedQuery, RankBy, parse_question
from pgrag.rerank import Reranker
from pgrag.search import SearchHit, SearchResult
from pgrag.vocabulary import Vocabulary, load_vocabulary, name_words, same_word, tokens

if TYPE_CHECKING:
    from pgrag.embed.base import Embedder
    from pgrag.embed.cache import QueryCache

DEFAULT_TOP_N = 5

# Whether a phrase occurs in any chunk this session may see (full text, GIN-served): a name the
# metadata does not hold may still be in the text (a product named in an order's lines). A chunk
# whose tsvector the worker has not filled in yet is read from its text, as searches do.
_IN_TEXT: LiteralString = (
    "select exists (select from pgrag.chunks c, phraseto_tsquery('english'::regconfig, %s) q "
    "where c.tsv @@ q or (c.tsv is null and pgrag.text_tsvector(c.text) @@ q))"
)


# The values of one key in the documents of a type whose metadata contains a value (GIN-served):
# a question's value looked up in a related type (pgrag.parse.Link).
_LINKED: LiteralString = (
    "select distinct c.metadata -> %(key)s from pgrag.chunks c "
    "where c.doc_type = %(type)s and c.metadata @> %(match)s and c.metadata ? %(key)s "
    "limit 1001"
)
MAX_LINKED = 1000


@dataclass(frozen=True)
class AskResult:
    question: str
    parsed: ParsedQuery
    filter: dict[str, Any]  # the filter searched
    hits: tuple[SearchHit, ...]  # after dedup and rerank: what the answer was given
    retrieved: tuple[SearchHit, ...]  # everything the search returned
    stats: dict[str, Any] | None
    answer: Answer
    scan: str
    timings: dict[str, float]  # ms: parse, embed, search, rerank, generate, total
    cache_hit: bool | None  # the question's vector came from the query cache
    notes: tuple[str, ...]
    stats_cached: dict[str, bool] | None = None  # per type: statistics from the stats cache
    not_found: str | None = None  # why the answer is "Cannot find ...", when it is


def contexts_of(hits: Sequence[SearchHit]) -> list[Context]:
    out = []
    for h in hits:
        text = h.text
        if h.parent_text:
            first = h.parent_text.split("\n", 1)[0]
            text = f"{text}\n(parent {h.parent_source_key}: {first})"
        out.append(Context(h.id, text, h.doc_type, h.source_key, h.score))
    return out


def pick_statistic(
    question: str,
    parsed: ParsedQuery,
    stats: Mapping[str, Any] | None,
    vocabulary: Vocabulary | None = None,
    flt: Mapping[str, Any] | None = None,
) -> tuple[str, Any] | None:
    """The one statistic the question asks for ("how many orders" -> <type>.order_count),
    by the words of its name, the aggregate asked for and the noun after "how many"; None when
    no statistic's name shares a word with the question. With the ``vocabulary``: a type's
    declared synonyms are words of its statistics' names ("visits" for appointment_count), and
    a type whose metadata lacks a key the filter (``flt``, else the parsed one) names is passed
    over: its statistics did not count what the question restricts ("appointments in the East
    Wing", where only departments have a building, counted 0). The noun "how many" counts
    weighs more than the others after it ("how many appointments with doctors ...":
    appointment_count, not doctor_count)."""
    if not stats or parsed.aggregate is None:
        return None
    words = [w for w in tokens(question) if w not in ("how", "many", "much", "the", "of", "a")]
    counted = re.search(r"\b(?:how\s+many|number\s+of)\s+((?:\w+\s+){0,2}\w+)", question, re.I)
    head = [w for w in tokens(counted.group(1)) if len(w) > 2] if counted else []
    kinds = {
        "count": {"count", "number", "n", "total"},
        "sum": {"total", "sum", "revenue", "amount", "spent"},
        "avg": {"average", "avg", "mean"},
        "max": {"max", "maximum", "highest", "largest"},
        "min": {"min", "minimum", "lowest", "smallest"},
    }[parsed.aggregate]
    counting = {"count", "number", "n"}
    averaging = {"average", "avg", "mean"}
    best: tuple[float, str, Any] | None = None
    types = vocabulary.types if vocabulary is not None else {}
    named_keys = _filter_keys(parsed.filter if flt is None else flt)
    for doc_type in parsed.doc_types:
        values = stats.get(doc_type)
        if not isinstance(values, Mapping):
            continue
        if doc_type in types and not named_keys <= {*types[doc_type].keys, "doc_type"}:
            continue
        for key, value in values.items():
            if isinstance(value, Mapping | list):
                continue
            key_words = set(name_words(str(key)))
            for t in types.values():  # a type's synonyms are words of the names of its own
                head_word = next(iter(name_words(t.name)), "")
                if head_word and any(same_word(head_word, k) for k in key_words):
                    key_words |= {w for syn in t.synonyms for w in name_words(syn)}
            if (
                head
                and parsed.aggregate == "count"
                and not any(same_word(h, k) for h in head for k in key_words)
            ):
                continue  # "how many products": not an order count
            named = sum(any(same_word(w, k) for k in key_words) for w in set(words))
            kind = bool(key_words & kinds)
            if not named and not kind:
                continue
            score = 2.0 * named + 1.5 * kind
            # a statistic of another kind than asked: a count for "how much", a sum for "how
            # many", an average for anything but "average"
            if parsed.aggregate == "count":
                score -= 2.0 * (not key_words & counting)
            elif key_words & counting:
                score -= 2.0
            if key_words & averaging and parsed.aggregate != "avg":
                score -= 2.0
            score += 1.0 * sum(any(same_word(h, k) for k in key_words) for h in head)
            if head and any(same_word(head[0], k) for k in key_words):
                score += 0.5  # the noun counted
            if score > 0 and (best is None or score > best[0]):
                best = (score, f"{doc_type}.{key}", value)
    return None if best is None else (best[1], best[2])


class AskArgs(TypedDict, total=False):
    """``ask``'s keyword arguments, for the Client's typed ``**kwargs``."""

    k: int | None
    top_n: int
    filter: Mapping[str, Any] | None
    doc_types: Sequence[str] | None
    stats: bool | None
    llm: LLMConfig | None
    use_env_llm: bool
    reranker: Reranker | None
    embedder: str | Embedder | QueryCache | None
    today: dt.date | None
    among: Sequence[str] | None


def ask(
    conn: psycopg.Connection[Any],
    question: str,
    *,
    k: int | None = None,
    top_n: int = DEFAULT_TOP_N,
    filter: Mapping[str, Any] | None = None,
    doc_types: Sequence[str] | None = None,
    stats: bool | None = None,
    llm: LLMConfig | None = None,
    use_env_llm: bool = True,
    reranker: Reranker | None = None,
    embedder: str | Embedder | QueryCache | None = None,
    today: dt.date | None = None,
    among: Sequence[str] | None = None,
) -> AskResult:
    """Answer ``question`` from the store. ``filter`` / ``doc_types`` replace the parsed ones;
    ``stats`` forces exact statistics on or off (default: when the parse says numbers are asked
    for). ``llm`` defaults to ``LLMConfig.from_env()`` (extractive answer when none). ``among``:
    the declared types the question may be about (default: every one).

    Two steps: ``find`` (the database's part) then ``respond`` (rerank and answer, no
    connection); the Client runs ``find`` on a pooled connection and gives it back before the
    rerank and the LLM, which may take seconds."""
    check_connection(conn, "ask")
    args = AskArgs(
        k=k,
        top_n=top_n,
        filter=filter,
        doc_types=doc_types,
        stats=stats,
        llm=llm,
        use_env_llm=use_env_llm,
        reranker=reranker,
        embedder=embedder,
        today=today,
        among=among,
    )
    return respond(find(conn, question, **args), **args)


@dataclass(frozen=True)
class Found:
    """What ``find`` read from the database for a question; ``respond`` answers from it
    alone."""

    question: str
    parsed: ParsedQuery
    vocabulary: Vocabulary
    filter: dict[str, Any]
    notes: tuple[str, ...]
    result: SearchResult | None
    missing: str | None
    rank: RankBy | None
    parse_ms: float
    started: float


def find(conn: psycopg.Connection[Any], question: str, **args: Unpack[AskArgs]) -> Found:
    """``ask``'s database part: parse the question against the store's vocabulary, resolve
    links and names, search (or rank) with exact statistics when numbers are asked for."""
    filter = args.get("filter")
    doc_types = args.get("doc_types")
    among = args.get("among")
    stats = args.get("stats")
    top_n = args.get("top_n", DEFAULT_TOP_N)
    check_question(question)
    if not question.strip():
        raise ConfigError("the question is empty: ask something, e.g. 'How many orders in 2024?'")
    started = time.perf_counter()
    vocabulary = load_vocabulary(conn)
    if among is not None:
        vocabulary = vocabulary.only(among)
    parsed = parse_question(question, vocabulary, today=args.get("today"))
    notes = list(parsed.notes)
    flt: dict[str, Any] = dict(filter) if filter is not None else dict(parsed.filter)
    types: list[str] | None
    if doc_types is not None:  # the caller's types, searched as given: never dropped
        check_filter(conn, {}, list(doc_types))  # DocumentError for an undeclared one
        outside = sorted(set(doc_types) - set(among)) if among is not None else []
        if outside:
            raise DocumentError(
                f"document type {outside[0]!r} is not among {', '.join(sorted(among or []))}: "
                "pass doc_types within among, or widen among"
            )
        types = list(doc_types) or None
    else:
        types = [t for t in parsed.doc_types if t in vocabulary.types] or None
    want_stats = parsed.needs_stats if stats is None else stats
    missing: str | None = None
    if filter is None:
        for link in parsed.links:
            missing = missing or _resolve_link(conn, link, flt, notes)
    if filter is None and parsed.unknown_names:
        absent = [n for n in parsed.unknown_names if not _in_text(conn, n)]
        if absent:
            missing = "nothing in the data is named " + " or ".join(map(repr, absent))
        else:  # in some text, in no key's values (or in too many): searched, not filtered on
            notes.extend(
                f"{n!r}: no key's value is that name alone, searched as text, {NOT_FILTERED}"
                for n in parsed.unknown_names
            )
    parse_ms = (time.perf_counter() - started) * 1000
    rank = parsed.rank_by if doc_types is None else None
    if (
        rank is not None
        and types
        and not all(
            t in vocabulary.types
            and rank.key in vocabulary.types[t].keys
            and vocabulary.types[t].keys[rank.key].type in ("integer", "numeric")
            for t in types
        )
    ):
        # (the parse took the key from one type and the documents from another: "which
        # doctor had the most appointments in 2025" ranked appointments by a doctor's
        # statistic, and ended in an invalid-filter error)
        notes.append(
            f"{rank.phrase!r}: {'/'.join(types)} has no numeric key {rank.key}, "
            "searched by similarity with the exact statistics instead"
        )
        rank = None
        want_stats = True
    found: SearchResult | None = None
    if missing is None:
        if rank is not None:
            found = search_mod.ranked(
                conn,
                rank.key,
                filter=flt,
                doc_types=types,
                descending=rank.descending,
                k=rank.limit or top_n,
                stats=want_stats,
            )
        else:
            found = search_mod.search(
                conn,
                parsed.search_text,
                filter=flt,
                doc_types=types,
                k=args.get("k"),  # (None: the search's default)
                stats=want_stats,
                embedder=args.get("embedder"),
            )
        if not found.hits and flt and filter is None:
            nothing = (
                "no " + "/".join(types or ["document"]) + " matches " + json.dumps(flt, default=str)
            )
            if found.stats and parsed.needs_stats and not _outside_data(parsed, vocabulary):
                # "how many orders has Michelle Morris placed?": she exists, the count is 0
                notes.append(nothing + ": the exact statistics are over no document")
            else:
                missing = nothing
    return Found(
        question=question,
        parsed=parsed,
        vocabulary=vocabulary,
        filter=flt,
        notes=tuple(notes),
        result=found,
        missing=missing,
        rank=rank,
        parse_ms=parse_ms,
        started=started,
    )


def respond(f: Found, **args: Unpack[AskArgs]) -> AskResult:
    """``ask``'s second part, with no connection: rerank what ``find`` found and answer (the
    LLM, or extractive), with the timings of both parts."""
    top_n = args.get("top_n", DEFAULT_TOP_N)
    llm = args.get("llm")
    found, missing, rank, parsed, flt = f.result, f.missing, f.rank, f.parsed, f.filter
    notes = list(f.notes)
    t = time.perf_counter()
    if found is None or missing is not None:
        kept: tuple[SearchHit, ...] = ()
    elif rank is not None:
        kept = found.hits[: rank.limit or top_n]  # the ranking is the order asked for
    else:
        ranked = (args.get("reranker") or Reranker(top_n=top_n)).rerank(f.question, found.hits)
        kept = tuple(r.hit for r in ranked.hits)
    rerank_ms = (time.perf_counter() - t) * 1000
    if llm is None and args.get("use_env_llm", True):
        llm = LLMConfig.from_env()
    t = time.perf_counter()
    stats_found = found.stats if found is not None else None
    if missing is not None:
        notes.append(missing)
        result = not_found_answer(missing)
    else:
        result = answer(
            f.question,
            contexts_of(kept),
            stats_found,
            llm=llm,
            headline=None
            if rank is not None
            or _partial(parsed, f.vocabulary, flt)
            or any(n.endswith(NOT_FILTERED) for n in notes)
            else pick_statistic(f.question, parsed, stats_found, f.vocabulary, flt),
        )
    generate_ms = (time.perf_counter() - t) * 1000
    timings = {
        "parse_ms": round(f.parse_ms, 3),
        "embed_ms": found.timings.get("embed_ms", 0.0) if found else 0.0,
        "search_ms": found.timings.get("search_ms", 0.0) if found else 0.0,
        "rerank_ms": round(rerank_ms, 3),
        "generate_ms": round(generate_ms, 3),
        "total_ms": round((time.perf_counter() - f.started) * 1000, 3),
    }
    return AskResult(
        question=f.question,
        parsed=parsed,
        filter=flt,
        hits=kept,
        retrieved=found.hits if found else (),
        stats=stats_found,
        answer=result,
        scan=found.scan if found else "none",
        timings=timings,
        cache_hit=found.cache_hit if found else None,
        stats_cached=found.stats_cached if found else None,
        notes=tuple(notes),
        not_found=missing,
    )


def _resolve_link(
    conn: psycopg.Connection[Any], link: Link, flt: dict[str, Any], notes: list[str]
) -> str | None:
    """Add ``link.key``'s values (of the related documents matching it) to ``flt``; the reason
    when none matches."""
    condition = link.condition
    if isinstance(condition, Mapping) and set(condition) == {"$contains"}:
        matches = [{link.via_key: [condition["$contains"]]}]
    elif isinstance(condition, Mapping) and set(condition) == {"$in"}:
        matches = [{link.via_key: v} for v in condition["$in"]]
    elif isinstance(condition, Mapping):
        notes.append(f"{link.phrase!r}: not looked up in {link.via_type} ({condition})")
        return None
    else:
        matches = [{link.via_key: condition}]
    values: list[Any] = []
    for match in matches:
        rows = conn.execute(
            _LINKED, {"key": link.key, "type": link.via_type, "match": Jsonb(match)}
        ).fetchall()
        values += [r[0] for r in rows if r[0] is not None and r[0] not in values]
    if not values:
        return f"no {link.via_type} has {link.via_key} {json.dumps(condition, default=str)}"
    if len(values) > MAX_LINKED:
        notes.append(f"{link.phrase!r} names over {MAX_LINKED} {link.via_type}: {NOT_FILTERED}")
        return None
    value: Any = values[0] if len(values) == 1 else {"$in": values}
    if link.key in flt and flt[link.key] != value:
        flt.setdefault("$and", []).append({link.key: value})
    else:
        flt[link.key] = value
    notes.append(f"{link.phrase!r} is {link.key} {json.dumps(value, default=str)}")
    return None


def _outside_data(parsed: ParsedQuery, vocabulary: Vocabulary) -> bool:
    """Whether the question's time lies outside every date the searched types hold (orders "in
    2031"): then there is no data to count, rather than a count of 0."""
    r = parsed.time_range
    if r is None:
        return False
    spans = [
        (k.min, k.max)
        for t in parsed.doc_types
        if t in vocabulary.types
        for k in vocabulary.types[t].keys.values()
        if k.type == "date" and k.min is not None and k.max is not None
    ]
    start = r.start.isoformat() if r.start else "0000-01-01"
    end = r.end.isoformat() if r.end else "9999-12-31"
    return bool(spans) and all(end < lo or start > hi for lo, hi in spans)


def _filter_keys(f: Any) -> set[str]:
    """The metadata keys a filter names, at any depth ($and, $or, $not)."""
    if isinstance(f, list):
        return set().union(*(_filter_keys(x) for x in f)) if f else set()
    if not isinstance(f, Mapping):
        return set()
    return {k for k in f if not k.startswith("$")} | set().union(
        *(_filter_keys(v) for k, v in f.items() if k.startswith("$"))
    )


def _partial(parsed: ParsedQuery, vocabulary: Vocabulary, flt: Mapping[str, Any]) -> bool:
    """Whether the filter picks documents by one element of a list ("booked on Pool Table":
    facilities contains it): their statistics then count the whole documents, not the part the
    question asks about, so no one statistic is the answer."""
    arrays = {
        k.name for t in parsed.doc_types if t in vocabulary.types
        for k in vocabulary.types[t].keys.values() if k.type.endswith("[]")
    }  # fmt: skip

    return bool(_filter_keys(flt) & arrays)


def _in_text(conn: psycopg.Connection[Any], phrase: str) -> bool:
    row = conn.execute(_IN_TEXT, (phrase,)).fetchone()
    return bool(row and row[0])


__all__ = ["AskResult", "Found", "ask", "contexts_of", "find", "pick_statistic", "respond"]
