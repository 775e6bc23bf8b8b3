"""The statistics cache: turn it on or off per document type, and see what it holds.

A cached type's exact statistics for a filter are computed once and reused while no table its
declared query reads has changed (``sql/idempotent/60_stats_cache.sql`` holds the design and
the proof; docs/search.md, "The statistics cache"). The search statement needs no change: its
``pgrag._doc_type_stats_where`` looks the result up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from pgrag.errors import mapped_database_errors


@dataclass(frozen=True)
class CachedType:
    """A document type with declared statistics, and its cache."""

    doc_type: str
    cached: bool
    tables: tuple[str, ...]  # the tables whose writes invalidate its results (cached only)
    results: int  # cached results (filters x roles)
    triggers_ok: bool  # every table has its trigger, enabled always (else computed every time)


_STATUS = """
select s.doc_type, s.cache_deps is not null as cached,
       coalesce((select array_agg(d::text order by d::text) from unnest(s.cache_deps) d),
                '{}') as tables,
       (select count(*) from pgrag.stats_cache c where c.doc_type = s.doc_type) as results,
       s.cache_deps is not null and pgrag._stats_triggers_state(s.cache_deps) is not null
           as triggers_ok
from pgrag.doc_stats s
order by s.doc_type
"""


def set_cached(conn: psycopg.Connection[Any], doc_type: str, enabled: bool = True) -> list[str]:
    """Cache (or stop caching) ``doc_type``'s statistics; the tables whose writes invalidate
    them ([] when off). Either way its cached results are not used again. DocumentError when the
    type has no statistics, or its query could change with none of those tables written."""
    with mapped_database_errors():
        row = conn.execute(
            "select array(select d::text from unnest(pgrag.cache_stats(%s, %s)) d)",
            (doc_type, enabled),
        ).fetchone()
    return list(row[0]) if row else []


def status(conn: psycopg.Connection[Any]) -> list[CachedType]:
    """Every type with declared statistics: whether cached, its tables, its cached results
    (rows of other roles are not counted: each role sees its own)."""
    with conn.cursor(row_factory=class_row(CachedType)) as cur:
        rows = cur.execute(_STATUS).fetchall()
    return [
        CachedType(r.doc_type, r.cached, tuple(r.tables), r.results, r.triggers_ok) for r in rows
    ]
