"""Declare / drop / rebuild / verify document types.

The logic lives in SQL (``sql/idempotent/1*_documents_*.sql``) so SQL-only users get all of it;
this module calls those functions, batches the rebuild behind a progress bar, and returns typed
rows. Database errors pgrag raised itself (SQLSTATE PR003/PR004) come back as DocumentError.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import class_row

from pgrag.errors import DocumentError, PgragError, mapped_database_errors
from pgrag.limits import MAX_NAME_CHARS, MAX_SQL_CHARS, check_text

REBUILD_BATCH = 2000

SyncMode = Literal["commit", "queue"]


@dataclass(frozen=True)
class DocType:
    name: str
    source: str
    key_type: str
    parent_type: str | None
    metadata_schema: dict[str, str]
    watches: dict[str, str]
    chunks: int
    sync: str = "commit"  # commit (rendered at the writer's commit) or queue (by the worker)


@dataclass(frozen=True)
class Mismatch:
    doc_type: str
    source_key: str | None
    problem: str


@dataclass(frozen=True)
class RebuildStats:
    doc_type: str
    documents: int
    changed: int
    seconds: float
    errors: int = 0  # documents whose render failed (pgrag verify lists them)

    @property
    def per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else float("inf")


def declare(
    conn: psycopg.Connection[Any],
    name: str,
    source: str,
    watches: Mapping[str, str],
    *,
    parent: str | None = None,
    metadata_schema: Mapping[str, str] | None = None,
    tenant_column: str | None = None,
    sensitive: Mapping[str, str] | None = None,
    sync: SyncMode | None = None,
) -> None:
    """Declare (or replace) a document type; see ``pgrag.declare_document`` in SQL.

    ``source`` is a view or table name, or a SELECT yielding ``source_key``, ``text`` and
    optionally ``parent_key`` and ``metadata``. ``watches`` maps each feeding table to a query
    over ``changed`` (that table's changed rows) returning the affected document keys.
    ``tenant_column`` names the source column holding each document's tenant; ``sensitive``
    maps source columns to ``"omit"`` or ``"mask"``: their values never reach the chunks
    (docs/security.md). ``sync``: ``commit`` renders the documents a transaction changed at its
    commit, ``queue`` has the worker render them (None: as declared before, else commit;
    docs/documents.md).
    """
    _check_declaration(name, source, watches, parent, metadata_schema)
    with mapped_database_errors(), conn.transaction():
        conn.execute(
            "select pgrag.declare_document(%s, %s, %s::jsonb, %s, %s::jsonb, %s, %s::jsonb, %s)",
            (
                name,
                source,
                json.dumps(dict(watches)),
                parent,
                json.dumps(dict(metadata_schema or {})),
                tenant_column,
                json.dumps(dict(sensitive or {})),
                sync,
            ),
        )


def set_sync(conn: psycopg.Connection[Any], name: str, mode: SyncMode) -> None:
    """Render a type's documents at its writers' commit (``commit``) or by the worker
    (``queue``), without re-declaring it (``pgrag.set_sync``)."""
    with mapped_database_errors(), conn.transaction():
        conn.execute("select pgrag.set_sync(%s, %s)", (name, mode))


def _check_declaration(
    name: Any,
    source: Any,
    watches: Any,
    parent: Any,
    metadata_schema: Any,
) -> None:
    """Refuse (DocumentError) declaration arguments PostgreSQL cannot take as text at all.

    Whether they make sense (an identifier, an existing table, a compiling query) is
    pgrag.declare_document's to check, in SQL, before it creates anything.
    """
    check_text(name, "the document type name", limit=MAX_NAME_CHARS, error=DocumentError)
    check_text(source, f"the source of {name}", limit=MAX_SQL_CHARS, error=DocumentError)
    if parent is not None:
        check_text(parent, f"the parent of {name}", limit=MAX_NAME_CHARS, error=DocumentError)
    for what, mapping, limit in (
        ("watches", watches, MAX_SQL_CHARS),
        ("metadata_schema", metadata_schema or {}, MAX_NAME_CHARS),
    ):
        if not isinstance(mapping, Mapping):
            raise DocumentError(
                f"{what} of {name} must be a mapping, not {type(mapping).__name__}: "
                + (
                    'e.g. {"shop.orders": "select customer_id from changed"}'
                    if what == "watches"
                    else 'e.g. {"segment": "text"}'
                )
            )
        for key, value in mapping.items():
            check_text(key, f"a key of {what} of {name}", limit=MAX_NAME_CHARS, error=DocumentError)
            check_text(value, f"{what}[{key!r}] of {name}", limit=limit, error=DocumentError)


def drop(conn: psycopg.Connection[Any], name: str, *, keep_chunks: bool = False) -> int:
    """Remove a document type, its triggers and (unless keep_chunks) its chunks."""
    with mapped_database_errors(), conn.transaction():
        row = conn.execute("select pgrag.drop_document(%s, %s)", (name, keep_chunks)).fetchone()
    return int(row[0]) if row else 0


def list_types(conn: psycopg.Connection[Any]) -> list[DocType]:
    with conn.cursor(row_factory=class_row(DocType)) as cur:
        return cur.execute(
            """
            select t.name, t.source::text as source, t.key_type, t.parent_type,
                   t.metadata_schema,
                   coalesce((select jsonb_object_agg(w.source_table::text, w.key_query)
                             from pgrag.doc_watches w where w.doc_type = t.name), '{}') as watches,
                   (select count(*) from pgrag.chunks c where c.doc_type = t.name) as chunks,
                   t.sync
            from pgrag.doc_types t
            order by t.parent_type nulls first, t.name
            """
        ).fetchall()


def refresh(
    conn: psycopg.Connection[Any],
    name: str,
    keys: Sequence[str] | None = None,
    *,
    on_error: Literal["record", "raise"] = "record",
) -> int:
    """Render the documents with these source keys (all when None) in the current transaction.

    A document whose render fails is recorded in ``pgrag.render_errors`` and skipped (``record``)
    or raised as a DocumentError naming it (``raise``).
    """
    with mapped_database_errors():
        row = conn.execute(
            "select pgrag.refresh(%s, %s::text[], %s)",
            (name, None if keys is None else list(keys), on_error),
        ).fetchone()
    return int(row[0]) if row else 0


def _ordered(types: list[DocType], only: str | None) -> list[DocType]:
    if only is None:
        return types  # list_types orders parents first
    chosen = [t for t in types if t.name == only]
    if not chosen:
        known = ", ".join(t.name for t in types) or "none"
        raise PgragError(
            f"document type {only} is not declared (declared: {known}): "
            "declare it first, or run `pgrag documents list`"
        )
    return chosen


def rebuild(
    conn: psycopg.Connection[Any],
    name: str | None = None,
    *,
    batch_size: int = REBUILD_BATCH,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[RebuildStats]:
    """Re-render every document of one type (or of all, parents first), set-based.

    On an autocommit connection each batch of keys commits on its own, so an interrupted
    rebuild keeps what it did and a second run finishes the job (inside a transaction, the
    batches are savepoints of it). Chunks whose source row is gone are deleted at the end.
    ``progress(doc_type, done, total)`` is called after every batch.
    """
    results = []
    for t in _ordered(list_types(conn), name):
        started = time.perf_counter()
        with mapped_database_errors(), conn.transaction():
            keys = [r[0] for r in conn.execute("select pgrag.document_keys(%s)", (t.name,))]
        changed = 0
        if progress:
            progress(t.name, 0, len(keys))
        for start in range(0, len(keys), batch_size):
            batch = keys[start : start + batch_size]
            with conn.transaction():
                changed += refresh(conn, t.name, batch)
            if progress:
                progress(t.name, min(start + batch_size, len(keys)), len(keys))
        with conn.transaction():
            gone = [
                r[0]
                for r in conn.execute(
                    "select source_key from pgrag.chunks where doc_type = %s "
                    "except select pgrag.document_keys(%s)",
                    (t.name, t.name),
                )
            ]
            if gone:
                changed += refresh(conn, t.name, gone)
        errors = conn.execute(
            "select count(*) from pgrag.render_errors where doc_type = %s", (t.name,)
        ).fetchone()
        results.append(
            RebuildStats(
                t.name,
                len(keys),
                changed,
                time.perf_counter() - started,
                int(errors[0]) if errors else 0,
            )
        )
    return results


def verify(conn: psycopg.Connection[Any], name: str | None = None) -> list[Mismatch]:
    """Differences between the declared source views and the stored chunks ([] = in sync)."""
    with mapped_database_errors(), conn.cursor(row_factory=class_row(Mismatch)) as cur:
        return cur.execute("select * from pgrag.verify(%s)", (name,)).fetchall()
