"""Docs that show what the database holds are generated from it, and checked here.

- docs/search.md's statement block is ``pgrag._search_statement`` (the statement every search
  runs), not a copy that drifts;
- docs/sql-api.md lists every function of the SQL API (the functions of schema pgrag whose names
  do not start with ``_``) with its arguments, result and COMMENT, as pg_proc has them; every
  API function has a COMMENT, every internal one is named ``_...``;
- the README's configuration table is ``pgrag.config.VARIABLES`` and its exit codes are
  ``pgrag.errors.EXIT_CODES``.

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
README = REPO / "README.md"

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


def config_block() -> str:
    from pgrag.config import VARIABLES

    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for v in VARIABLES:
        default = f"`{v.default}`" if v.default else ""
        lines.append(f"| `{v.name}` | {default} | {v.meaning} |")
    return "\n".join(lines)


def exit_codes_block() -> str:
    from pgrag.errors import EXIT_CODES

    return "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES) + "."


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


def test_the_readme_shows_the_configuration_and_exit_codes_pgrag_has() -> None:
    text = README.read_text()
    assert _between(text, "config") == config_block(), (
        "README.md's configuration table is stale: python -m tests.test_docs --update"
    )
    assert _between(text, "exit-codes") == exit_codes_block(), (
        "README.md's exit codes are stale: python -m tests.test_docs --update"
    )


def test_every_api_function_has_a_comment_and_internals_are_underscored(
    conn: psycopg.Connection[Any],
) -> None:
    missing = [r[0] for r in conn.execute(_API) if not r[3]]
    assert missing == [], f"API functions without a COMMENT: {missing}"


def _update() -> None:
    from pgrag import migrate
    from pgrag.connection import resolve_url

    url = resolve_url(None)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        SEARCH_MD.write_text(_replace(SEARCH_MD.read_text(), "statement", statement_block(conn)))
        SQL_API_MD.write_text(_replace(SQL_API_MD.read_text(), "api", api_block(conn)))
    text = _replace(README.read_text(), "config", config_block())
    README.write_text(_replace(text, "exit-codes", exit_codes_block()))
    print(f"updated {SEARCH_MD.relative_to(REPO)}, {SQL_API_MD.relative_to(REPO)}, README.md")


if __name__ == "__main__" and "--update" in sys.argv:
    _update()
