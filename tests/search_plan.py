"""What pgrag._search decides and runs, taken apart for tests: its plan (pgrag._search_plan),
its statement run or explained with the plan's values, and its settings."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import psycopg

from pgrag import search as s


def plan(conn: psycopg.Connection[Any], q: Any, flt: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """What pgrag._search decides for a vector search (pgrag._search_plan), as a dict."""
    args = {"k": None, "candidates": None, "exact_threshold": None, "ef_search": None} | kw
    cur = conn.execute(
        "select * from pgrag._search_plan('vector', null, %(q)s::real[]::vector, null, %(k)s, "
        "%(f)s::jsonb, null, null, %(candidates)s, %(ef_search)s, %(exact_threshold)s, "
        "null, null)",
        {"q": q.tolist(), "f": json.dumps(flt)} | args,
    )
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


_RUN_PLAN = b"""
create or replace function pg_temp.run_plan(stmt text, q vector, k integer, kc integer,
                                            exact_threshold integer, rrf_k integer,
                                            fts_limit integer, match text)
returns setof pgrag.search_hit language plpgsql as $$
begin
    return query execute stmt using null::text, q, k, kc, exact_threshold, rrf_k, fts_limit, match;
end $$;
create or replace function pg_temp.explain_plan(stmt text, q vector, k integer, kc integer,
                                                exact_threshold integer, rrf_k integer,
                                                fts_limit integer, match text, do_analyze boolean)
returns setof text language plpgsql as $$
begin
    return query execute 'explain (analyze ' || do_analyze || ', costs off) ' || stmt
        using null::text, q, k, kc, exact_threshold, rrf_k, fts_limit, match;
end $$;
"""


def run_plan(
    conn: psycopg.Connection[Any],
    q: Any,
    plan: dict[str, Any],
    *,
    explain: bool = False,
    analyze: bool = True,
) -> list[Any]:
    """Run a plan's statement (or EXPLAIN it, ANALYZE unless told not to) with its bound values,
    as pgrag._search does (EXECUTE ... USING, in a function of this session's)."""
    conn.execute(_RUN_PLAN)
    values = [
        plan["statement"],
        s.VectorParam(np.asarray(q, dtype=np.float32)),
        plan["k"],
        plan["kc"],
        plan["exact_threshold"],
        plan["rrf_k"],
        plan["fts_limit"],
        plan["match"],
    ]
    with conn.cursor() as cur:
        s._adapt_vector_param(cur.adapters)
        if explain:
            return cur.execute(
                "select * from pg_temp.explain_plan(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s)",
                [*values, analyze],
            ).fetchall()
        return cur.execute(
            "select * from pg_temp.run_plan(%s, %s::vector, %s, %s, %s, %s, %s, %s)", values
        ).fetchall()


def settings(conn: psycopg.Connection[Any], plan: dict[str, Any], **kw: Any) -> None:
    """The settings the plan runs under (kw: overrides), transaction-local."""
    for name, value in (plan["settings"] | kw).items():
        conn.execute("select set_config(%s, %s, true)", (name, str(value)))
