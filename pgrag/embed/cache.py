"""The two caches: content (inside the worker's SQL) and query (here).

Content cache: ``pgrag.embedding_cache`` keyed by (model, sha256 of the text). The worker's claim
returns a chunk's cached vector with it and ``store_embeddings`` fills the cache, so a text is
sent to a model once, whichever chunk carries it and however often it is rebuilt.

Query cache: a question, normalized (Unicode NFKC, whitespace collapsed, trimmed), is embedded
once per model: an in-process LRU first (entries kept an hour at most), then
``pgrag.query_cache`` (shared by every process; entries older than the server's TTL,
``pgrag.settings.query_cache_ttl``, ignored and purged), then the model. Every answer says where
the vector came from.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import psycopg

from pgrag import config
from pgrag.embed.base import QUERY_RETRY, Embedder, RetryPolicy, Vectors, embed_with_retry

# Before revision 0009 the caller chose the shared cache's TTL; it is the server's setting now.
ENV_QUERY_CACHE_TTL = "PGRAG_QUERY_CACHE_TTL"
DEFAULT_MEMORY_TTL_S = 3600.0
DEFAULT_LRU_SIZE = 1024

_log = logging.getLogger(__name__)

CacheSource = Literal["memory", "database", "model"]


def content_hash(text: str) -> bytes:
    """sha256 of the UTF-8 text: the same bytes as ``pgrag.chunks.content_hash``."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def normalize_query(question: str) -> str:
    """NFKC, whitespace runs to one space, trimmed: spelling-identical questions share a vector."""
    return " ".join(unicodedata.normalize("NFKC", question).split())


@dataclass(frozen=True, eq=False)
class QueryVector:
    """A question's vector and where it came from (``cache_hit`` unless the model ran)."""

    vector: Vectors
    model: str
    source: CacheSource
    seconds: float

    @property
    def cache_hit(self) -> bool:
        return self.source != "model"


@functools.cache
def _warn_old_ttl_setting() -> None:
    if config.env(ENV_QUERY_CACHE_TTL):
        _log.warning(
            "%s is ignored: the shared query cache's TTL is the server's setting; set it with "
            "update pgrag.settings set query_cache_ttl = '7 days' (docs/embeddings.md)",
            ENV_QUERY_CACHE_TTL,
        )


class QueryCache:
    """Question → vector for one embedder: LRU in this process, then Postgres, then the model.

    Thread-safe. ``embed(conn, question)`` takes a psycopg connection (pgvector need not be
    registered on it); ``aembed`` the same with an AsyncConnection. Both run the same SQL. A new
    entry is written in a savepoint of the caller's transaction (or its own, in autocommit) and
    is shared once that commits; failing to write it never fails the caller.
    """

    GET = "select pgrag.query_cache_get(%(model)s, %(hash)s)::real[]"
    PUT = "select pgrag.query_cache_put(%(model)s, %(hash)s, %(query)s, %(vec)s::real[]::vector)"

    def __init__(
        self,
        embedder: Embedder,
        *,
        memory_ttl_s: float = DEFAULT_MEMORY_TTL_S,
        max_items: int = DEFAULT_LRU_SIZE,
        retry: RetryPolicy = QUERY_RETRY,
    ) -> None:
        self.embedder = embedder
        self.memory_ttl_s = memory_ttl_s  # the in-process LRU's; the shared cache's is the server's
        _warn_old_ttl_setting()
        self.max_items = max_items
        self.retry = retry
        self._lru: OrderedDict[bytes, tuple[float, Vectors]] = OrderedDict()
        self._lock = threading.Lock()

    # ---- the in-process LRU ----

    def _memory_get(self, key: bytes) -> Vectors | None:
        with self._lock:
            hit = self._lru.get(key)
            if hit is None:
                return None
            stored_at, vector = hit
            if time.monotonic() - stored_at > self.memory_ttl_s:
                del self._lru[key]
                return None
            self._lru.move_to_end(key)
            return vector

    def _memory_put(self, key: bytes, vector: Vectors) -> None:
        with self._lock:
            self._lru[key] = (time.monotonic(), vector)
            self._lru.move_to_end(key)
            while len(self._lru) > self.max_items:
                self._lru.popitem(last=False)

    def clear_memory(self) -> None:
        with self._lock:
            self._lru.clear()

    def embedder_ready(self) -> bool:
        """Whether embedding a question costs no model load (an embedder that loads a model
        on first use says so with ``loaded``; one without a model to load is always ready)."""
        return bool(getattr(self.embedder, "loaded", True))

    # ---- lookups ----

    def _params(self, normalized: str) -> dict[str, Any]:
        return {"model": self.embedder.name, "hash": content_hash(normalized)}

    def _compute(self, normalized: str) -> Vectors:
        vector: Vectors = embed_with_retry(self.embedder, [normalized], self.retry)[0]
        vector.setflags(write=False)
        return vector

    def _steps(self, question: str) -> Generator[_Step, Any, QueryVector]:
        """A lookup without I/O: it yields the statements and the model call it needs and is
        sent their results; ``embed`` and ``aembed`` drive it (one body for both)."""
        started = time.perf_counter()
        normalized = normalize_query(question)
        params = self._params(normalized)
        key = params["hash"]
        vector = self._memory_get(key)
        if vector is not None:
            return QueryVector(vector, self.embedder.name, "memory", _since(started))
        row = yield _Get(params)
        if row is not None and row[0] is not None:
            vector = _frozen(row[0])
            self._memory_put(key, vector)
            return QueryVector(vector, self.embedder.name, "database", _since(started))
        vector = yield _Compute(normalized)
        # a savepoint inside the caller's transaction: a failed write fails nothing else (e.g. a
        # read-only standby: the vector is still right, just not shared)
        yield _Put({**params, "query": normalized, "vec": vector.tolist()})
        self._memory_put(key, vector)
        return QueryVector(vector, self.embedder.name, "model", _since(started))

    def embed(self, conn: psycopg.Connection[Any], question: str) -> QueryVector:
        steps = self._steps(question)
        try:
            step = next(steps)
            while True:
                if isinstance(step, _Get):
                    step = steps.send(conn.execute(self.GET, step.params).fetchone())
                elif isinstance(step, _Compute):
                    step = steps.send(self._compute(step.normalized))
                else:
                    with contextlib.suppress(psycopg.Error), conn.transaction():
                        conn.execute(self.PUT, step.params)
                    step = next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def aembed(self, conn: psycopg.AsyncConnection[Any], question: str) -> QueryVector:
        import asyncio

        steps = self._steps(question)
        try:
            step = next(steps)
            while True:
                if isinstance(step, _Get):
                    cur = await conn.execute(self.GET, step.params)
                    step = steps.send(await cur.fetchone())
                elif isinstance(step, _Compute):
                    step = steps.send(await asyncio.to_thread(self._compute, step.normalized))
                else:
                    with contextlib.suppress(psycopg.Error):
                        async with conn.transaction():
                            await conn.execute(self.PUT, step.params)
                    step = next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Get:  # look the question up in pgrag.query_cache; sent the row
    params: dict[str, Any]


@dataclass(frozen=True)
class _Compute:  # embed it with the model; sent the vector
    normalized: str


@dataclass(frozen=True)
class _Put:  # share it (best effort); sent nothing
    params: dict[str, Any]


_Step = _Get | _Compute | _Put


def _frozen(values: Any) -> Vectors:
    vector = np.asarray(values, dtype=np.float32)
    vector.setflags(write=False)
    return vector


def _since(started: float) -> float:
    return time.perf_counter() - started
