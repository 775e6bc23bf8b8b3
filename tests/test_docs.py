"""Docs that show what the database holds are generated from it, and checked here.

- docs/search.md's statement block is ``pgrag._search_statement`` (the statement every search
  runs), not a copy that drifts;
- docs/sql-api.md lists every function of the SQL API (the functions of schema pgrag whose names
  do not start with ``_``) with its arguments, result and COMMENT, as pg_proc has them; every
  API function has a COMMENT, every internal one is named ``_...``.

When one fails, regenerate the blocks from a migrated database and commit them:

    python -m tests.test_docs --update        # PGRAG_DATABASE_URL, or the embedded server
"""

from __future__ import annotations

import re
import sys
from typing import Any

import psycopg

from .conftest import REPO

SEARCH_MD = REPO / "docs" / "search.md"
SQL_API_MD = REPO / "docs" / "sql-api.md"

_STATEMENT = "select pgrag._search_statement('hybrid', '<filter>', false, 'public')"
_API = """
select p.proname as name, pg_get_function_arguments(p.oid) as args,
       pg_get_function_result(p.oid) as result,
       coalesce(obj_description(p.oid, 'pg_proc'), '') as comment
from pg_proc p
where p.pronamespace = 'pgrag'::regnamespace and p.proname !~ '^_'
  and p.proname <> 'text_sha256'
  -- the functions generated for declared types (documents.md), not pgrag's own
  and p.proname !~ '^(render|store)_' and p.proname !~ '^(sync|keys)_[a-z0-9_]+_[0-9a-f]{10}$'
order by p.proname collate "C", pg_get_function_arguments(p.oid) collate "C"
"""


def statement_block(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(_STATEMENT).fetchone()
    assert row is not None
    return "```sql\n" + str(row[0]).strip() + "\n```"


def api_block(conn: psycopg.Connection[Any]) -> str:
    lines = ["| function | returns | what it does |", "|---|---|---|"]
    for name, args, result, comment in conn.execute(_API):
        cell = f"`pgrag.{name}({args})`".replace("|", "\\|")
        lines.append(f"| {cell} | `{result}` | {comment} |")
    return "\n".join(lines)


def _between(text: str, marker: str) -> str:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def _replace(text: str, marker: str, block: str) -> str:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    return pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text, count=1)


def test_the_search_statement_block_is_the_sql_function(conn: psycopg.Connection[Any]) -> None:
    assert _between(SEARCH_MD.read_text(), "statement") == statement_block(conn), (
        "docs/search.md's statement is stale: python -m tests.test_docs --update"
    )


def test_the_sql_api_page_lists_every_api_function(conn: psycopg.Connection[Any]) -> None:
    assert _between(SQL_API_MD.read_text(), "api") == api_block(conn), (
        "docs/sql-api.md is stale: python -m tests.test_docs --update"
    )


def test_every_api_function_has_a_comment_and_internals_are_underscored(
    conn: psycopg.Connection[Any],
) -> None:
    missing = [r[0] for r in conn.execute(_API) if not r[3]]
    assert missing == [], f"API functions without a COMMENT: {missing}"


def _update() -> None:
    from pgrag import migrate
    from pgrag.db import resolve_url

    url = resolve_url(None)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        SEARCH_MD.write_text(_replace(SEARCH_MD.read_text(), "statement", statement_block(conn)))
        SQL_API_MD.write_text(_replace(SQL_API_MD.read_text(), "api", api_block(conn)))
    print(f"updated {SEARCH_MD.relative_to(REPO)} and {SQL_API_MD.relative_to(REPO)}")


if __name__ == "__main__" and "--update" in sys.argv:
    _update()
