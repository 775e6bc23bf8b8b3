"""Filter indexes: partial HNSW indexes over the chunks of the filters searches use most.

A filtered vector search on the store's one HNSW index walks the graph of every chunk and checks
the filter on each chunk it visits: at 10% or 1% of 1,000,000 chunks that walk visits thousands
of chunks for ten hits (docs/benchmarks.md). A filter index is ``create index ... using hnsw
(embedding) where <the filter>``: its graph holds only the matching chunks, so a search with that
filter walks a small graph and checks nothing. PostgreSQL's planner picks it by itself for any
search whose filter contains the index's filter: the planner proves a partial index's predicate
from identical conditions, so searches compile the keys of filter indexes
(``pgrag._filter_index_keys()``, read from the indexes' comments) into conditions of their own,
in canonical form (``split_keys`` of ``pgrag._filter_sql``), and the index's predicate is
compiled the same way, by the same SQL function (``pgrag._filter_index_plan`` writes the DDL;
``CREATE INDEX CONCURRENTLY`` cannot run in a function, so this module runs it). Nothing else
changes: the same statement, the same exact scan below ``exact_threshold`` rows, the same
``hnsw.ef_search``.

The index is built ``concurrently`` (writers are not blocked; a failed build leaves an invalid
index, which the next ``add`` of the same filter replaces) with the store index's ``m`` and
``ef_construction``; its comment holds the filter, which ``list`` shows. Each index costs a write
on every matching chunk's vector, and memory: size them to the filters that matter.

The store index itself is rebuilt here too (``rebuild_store_index``, ``pgrag reindex``): a
denser graph for a store that outgrew the default one, built concurrently beside it, then
swapped in (``pgrag._store_index_plan``, ``pgrag._store_index_swap``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString, NoReturn

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from pgrag import config
from pgrag.errors import (
    ConfigError,
    IndexBuildFailed,
    IndexBusy,
    from_database,
    mapped_database_errors,
)
from pgrag.filters import filter_param, parse_filter_json

if TYPE_CHECKING:
    from pgrag.tune import TuneResult

PREFIX = "chunks_embedding_hnsw_f_"
CLEANUP_LOCK_TIMEOUT = "5s"

_LIST: LiteralString = """
select i.relname as name,
       coalesce(obj_description(i.oid, 'pg_class'), '') as filter_json,
       pg_get_expr(x.indpred, x.indrelid) as predicate,
       -- (a partitioned store's index: its partitions' graphs)
       coalesce((select sum(greatest(c.reltuples, 0)) from pg_partition_tree(i.oid) t
                   join pg_class c on c.oid = t.relid),
                greatest(i.reltuples, 0))::bigint as rows,
       coalesce((select sum(pg_relation_size(t.relid)) from pg_partition_tree(i.oid) t),
                pg_relation_size(i.oid))::bigint as size_bytes,
       x.indisvalid as valid,
       exists (select from pg_stat_progress_create_index p
               where (p.index_relid = i.oid  -- (a partition's: named after the parent's oid)
                      or p.index_relid in (select c.oid from pg_class c
                                            where c.relname like 'chunks\\_hnsw\\_'
                                                                 || i.oid || '\\_%'))
                 and p.datid = (select oid from pg_database where datname = current_database()))
           as building
from pg_index x
join pg_class i on i.oid = x.indexrelid
where x.indrelid = 'pgrag.chunks'::regclass and i.relname like 'chunks\\_embedding\\_hnsw\\_f\\_%'
order by i.relname
"""
# One build or drop of an index of the chunks at a time, whichever index: two concurrent builds
# on one table wait for each other's snapshots, and one of them dies of a deadlock at the end.
_LOCK: LiteralString = (
    "select pg_try_advisory_lock(hashtextextended('pgrag chunks index builds', 0))"
)
_UNLOCK: LiteralString = (
    "select pg_advisory_unlock(hashtextextended('pgrag chunks index builds', 0))"
)
_BUILDING: LiteralString = (
    "select exists (select from pg_stat_progress_create_index "
    "where index_relid = to_regclass('pgrag.' || quote_ident(%s)) "
    "and datid = (select oid from pg_database where datname = current_database()))"
)
_PROGRESS: LiteralString = (
    "select phase, blocks_done, blocks_total from pg_stat_progress_create_index where pid = %s"
)


@dataclass(frozen=True)
class FilterIndex:
    """One filter index: its name, the filter it serves and its SQL predicate."""

    name: str
    filter_json: str
    predicate: str
    rows: int
    size_bytes: int
    valid: bool
    building: bool  # a build in progress (the index is invalid until it ends)

    @property
    def filter(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.filter_json)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Plan:
    """What ``add`` will run: the index's name, its filter and its DDL, written by the server
    (``pgrag._filter_index_plan``: every identifier quoted, every value a literal)."""

    name: str
    filter_json: str
    create_ddl: str
    comment_ddl: str

    @property
    def create(self) -> bytes:
        return self.create_ddl.encode()

    @property
    def comment(self) -> bytes:
        return self.comment_ddl.encode()


def _as_dict(filter: Mapping[str, Any] | str) -> dict[str, Any]:
    """The filter as a dict (from JSON text if given text); InvalidFilter if it is not one."""
    if isinstance(filter, str):
        return parse_filter_json(filter)
    return dict(filter)


def plan(conn: psycopg.Connection[Any], filter: Mapping[str, Any] | str) -> Plan:
    """The CREATE INDEX of ``filter``'s index, compiled exactly as a search compiles it, against
    the declared metadata schemas (InvalidFilter for a filter a search would refuse, ConfigError
    for one that selects every chunk or none)."""
    flt = _as_dict(filter)
    if not flt:
        raise ConfigError(
            "a filter index needs a filter: the store index already serves unfiltered searches"
        )
    with mapped_database_errors(), conn.cursor(row_factory=class_row(Plan)) as cur:
        row = cur.execute(
            "select * from pgrag._filter_index_plan(%s::jsonb)", (filter_param(flt),)
        ).fetchone()
    assert row is not None
    return row


def list_indexes(conn: psycopg.Connection[Any]) -> list[FilterIndex]:
    with conn.cursor(row_factory=class_row(FilterIndex)) as cur:
        return cur.execute(_LIST).fetchall()


def find(conn: psycopg.Connection[Any], name: str) -> FilterIndex | None:
    return next((i for i in list_indexes(conn) if i.name == name), None)


def add(
    url: str,
    filter: Mapping[str, Any] | str,
    *,
    maintenance_work_mem: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[FilterIndex, bool]:
    """Build ``filter``'s index (concurrently) unless a valid one exists; (index, built).

    An invalid index of the same filter (a build that failed or was cancelled) is dropped and
    built again. ``progress(phase, blocks_done, blocks_total)`` is called about twice a second.
    A store partitioned by tenant gets the index partition by partition (``_build_partitions``:
    PostgreSQL builds no index concurrently on a partitioned table); one left partly built
    there is gone on with.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        p = plan(conn, filter)
        with _exclusive(conn, p.name):
            existing = find(conn, p.name)
            if existing is not None and existing.valid:
                if not existing.filter_json:  # built by a process killed before its comment
                    conn.execute(p.comment)
                    existing = find(conn, p.name)
                assert existing is not None
                return existing, False
            set_maintenance_work_mem(conn, maintenance_work_mem)
            if store_partitioned(conn):
                _add_partitioned(url, conn, p, progress)
            else:
                if existing is not None:
                    conn.execute(
                        sql.SQL("drop index concurrently if exists {}").format(_ident(p.name))
                    )
                try:
                    _run_with_progress(url, conn, p.create, progress)
                except BaseException as exc:
                    _build_failed(
                        conn,
                        exc,
                        p.name,
                        f"building filter index {p.name}",
                        "the partial index was dropped",
                        f"drop it with `pgrag filter-index drop {p.name}`",
                        "run the same add again",
                    )
            conn.execute(p.comment)
            built = find(conn, p.name)
    assert built is not None
    return built, True


def store_partitioned(conn: psycopg.Connection[Any]) -> bool:
    """Whether the chunk store is partitioned by tenant (docs/scaling.md)."""
    row = conn.execute("select pgrag._store_partitioned()").fetchone()
    return bool(row and row[0])


def _add_partitioned(
    url: str,
    conn: psycopg.Connection[Any],
    p: Plan,
    progress: Callable[[str, int, int], None] | None,
) -> None:
    """A filter index on a partitioned store: made on the parent alone (ON ONLY, invalid until
    every partition's graph is attached), then each partition's graph built concurrently and
    attached. A run that fails leaves the partitions done attached, and the next add of the
    filter goes on from there."""
    again = "run the same `pgrag filter-index add` again: it goes on from there"
    _short_locks(conn, p.create, None, f"before {p.name} was begun", again)
    conn.execute(p.comment)  # (at once: `list` shows a half-built index's filter)
    words = _Words(
        what=f"filter index {p.name}",
        intact="searches use the store index meanwhile; the partitions done so far keep their "
        "graphs",
        cleanup=f"the next add of the filter, or `pgrag filter-index drop {p.name}`, drops it",
        again=again,
    )
    if not _build_partitions(url, conn, p.name, progress, None, words):
        raise IndexBuildFailed(
            f"filter index {p.name} came out incomplete (the partitions changed while it was "
            f"built): {again}"
        )


def drop(url: str, filter_or_name: str) -> str | None:
    """Drop the index of a filter (JSON text) or of a name; its name, or None if none existed."""
    with psycopg.connect(url, autocommit=True) as conn:
        text = filter_or_name.strip()
        if text.startswith(PREFIX):
            name = text
        else:
            p = plan(conn, text)
            # an index of the same filter built by an older pgrag may have another name
            same = [i.name for i in list_indexes(conn) if i.filter == json.loads(p.filter_json)]
            name = p.name if find(conn, p.name) is not None or not same else same[0]
        with _exclusive(conn, name):
            if find(conn, name) is None:
                return None
            if store_partitioned(conn):  # (no DROP INDEX CONCURRENTLY of a partitioned index)
                statement = sql.SQL("drop index if exists {}").format(_ident(name))
                _drop_partitioned(
                    conn,
                    name,
                    statement.as_bytes(conn),
                    None,
                    f"before {name} was dropped",
                    "run the same `pgrag filter-index drop` again",
                )
            else:
                conn.execute(sql.SQL("drop index concurrently if exists {}").format(_ident(name)))
    return name


@contextlib.contextmanager
def _exclusive(conn: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """One add, drop or rebuild of an index of the chunks at a time: a concurrent build of the
    same index shows as an invalid index, which a second add would take for a crashed one and
    drop, and two builds on one table deadlock in their last phase."""
    row = conn.execute(_LOCK).fetchone()
    building = conn.execute(_BUILDING, (name,)).fetchone()
    if not (row and row[0]) or (building and building[0]):
        if row and row[0]:
            conn.execute(_UNLOCK)
        raise IndexBusy(
            f"an index of pgrag.chunks ({name} or another) is being built or dropped by another "
            "session: wait for it (pg_stat_progress_create_index shows a build), then run the "
            "command again"
        )
    try:
        yield
    finally:
        if not conn.broken:  # a lost connection took the session lock with it
            with contextlib.suppress(psycopg.Error):
                conn.execute(_UNLOCK)


def _drop_quickly(conn: psycopg.Connection[Any], name: str) -> bool:
    """Drop an invalid index unless that waits on open transactions longer than
    CLEANUP_LOCK_TIMEOUT (the ones that may have stalled the build); True if it is left."""
    if conn.broken:
        return True
    try:
        conn.execute("select set_config('lock_timeout', %s, false)", (CLEANUP_LOCK_TIMEOUT,))
        conn.execute(sql.SQL("drop index concurrently if exists {}").format(_ident(name)))
    except psycopg.Error:  # the lock timeout, or a connection lost meanwhile
        return True
    finally:
        if not conn.broken:
            conn.execute("select set_config('lock_timeout', '0', false)")
    return False


STORE_INDEX = "chunks_embedding_hnsw"
NEW_STORE_INDEX = "chunks_embedding_hnsw_new"  # (not a filter index: no PREFIX)


@dataclass(frozen=True)
class StoreIndexRebuild:
    """What ``rebuild_store_index`` did: the graph's parameters before and after, the vectors
    it holds, the index's size, and whether it finished a rebuild an earlier run left (whose
    graph it kept, whatever this run asked)."""

    m: int
    ef_construction: int
    previous_m: int
    previous_ef_construction: int
    vectors: int
    size_bytes: int
    finished_earlier: bool = False


_STORE_INDEX_STATE: LiteralString = """
select s.hnsw_m, s.hnsw_ef_construction, pgrag._vectors() as vectors,
       (select x.indisvalid from pg_index x
         where x.indexrelid = to_regclass('pgrag.chunks_embedding_hnsw_new')) as new_valid,
       (select pg_has_role(c.relowner, 'USAGE') from pg_class c
         where c.oid = 'pgrag.chunks'::regclass) as owner,
       pgrag._store_partitioned() as partitioned,
       (select o.option_value from pg_class c, pg_options_to_table(c.reloptions) o
         where c.oid = to_regclass('pgrag.chunks_embedding_hnsw_new')
           and o.option_name = 'm') as new_m,
       (select o.option_value from pg_class c, pg_options_to_table(c.reloptions) o
         where c.oid = to_regclass('pgrag.chunks_embedding_hnsw_new')
           and o.option_name = 'ef_construction') as new_ef_construction
from pgrag.settings s
"""


@dataclass(frozen=True)
class GraphBehind:
    """The store index against its size's graph (``graph_behind``): the vectors, the current
    and the wanted (m, ef_construction), whether a rebuild left its work unfinished
    (``unfinished``: a valid chunks_embedding_hnsw_new, which the next rebuild swaps in, or on
    a partitioned store a partly built one, which it goes on with: ``partial``), and whether
    this role owns pgrag.chunks (only the owner rebuilds it)."""

    vectors: int
    current: tuple[int, int]
    wanted: tuple[int, int]
    unfinished: bool
    owner: bool
    partial: bool = False


def graph_behind(conn: psycopg.Connection[Any]) -> GraphBehind | None:
    """The store index's graph against the one ``pgrag reindex`` would build for the store's
    size (``choose_graph``); None when they are the same and no rebuild is unfinished."""
    with conn.transaction():
        row = conn.execute(_STORE_INDEX_STATE).fetchone()
    assert row is not None
    current = (int(row[0]), int(row[1]))
    wanted = choose_graph(int(row[2]), current, None, None)
    partial = row[3] is False and bool(row[5])  # (a partitioned store's: gone on with)
    unfinished = bool(row[3]) or partial
    if wanted == current and not unfinished:
        return None
    return GraphBehind(int(row[2]), current, wanted, unfinished, bool(row[4]), partial)


_REBUILD_STATE: LiteralString = """
select x.indisvalid,
       (select p.phase || coalesce(': ' || round(100.0 * p.blocks_done
                                                 / nullif(p.blocks_total, 0))::text || '%', '')
               || case when parts.n > 0
                       then format(', partition %s of %s', parts.attached + 1, parts.n)
                       else '' end
          from pg_stat_progress_create_index p
         where (p.index_relid = x.indexrelid  -- (a partition's: named after the parent's oid)
                or p.index_relid in (select c.oid from pg_class c
                                      where c.relname like 'chunks\\_hnsw\\_'
                                                           || x.indexrelid || '\\_%'))
           and p.datid = (select oid from pg_database where datname = current_database())
         limit 1)
from pg_index x,
     lateral (select (select count(*) from pg_inherits h
                       where h.inhparent = 'pgrag.chunks'::regclass) as n,
                     (select count(*) from pg_inherits h
                       where h.inhparent = x.indexrelid) as attached) parts
where x.indexrelid = to_regclass('pgrag.chunks_embedding_hnsw_new')
"""


def rebuild_state(conn: psycopg.Connection[Any]) -> str | None:
    """A rebuild of the store index under way or left unfinished, in words (``pgrag status``);
    None when there is none."""
    with conn.transaction():
        row = conn.execute(_REBUILD_STATE).fetchone()
    if row is None:
        return None
    if row[1] is not None:
        return f"being rebuilt ({row[1]}); searches use the old graph meanwhile"
    if row[0]:
        return (
            f"a rebuilt index ({NEW_STORE_INDEX}) waits beside the old one: the next "
            "`pgrag reindex`, or a worker when it starts, swaps it in"
        )
    # (a role without pg_read_all_stats sees no other role's build progress)
    return (
        f"{NEW_STORE_INDEX} is not built yet: being built by a session whose progress this role "
        "cannot see, or left by a build that stopped (the next `pgrag reindex`, or a worker when "
        "it starts, goes on with it on a partitioned store, builds it again on one table)"
    )


def choose_graph(
    vectors: int, current: tuple[int, int], m: int | None, ef_construction: int | None
) -> tuple[int, int]:
    """The graph a rebuild builds: the given m and ef_construction, else the store size's
    (``config.graph_for``) but never sparser than the current graph; ef_construction at least
    twice m (pgvector's rule)."""
    sized = config.graph_for(vectors)
    want_m = m or max(sized[0], current[0])
    want_efc = ef_construction or max(sized[1], current[1], 2 * want_m)
    return want_m, want_efc


def rebuild_store_index(
    url: str,
    *,
    m: int | None = None,
    ef_construction: int | None = None,
    maintenance_work_mem: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> StoreIndexRebuild:
    """Rebuild the store's HNSW index with ``m`` and ``ef_construction`` (default
    ``choose_graph``), concurrently: searches and writes go on, on the old graph until the new
    one replaces it. A new index an earlier run finished building is swapped in as it is (that
    run's graph; ``finished_earlier``); a half-built one is dropped and built again.
    IndexBuildFailed if the build fails or is cancelled (the old index stays as it was).
    ``progress(phase, done, total)``: the build's phases, then the drop of the old index,
    which waits for the transactions open on the chunks. ``should_stop``, asked every half
    second while the index builds and every second while the old one is dropped: True cancels
    the build, or leaves the new index valid beside the old one (which the next rebuild swaps
    in); IndexBuildFailed either way. A store partitioned by tenant is rebuilt partition by
    partition (``_build_partitions``); a partly built new index there is gone on with, with
    its own graph, unless ``m`` or ``ef_construction`` ask for another."""
    with psycopg.connect(url, autocommit=True) as conn, _exclusive(conn, STORE_INDEX):
        row = conn.execute(_STORE_INDEX_STATE).fetchone()
        assert row is not None
        prev = (int(row[0]), int(row[1]))
        vectors, new_valid = int(row[2]), row[3]
        asked = (m, ef_construction)
        m, ef_construction = choose_graph(vectors, prev, m, ef_construction)
        with mapped_database_errors():  # PR006: a graph pgvector refuses, or not the owner
            p = conn.execute(
                "select create_ddl, drop_ddl, drop_new_ddl, partitioned "
                "from pgrag._store_index_plan(%s, %s)",
                (m, ef_construction),
            ).fetchone()
        assert p is not None
        create, drop_old, drop_new = (str(x).encode() for x in p[:3])
        finished_earlier = bool(new_valid)  # built by a run that died: swapped in as it is
        if p[3]:  # partitioned: partition by partition, the old index dropped in one statement
            earlier = (row[6], row[7])  # a partly built new index: its graph
            if new_valid is False and any(
                a is not None and str(a) != e for a, e in zip(asked, earlier, strict=True)
            ):
                # asked for another graph than the one a stopped run began: begun again
                _drop_partitioned(
                    conn, NEW_STORE_INDEX, drop_new, should_stop, "before rebuilding it"
                )
            if not finished_earlier:
                set_maintenance_work_mem(conn, maintenance_work_mem)
                # the parent's (ON ONLY: invalid until each partition's is attached)
                _short_locks(conn, create, should_stop, "before the new store index was begun")
                if not _build_partitions(
                    url, conn, NEW_STORE_INDEX, progress, should_stop, _REBUILD
                ):
                    _drop_partitioned(
                        conn, NEW_STORE_INDEX, drop_new, should_stop, "before rebuilding it"
                    )
                    raise IndexBuildFailed(
                        "the new store index came out incomplete (the partitions changed while "
                        "it was built): dropped; the old index is as it was; run `pgrag "
                        "reindex` again"
                    )
            if progress is not None:
                progress("dropping the old index (waits for a lock on each partition)", 0, 1)
            _short_locks(conn, drop_old, should_stop, _KEPT)
        elif not finished_earlier:
            if new_valid is not None:  # half built by a run that died
                _drop_stoppable(url, conn, drop_new, should_stop, "before rebuilding it")
            set_maintenance_work_mem(conn, maintenance_work_mem)
            try:
                _run_with_progress(url, conn, create, progress, should_stop)
            except BaseException as exc:
                _build_failed(
                    conn,
                    exc,
                    NEW_STORE_INDEX,
                    "rebuilding the store index",
                    "the store's index is as it was",
                    "the next `pgrag reindex` drops it",
                    "run `pgrag reindex` again",
                )
        if not p[3]:
            if progress is not None:
                progress("dropping the old index (waits for open transactions)", 0, 1)
            _drop_stoppable(url, conn, drop_old, should_stop, _KEPT)
        swapped = conn.execute("select * from pgrag._store_index_swap()").fetchone()
        assert swapped is not None
        if progress is not None:
            progress("dropping the old index", 1, 1)
    return StoreIndexRebuild(
        m=int(swapped[0]),
        ef_construction=int(swapped[1]),
        previous_m=prev[0],
        previous_ef_construction=prev[1],
        vectors=vectors,
        size_bytes=int(swapped[2]),
        finished_earlier=finished_earlier,
    )


_PARTITION_PLAN: LiteralString = (
    "select partition_name, index_name, state, create_ddl, drop_ddl, attach_ddl "
    "from pgrag._index_partition_plan(%s)"
)


@dataclass(frozen=True)
class _Words:
    """What a partition by partition build says when it stops or fails: the index, what
    stands meanwhile, how its debris goes, and how to go on."""

    what: str
    intact: str
    cleanup: str
    again: str


_REBUILD = _Words(
    what="the new store index",
    intact="the old index serves searches; the partitions done so far keep their new graphs",
    cleanup="the next `pgrag reindex` drops it",
    again="run `pgrag reindex` again (or start the worker): it goes on from there",
)


def _build_partitions(
    url: str,
    conn: psycopg.Connection[Any],
    parent: str,
    progress: Callable[[str, int, int], None] | None,
    should_stop: Callable[[], bool] | None,
    words: _Words,
) -> bool:
    """A partitioned store's index ``parent`` (made on the parent table alone), partition by
    partition: each partition's graph built concurrently, then attached to it
    (pgrag._index_partition_plan). A run that stops or fails leaves the partitions done
    attached: the next one goes on from there. Whether ``parent`` came out valid (it does not
    when the partitions changed meanwhile: one detached, say)."""
    todo = conn.execute(_PARTITION_PLAN, (parent,)).fetchall()
    for i, (part, name, state, create, drop, attach) in enumerate(todo, 1):
        if should_stop is not None and should_stop():
            raise IndexBuildFailed(
                f"stopped before {words.what} was built on partition {part} ({i - 1} of "
                f"{len(todo)} built); {words.intact}; {words.again}"
            )

        def shown(phase: str, done: int, total: int, part: str = part, i: int = i) -> None:
            assert progress is not None
            progress(f"{part} ({i}/{len(todo)}): {phase}", done, total)

        if state == "invalid":  # a build that died on it
            _drop_stoppable(url, conn, str(drop).encode(), should_stop, "before rebuilding it")
        if state != "built":
            try:
                _run_with_progress(
                    url,
                    conn,
                    str(create).encode(),
                    None if progress is None else shown,
                    should_stop,
                )
            except BaseException as exc:
                _build_failed(
                    conn,
                    exc,
                    str(name),
                    f"building {words.what} on partition {part}",
                    words.intact,
                    words.cleanup,
                    words.again,
                )
        try:
            _short_locks(
                conn,
                str(attach).encode(),
                should_stop,
                f"before {words.what} was attached on partition {part}; {words.again}",
                words.again,
            )
        except psycopg.Error as exc:  # (a partition detached or dropped meanwhile, say)
            raise IndexBuildFailed(
                f"attaching {words.what}'s graph on partition {part} failed: "
                f"{_first_line(exc)} ({words.intact}; {words.again})"
            ) from exc
    valid = conn.execute(
        "select indisvalid from pg_index where indexrelid = to_regclass(%s)", (f"pgrag.{parent}",)
    ).fetchone()
    return bool(valid and valid[0])


# A partitioned index's graphs built on partitions and never attached to it (a build that
# failed, or a process killed between a partition's build and its attach): named after the
# parent's oid (pgrag._index_partition_plan), dropped with it.
_UNATTACHED: LiteralString = """
select format('drop index concurrently if exists pgrag.%%I', c.relname)
  from pg_class c
 where c.relnamespace = 'pgrag'::regnamespace and c.relkind = 'i'
   and c.relname like 'chunks\\_hnsw\\_' || %s::text || '\\_%%'
   and not exists (select from pg_inherits h where h.inhrelid = c.oid)
"""


def _drop_partitioned(
    conn: psycopg.Connection[Any],
    name: str,
    statement: bytes,
    should_stop: Callable[[], bool] | None,
    stopped: str,
    again: str = "run `pgrag reindex` again, which goes on where this run stopped",
) -> None:
    """Drop a partitioned index of the chunks (``statement``, in short lock tries), and then
    its partitions' graphs that were never attached to it (DROP INDEX takes only those that
    were): a ready index left behind would be written at every write, unseen."""
    row = conn.execute("select to_regclass(%s)::oid", (f"pgrag.{name}",)).fetchone()
    _short_locks(conn, statement, should_stop, stopped, again)
    if row is None or row[0] is None:
        return
    for (drop,) in conn.execute(_UNATTACHED, (int(row[0]),)).fetchall():
        conn.execute(str(drop).encode())


SHORT_LOCKS_PATIENCE_S = 600.0


def _short_locks(
    conn: psycopg.Connection[Any],
    statement: bytes,
    should_stop: Callable[[], bool] | None,
    stopped: str,
    again: str = "run `pgrag reindex` again, which goes on where this run stopped",
) -> None:
    """Run a statement that takes the chunks' locks for a moment (a partitioned store's new
    parent index, a partition's graph attached to it, the old index dropped: no CONCURRENTLY
    for a partitioned index, so the drop takes every partition's ACCESS EXCLUSIVE lock). Each
    try waits at most a second for its locks (reads and writes queue behind a waiting lock: a
    transaction left open would otherwise stall every search), then lets the queue through
    for a growing pause (0.1 s doubling to 5 s); between tries, ``should_stop`` (IndexBuildFailed
    "stopped <stopped>"). After SHORT_LOCKS_PATIENCE_S of tries, IndexBuildFailed naming the
    sessions in the way. A deadlock with such a session counts as a try."""
    conn.execute("select set_config('lock_timeout', '1s', false)")
    deadline = time.monotonic() + SHORT_LOCKS_PATIENCE_S
    pause = 0.1
    try:
        while True:
            if should_stop is not None and should_stop():
                raise IndexBuildFailed(f"stopped {stopped}")
            try:
                conn.execute(statement)
                return
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                pass
            if time.monotonic() > deadline:
                row = conn.execute(
                    "select string_agg(distinct l.pid::text, ', ') from pg_locks l "
                    "join pg_inherits h on l.relation in (h.inhrelid, h.inhparent) "
                    "where h.inhparent = 'pgrag.chunks'::regclass and l.granted "
                    "and l.pid <> pg_backend_pid()"
                ).fetchone()
                raise IndexBuildFailed(
                    f"could not lock pgrag.chunks for {SHORT_LOCKS_PATIENCE_S / 60:.0f} minutes "
                    f"(sessions holding it: {row[0] if row and row[0] else 'none now'}; "
                    f"pg_stat_activity shows them): end those transactions and {again}"
                )
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
    finally:
        conn.execute("select set_config('lock_timeout', '0', false)")


_KEPT = (
    f"before the new store index replaced the old one: {NEW_STORE_INDEX} is built and serves "
    "searches beside the old one; the next `pgrag reindex`, or the worker when it starts, swaps "
    "it in"
)


def _drop_stoppable(
    url: str,
    conn: psycopg.Connection[Any],
    drop: bytes,
    should_stop: Callable[[], bool] | None,
    state: str,
) -> None:
    """Drop an index concurrently (it waits for the transactions open on the chunks, without
    end while one stays open), cancelled when ``should_stop`` says so: IndexBuildFailed
    "stopped <state>"."""
    try:
        _run_with_progress(url, conn, drop, None, should_stop)
    except psycopg.errors.QueryCanceled as exc:
        if should_stop is None or not should_stop():
            raise
        raise IndexBuildFailed(f"stopped {state}") from exc


def rebuild_and_tune(
    url: str,
    *,
    m: int | None = None,
    ef_construction: int | None = None,
    maintenance_work_mem: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    tune: bool = True,
    tuned_by: str = "pgrag reindex",
) -> tuple[StoreIndexRebuild, TuneResult | str | None]:
    """``rebuild_store_index``, then (unless ``tune`` is False) ef_search measured on the new
    graph as the worker measures it: ``pgrag reindex``, and the worker when the store outgrew
    its graph. Second: the measurement; None when not taken (``tune`` False, fewer vectors
    than the worker tunes, or stopped); or why it failed (the new index stays, searches keep
    the old ef_search)."""
    from pgvector.psycopg import register_vector

    from pgrag import tune as tuning
    from pgrag.errors import PgragError

    done = rebuild_store_index(
        url,
        m=m,
        ef_construction=ef_construction,
        maintenance_work_mem=maintenance_work_mem,
        progress=progress,
        should_stop=should_stop,
    )
    if not tune or done.vectors < tuning.AUTO_MIN_CHUNKS:
        return done, None
    try:
        with psycopg.connect(url, autocommit=True) as conn, mapped_database_errors():
            register_vector(conn)
            return done, tuning.auto_tune(conn, tuned_by=tuned_by, should_stop=should_stop)
    except tuning.TuneStopped:
        return done, None
    except (PgragError, psycopg.Error) as exc:
        return done, _first_line(exc)


def set_maintenance_work_mem(conn: psycopg.Connection[Any], value: str | None) -> None:
    """The build's memory for this session; ConfigError for a value that is not a size."""
    if value is None:
        return
    try:
        conn.execute("select set_config('maintenance_work_mem', %s, false)", (value,))
    except psycopg.errors.InvalidParameterValue as exc:
        raise ConfigError(
            f"maintenance_work_mem {value!r} is not a memory size PostgreSQL takes: write e.g. "
            "2GB or 512MB"
        ) from exc


def _build_failed(
    conn: psycopg.Connection[Any],
    exc: BaseException,
    name: str,
    what: str,
    intact: str,
    cleanup: str,
    again: str,
) -> NoReturn:
    """Called while handling ``exc``, a failed concurrent build of ``name``: drop the invalid
    index it left, unless open transactions hold that up, then raise what the caller should
    see (``exc`` itself for a KeyboardInterrupt or an error not of the database's, when
    nothing is left behind; pgrag's own error; else IndexBuildFailed saying what is left)."""
    left = _drop_quickly(conn, name)
    if (isinstance(exc, KeyboardInterrupt) and not left) or not isinstance(
        exc, psycopg.Error | KeyboardInterrupt
    ):
        raise  # (the exception being handled)
    mapped = from_database(exc) if isinstance(exc, psycopg.Error) else None
    if mapped is not None and not left:
        raise mapped from exc
    after = (
        f"invalid index {name} is left behind, as an open transaction holds it: {cleanup}"
        if left
        else intact
    )
    raise IndexBuildFailed(
        f"{what} failed: {_first_line(exc) or 'interrupted'} ({after}; fix the cause and {again})"
    ) from exc


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier("pgrag", name)


def _run_with_progress(
    url: str,
    conn: psycopg.Connection[Any],
    statement: bytes,
    progress: Callable[[str, int, int], None] | None,
    should_stop: Callable[[], bool] | None = None,
) -> None:
    """Run ``statement`` on ``conn``; meanwhile report its pg_stat_progress_create_index row,
    and cancel it when ``should_stop`` says so (the statement then fails: QueryCanceled)."""
    if progress is None and should_stop is None:
        conn.execute(statement)
        return
    pid = conn.info.backend_pid
    failure: list[BaseException] = []
    done = threading.Event()

    def build() -> None:
        try:
            conn.execute(statement)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=build, name="pgrag-filter-index", daemon=True)
    worker.start()
    try:
        with psycopg.connect(url, autocommit=True) as watch:
            while not done.wait(0.5):
                if should_stop is not None and should_stop():
                    conn.cancel_safe()
                    worker.join()
                    break
                row = watch.execute(_PROGRESS, (pid,)).fetchone()
                if row is not None and progress is not None:
                    progress(str(row[0]), int(row[1] or 0), int(row[2] or 0))
    except BaseException:  # Ctrl-C, a failing progress callback, a lost watch connection
        conn.cancel_safe()
        worker.join()
        raise
    worker.join()
    if failure:
        raise failure[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
