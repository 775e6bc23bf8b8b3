"""Connections and the pool, pgvector registered; the Client users hold.

``connect()`` resolves the database (an explicit URL, ``PGRAG_DATABASE_URL``, or the embedded
server), checks it answers and has pgvector, and returns a ``Client`` over a psycopg 3 pool whose
every connection has the pgvector types registered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import class_row
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool

from pgrag import config, documents, security

if TYPE_CHECKING:
    from pgrag.ask import AskResult
    from pgrag.filter_index import FilterIndex
    from pgrag.search import ContextRow, SearchResult
    from pgrag.stats_cache import CachedType
from pgrag.errors import (
    ConnectionFailed,
    MissingExtension,
    NotMigrated,
    PgragError,
    mapped_database_errors,
)

CONNECT_TIMEOUT_S = 5


def resolve_url(url: str | None) -> str:
    """An explicit URL, else PGRAG_DATABASE_URL, else the embedded server (started if needed)."""
    resolved = config.database_url(url)
    if resolved is not None:
        return resolved
    from pgrag.server import EmbeddedServer

    return EmbeddedServer().ensure()


def describe_target(url: str) -> str:
    """host:port/dbname for messages (never the password)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the database"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


@contextlib.contextmanager
def connect_once(url: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """One plain connection, with connection failures turned into ConnectionFailed."""
    config.validate_url(url)
    try:
        conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        reason = _first_line(str(exc))
        raise ConnectionFailed(
            f"cannot connect to {describe_target(url)} ({reason}): check that the server runs "
            f"and the URL is right, or unset PGRAG_DATABASE_URL to use the embedded server"
        ) from exc
    with conn:
        yield conn


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("connection failed: ")
    return "no reason given"


def _configure(conn: psycopg.Connection[Any], tenant: str | None = None) -> None:
    """Pool hook: register pgvector on every new connection (once the extension exists), and
    set the Client's tenant for the session."""
    if TypeInfo.fetch(conn, "vector") is not None:
        register_vector(conn)
    if tenant is not None:
        security.set_session_tenant(conn, tenant)
    conn.commit()


@dataclass(frozen=True)
class StoreSettings:
    embedding_dim: int
    embedding_model: str | None
    hnsw_m: int
    hnsw_ef_construction: int


@dataclass(frozen=True)
class StoreStatus:
    embedding_dim: int
    embedding_model: str | None
    chunks: int
    pending: int
    doc_types: dict[str, int]
    # the render queue (None when the role may not read it: a reader)
    render_queued: int | None = None
    render_oldest: timedelta | None = None
    render_lag: dict[str, float] | None = None  # documents, p50_ms, p95_ms, max_ms (15 min)
    render_errors: int | None = None


class Client:
    """pgrag on one database: a pool of connections with pgvector registered.

    Use as a context manager, or call ``close()``. With ``tenant``, every connection's session
    has ``pgrag.tenant`` set to it (docs/security.md); ``tenant=`` on a call overrides it for
    that call.
    """

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, tenant: str | None = None
    ) -> None:
        self.url = url
        self.tenant = None if tenant is None else security.check_tenant(tenant)
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
            configure=lambda conn: _configure(conn, self.tenant),
            open=False,
            name="pgrag",
        )
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)

    # ---- lifecycle ----

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextlib.contextmanager
    def connection(self, *, tenant: str | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; database errors pgrag raised itself become PgragErrors.

        With ``tenant``, the block runs in one transaction as that tenant.
        """
        with (
            self._pool.connection() as conn,
            mapped_database_errors(),
            security.tenant_scope(conn, tenant),
        ):
            yield conn

    # ---- the store ----

    def settings(self) -> StoreSettings:
        self.require_schema()
        with self.connection() as conn, conn.cursor(row_factory=class_row(StoreSettings)) as cur:
            row = cur.execute(
                "select embedding_dim, embedding_model, hnsw_m, hnsw_ef_construction "
                "from pgrag.settings"
            ).fetchone()
        if row is None:
            raise NotMigrated("pgrag.settings is empty: run `pgrag db upgrade`")
        return row

    def status(self) -> StoreStatus:
        self.require_schema()
        with self.connection() as conn, conn.cursor(row_factory=class_row(StoreStatus)) as cur:
            row = cur.execute("select * from pgrag.status()").fetchone()
        assert row is not None
        return row

    def check_dimension(self, dim: int) -> None:
        """Raise DimensionMismatch unless ``dim`` is the store's dimension (SQL: the same check
        as ``pgrag.check_dimension``, which owns the message)."""
        self.require_schema()
        with self.connection() as conn:
            conn.execute("select pgrag.check_dimension(%s)", (dim,))

    def require_schema(self) -> None:
        """Raise NotMigrated unless the database is at pgrag's head (on a pooled connection)."""
        from pgrag import migrate

        with self.connection() as conn:
            at = migrate.current_on(conn)
        migrate.check_head(at)

    # ---- document types (pgrag/documents.py) ----

    def declare_document(
        self,
        name: str,
        source: str,
        watches: Mapping[str, str],
        *,
        parent: str | None = None,
        metadata_schema: Mapping[str, str] | None = None,
        tenant_column: str | None = None,
        sensitive: Mapping[str, str] | None = None,
        sync: documents.SyncMode | None = None,
    ) -> None:
        """Declare or replace a document type (see ``pgrag.documents.declare``)."""
        with self.connection() as conn:
            documents.declare(
                conn,
                name,
                source,
                watches,
                parent=parent,
                metadata_schema=metadata_schema,
                tenant_column=tenant_column,
                sensitive=sensitive,
                sync=sync,
            )

    def set_sync(self, name: str, mode: documents.SyncMode) -> None:
        """Render a type at its writers' commit or by the worker (``pgrag.documents.set_sync``)."""
        with self.connection() as conn:
            documents.set_sync(conn, name, mode)

    def drop_document(self, name: str, *, keep_chunks: bool = False) -> int:
        with self.connection() as conn:
            return documents.drop(conn, name, keep_chunks=keep_chunks)

    def document_types(self) -> list[documents.DocType]:
        with self.connection() as conn:
            return documents.list_types(conn)

    def rebuild(
        self,
        name: str | None = None,
        *,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> list[documents.RebuildStats]:
        """Re-render one document type or all; each batch commits on its own."""
        with self.connection() as conn:
            conn.autocommit = True
            try:
                return documents.rebuild(conn, name, progress=progress)
            finally:
                conn.autocommit = False

    def verify(self, name: str | None = None) -> list[documents.Mismatch]:
        with self.connection() as conn:
            return documents.verify(conn, name)

    # ---- search and answers (pgrag/search.py, pgrag/ask.py) ----

    def search(
        self, query: str | None = None, *, tenant: str | None = None, **kwargs: Any
    ) -> SearchResult:
        """One-statement hybrid search; see ``pgrag.search.search`` for the arguments.
        ``tenant`` searches as that tenant (default: the Client's)."""
        from pgrag.search import search

        with self.connection(tenant=tenant) as conn:
            return search(conn, query, **kwargs)

    def stats(self, *, tenant: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Exact aggregates over the source rows matching a filter (``pgrag.search.stats``)."""
        from pgrag.search import stats

        with self.connection(tenant=tenant) as conn:
            return stats(conn, **kwargs)

    def context(
        self, chunk_id: int, *, tenant: str | None = None, **kwargs: Any
    ) -> list[ContextRow]:
        """A chunk with its parent and children (``pgrag.search.context``)."""
        from pgrag.search import context

        with self.connection(tenant=tenant) as conn:
            return context(conn, chunk_id, **kwargs)

    def ask(self, question: str, *, tenant: str | None = None, **kwargs: Any) -> AskResult:
        """Question → filters → search → rerank → grounded answer (``pgrag.ask.ask``)."""
        from pgrag.ask import ask

        with self.connection(tenant=tenant) as conn:
            return ask(conn, question, **kwargs)

    # ---- filter indexes (pgrag/filter_index.py) ----

    def add_filter_index(
        self,
        filter: Mapping[str, Any] | str,
        *,
        maintenance_work_mem: str | None = None,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> tuple[FilterIndex, bool]:
        """Build a partial HNSW index for ``filter`` (concurrently) unless one exists;
        (index, built). Searches whose filter contains it use it (``pgrag.filter_index``)."""
        from pgrag import filter_index

        self.require_schema()
        with mapped_database_errors():
            return filter_index.add(
                self.url, filter, maintenance_work_mem=maintenance_work_mem, progress=progress
            )

    def filter_indexes(self) -> list[FilterIndex]:
        from pgrag import filter_index

        self.require_schema()
        with self.connection() as conn:
            return filter_index.list_indexes(conn)

    def drop_filter_index(self, filter_or_name: str) -> str | None:
        """Drop the filter index of a filter (JSON) or a name; its name, None if none existed."""
        from pgrag import filter_index

        self.require_schema()
        with mapped_database_errors():
            return filter_index.drop(self.url, filter_or_name)

    # ---- the statistics cache (pgrag/stats_cache.py) ----

    def cache_stats(self, doc_type: str, enabled: bool = True) -> list[str]:
        """Cache ``doc_type``'s exact statistics per filter, reused while the tables they read
        are unchanged (False: compute them at every call); those tables."""
        from pgrag import stats_cache

        self.require_schema()
        with self.connection() as conn:
            return stats_cache.set_cached(conn, doc_type, enabled)

    def stats_cache(self) -> list[CachedType]:
        """Every type with declared statistics: cached or not, its tables, its results."""
        from pgrag import stats_cache

        self.require_schema()
        with self.connection() as conn:
            return stats_cache.status(conn)

    def upgrade(self, revision: str = "head", *, dimension: int | None = None) -> None:
        """Migrate this database (see ``pgrag.migrate.upgrade``) and refresh pooled connections."""
        from pgrag import migrate

        migrate.upgrade(self.url, revision, dimension=dimension)
        self._pool.drain()


def connect(
    url: str | None = None, *, min_size: int = 1, max_size: int = 8, tenant: str | None = None
) -> Client:
    """A Client on ``url``, ``PGRAG_DATABASE_URL``, or the embedded server; with ``tenant``,
    its searches see that tenant's chunks (and the shared ones) only (docs/security.md).

    Fails fast with a one-line PgragError if the server is unreachable or lacks pgvector.
    """
    resolved = resolve_url(url)
    with connect_once(resolved) as conn:
        row = conn.execute(
            "select exists (select 1 from pg_available_extensions where name = 'vector')"
        ).fetchone()
    if not row or not row[0]:
        raise MissingExtension(
            f"{describe_target(resolved)} has no pgvector extension: install pgvector on the "
            "server, or unset PGRAG_DATABASE_URL to use the embedded server"
        )
    try:
        return Client(resolved, min_size=min_size, max_size=max_size, tenant=tenant)
    except psycopg.Error as exc:
        raise PgragError(
            f"cannot open a connection pool on {describe_target(resolved)} ({exc}): "
            "check max_connections on the server"
        ) from exc
