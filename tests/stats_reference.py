"""A type's declared statistics computed afresh, for tests to compare what pgrag returns with:
the declared query over the chunks a condition selects, run directly (never the statistics
cache, never pgrag's filter compiler), in the caller's snapshot and with its rights."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb


def declared_stats(
    conn: psycopg.Connection[Any],
    doc_type: str,
    ids: list[int] | None = None,
    containment: Any = None,
) -> Any:
    """``doc_type``'s statistics over its chunks with these ids (all when None) whose metadata
    contains ``containment`` (a JSON-able value; no condition when None)."""
    row = conn.execute(
        "select pgrag._stats_statement(s.stats_sql, format('c.doc_type = %%L%%s%%s', s.doc_type, "
        "case when %(ids)s::bigint[] is null then '' "
        "else format(' and c.id = any(%%L::bigint[])', %(ids)s::bigint[]) end, "
        "case when %(c)s::jsonb is null then '' "
        "else format(' and c.metadata @> %%L::jsonb', %(c)s::jsonb) end)) "
        "from pgrag.doc_stats s where s.doc_type = %(t)s",
        {
            "t": doc_type,
            "ids": ids,
            "c": None if containment is None else Jsonb(containment),
        },
    ).fetchone()
    if row is None:
        return None
    out = conn.execute(str(row[0]).replace("%", "%%").encode()).fetchone()
    return None if out is None else out[0]
