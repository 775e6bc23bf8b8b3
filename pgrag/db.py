"""Connections and the pool, pgvector registered; the Client users hold.

``connect()`` resolves the database (an explicit URL, ``PGRAG_DATABASE_URL``, or the embedded
server), checks it answers and has pgvector, and returns a ``Client`` over a psycopg 3 pool whose
every connection has the pgvector types registered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import class_row
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgrag import documents, security

if TYPE_CHECKING:
    from pgrag.ask import AskArgs, AskResult
    from pgrag.filter_index import FilterIndex
    from pgrag.search import ContextRow, SearchArgs, SearchOptions, SearchResult
    from pgrag.stats_cache import CachedType
from pgrag.connection import CONNECT_TIMEOUT_S, connect_once, describe_target, resolve_url
from pgrag.errors import (
    MissingExtension,
    NotMigrated,
    PgragError,
    mapped_database_errors,
)


def _pool_options(min_size: int, max_size: int, name: str) -> dict[str, Any]:
    """What both clients' pools are opened with (opened by the client, not the constructor)."""
    return {
        "min_size": min_size,
        "max_size": max_size,
        "kwargs": {"connect_timeout": CONNECT_TIMEOUT_S},
        "open": False,
        "name": name,
    }


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
    # the last recall measurement (pgrag.tuning): ef_search, recall, target, k, chunks,
    # best_ef_search, model, measured_at, tuned_by; None before any, or for a reader
    tuning: dict[str, Any] | None = None


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
            configure=lambda conn: _configure(conn, self.tenant),
            **_pool_options(min_size, max_size, "pgrag"),
        )
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)

    # ---- lifecycle ----

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
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
        self,
        query: str | None = None,
        options: SearchOptions | None = None,
        *,
        tenant: str | None = None,
        **args: Unpack[SearchArgs],
    ) -> SearchResult:
        """One-statement hybrid search (``pgrag.search.search``): the question, then a
        ``SearchOptions`` and/or its fields as keywords. ``tenant`` searches as that tenant
        (default: the Client's)."""
        from pgrag.search import search

        with self.connection(tenant=tenant) as conn:
            return search(conn, query, options, **args)

    def stats(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        doc_types: Sequence[str] | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Exact aggregates over the source rows matching a filter (``pgrag.search.stats``)."""
        from pgrag.search import stats

        with self.connection(tenant=tenant) as conn:
            return stats(conn, filter=filter, doc_types=doc_types)

    def context(
        self, chunk_id: int, *, max_children: int = 20, tenant: str | None = None
    ) -> list[ContextRow]:
        """A chunk with its parent and children (``pgrag.search.context``)."""
        from pgrag.search import context

        with self.connection(tenant=tenant) as conn:
            return context(conn, chunk_id, max_children=max_children)

    def ask(
        self, question: str, *, tenant: str | None = None, **args: Unpack[AskArgs]
    ) -> AskResult:
        """Question → filters → search → rerank → grounded answer (``pgrag.ask.ask``)."""
        from pgrag.ask import ask

        with self.connection(tenant=tenant) as conn:
            return ask(conn, question, **args)

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


async def _aconfigure(conn: psycopg.AsyncConnection[Any], tenant: str | None = None) -> None:
    """Async pool hook: ``_configure`` on an async connection."""
    from pgvector.psycopg import register_vector_async

    if await TypeInfo.fetch(conn, "vector") is not None:
        await register_vector_async(conn)
    if tenant is not None:
        await conn.execute(
            "select set_config('pgrag.tenant', %s, false)", (security.check_tenant(tenant),)
        )
    await conn.commit()


class AsyncClient:
    """``Client``'s searches on asyncio: a pool of async connections with pgvector registered.

    ``async with await pgrag.aconnect(url) as client:``, then ``await client.search(...)``,
    ``stats``, ``context``, ``status``. The search is the same plan and statement as the sync
    client's (``pgrag.search._plan``); declarations, rebuilds and the worker stay on the sync
    ``Client`` (they are not request-path work).
    """

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, tenant: str | None = None
    ) -> None:
        self.url = url
        self.tenant = None if tenant is None else security.check_tenant(tenant)
        self._pool = AsyncConnectionPool(
            url,
            configure=lambda conn: _aconfigure(conn, self.tenant),
            **_pool_options(min_size, max_size, "pgrag-async"),
        )

    async def open(self) -> AsyncClient:
        await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        return self

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(
        self, *, tenant: str | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled async connection; with ``tenant``, one transaction as that tenant."""
        async with self._pool.connection() as conn, security.atenant_scope(conn, tenant):
            with mapped_database_errors():
                yield conn

    async def search(
        self,
        query: str | None = None,
        options: SearchOptions | None = None,
        *,
        tenant: str | None = None,
        **args: Unpack[SearchArgs],
    ) -> SearchResult:
        """``Client.search`` on asyncio (``pgrag.search.asearch``)."""
        from pgrag.search import asearch

        async with self.connection(tenant=tenant) as conn:
            return await asearch(conn, query, options, **args)

    async def stats(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        doc_types: Sequence[str] | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        from pgrag.search import astats

        async with self.connection(tenant=tenant) as conn:
            return await astats(conn, filter=filter, doc_types=doc_types)

    async def context(
        self, chunk_id: int, *, max_children: int = 20, tenant: str | None = None
    ) -> list[ContextRow]:
        from pgrag.search import acontext

        async with self.connection(tenant=tenant) as conn:
            return await acontext(conn, chunk_id, max_children=max_children)

    async def status(self) -> StoreStatus:
        async with (
            self.connection() as conn,
            conn.cursor(row_factory=class_row(StoreStatus)) as cur,
        ):
            await cur.execute("select * from pgrag.status()")
            row = await cur.fetchone()
        assert row is not None
        return row


async def aconnect(
    url: str | None = None,
    *,
    embedded: bool = False,
    min_size: int = 1,
    max_size: int = 8,
    tenant: str | None = None,
) -> AsyncClient:
    """An open AsyncClient: ``connect``'s checks, then an asyncio pool."""
    import asyncio

    client = await asyncio.to_thread(
        connect, url, embedded=embedded, min_size=1, max_size=1, tenant=tenant
    )
    try:
        checked = client.url
    finally:
        client.close()
    return await AsyncClient(checked, min_size=min_size, max_size=max_size, tenant=tenant).open()


def connect(
    url: str | None = None,
    *,
    embedded: bool = False,
    min_size: int = 1,
    max_size: int = 8,
    tenant: str | None = None,
) -> Client:
    """A Client on ``url``, else ``PGRAG_DATABASE_URL``; with neither, ``embedded=True``
    starts (or reuses) pgrag's embedded PostgreSQL, and without it this is a ConfigError: a
    server is never started unasked. With ``tenant``, its searches see that tenant's chunks
    (and the shared ones) only (docs/security.md).

    Fails fast with a one-line PgragError if the server is unreachable or lacks pgvector.
    """
    resolved = resolve_url(url, embedded=embedded)
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
