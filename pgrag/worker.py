"""The worker: renders the documents waiting in the render queue, then embeds the chunks
waiting for a vector and writes the vectors back.

Rendering: ``pgrag.render_queued`` takes entries of ``pgrag.render_queue`` (a queue-mode type's
changes, or documents a committing transaction handed over) and renders them, in one
transaction per call; several workers take different entries.

How an embedding batch runs (the SQL is in ``sql/idempotent/20_embeddings.sql``):

1. ``pgrag.claim_chunks`` takes a session advisory lock on up to ``batch_size`` waiting chunks
   (skipping chunks other workers hold, like ``FOR UPDATE SKIP LOCKED``) and returns their text,
   content hash and cached vector, if the content cache has one. No transaction stays open.
2. Texts not in the cache are embedded, each distinct text once, with transient failures
   retried with backoff. A batch that fails for good is split in halves to find the chunks
   that fail; only those are recorded in ``pgrag.embed_errors``.
3. ``pgrag.store_embeddings`` writes, in one transaction, the content cache and the vectors of
   the chunks whose text still has the hash that was embedded; a chunk rewritten meanwhile
   stays queued. Then the locks are released.

A worker killed at any point wrote all of a batch or none of it, and its locks vanished with its
connection: the next worker takes the batch again (from the cache where it can).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import FrameType
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.rows import class_row

from pgrag.connection import connect_once, describe_target, first_line
from pgrag.embed.base import (
    DEFAULT_RETRY,
    Embedder,
    EmbedError,
    RetryPolicy,
    Stopped,
    Vectors,
    embed_with_retry,
)
from pgrag.errors import (
    ConfigError,
    ConnectionFailed,
    IndexBuildFailed,
    IndexBusy,
    PgragError,
    from_database,
)
from pgrag.tune import TuneResult, maybe_tune

_log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "pgrag_chunks"  # chunks waiting for a vector
RENDER_CHANNEL = "pgrag_render"  # documents waiting in the render queue
DEFAULT_BATCH_SIZE = 64
DEFAULT_RENDER_ENTRIES = 500
MAX_RENDER_ENTRIES = 50_000
RENDER_BATCH_S = 0.5  # the render batch's target duration
# Seconds between looks at the queues when no NOTIFY arrives: idle, and right after a batch
# (a burst of writers notifies once: pgrag._notify).
DEFAULT_POLL_S = 2.0
BUSY_POLL_S = 0.05
DEFAULT_MAX_ATTEMPTS = 5
# A store index rebuild that failed (not stopped) is tried again after REINDEX_RETRY_S, at most
# REINDEX_ATTEMPTS times in all per worker: a transient failure (a lost connection, a deadlock
# with a manual VACUUM) retried, a lasting one (disk full) not every drain.
REINDEX_ATTEMPTS = 3
REINDEX_RETRY_S = 600.0
DEFAULT_FAILURE_RETRY_S = 60.0
# How often, at most, a worker looks whether pgrag.stats_changes needs pruning (_maybe_prune)
PRUNE_EVERY_S = 10.0
# Prune the statistics cache's record of writes when it has grown (the threshold is the SQL's:
# pgrag._stats_changes_to_prune); a no-op otherwise
_PRUNE = "select pgrag._prune_stats_changes() where pgrag._stats_changes_to_prune()"


@dataclass(frozen=True, eq=False)
class ClaimedChunk:
    chunk_id: int
    text: str
    content_hash: bytes
    cached: object | None  # a pgvector Vector when the content cache had the text


def as_vector(value: object) -> Vectors:
    """A vector column's value (pgvector Vector, ndarray, list, or text) as a float32 array."""
    to_numpy = getattr(value, "to_numpy", None)
    if to_numpy is not None:
        value = to_numpy()
    elif isinstance(value, str):
        value = [float(x) for x in value.strip("[]").split(",")]
    return np.asarray(value, dtype=np.float32)


@dataclass(frozen=True)
class ChunkFailure:
    chunk_id: int
    error: str
    transient: bool


@dataclass(frozen=True)
class QueueStatus:
    """Chunks without a vector: ready to embed, failed and waiting to retry, given up on."""

    waiting: int
    retrying: int
    given_up: int


@dataclass(frozen=True)
class BatchResult:
    claimed: int
    written: int  # vectors written to chunks
    from_cache: int  # of which the content cache had the vector
    model_texts: int  # distinct texts sent to the model
    changed: int  # text changed while embedding: left queued
    failures: tuple[ChunkFailure, ...]
    seconds: float

    @property
    def outage(self) -> bool:
        """The embedder failed transiently on the whole batch, even after retries."""
        return bool(self.failures) and all(f.transient for f in self.failures)


@dataclass(frozen=True)
class RenderResult:
    """One call of ``pgrag.render_queued``: queue entries taken, chunks written or deleted,
    and how long the oldest entry had waited."""

    entries: int
    chunks: int
    oldest_s: float
    seconds: float


@dataclass(frozen=True)
class DrainResult:
    batches: int = 0
    rendered_entries: int = 0  # render queue entries done
    rendered_chunks: int = 0
    indexed: int = 0  # chunks whose full-text vector was filled in (pgrag.index_text)
    claimed: int = 0
    written: int = 0
    from_cache: int = 0
    model_texts: int = 0
    changed: int = 0
    failures: tuple[ChunkFailure, ...] = ()
    seconds: float = 0.0
    stopped: bool = False
    outage: bool = False

    def rendered(self, r: RenderResult) -> DrainResult:
        return replace(
            self,
            rendered_entries=self.rendered_entries + r.entries,
            rendered_chunks=self.rendered_chunks + r.chunks,
        )

    def add(self, b: BatchResult) -> DrainResult:
        return DrainResult(
            batches=self.batches + 1,
            rendered_entries=self.rendered_entries,
            rendered_chunks=self.rendered_chunks,
            indexed=self.indexed,
            claimed=self.claimed + b.claimed,
            written=self.written + b.written,
            from_cache=self.from_cache + b.from_cache,
            model_texts=self.model_texts + b.model_texts,
            changed=self.changed + b.changed,
            failures=self.failures + b.failures,
            seconds=self.seconds,
            stopped=self.stopped,
            outage=self.outage or b.outage,
        )


@dataclass
class _Outcome:
    vectors: dict[bytes, Vectors] = field(default_factory=dict)
    errors: dict[bytes, EmbedError] = field(default_factory=dict)


class Worker:
    """One embedding worker on one database connection. Use as a context manager.

    Several workers (threads or processes, on one machine or many) may drain one store at once.
    ``stop`` (a threading.Event) ends ``drain`` and ``run_forever`` after the current batch.
    """

    def __init__(
        self,
        url: str,
        embedder: Embedder,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        render_entries: int = DEFAULT_RENDER_ENTRIES,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        failure_retry_s: float = DEFAULT_FAILURE_RETRY_S,
        stop: threading.Event | None = None,
        auto_tune: bool = True,
        auto_reindex: bool = True,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        # after a drain that embedded, measure ef_search again when the store doubled or
        # halved (pgrag/tune.py maybe_tune); the last measurement, if this worker took one
        self.auto_tune = auto_tune
        self.last_tune: TuneResult | None = None
        # when that measurement finds the graph the limit and the store has outgrown it,
        # rebuild the store index for its size, in a thread (_maybe_reindex)
        self.auto_reindex = auto_reindex
        self.notice: Callable[[str], None] = notice or (lambda line: _log.warning("%s", line))
        self._reindex: threading.Thread | None = None
        self._reindex_cancel = threading.Event()
        self._reindex_failures = 0  # rebuilds that failed (not stopped): retried, up to a bound
        self._reindex_after = 0.0  # time.monotonic() before which none is tried again
        self._reindex_checked = False  # an unfinished rebuild looked for, once per worker
        self.embedder = embedder
        self.batch_size = batch_size
        self.render_entries = render_entries
        self._render_take = render_entries  # adapts to the backlog (render_batch)
        self.retry = retry
        self.max_attempts = max_attempts
        self.failure_retry = timedelta(seconds=failure_retry_s)
        self.stop = stop or threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._warned: set[str] = set()  # server warnings passed to notice (_server_warning)
        self._prune_after = 0.0  # time.monotonic() before which _maybe_prune does not look
        self._pending_lists_failed = False  # pgrag.clean_pending_lists failed: not asked again

    # ---- lifecycle ----

    def open(self) -> Worker:
        from pgrag import migrate

        migrate.require_head(self.url)
        with connect_once(self.url):  # connection failures as one-line ConnectionFailed
            pass
        conn = psycopg.connect(self.url, autocommit=True, application_name="pgrag worker")
        row = conn.execute("select pg_is_in_recovery()").fetchone()
        if row and row[0]:
            conn.close()
            raise ConfigError(
                f"{describe_target(self.url)} is a standby (read-only): run the worker against "
                "the primary; the vectors it writes reach the standbys by replication"
            )
        register_vector(conn)
        conn.add_notice_handler(self._server_warning)
        self._conn = conn
        if self.auto_reindex and not self._reindex_checked:
            # a rebuild that built its index but died before the swap (a killed worker or
            # `pgrag reindex`): finished now, not when the store next outgrows its graph
            self._maybe_reindex(unfinished_only=True)
            self._reindex_checked = True
        return self

    def close(self) -> None:
        """Stop a rebuild in flight (``_maybe_reindex``: the old index stays, or a new one
        already built stays beside it for the next start to swap in) and close the session."""
        self._reindex_cancel.set()
        self.join_reindex()
        self._reindex_cancel.clear()
        self._close_connection()

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()  # closing ends the session: its advisory locks go with it
            self._conn = None

    def __enter__(self) -> Worker:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self.open()
        assert self._conn is not None
        return self._conn

    def _execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        try:
            return self.conn.execute(query, params)
        except psycopg.Error as exc:
            mapped = from_database(exc)
            if mapped is not None:
                raise mapped from exc
            raise

    # ---- the store's model ----

    def check(self) -> None:
        """Refuse (ModelMismatch, DimensionMismatch) an embedder the store was not made with."""
        self._execute(
            "select pgrag.check_embedder(%s, %s)", (self.embedder.name, self.embedder.dimension)
        )

    def begin_reembed(self) -> int:
        """Switch the store to this embedder: drop every vector, queue every chunk."""
        row = self._execute(
            "select pgrag.begin_reembed(%s, %s)", (self.embedder.name, self.embedder.dimension)
        ).fetchone()
        register_vector(self.conn)  # the column's type may have changed
        return int(row[0]) if row else 0

    def queue(self) -> QueueStatus:
        with self.conn.cursor(row_factory=class_row(QueueStatus)) as cur:
            row = cur.execute(
                "select waiting, retrying, given_up from pgrag.embed_queue(%s, %s)",
                (self.embedder.name, self.max_attempts),
            ).fetchone()
        assert row is not None
        return row

    def clear_errors(self) -> int:
        row = self._execute("select pgrag.clear_embed_errors()").fetchone()
        return int(row[0]) if row else 0

    def recorded_failures(self, limit: int = 10) -> list[ChunkFailure]:
        rows = self._execute(
            "select chunk_id, error from pgrag.embed_errors where model = %s "
            "order by failed_at desc, chunk_id limit %s",
            (self.embedder.name, limit),
        ).fetchall()
        return [ChunkFailure(int(r[0]), str(r[1]), False) for r in rows]

    def _server_warning(self, diag: psycopg.errors.Diagnostic) -> None:
        """pgrag's own server warnings (``pgrag: ...``) to ``notice``, each text once per
        worker: render_queued in a privileged session leaves other roles' types in the
        queue and says so at every poll."""
        text = diag.message_primary or ""
        if diag.severity_nonlocalized != "WARNING" or not text.startswith("pgrag: "):
            return
        if text in self._warned:
            return
        self._warned.add(text)
        self.notice(text + (f" ({diag.message_hint})" if diag.message_hint else ""))

    # ---- one batch ----

    def index_text_batch(self) -> int:
        """Fill in the full-text vector of chunks a render at a writer's commit left without
        one (pgrag.index_text): ahead of the embeddings, which take a second or more a batch
        where this takes a fraction. How many were filled; 0 when none is waiting."""
        row = self._execute("select pgrag.index_text()").fetchone()  # (its batch: the SQL's)
        self._clean_pending_lists()
        return int(row[0]) if row and row[0] else 0

    def _clean_pending_lists(self) -> None:
        """Move the GIN pending lists the full-text vectors and the writers' chunks filled into
        their indexes (pgrag.clean_pending_lists, a transaction of its own: no chunk row is held
        meanwhile), so that no writer's commit finds one full and moves it itself. A failure
        (no privilege, the function missing from a database upgraded from an earlier build of
        this revision) is logged once and skipped; a lost connection goes to the caller."""
        if self._pending_lists_failed:
            return
        try:
            self._execute("select pgrag.clean_pending_lists()")
        except (psycopg.Error, PgragError) as exc:
            if connection_lost(exc):
                raise
            self._pending_lists_failed = True
            _log.warning(
                "pgrag: GIN pending lists left to the writers' commits: %s "
                "(run `pgrag db upgrade` as the store's owner)",
                str(exc).strip().splitlines()[0],
            )

    def render_batch(self) -> RenderResult | None:
        """Render entries of the render queue; None when it is empty.

        The number taken adapts: a backlog is taken in larger batches (a document changed by
        many entries renders once per batch), up to a batch of about half a second.
        """
        started = time.perf_counter()
        row = self._execute(
            "select entries, documents, extract(epoch from oldest)::float8 "
            "from pgrag.render_queued(%s)",
            (self._render_take,),
        ).fetchone()
        if row is None or row[0] == 0:
            return None
        seconds = _since(started)
        if row[0] >= self._render_take and seconds < RENDER_BATCH_S / 2:
            self._render_take = min(self._render_take * 2, MAX_RENDER_ENTRIES)
        elif seconds > RENDER_BATCH_S * 2:
            self._render_take = max(self._render_take // 2, self.render_entries // 10 or 1)
        return RenderResult(int(row[0]), int(row[1]), float(row[2] or 0.0), seconds)

    def run_batch(self) -> BatchResult | None:
        """Claim, embed and store one batch; None when nothing is waiting."""
        started = time.perf_counter()
        with self.conn.cursor(row_factory=class_row(ClaimedChunk)) as cur:
            claimed = cur.execute(
                "select claimed_id as chunk_id, claimed_text as text, "
                "claimed_hash as content_hash, cached_embedding as cached "
                "from pgrag.claim_chunks(%s, %s, %s)",
                (self.embedder.name, self.batch_size, self.max_attempts),
            ).fetchall()
        if not claimed:
            return None
        ids = [c.chunk_id for c in claimed]
        try:
            return self._finish(claimed, started)
        finally:
            if not self.conn.closed:
                self.conn.execute("select pgrag.release_chunks(%s::bigint[])", (ids,))

    def _finish(self, claimed: list[ClaimedChunk], started: float) -> BatchResult:
        outcome = _Outcome()
        for c in claimed:
            if c.cached is not None:
                outcome.vectors[c.content_hash] = as_vector(c.cached)
        todo: dict[bytes, str] = {}
        for c in claimed:
            if c.content_hash not in outcome.vectors:
                todo.setdefault(c.content_hash, c.text)
        if todo:
            self._embed_resilient(list(todo.items()), outcome)
        ready = [c for c in claimed if c.content_hash in outcome.vectors]
        written: set[int] = set()
        if ready:
            args = (
                self.embedder.name,
                [c.chunk_id for c in ready],
                [c.content_hash for c in ready],
                [outcome.vectors[c.content_hash] for c in ready],
            )
            for attempt in range(1, STORE_ATTEMPTS + 1):
                try:
                    rows = self._execute(
                        "select * from pgrag.store_embeddings("
                        "%s, %s::bigint[], %s::bytea[], %s::vector[])",
                        args,
                    ).fetchall()
                    break
                except psycopg.errors.TransactionRollback:
                    # a serialization failure (on a store partitioned by tenant, a render
                    # moved one of these chunks to another partition meanwhile) or a
                    # deadlock: nothing was written; the next statement sees the move
                    if attempt == STORE_ATTEMPTS:
                        raise
            written = {int(r[0]) for r in rows}
        failures = tuple(
            ChunkFailure(
                c.chunk_id,
                str(outcome.errors[c.content_hash]),
                outcome.errors[c.content_hash].transient,
            )
            for c in claimed
            if c.content_hash in outcome.errors
        )
        self._record(claimed, outcome)
        return BatchResult(
            claimed=len(claimed),
            written=len(written),
            from_cache=sum(1 for c in claimed if c.cached is not None and c.chunk_id in written),
            model_texts=len(todo),
            changed=len(ready) - len(written),
            failures=failures,
            seconds=time.perf_counter() - started,
        )

    def _embed_resilient(self, items: list[tuple[bytes, str]], outcome: _Outcome) -> None:
        """Embed; on a lasting non-transient failure, split to find the texts that fail."""
        try:
            vectors = embed_with_retry(
                self.embedder, [t for _, t in items], self.retry, self.stop.wait
            )
        except Stopped:
            raise
        except EmbedError as exc:
            if exc.transient or len(items) == 1:
                for h, _ in items:
                    outcome.errors[h] = exc
                return
            half = len(items) // 2
            self._embed_resilient(items[:half], outcome)
            self._embed_resilient(items[half:], outcome)
            return
        for (h, _), v in zip(items, vectors, strict=True):
            outcome.vectors[h] = v

    def _record(self, claimed: list[ClaimedChunk], outcome: _Outcome) -> None:
        by_error: dict[str, list[ClaimedChunk]] = {}
        for c in claimed:
            exc = outcome.errors.get(c.content_hash)
            if exc is not None:
                by_error.setdefault(str(exc)[:1000], []).append(c)
        for message, chunks in by_error.items():
            self._execute(
                "select pgrag.record_embed_failures(%s, %s::bigint[], %s::bytea[], %s, %s)",
                (
                    self.embedder.name,
                    [c.chunk_id for c in chunks],
                    [c.content_hash for c in chunks],
                    message,
                    self.failure_retry,
                ),
            )

    # ---- many batches ----

    def drain(
        self,
        on_batch: Callable[[BatchResult], None] | None = None,
        on_render: Callable[[RenderResult], None] | None = None,
    ) -> DrainResult:
        """Render and embed until nothing is waiting (or stop is set, or the embedder is
        unreachable). Renders come first: a rendered document's chunk then waits for a vector."""
        started = time.perf_counter()
        total = DrainResult()
        while not self.stop.is_set():
            rendered = self.render_batch()
            if rendered is not None:
                total = total.rendered(rendered)
                if on_render is not None:
                    on_render(rendered)
                continue
            indexed = self.index_text_batch()
            if indexed:
                total = replace(total, indexed=total.indexed + indexed)
                continue
            try:
                batch = self.run_batch()
            except Stopped:
                break
            if batch is None:
                break
            total = total.add(batch)
            if on_batch is not None:
                on_batch(batch)
            if batch.outage:
                break  # every batch would wait out the same retries: report and stop
        seconds = time.perf_counter() - started  # the embedding's, not the tuning's
        if not self.stop.is_set():
            self._maybe_prune()
        if self.auto_tune and total.claimed > 0 and not self.stop.is_set():
            self._maybe_tune()
            if (
                self._reindex_failures
                and self._reindex_failures < REINDEX_ATTEMPTS
                and time.monotonic() >= self._reindex_after
            ):
                self._maybe_reindex()  # a rebuild that failed, tried again
        return _with(total, seconds=seconds, stopped=self.stop.is_set())

    def _maybe_prune(self) -> None:
        """Every write to a table that cached statistics read records its transaction in
        pgrag.stats_changes; results stored prune it, but a database written far more often than
        its statistics are asked for would grow it until then: the worker prunes it too, looking
        at most every PRUNE_EVERY_S. A failure (no privilege, a lock timeout) is logged and
        skipped; a lost connection goes to the caller's reconnect logic."""
        if time.monotonic() < self._prune_after:
            return
        self._prune_after = time.monotonic() + PRUNE_EVERY_S
        try:
            self._execute(_PRUNE)
        except (psycopg.Error, PgragError) as exc:
            if connection_lost(exc):
                raise
            _log.warning("pgrag: statistics cache not pruned: %s", str(exc).strip().splitlines()[0])

    def _maybe_tune(self) -> None:
        """Recall out of the box: tune when the store grew or shrank twofold (`pgrag status`
        shows the last measurement). The vectors are stored already: a measurement that fails
        (no privilege, a statement or lock timeout) is logged and skipped, never the run's
        failure; a lost connection goes to the caller's reconnect logic; a stop ends it."""
        try:
            tuned = maybe_tune(self.conn, should_stop=self.stop.is_set)
        except (psycopg.Error, PgragError) as exc:
            if connection_lost(exc):
                raise
            _log.warning("pgrag: recall not measured: %s", str(exc).strip().splitlines()[0])
            return
        if tuned is not None:
            self.last_tune = tuned
            if (
                tuned.chosen is None
                and self.auto_reindex
                and self._reindex_failures < REINDEX_ATTEMPTS
            ):
                self._maybe_reindex()

    def _maybe_reindex(self, *, unfinished_only: bool = False) -> None:
        """No ef_search reached the recall target: when the store has outgrown its graph
        (``filter_index.graph_behind``: m 16 / ef_construction 64 past 500,000 vectors, or a
        graph built sparser by hand), rebuild the store index for its size and measure
        ef_search again (``pgrag reindex``'s work), in a thread: the build is concurrent, so
        this worker goes on embedding, and searches use the old graph until the new one
        replaces it. Only the owner of pgrag.chunks can; another role is told to ask for
        ``pgrag reindex``. ``unfinished_only``: only finish a rebuild whose new index is built
        (a valid chunks_embedding_hnsw_new). ``close`` and the stop event stop a rebuild: the
        old index stays, or the new one, built, stays beside it for the next start. A failed
        rebuild is tried again after REINDEX_RETRY_S, up to REINDEX_ATTEMPTS. Told through
        ``notice``, one line each."""
        from pgrag import filter_index

        if self._reindex is not None and self._reindex.is_alive():
            return
        try:
            behind = filter_index.graph_behind(self.conn)
        except psycopg.Error as exc:
            if connection_lost(exc):
                raise
            self.notice(f"pgrag: store index not checked: {first_line(str(exc))}")
            return
        if behind is None:
            self._reindex_failures = 0  # done, by whoever: nothing to try again
            return
        if unfinished_only and not behind.unfinished:
            return
        (m, efc), (want_m, want_efc) = behind.current, behind.wanted
        if behind.partial:
            what = (
                f"a rebuild of the store index left {filter_index.NEW_STORE_INDEX} partly built "
                "(a store partitioned by tenant)"
            )
            doing = "going on with it"
        elif behind.unfinished:
            what = (
                f"a rebuild of the store index left {filter_index.NEW_STORE_INDEX} built "
                "beside the old one"
            )
            doing = "swapping it in"
        else:
            what = (
                f"the store index's graph (m {m}, ef_construction {efc}) stops short of the "
                f"recall target at {behind.vectors:,} vectors"
            )
            doing = (
                f"rebuilding it with m {want_m}, ef_construction {want_efc}, concurrently "
                "(searches and writes go on"
            )
        if not behind.owner:
            self.notice(
                f"pgrag: {what}: `pgrag reindex`, as the owner of pgrag.chunks, "
                + (
                    "finishes it"
                    if behind.unfinished
                    else f"rebuilds it with m {want_m}, ef_construction {want_efc}"
                )
                + " (docs/search.md, 'The graph')"
            )
            return
        self.notice(
            f"pgrag: {what}: {doing}"
            + ("; docs/search.md, 'The graph')" if not behind.unfinished else "")
        )

        def stopping() -> bool:
            return self._reindex_cancel.is_set() or self.stop.is_set()

        def rebuild() -> None:
            started = time.perf_counter()
            try:
                done, tuned = filter_index.rebuild_and_tune(
                    self.url, should_stop=stopping, tuned_by="worker"
                )
            except IndexBusy:
                self.notice(
                    "pgrag: store index not rebuilt here: another session is building or "
                    "dropping an index of the chunks (a worker or `pgrag reindex`); it is left "
                    "to that one"
                )
                return
            except Exception as exc:  # noqa: BLE001 (told in one line, never a traceback)
                if stopping():
                    said = first_line(str(exc))
                    self.notice(
                        f"pgrag: store index rebuild {said}"
                        if isinstance(exc, IndexBuildFailed) and said.startswith("stopped ")
                        else "pgrag: store index rebuild stopped with the worker: the old index "
                        "stays as it was"
                    )
                    return
                self._reindex_failures += 1
                self._reindex_after = time.monotonic() + REINDEX_RETRY_S
                again = (
                    f"tried again after {REINDEX_RETRY_S / 60:.0f} minutes"
                    if self._reindex_failures < REINDEX_ATTEMPTS
                    else "not tried again by this worker: `pgrag reindex` runs it"
                )
                self.notice(f"pgrag: store index not rebuilt ({again}): {first_line(str(exc))}")
                return
            self._reindex_failures = 0
            line = (
                f"pgrag: store index {'swapped in' if done.finished_earlier else 'rebuilt'} "
                f"({time.perf_counter() - started:.0f} s): m {done.m}, ef_construction "
                f"{done.ef_construction}, {done.size_bytes / 2**20:,.0f} MB"
            )
            if isinstance(tuned, str):
                line += f"; ef_search not measured ({tuned}): `pgrag tune` measures it"
            elif tuned is not None:
                self.last_tune = tuned
                used = next((p for p in tuned.points if p.ef_search == tuned.chosen), tuned.closest)
                line += f"; ef_search {used.ef_search}: recall@{tuned.k} {used.recall:.3f}"
            elif stopping():
                line += "; ef_search not measured (the worker stopped): `pgrag tune` measures it"
            self.notice(line)

        self._reindex = threading.Thread(target=rebuild, name="pgrag-reindex", daemon=True)
        self._reindex.start()

    def join_reindex(self) -> None:
        """Wait for a store index rebuild this worker started (``_maybe_reindex``), if any."""
        if self._reindex is not None:
            self._reindex.join()
            self._reindex = None

    def run_forever(
        self,
        on_batch: Callable[[BatchResult], None] | None = None,
        *,
        poll_s: float = DEFAULT_POLL_S,
        outage_pause_s: float = 30.0,
        on_reconnect: Callable[[Reconnect], None] | None = None,
        backoff: Backoff | None = None,
        on_render: Callable[[RenderResult], None] | None = None,
    ) -> DrainResult:
        """Drain, then sleep until a NOTIFY on pgrag_chunks or pgrag_render (or ``poll_s``);
        until stop is set.

        A lost connection (the server restarting, a failover, a terminated backend) is not an
        end: the worker drops its connections, waits (``backoff``: 1 s doubling to 60 s, with
        jitter), connects again and goes on, telling ``on_reconnect`` each time. The batch it
        held is taken again (its locks went with the session); nothing is lost. Any other error
        ends the run.
        """
        started = time.perf_counter()
        total = DrainResult()
        backoff = backoff or Backoff()
        failures = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(
                    self.url, autocommit=True, application_name="pgrag worker listener"
                ) as listener:
                    for channel in (NOTIFY_CHANNEL, RENDER_CHANNEL):
                        listener.execute(sql.SQL("listen {}").format(sql.Identifier(channel)))
                    while not self.stop.is_set():
                        result = self.drain(on_batch, on_render)
                        total = _merge(total, result)
                        if failures and on_reconnect is not None:
                            on_reconnect(Reconnect(failures, 0.0, None))  # back: say so once
                        failures = 0
                        if self.stop.is_set():
                            break
                        # after work, look again soon: writers that committed meanwhile
                        # may not have notified (pgrag._notify wakes once per burst)
                        did_work = (
                            result.rendered_entries > 0 or result.indexed > 0 or result.claimed > 0
                        )
                        pause = (
                            outage_pause_s
                            if result.outage
                            else (BUSY_POLL_S if did_work else poll_s)
                        )
                        self._wait_for_notify(listener, pause)
            except (psycopg.Error, PgragError) as exc:
                if not connection_lost(exc):
                    raise
                self._close_connection()  # a rebuild in flight has its own connections
                failures += 1
                delay = backoff.delay(failures)
                if on_reconnect is not None:
                    on_reconnect(Reconnect(failures, delay, exc))
                self.stop.wait(delay)
        return _with(total, seconds=time.perf_counter() - started, stopped=True)

    def _wait_for_notify(self, listener: psycopg.Connection[Any], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if any(True for _ in listener.notifies(timeout=min(0.5, left), stop_after=1)):
                for _ in listener.notifies(timeout=0.0):  # swallow the rest of the burst
                    pass
                return


@dataclass(frozen=True)
class Backoff:
    """How long a worker waits before its n-th attempt to connect again: ``base_s`` doubling
    up to ``max_s``, each wait between half and all of that (jitter, so that many workers
    do not all come back at the same instant)."""

    base_s: float = 1.0
    max_s: float = 60.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_s, self.base_s * 2.0 ** min(attempt - 1, 30))
        return ceiling * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not a secret)


@dataclass(frozen=True)
class Reconnect:
    """One event of a worker's reconnection: ``attempt`` failures in a row so far, and the
    wait before the next try with the error that caused it; ``error`` None: connected again
    after ``attempt`` failures."""

    attempt: int
    delay_s: float
    error: BaseException | None


# How many times a batch's vectors are written when the server rolls the write back to settle a
# conflict (pgrag.store_embeddings; then the batch fails as after a lost connection).
STORE_ATTEMPTS = 3

# SQLSTATE classes and codes of a connection that is gone or a server not (yet) serving:
# connection exceptions, the server shutting down or starting, a terminated backend; and of a
# transaction the server rolled back to settle a conflict, which the next attempt does not
# meet (a serialization failure: on a store partitioned by tenant, a render that moved a chunk
# to another tenant's partition while the worker wrote its vector; a deadlock).
_LOST_CLASSES = ("08",)
_LOST_STATES = frozenset({"57P01", "57P02", "57P03", "57P05", "40001", "40P01"})


def connection_lost(exc: BaseException) -> bool:
    """Whether an error means the connection or the server went away, or the server rolled
    back the transaction to settle a conflict (try again), rather than a fault of the work
    (stop)."""
    if isinstance(exc, ConnectionFailed):
        return True
    cause = exc.__cause__ if isinstance(exc, PgragError) else exc
    if not isinstance(cause, psycopg.OperationalError):
        return False
    state = cause.sqlstate
    # no SQLSTATE: the client library lost the socket ("consuming input failed", "server
    # closed the connection unexpectedly")
    return state is None or state.startswith(_LOST_CLASSES) or state in _LOST_STATES


def _with(r: DrainResult, *, seconds: float, stopped: bool) -> DrainResult:
    return replace(r, seconds=seconds, stopped=stopped)


def _merge(a: DrainResult, b: DrainResult) -> DrainResult:
    return DrainResult(
        batches=a.batches + b.batches,
        rendered_entries=a.rendered_entries + b.rendered_entries,
        rendered_chunks=a.rendered_chunks + b.rendered_chunks,
        indexed=a.indexed + b.indexed,
        claimed=a.claimed + b.claimed,
        written=a.written + b.written,
        from_cache=a.from_cache + b.from_cache,
        model_texts=a.model_texts + b.model_texts,
        changed=a.changed + b.changed,
        failures=(a.failures + b.failures)[-1000:],
        outage=b.outage,
    )


@dataclass
class StopOnSignals:
    """SIGINT / SIGTERM set ``event`` (finish the batch, then stop); a second one interrupts."""

    event: threading.Event
    _previous: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> StopOnSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _since(started: float) -> float:
    return time.perf_counter() - started
