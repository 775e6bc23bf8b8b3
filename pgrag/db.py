"""Connections and the pool, pgvector registered; the Client users hold.

``connect()`` resolves the database (an explicit URL, ``PGRAG_DATABASE_URL``, or the embedded
server), checks it answers and has pgvector, and returns a ``Client`` over a psycopg 3 pool whose
every connection has the pgvector types registered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import class_row
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from pgrag import documents, security
from pgrag import replicas as routing

if TYPE_CHECKING:
    from pgrag.ask import AskArgs, AskResult
    from pgrag.filter_index import FilterIndex, StoreIndexRebuild
    from pgrag.search import ContextRow, SearchArgs, SearchOptions, SearchResult
    from pgrag.stats_cache import CachedType
    from pgrag.tune import TuneResult
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


_T = TypeVar("_T")


def _configure(conn: psycopg.Connection[Any], tenant: str | None = None) -> None:
    """Pool hook: register pgvector on every new connection (once the extension exists), and
    set the Client's tenant for the session."""
    if TypeInfo.fetch(conn, "vector") is not None:
        register_vector(conn)
    if tenant is not None:
        security.set_session_tenant(conn, tenant)
    conn.commit()


def _alone(fn: Callable[[psycopg.Connection[Any]], _T]) -> Callable[[psycopg.Connection[Any]], _T]:
    """``fn`` with its connection its own (``pgrag.search.exclusive``)."""
    from pgrag.search import exclusive

    def run(conn: psycopg.Connection[Any]) -> _T:
        with exclusive(conn):
            return fn(conn)

    return run


def _aalone(
    fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]],
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]:
    """``_alone`` on asyncio."""
    from pgrag.search import exclusive

    async def run(conn: psycopg.AsyncConnection[Any]) -> _T:
        with exclusive(conn):
            return await fn(conn)

    return run


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
    # streaming replication: {"role": "primary", "standbys": [...]} or {"role": "standby", ...}
    # (pgrag.status(), docs/scaling.md)
    replication: dict[str, Any] | None = None
    # the chunk store's partitions (docs/scaling.md): None for one table, else
    # {"by": "tenant", "strategy": "list" | "hash", "partitions", "default_rows" (list)}
    store: dict[str, Any] | None = None
    # chunks waiting for their full-text vector (revision 0011: the worker fills it in)
    text_pending: int = 0


class _Replicated:
    """What both clients expose of their replicas' state (``pgrag.replicas.Reads``)."""

    _reads: routing.Reads

    @property
    def written_lsn(self) -> str | None:
        """The primary's WAL position after this client's last write (None before any)."""
        return self._reads.written

    @property
    def read_your_writes(self) -> bool:
        """Whether reads wait for this client's last write (``fresh=`` overrides per call)."""
        return self._reads.read_your_writes

    @read_your_writes.setter
    def read_your_writes(self, value: bool) -> None:
        self._reads.read_your_writes = value

    @property
    def replay_wait_s(self) -> float:
        """How long a fresh read waits for a replica to replay the last write."""
        return self._reads.replay_wait_s


class Client(_Replicated):
    """pgrag on one database: a pool of connections with pgvector registered.

    Use as a context manager, or call ``close()``. With ``tenant``, every connection's session
    has ``pgrag.tenant`` set to it (docs/security.md); ``tenant=`` on a call overrides it for
    that call.

    With ``replicas`` (streaming standbys of ``url``), or a multi-host ``url``, reads (search,
    stats, context, ask, ``reading()``) go to the replicas in turn, skipping one that is down,
    and everything else to the primary (docs/scaling.md). ``read_your_writes`` (here for every
    read, or per call) makes a read wait until its replica has replayed this client's last
    write, up to ``replay_wait_s``, then read from the primary instead.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        tenant: str | None = None,
        replicas: Sequence[str] = (),
        read_your_writes: bool = False,
        replay_wait_s: float = routing.REPLAY_WAIT_S,
    ) -> None:
        self._reads = routing.Reads(url, replicas, read_your_writes, replay_wait_s)
        writer, readers = self._reads.writer, self._reads.urls
        self.url = writer
        self.replicas = readers
        self.tenant = None if tenant is None else security.check_tenant(tenant)
        self._rotation = self._reads.rotation
        self._pool = ConnectionPool(
            writer,
            configure=lambda conn: _configure(conn, self.tenant),
            **_pool_options(min_size, max_size, "pgrag"),
        )
        self._readers = [
            ConnectionPool(
                r,
                configure=lambda conn: _configure(conn, self.tenant),
                check=ConnectionPool.check_connection,  # a restarted replica's stale ones
                **_pool_options(min_size, max_size, f"pgrag-replica-{i}"),
            )
            for i, r in enumerate(readers)
        ]
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        for i, pool in enumerate(self._readers):
            # a replica that answers starts with its connections ready; one down is skipped
            up = routing.answers(readers[i])
            pool.open(wait=False)
            if up:
                with contextlib.suppress(PoolTimeout):
                    pool.wait(timeout=CONNECT_TIMEOUT_S * 2)
            else:
                self._rotation.down(i)

    # ---- lifecycle ----

    def close(self) -> None:
        for pool in self._readers:
            pool.close()
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def connection(self, *, tenant: str | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the primary; database errors pgrag raised itself become
        PgragErrors.

        With ``tenant``, the block runs in one transaction as that tenant. With replicas, the
        block is committed when it ends and its position in the primary's WAL noted: a read
        with read_your_writes waits for it.
        """
        with self._pool.connection() as conn:
            with mapped_database_errors(), security.tenant_scope(conn, tenant):
                yield conn
            if self._readers:
                if not conn.autocommit:
                    conn.commit()
                self._note_write(conn)

    @contextlib.contextmanager
    def _primary(self, tenant: str | None = None) -> Iterator[psycopg.Connection[Any]]:
        """``connection()`` for pgrag's own reads of the primary: no WAL position noted."""
        with (
            self._pool.connection() as conn,
            mapped_database_errors(),
            security.tenant_scope(conn, tenant),
        ):
            yield conn

    def _note_write(self, conn: psycopg.Connection[Any]) -> None:
        """After a committed block: the primary's WAL position, for fresh reads. It never
        fails the block, which has committed: if the position cannot be read, fresh reads
        go to the primary until the next block's is."""
        try:
            row = conn.execute(routing.WRITTEN_LSN).fetchone()
            if not conn.autocommit:
                conn.commit()
        except psycopg.Error:
            self._reads.lost()
            return
        if row and row[0]:
            self._reads.remember(str(row[0]))

    def wrote(self, lsn: str | None = None) -> None:
        """Note a write made outside this client (its LSN, e.g. from
        ``pg_current_wal_insert_lsn()`` after the commit; None: the primary's position now):
        reads with read_your_writes wait until their replica has it."""
        if lsn is None:
            with self._pool.connection() as conn:
                row = conn.execute(routing.WRITTEN_LSN).fetchone()
            lsn = str(row[0]) if row else None
        if lsn:
            self._reads.remember(lsn)

    def _checkout(self, i: int, lsn: str | None) -> tuple[str, psycopg.Connection[Any] | None]:
        """A connection of replica i that answers and has replayed ``lsn``: ("ready", conn),
        to be given back with ``putconn``; or "down" (its server does not answer: marked down),
        "busy" (no connection free in time), "behind" (not replayed ``lsn`` within
        replay_wait_s)."""
        pool = self._readers[i]
        if self._reads.pool_failed(i, pool.get_stats()) and not routing.answers(self.replicas[i]):
            self._rotation.down(i)
            return "down", None
        try:
            conn = pool.getconn(timeout=routing.REPLICA_CONNECT_S)
        except PoolTimeout:
            if not routing.answers(self.replicas[i]):
                self._rotation.down(i)
                return "down", None
            return "busy", None  # every connection in use: the next server takes the read
        try:
            if lsn is None or routing.replayed(conn, lsn, self.replay_wait_s):
                return "ready", conn
            conn.rollback()
            outcome = "behind"
        except psycopg.Error as exc:
            if not routing.is_server_failure(exc, conn):
                pool.putconn(conn)
                raise
            self._rotation.down(i)
            outcome = "down"
        pool.putconn(conn)
        return outcome, None

    def _on_replica(
        self,
        i: int,
        fn: Callable[[psycopg.Connection[Any]], _T],
        tenant: str | None,
        lsn: str | None,
    ) -> tuple[str, _T | None]:
        """One read on replica i: ("done", result), or ``_checkout``'s "down", "busy" or
        "behind". An error of the read itself is raised, never retried; a read that finished
        is never run again (its commit, read-only, may fail harmlessly)."""
        outcome, conn = self._checkout(i, lsn)
        if conn is None:
            return outcome, None
        pool = self._readers[i]
        try:
            try:
                with mapped_database_errors(), security.tenant_scope(conn, tenant):
                    result = fn(conn)
            except Exception as exc:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()
                if routing.is_server_failure(exc, conn):
                    self._rotation.down(i)
                    return "down", None
                raise
            with contextlib.suppress(psycopg.Error):
                conn.commit()
            self._rotation.up(i)
            return "done", result
        finally:
            pool.putconn(conn)

    def _read(
        self,
        fn: Callable[[psycopg.Connection[Any]], _T],
        tenant: str | None,
        read_your_writes: bool | None,
    ) -> _T:
        """``fn`` on a replica: each in turn at most once (one whose server fails under the
        read, or that is busy, passes it to the next), then on the primary (when none could,
        when one is behind the caller's write, or without replicas). A pooled connection is
        lent to one caller at a time: ``fn``'s searches run by their kept plans on it."""
        fn = _alone(fn)
        replica_ok, lsn = self._reads.wanted(read_your_writes)
        if replica_ok:
            for i in self._rotation.order():
                outcome, result = self._on_replica(i, fn, tenant, lsn)
                if outcome == "done":
                    return result  # type: ignore[return-value]
                if outcome == "behind":
                    break  # the primary has it; another replica would be the same gamble
        with self._primary(tenant) as conn:
            return fn(conn)

    @contextlib.contextmanager
    def reading(
        self, *, tenant: str | None = None, read_your_writes: bool | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for your own reads: a replica that answers (and, with
        read_your_writes, has this client's last write), else the primary. Errors inside the
        block are raised, not retried."""
        replica_ok, lsn = self._reads.wanted(read_your_writes)
        if replica_ok:
            for i in self._rotation.order():
                outcome, conn = self._checkout(i, lsn)
                if conn is not None:
                    try:
                        with conn, mapped_database_errors(), security.tenant_scope(conn, tenant):
                            yield conn
                    finally:
                        self._readers[i].putconn(conn)
                    return
                if outcome == "behind":
                    break
        with self._primary(tenant) as conn:
            yield conn

    # ---- the store ----

    def settings(self) -> StoreSettings:
        self.require_schema()
        with self._primary() as conn, conn.cursor(row_factory=class_row(StoreSettings)) as cur:
            row = cur.execute(
                "select embedding_dim, embedding_model, hnsw_m, hnsw_ef_construction "
                "from pgrag.settings"
            ).fetchone()
        if row is None:
            raise NotMigrated("pgrag.settings is empty: run `pgrag db upgrade`")
        return row

    def status(self) -> StoreStatus:
        self.require_schema()
        with self._primary() as conn, conn.cursor(row_factory=class_row(StoreStatus)) as cur:
            row = cur.execute("select * from pgrag.status()").fetchone()
        assert row is not None
        return row

    def check_dimension(self, dim: int) -> None:
        """Raise DimensionMismatch unless ``dim`` is the store's dimension (SQL: the same check
        as ``pgrag.check_dimension``, which owns the message)."""
        self.require_schema()
        with self._primary() as conn:
            conn.execute("select pgrag.check_dimension(%s)", (dim,))

    def require_schema(self) -> None:
        """Raise NotMigrated unless the database is at pgrag's head (on a pooled connection)."""
        from pgrag import migrate

        with self._primary() as conn:
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
        with self._primary() as conn:
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
        with self._primary() as conn:
            return documents.verify(conn, name)

    # ---- search and answers (pgrag/search.py, pgrag/ask.py) ----

    def search(
        self,
        query: str | None = None,
        options: SearchOptions | None = None,
        *,
        tenant: str | None = None,
        fresh: bool | None = None,
        **args: Unpack[SearchArgs],
    ) -> SearchResult:
        """One-statement hybrid search (``pgrag.search.search``): the question, then a
        ``SearchOptions`` and/or its fields as keywords. ``tenant`` searches as that tenant
        (default: the Client's); ``fresh`` overrides the Client's read_your_writes."""
        from pgrag.search import search

        return self._read(lambda conn: search(conn, query, options, **args), tenant, fresh)

    def stats(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        doc_types: Sequence[str] | None = None,
        tenant: str | None = None,
        fresh: bool | None = None,
    ) -> dict[str, Any]:
        """Exact aggregates over the source rows matching a filter (``pgrag.search.stats``)."""
        from pgrag.search import stats

        return self._read(
            lambda conn: stats(conn, filter=filter, doc_types=doc_types), tenant, fresh
        )

    def context(
        self,
        chunk_id: int,
        *,
        max_children: int = 20,
        tenant: str | None = None,
        fresh: bool | None = None,
    ) -> list[ContextRow]:
        """A chunk with its parent and children (``pgrag.search.context``)."""
        from pgrag.search import context

        return self._read(
            lambda conn: context(conn, chunk_id, max_children=max_children), tenant, fresh
        )

    def ask(
        self,
        question: str,
        *,
        tenant: str | None = None,
        fresh: bool | None = None,
        **args: Unpack[AskArgs],
    ) -> AskResult:
        """Question → filters → search → rerank → grounded answer (``pgrag.ask.ask``). The
        database's part runs on a pooled connection (a replica's, with replicas), which goes
        back to the pool before the rerank and the LLM."""
        from pgrag.ask import find, respond

        found = self._read(lambda conn: find(conn, question, **args), tenant, fresh)
        return respond(found, **args)

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
        with self._primary() as conn:
            return filter_index.list_indexes(conn)

    def drop_filter_index(self, filter_or_name: str) -> str | None:
        """Drop the filter index of a filter (JSON) or a name; its name, None if none existed."""
        from pgrag import filter_index

        self.require_schema()
        with mapped_database_errors():
            return filter_index.drop(self.url, filter_or_name)

    def reindex(
        self,
        *,
        m: int | None = None,
        ef_construction: int | None = None,
        maintenance_work_mem: str | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        tune: bool = True,
    ) -> tuple[StoreIndexRebuild, TuneResult | str | None]:
        """Rebuild the store's HNSW index (concurrently) with a graph for its size, or the
        given m and ef_construction (``pgrag.filter_index.rebuild_store_index``); then, unless
        ``tune`` is False, measure ef_search on the new graph as the worker does. Second: the
        measurement, None when not taken (``tune`` False, or fewer vectors than the worker
        tunes), or why it failed (the new index stays, searches keep the old ef_search)."""
        from pgrag import filter_index

        self.require_schema()
        with mapped_database_errors():
            return filter_index.rebuild_and_tune(
                self.url,
                m=m,
                ef_construction=ef_construction,
                maintenance_work_mem=maintenance_work_mem,
                progress=progress,
                tune=tune,
            )

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
        with self._primary() as conn:
            return stats_cache.status(conn)

    def upgrade(self, revision: str = "head", *, dimension: int | None = None) -> None:
        """Migrate this database (see ``pgrag.migrate.upgrade``) and refresh pooled connections."""
        from pgrag import migrate

        migrate.upgrade(self.url, revision, dimension=dimension)
        self._pool.drain()
        for pool in self._readers:
            pool.drain()
        if self._readers:
            self.wrote()  # fresh reads see the migrated schema


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


class AsyncClient(_Replicated):
    """``Client``'s searches on asyncio: a pool of async connections with pgvector registered.

    ``async with await pgrag.aconnect(url) as client:``, then ``await client.search(...)``,
    ``stats``, ``context``, ``status``. The search is the same plan and statement as the sync
    client's (``pgrag.search._plan``); declarations, rebuilds and the worker stay on the sync
    ``Client`` (they are not request-path work). ``replicas``, a multi-host ``url``,
    ``read_your_writes`` and ``fresh`` route reads as ``Client``'s do.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        tenant: str | None = None,
        replicas: Sequence[str] = (),
        read_your_writes: bool = False,
        replay_wait_s: float = routing.REPLAY_WAIT_S,
    ) -> None:
        self._reads = routing.Reads(url, replicas, read_your_writes, replay_wait_s)
        writer, readers = self._reads.writer, self._reads.urls
        self.url = writer
        self.replicas = readers
        self.tenant = None if tenant is None else security.check_tenant(tenant)
        self._rotation = self._reads.rotation
        self._pool = AsyncConnectionPool(
            writer,
            configure=lambda conn: _aconfigure(conn, self.tenant),
            **_pool_options(min_size, max_size, "pgrag-async"),
        )
        self._readers = [
            AsyncConnectionPool(
                r,
                configure=lambda conn: _aconfigure(conn, self.tenant),
                check=AsyncConnectionPool.check_connection,
                **_pool_options(min_size, max_size, f"pgrag-async-replica-{i}"),
            )
            for i, r in enumerate(readers)
        ]

    async def open(self) -> AsyncClient:
        await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        for i, pool in enumerate(self._readers):
            up = await routing.aanswers(self.replicas[i])
            await pool.open(wait=False)
            if up:
                with contextlib.suppress(PoolTimeout):
                    await pool.wait(timeout=CONNECT_TIMEOUT_S * 2)
            else:
                self._rotation.down(i)
        return self

    async def close(self) -> None:
        for pool in self._readers:
            await pool.close()
        await self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(
        self, *, tenant: str | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled async connection to the primary; with ``tenant``, one transaction as that
        tenant. With replicas, committed at the end and its WAL position noted (``Client``)."""
        async with self._pool.connection() as conn:
            async with security.atenant_scope(conn, tenant):
                with mapped_database_errors():
                    yield conn
            if self._readers:
                if not conn.autocommit:
                    await conn.commit()
                await self._note_write(conn)

    @contextlib.asynccontextmanager
    async def _primary(
        self, tenant: str | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._pool.connection() as conn, security.atenant_scope(conn, tenant):
            with mapped_database_errors():
                yield conn

    async def _note_write(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """``Client._note_write`` on asyncio."""
        try:
            cur = await conn.execute(routing.WRITTEN_LSN)
            row = await cur.fetchone()
            if not conn.autocommit:
                await conn.commit()
        except psycopg.Error:
            self._reads.lost()
            return
        if row and row[0]:
            self._reads.remember(str(row[0]))

    async def wrote(self, lsn: str | None = None) -> None:
        """``Client.wrote`` on asyncio: note a write made outside this client (None: the
        primary's position now)."""
        if lsn is None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(routing.WRITTEN_LSN)
                row = await cur.fetchone()
            lsn = str(row[0]) if row else None
        if lsn:
            self._reads.remember(lsn)

    async def _checkout(
        self, i: int, lsn: str | None
    ) -> tuple[str, psycopg.AsyncConnection[Any] | None]:
        """``Client._checkout`` on asyncio."""
        pool = self._readers[i]
        if self._reads.pool_failed(i, pool.get_stats()) and not await routing.aanswers(
            self.replicas[i]
        ):
            self._rotation.down(i)
            return "down", None
        try:
            conn = await pool.getconn(timeout=routing.REPLICA_CONNECT_S)
        except PoolTimeout:
            if not await routing.aanswers(self.replicas[i]):
                self._rotation.down(i)
                return "down", None
            return "busy", None  # every connection in use: the next server takes the read
        try:
            if lsn is None or await routing.areplayed(conn, lsn, self.replay_wait_s):
                return "ready", conn
            await conn.rollback()
            outcome = "behind"
        except psycopg.Error as exc:
            if not routing.is_server_failure(exc, conn):
                await pool.putconn(conn)
                raise
            self._rotation.down(i)
            outcome = "down"
        await pool.putconn(conn)
        return outcome, None

    async def _on_replica(
        self,
        i: int,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]],
        tenant: str | None,
        lsn: str | None,
    ) -> tuple[str, _T | None]:
        """``Client._on_replica`` on asyncio."""
        outcome, conn = await self._checkout(i, lsn)
        if conn is None:
            return outcome, None
        pool = self._readers[i]
        try:
            try:
                async with security.atenant_scope(conn, tenant):
                    with mapped_database_errors():
                        result = await fn(conn)
            except Exception as exc:
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                if routing.is_server_failure(exc, conn):
                    self._rotation.down(i)
                    return "down", None
                raise
            with contextlib.suppress(psycopg.Error):
                await conn.commit()
            self._rotation.up(i)
            return "done", result
        finally:
            await pool.putconn(conn)

    async def _read(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]],
        tenant: str | None,
        read_your_writes: bool | None,
    ) -> _T:
        """``Client._read`` on asyncio."""
        fn = _aalone(fn)
        replica_ok, lsn = self._reads.wanted(read_your_writes)
        if replica_ok:
            for i in self._rotation.order():
                outcome, result = await self._on_replica(i, fn, tenant, lsn)
                if outcome == "done":
                    return result  # type: ignore[return-value]
                if outcome == "behind":
                    break
        async with self._primary(tenant) as conn:
            return await fn(conn)

    @contextlib.asynccontextmanager
    async def reading(
        self, *, tenant: str | None = None, read_your_writes: bool | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``Client.reading`` on asyncio."""
        replica_ok, lsn = self._reads.wanted(read_your_writes)
        if replica_ok:
            for i in self._rotation.order():
                outcome, conn = await self._checkout(i, lsn)
                if conn is not None:
                    try:
                        async with conn, security.atenant_scope(conn, tenant):
                            with mapped_database_errors():
                                yield conn
                    finally:
                        await self._readers[i].putconn(conn)
                    return
                if outcome == "behind":
                    break
        async with self._primary(tenant) as conn:
            yield conn

    async def search(
        self,
        query: str | None = None,
        options: SearchOptions | None = None,
        *,
        tenant: str | None = None,
        fresh: bool | None = None,
        **args: Unpack[SearchArgs],
    ) -> SearchResult:
        """``Client.search`` on asyncio (``pgrag.search.asearch``)."""
        from pgrag.search import asearch

        return await self._read(lambda conn: asearch(conn, query, options, **args), tenant, fresh)

    async def stats(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        doc_types: Sequence[str] | None = None,
        tenant: str | None = None,
        fresh: bool | None = None,
    ) -> dict[str, Any]:
        from pgrag.search import astats

        return await self._read(
            lambda conn: astats(conn, filter=filter, doc_types=doc_types), tenant, fresh
        )

    async def context(
        self,
        chunk_id: int,
        *,
        max_children: int = 20,
        tenant: str | None = None,
        fresh: bool | None = None,
    ) -> list[ContextRow]:
        from pgrag.search import acontext

        return await self._read(
            lambda conn: acontext(conn, chunk_id, max_children=max_children), tenant, fresh
        )

    async def status(self) -> StoreStatus:
        async with (
            self._primary() as conn,
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
    replicas: Sequence[str] = (),
    read_your_writes: bool = False,
    replay_wait_s: float = routing.REPLAY_WAIT_S,
) -> AsyncClient:
    """An open AsyncClient: ``connect``'s checks, then an asyncio pool."""
    import asyncio

    checked = await asyncio.to_thread(resolve_checked, url, embedded=embedded)
    return await AsyncClient(
        checked,
        min_size=min_size,
        max_size=max_size,
        tenant=tenant,
        replicas=replicas,
        read_your_writes=read_your_writes,
        replay_wait_s=replay_wait_s,
    ).open()


def resolve_checked(url: str | None, *, embedded: bool) -> str:
    """The database URL (``resolve_url``), checked to answer and to have pgvector available:
    a one-line PgragError otherwise."""
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
    return resolved


def connect(
    url: str | None = None,
    *,
    embedded: bool = False,
    min_size: int = 1,
    max_size: int = 8,
    tenant: str | None = None,
    replicas: Sequence[str] = (),
    read_your_writes: bool = False,
    replay_wait_s: float = routing.REPLAY_WAIT_S,
) -> Client:
    """A Client on ``url``, else ``PGRAG_DATABASE_URL``; with neither, ``embedded=True``
    starts (or reuses) pgrag's embedded PostgreSQL, and without it this is a ConfigError: a
    server is never started unasked. With ``tenant``, its searches see that tenant's chunks
    (and the shared ones) only (docs/security.md). With ``replicas`` (or a multi-host
    ``url``), reads go to the replicas (``Client``, docs/scaling.md).

    Fails fast with a one-line PgragError if the server is unreachable or lacks pgvector.
    """
    resolved = resolve_checked(url, embedded=embedded)
    try:
        return Client(
            resolved,
            min_size=min_size,
            max_size=max_size,
            tenant=tenant,
            replicas=replicas,
            read_your_writes=read_your_writes,
            replay_wait_s=replay_wait_s,
        )
    except psycopg.Error as exc:
        raise PgragError(
            f"cannot open a connection pool on {describe_target(resolved)} ({exc}): "
            "check max_connections on the server"
        ) from exc
