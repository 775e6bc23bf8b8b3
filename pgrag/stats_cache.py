"""The statistics cache: turn it on or off per document type, and see what it holds.

A cached type's exact statistics for a filter are computed once and reused while no table its
declared query reads has changed (``sql/idempotent/40_stats_int.sql`` holds the design and
the proof; docs/search.md, "The statistics cache"). The search statement needs no change: its
``pgrag._doc_type_stats_where`` looks the result up.
"""

from __future__ import annotations

import time
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


# Whether a result computed now would be stored: this snapshot is no older than the horizon.
_HORIZON_OPEN = (
    "select pg_snapshot_xmin(pg_current_snapshot()) >= h.pruned_below "
    "from pgrag.stats_cache_horizon h"
)
# The transactions that hold the horizon back: every other session with a transaction id or a
# snapshot, and every prepared (two-phase) transaction.
_HORIZON_BLOCKERS = """
select format('pid %s (%s, %s): %s', a.pid, a.datname, a.state, left(a.query, 60))
  from pg_stat_activity a
 where a.pid <> pg_backend_pid() and (a.backend_xid is not null or a.backend_xmin is not null)
union all
select format('prepared transaction %L (%s)', p.gid, p.database) from pg_prepared_xacts p
"""


def start_horizon(url: str, patience_s: float) -> list[str]:
    """Start the statistics cache's pruning horizon on this server, as the first result stored
    on it would, then wait until every transaction that was running then has ended: until they
    have, results are computed and not stored (docs/search.md, "The statistics cache"). [] once
    they have; else, after ``patience_s``, the sessions still in the way (for benchmarks and
    tests whose first computation must be stored, whatever else runs on the server)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("select pgrag._prune_stats_changes()")
        deadline = time.monotonic() + patience_s
        while True:
            row = conn.execute(_HORIZON_OPEN).fetchone()
            if row is not None and row[0]:
                return []
            if time.monotonic() >= deadline:
                return [str(r[0]) for r in conn.execute(_HORIZON_BLOCKERS)]
            time.sleep(0.05)
