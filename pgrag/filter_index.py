"""Filter indexes: partial HNSW indexes over the chunks of the filters searches use most.

A filtered vector search on the store's one HNSW index walks the graph of every chunk and checks
the filter on each chunk it visits: at 10% or 1% of 1,000,000 chunks that walk visits thousands
of chunks for ten hits (docs/benchmarks.md). A filter index is ``create index ... using hnsw
(embedding) where <the filter>``: its graph holds only the matching chunks, so a search with that
filter walks a small graph and checks nothing. PostgreSQL's planner picks it by itself for any
search whose filter contains the index's filter: the planner proves a partial index's predicate
from identical conditions, so searches compile the keys of filter indexes
(``pgrag.filter_index_keys()``, read from the indexes' comments) into conditions of their own,
in canonical form (``split_keys`` in pgrag/filters.py), and the index's predicate is compiled
the same way. Nothing else changes: the same statement, the same exact scan below
``exact_threshold`` rows, the same ``hnsw.ef_search``.

The index is built ``concurrently`` (writers are not blocked; a failed build leaves an invalid
index, which the next ``add`` of the same filter replaces) with the store index's ``m`` and
``ef_construction``; its comment holds the filter, which ``list`` shows. Each index costs a write
on every matching chunk's vector, and memory: size them to the filters that matter.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from pgrag.errors import ConfigError, IndexBuildFailed, from_database
from pgrag.filters import compile_filter, parse_filter_json, with_literals
from pgrag.search import filter_schema, forget_schemas

PREFIX = "chunks_embedding_hnsw_f_"
CLEANUP_LOCK_TIMEOUT = "5s"

_LIST: LiteralString = """
select i.relname as name,
       coalesce(obj_description(i.oid, 'pg_class'), '') as filter_json,
       pg_get_expr(x.indpred, x.indrelid) as predicate,
       greatest(i.reltuples, 0)::bigint as rows,
       pg_relation_size(i.oid) as size_bytes,
       x.indisvalid as valid,
       exists (select from pg_stat_progress_create_index p
               where p.index_relid = i.oid
                 and p.datid = (select oid from pg_database where datname = current_database()))
           as building
from pg_index x
join pg_class i on i.oid = x.indexrelid
where x.indrelid = 'pgrag.chunks'::regclass and i.relname like 'chunks\\_embedding\\_hnsw\\_f\\_%'
order by i.relname
"""
# the store index's build parameters, which a filter index copies (its graph should be as good)
_STORE_OPTIONS: LiteralString = """
select coalesce(max(o.option_value) filter (where o.option_name = 'm'), s.hnsw_m::text)::int,
       coalesce(max(o.option_value) filter (where o.option_name = 'ef_construction'),
                s.hnsw_ef_construction::text)::int,
       (select n.nspname from pg_extension e join pg_namespace n on n.oid = e.extnamespace
        where e.extname = 'vector')
from pgrag.settings s
left join pg_class c on c.oid = to_regclass('pgrag.chunks_embedding_hnsw')
left join lateral pg_options_to_table(c.reloptions) o on true
group by s.hnsw_m, s.hnsw_ef_construction
"""
_LOCK: LiteralString = (
    "select pg_try_advisory_lock(hashtextextended('pgrag filter index ' || %s, 0))"
)
_UNLOCK: LiteralString = (
    "select pg_advisory_unlock(hashtextextended('pgrag filter index ' || %s, 0))"
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
    """What ``add`` will run: the index's name, its filter and its DDL."""

    name: str
    filter_json: str
    create: sql.Composed
    comment: sql.Composed


def _as_dict(filter: Mapping[str, Any] | str) -> dict[str, Any]:
    """The filter as a dict (from JSON text if given text); InvalidFilter if it is not one."""
    if isinstance(filter, str):
        return parse_filter_json(filter)
    return dict(filter)


def plan(
    conn: psycopg.Connection[Any],
    filter: Mapping[str, Any] | str,
    schema: Mapping[str, str] | None = None,
) -> Plan:
    """The CREATE INDEX of ``filter``'s index, compiled exactly as a search compiles it, against
    ``schema`` or else the declared metadata schemas (InvalidFilter for a filter a search would
    refuse)."""
    flt = _as_dict(filter)
    if not flt:
        raise ConfigError(
            "a filter index needs a filter: the store index already serves unfiltered searches"
        )
    text = json.dumps(flt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # its keys split out and canonical, as a search compiles them once the index exists
    compiled = compile_filter(
        flt,
        filter_schema(conn, flt, None) if schema is None else schema,
        column=sql.Identifier("metadata"),
        doc_type_column=sql.Identifier("doc_type"),
        split_keys=flt.keys(),
    )
    predicate = with_literals(compiled, compiled.params)
    shown = predicate.as_string(conn)
    constant = _constant(conn, predicate)
    if constant is not None:
        raise ConfigError(
            f"filter {text} matches {'every' if constant else 'no'} chunk: a filter "
            "index needs a filter that selects some of them"
        )
    # named by the predicate: {"k": 1} and {"k": {"$eq": 1}} are one index
    name = PREFIX + hashlib.sha256(shown.encode()).hexdigest()[:12]
    row = conn.execute(_STORE_OPTIONS).fetchone()
    if row is None or row[2] is None:
        raise ConfigError("pgrag.settings or pgvector is missing: run `pgrag db upgrade`")
    m, ef_construction, vector_schema = row
    ident = sql.Identifier("pgrag", name)
    create = sql.SQL(
        "create index concurrently {} on pgrag.chunks using hnsw (embedding {}) "
        "with (m = {}, ef_construction = {}) where {}"
    ).format(
        sql.Identifier(name),
        sql.Identifier(vector_schema, "vector_cosine_ops"),
        sql.Literal(int(m)),
        sql.Literal(int(ef_construction)),
        predicate,
    )
    comment = sql.SQL("comment on index {} is {}").format(ident, sql.Literal(text))
    return Plan(name=name, filter_json=text, create=create, comment=comment)


def _constant(conn: psycopg.Connection[Any], predicate: sql.Composable) -> bool | None:
    """True or False if PostgreSQL folds ``predicate`` to a constant (``not false``,
    ``k and false``...), else None."""
    query = sql.SQL("explain (format json, costs off) select from pgrag.chunks where {}")
    row = conn.execute(query.format(predicate)).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    if plan.get("One-Time Filter") == "false":
        return False
    text = json.dumps(plan)
    if not any(f'"{k}"' in text for k in ("Filter", "Index Cond", "Recheck Cond")):
        return True  # no condition left anywhere in the plan
    return None


def list_indexes(conn: psycopg.Connection[Any]) -> list[FilterIndex]:
    with conn.cursor(row_factory=class_row(FilterIndex)) as cur:
        return cur.execute(_LIST).fetchall()


def find(conn: psycopg.Connection[Any], name: str) -> FilterIndex | None:
    return next((i for i in list_indexes(conn) if i.name == name), None)


def add(
    url: str,
    filter: Mapping[str, Any] | str,
    *,
    schema: Mapping[str, str] | None = None,
    maintenance_work_mem: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[FilterIndex, bool]:
    """Build ``filter``'s index (concurrently) unless a valid one exists; (index, built).

    An invalid index of the same filter (a build that failed or was cancelled) is dropped and
    built again. ``progress(phase, blocks_done, blocks_total)`` is called about twice a second.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        p = plan(conn, filter, schema)
        with _exclusive(conn, p.name):
            existing = find(conn, p.name)
            if existing is not None and existing.valid:
                if not existing.filter_json:  # built by a process killed before its comment
                    conn.execute(p.comment)
                    existing = find(conn, p.name)
                assert existing is not None
                return existing, False
            if existing is not None:
                conn.execute(sql.SQL("drop index concurrently if exists {}").format(_ident(p.name)))
            if maintenance_work_mem is not None:
                conn.execute(
                    "select set_config('maintenance_work_mem', %s, false)", (maintenance_work_mem,)
                )
            try:
                _run_with_progress(url, conn, p.create, progress)
            except BaseException as exc:
                # a failed concurrent build leaves an invalid index that every write still
                # updates: drop it, unless open transactions hold that up
                left = _drop_quickly(conn, p.name)
                after = (
                    f"invalid index {p.name} is left behind, as an open transaction holds it: "
                    f"drop it with `pgrag filter-index drop {p.name}`"
                    if left
                    else "the partial index was dropped"
                )
                if isinstance(exc, KeyboardInterrupt) and not left:
                    raise
                if not isinstance(exc, psycopg.Error | KeyboardInterrupt):
                    raise
                mapped = from_database(exc) if isinstance(exc, psycopg.Error) else None
                if mapped is not None and not left:
                    raise mapped from exc
                raise IndexBuildFailed(
                    f"building filter index {p.name} failed: {_first_line(exc) or 'interrupted'}"
                    f" ({after}; fix the cause and run the same add again)"
                ) from exc
            conn.execute(p.comment)
            built = find(conn, p.name)
    forget_schemas()  # this process's searches split the new keys at once
    assert built is not None
    return built, True


def drop(url: str, filter_or_name: str, *, schema: Mapping[str, str] | None = None) -> str | None:
    """Drop the index of a filter (JSON text) or of a name; its name, or None if none existed."""
    with psycopg.connect(url, autocommit=True) as conn:
        text = filter_or_name.strip()
        if text.startswith(PREFIX):
            name = text
        else:
            p = plan(conn, text, schema)
            # an index of the same filter built by an older pgrag may have another name
            same = [i.name for i in list_indexes(conn) if i.filter_json == p.filter_json]
            name = p.name if find(conn, p.name) is not None or not same else same[0]
        with _exclusive(conn, name):
            if find(conn, name) is None:
                return None
            conn.execute(sql.SQL("drop index concurrently if exists {}").format(_ident(name)))
    forget_schemas()
    return name


@contextlib.contextmanager
def _exclusive(conn: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """One add or drop of an index at a time: a concurrent build shows as an invalid index,
    which a second add would take for a crashed one and drop."""
    row = conn.execute(_LOCK, (name,)).fetchone()
    building = conn.execute(_BUILDING, (name,)).fetchone()
    if not (row and row[0]) or (building and building[0]):
        if row and row[0]:
            conn.execute(_UNLOCK, (name,))
        raise IndexBuildFailed(
            f"filter index {name} is being built or dropped by another session: wait for it "
            "(pg_stat_progress_create_index shows a build), then run the command again"
        )
    try:
        yield
    finally:
        if not conn.broken:  # a lost connection took the session lock with it
            with contextlib.suppress(psycopg.Error):
                conn.execute(_UNLOCK, (name,))


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


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier("pgrag", name)


def _run_with_progress(
    url: str,
    conn: psycopg.Connection[Any],
    statement: sql.Composed,
    progress: Callable[[str, int, int], None] | None,
) -> None:
    """Run ``statement`` on ``conn``; meanwhile report its pg_stat_progress_create_index row."""
    if progress is None:
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
                row = watch.execute(_PROGRESS, (pid,)).fetchone()
                if row is not None:
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
