"""Filter indexes: partial HNSW indexes that searches with a containing filter use by themselves."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from pgrag import filter_index
from pgrag import search as s
from pgrag.db import connect
from pgrag.errors import ConfigError, IndexBuildFailed, InvalidFilter
from pgrag.lab import synthetic

from . import search_plan
from .conftest import run_pgrag

ROWS = 3000


@pytest.fixture(scope="module")
def store_url(pg_server: Any, template_db: str) -> Iterator[str]:
    """3,000 synthetic chunks (metadata schema declared) with one filter index, on {"p10": true}."""
    from .conftest import create_database, drop_database

    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    vecs, texts, metas = synthetic.rows(ROWS, seed=5)
    synthetic.store(url, vecs, texts, metas)
    with psycopg.connect(url) as conn:
        synthetic.declare_stats(conn)
    filter_index.add(url, {"p10": True})
    yield url
    drop_database(pg_server, name)


def _plan(conn: psycopg.Connection[Any], flt: dict[str, Any]) -> str:
    """EXPLAIN of the statement a vector search with ``flt`` runs, as pgrag._search plans it.
    exact_threshold 0: the vector leg always walks an index, whichever the planner picks."""
    q = synthetic.queries(1)[0][0]
    plan = search_plan.plan(conn, q, flt, exact_threshold=0)
    search_plan.settings(conn, plan)
    rows = search_plan.run_plan(conn, q, plan, explain=True, analyze=False)
    conn.rollback()
    return "\n".join(r[0] for r in rows)


def _index_name(url: str, flt: dict[str, Any]) -> str:
    with psycopg.connect(url) as conn:
        return filter_index.plan(conn, flt).name


def test_add_builds_a_valid_index_once_and_lists_it(store_url: str) -> None:
    name = _index_name(store_url, {"p10": True})
    with psycopg.connect(store_url) as conn:
        (listed,) = filter_index.list_indexes(conn)
        row = conn.execute(
            "select count(*) from pgrag.chunks where metadata @> '{\"p10\": true}'"
        ).fetchone()
    assert listed.name == name and listed.valid
    assert listed.filter == {"p10": True}
    assert row is not None and listed.rows == row[0] == ROWS // 10
    assert listed.size_bytes > 0
    again, built = filter_index.add(store_url, '{"p10": true}')
    assert not built and again == listed


@pytest.mark.parametrize(
    "flt",
    [
        {"p10": True},
        {"p10": True, "all": True},  # a key more: still each key its own condition
        {"$and": [{"p10": True}, {"bucket": {"$gt": 5}}]},
        {"bucket": {"$lt": 900}, "p10": True, "$not": {"p1": True}},
    ],
)
def test_searches_whose_filter_contains_it_use_it(store_url: str, flt: dict[str, Any]) -> None:
    # (filters matching a handful of rows would rather be sorted off the GIN bitmap: no HNSW)
    name = _index_name(store_url, {"p10": True})
    with psycopg.connect(store_url) as conn:
        assert name in _plan(conn, flt)


@pytest.mark.parametrize(
    "flt", [{"p1": True}, {"p10": False}, {"$or": [{"p10": True}, {"p1": True}]}]
)
def test_other_filters_do_not(store_url: str, flt: dict[str, Any]) -> None:
    name = _index_name(store_url, {"p10": True})
    with psycopg.connect(store_url) as conn:
        plan = _plan(conn, flt)
    assert name not in plan


def test_results_through_it_have_recall(store_url: str) -> None:
    qv, _ = synthetic.queries(20)
    flt = {"p10": True, "topic": {"$gte": 0}}
    recalls = []
    with psycopg.connect(store_url) as conn:
        for q in qv:
            with conn.transaction():
                conn.execute("set local enable_indexscan = off")
                truth = [
                    r[0]
                    for r in conn.execute(
                        "select id from pgrag.chunks where metadata @> '{\"p10\": true}' "
                        "order by embedding <=> %s::real[]::vector limit 10",
                        (q.tolist(),),
                    )
                ]
            res = s.search(
                conn, vector=q, model="synthetic", filter=flt, mode="vector", exact_threshold=0
            )
            conn.rollback()
            assert len(res.hits) == 10 and res.scan == "index"
            recalls.append(len({h.id for h in res.hits} & set(truth)) / 10)
    assert np.mean(recalls) >= 0.95


def test_bad_filters_are_refused_before_any_ddl(store_url: str) -> None:
    with pytest.raises(InvalidFilter, match="unknown filter key 'nokey'"):
        filter_index.add(store_url, {"nokey": 1})
    with pytest.raises(InvalidFilter, match="expects boolean"):
        filter_index.add(store_url, '{"p1": 1}')
    with pytest.raises(InvalidFilter):
        filter_index.add(store_url, "{not json")
    with pytest.raises(ConfigError, match="needs a filter"):
        filter_index.add(store_url, {})
    with psycopg.connect(store_url) as conn:
        assert len(filter_index.list_indexes(conn)) == 1


def _cancel_once(
    writer: psycopg.Connection[Any], dba: psycopg.Connection[Any], *, end_writer: bool
) -> Any:
    cancelled = threading.Event()

    def progress(phase: str, done: int, total: int) -> None:  # noqa: ARG001
        if not cancelled.is_set():
            dba.execute(
                "select pg_cancel_backend(pid) from pg_stat_progress_create_index "
                "where relid = 'pgrag.chunks'::regclass"
            )
            cancelled.set()
            if end_writer:
                writer.rollback()

    return progress


def test_a_cancelled_build_leaves_nothing(store_url: str) -> None:
    # a transaction writing to the chunks holds the concurrent build in its first wait; the
    # progress callback then cancels it, as Ctrl-C or a DBA's pg_cancel_backend would
    with psycopg.connect(store_url) as writer, psycopg.connect(store_url, autocommit=True) as dba:
        writer.execute("update pgrag.chunks set updated_at = updated_at where id = 1")
        progress = _cancel_once(writer, dba, end_writer=True)
        with pytest.raises(IndexBuildFailed, match="the partial index was dropped"):
            filter_index.add(store_url, {"p1": True}, progress=progress)
    with psycopg.connect(store_url) as conn:
        assert [i.filter for i in filter_index.list_indexes(conn)] == [{"p10": True}]


def test_a_build_stalled_by_an_open_transaction_says_what_it_left(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filter_index, "CLEANUP_LOCK_TIMEOUT", "200ms")
    with psycopg.connect(store_url) as writer, psycopg.connect(store_url, autocommit=True) as dba:
        writer.execute("update pgrag.chunks set updated_at = updated_at where id = 1")
        progress = _cancel_once(writer, dba, end_writer=False)
        with pytest.raises(IndexBuildFailed, match="is left behind.*filter-index drop"):
            filter_index.add(store_url, {"p1": True}, progress=progress)
        writer.rollback()
    with psycopg.connect(store_url) as conn:
        (left,) = [i for i in filter_index.list_indexes(conn) if i.filter_json == ""]
        assert not left.valid
    assert filter_index.drop(store_url, left.name) == left.name


def test_an_invalid_index_left_by_a_crash_is_rebuilt(store_url: str) -> None:
    flt = {"p01": True}
    index, _ = filter_index.add(store_url, flt)
    with psycopg.connect(store_url, autocommit=True) as conn:  # what a killed build leaves
        conn.execute(
            "update pg_index set indisvalid = false where indexrelid = %s::regclass",
            (f"pgrag.{index.name}",),
        )
        assert filter_index.find(conn, index.name) is not None
        assert not filter_index.find(conn, index.name).valid  # type: ignore[union-attr]
    rebuilt, built = filter_index.add(store_url, flt)
    assert built and rebuilt.valid
    assert filter_index.drop(store_url, index.name) == index.name
    assert filter_index.drop(store_url, '{"p01": true}') is None


def test_client_and_cli(store_url: str) -> None:
    env = {"PGRAG_DATABASE_URL": store_url}
    r = run_pgrag("filter-index", "add", "--sql", '{"p1": true}', env=env)
    assert r.returncode == 0, r.stderr
    assert "create index concurrently" in r.stdout and "comment on index" in r.stdout
    r = run_pgrag("filter-index", "add", '{"p1": true}', env=env)
    assert r.returncode == 0, r.stderr
    assert "built in" in r.stdout and "30 chunks" in r.stdout
    r = run_pgrag("filter-index", "list", env=env)
    assert r.returncode == 0 and '{"p1": true}' in r.stdout and '{"p10": true}' in r.stdout
    r = run_pgrag("filter-index", "add", '{"p1": "yes"}', env=env)
    assert r.returncode == 7 and r.stderr.startswith("pgrag: error: filter key 'p1' expects")
    with connect(store_url) as client:
        assert {i.filter_json for i in client.filter_indexes()} == {'{"p1": true}', '{"p10": true}'}
        assert client.drop_filter_index('{"p1": true}') is not None
    r = run_pgrag("filter-index", "drop", '{"p1": true}', env=env)
    assert r.returncode == 1 and r.stdout == "" and "no such filter index" in r.stderr
    r = run_pgrag("filter-index", "drop", '{"p1": true}', "--if-exists", env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("flt", "uses"),
    [({"p10": True}, True), ({"p10": True, "all": True}, True), ({"all": True}, False)],
)
def test_the_sql_functions_use_it_too(store_url: str, flt: dict[str, Any], uses: bool) -> None:
    # the SQL API takes a containment filter; it is split per key like the Python compiler's
    name = _index_name(store_url, {"p10": True})
    q = synthetic.queries(1)[0][0]
    with psycopg.connect(store_url) as conn:
        rows = conn.execute(
            "select id, scan from pgrag.search(%s::real[]::vector, 10, %s::jsonb, "
            "exact_threshold => 0)",
            (q.tolist(), json.dumps(flt)),
        ).fetchall()
        scans = conn.execute(
            "select pg_stat_get_xact_numscans(%s::regclass)", (f"pgrag.{name}",)
        ).fetchone()
    assert len(rows) == 10 and {r[1] for r in rows} == {"index"}
    assert scans is not None and (scans[0] > 0) == uses


def test_a_reembed_to_another_dimension_keeps_filter_indexes(db_url: str) -> None:
    vecs, texts, metas = synthetic.rows(300, seed=9)
    synthetic.store(db_url, vecs, texts, metas)
    with psycopg.connect(db_url) as conn:
        synthetic.declare_stats(conn)
    index, _ = filter_index.add(db_url, {"p10": True})
    with psycopg.connect(db_url) as conn:
        assert conn.execute("select pgrag.begin_reembed('other', 8)").fetchone() == (300,)
        conn.commit()
        (after,) = filter_index.list_indexes(conn)
        typ = conn.execute(
            "select format_type(atttypid, atttypmod) from pg_attribute "
            "where attrelid = 'pgrag.chunks'::regclass and attname = 'embedding'"
        ).fetchone()
    assert after.name == index.name and after.valid and after.filter == {"p10": True}
    assert typ == ("vector(8)",)


def test_every_search_on_one_connection_uses_it(store_url: str) -> None:
    # psycopg prepares a statement run 5 times; a generic plan could not use a partial index
    name = _index_name(store_url, {"p10": True})
    qv, _ = synthetic.queries(12)
    with psycopg.connect(store_url) as conn:
        for q in qv:
            s.search(
                conn,
                vector=q,
                model="synthetic",
                filter={"p10": True},
                mode="vector",
                exact_threshold=0,
            )
        row = conn.execute(
            "select pg_stat_get_xact_numscans(%s::regclass)", (f"pgrag.{name}",)
        ).fetchone()
    assert row is not None and row[0] >= 12


def test_a_range_index_serves_the_range_however_written(store_url: str) -> None:
    index, _ = filter_index.add(store_url, {"bucket": {"$lt": 500, "$gte": 100}})
    try:
        with psycopg.connect(store_url) as conn:
            plan = _plan(conn, {"all": True, "bucket": {"$gte": 100.0, "$lt": 500}})
        assert index.name in plan
    finally:
        filter_index.drop(store_url, index.name)


def test_filters_that_select_all_or_nothing_are_refused(store_url: str) -> None:
    with pytest.raises(ConfigError, match="matches every chunk"):
        filter_index.add(store_url, {"topic": {"$nin": []}})
    with pytest.raises(ConfigError, match="matches no chunk"):
        filter_index.add(store_url, {"topic": {"$in": []}})


def test_one_add_or_drop_of_an_index_at_a_time(store_url: str) -> None:
    name = _index_name(store_url, {"p1": True})
    with psycopg.connect(store_url, autocommit=True) as other:
        other.execute("select pg_advisory_lock(hashtextextended('pgrag chunks index builds', 0))")
        with pytest.raises(IndexBuildFailed, match="being built or dropped by another session"):
            filter_index.add(store_url, {"p1": True})
        with pytest.raises(IndexBuildFailed, match="being built or dropped"):
            filter_index.drop(store_url, name)
        with pytest.raises(IndexBuildFailed, match="being built or dropped"):  # one lock for all
            filter_index.rebuild_store_index(store_url)


def test_an_error_in_the_progress_callback_cancels_the_build(store_url: str) -> None:
    with psycopg.connect(store_url) as writer:
        writer.execute("update pgrag.chunks set updated_at = updated_at where id = 1")

        def progress(phase: str, done: int, total: int) -> None:  # noqa: ARG001
            writer.rollback()  # lets the cleanup's drop through
            raise ValueError("the progress display broke")

        with pytest.raises(ValueError, match="display broke"):
            filter_index.add(store_url, {"p1": True}, progress=progress)
    with psycopg.connect(store_url) as conn:
        assert [i.filter for i in filter_index.list_indexes(conn)] == [{"p10": True}]


def test_filters_folded_to_a_constant_are_refused(store_url: str) -> None:
    with pytest.raises(ConfigError, match="matches every chunk"):
        filter_index.add(store_url, {"$not": {"topic": {"$in": []}}})
    with pytest.raises(ConfigError, match="matches no chunk"):
        filter_index.add(store_url, {"topic": {"$in": []}, "p10": True})


def test_drop_by_filter_finds_an_index_named_otherwise(store_url: str) -> None:
    # an index of an older pgrag's naming: found by the filter in its comment
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "create index chunks_embedding_hnsw_f_000000000000 on pgrag.chunks "
            "using hnsw (embedding vector_cosine_ops) where metadata @> '{\"p1\": true}'"
        )
        conn.execute(
            "comment on index pgrag.chunks_embedding_hnsw_f_000000000000 is '{\"p1\":true}'"
        )
    assert filter_index.drop(store_url, '{"p1": true}') == "chunks_embedding_hnsw_f_000000000000"


def test_a_database_with_older_functions_says_to_upgrade(db_url: str) -> None:
    from pgrag import migrate
    from pgrag.errors import NotMigrated

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("drop function pgrag._filter_index_keys()")  # as before this pgrag
        with pytest.raises(NotMigrated, match="run `pgrag db upgrade`"):
            s.search(conn, "anything", filter={"segment": "VIP"}, mode="text")
    migrate.upgrade(db_url)  # what `pgrag db upgrade` does at head
    with (
        psycopg.connect(db_url, autocommit=True) as conn,
        pytest.raises(InvalidFilter, match="unknown filter key 'segment'"),  # it got that far
    ):
        s.search(conn, "anything", filter={"segment": "VIP"}, mode="text")


# ---- the store index rebuilt (pgrag reindex) ----


@pytest.fixture
def small_store(pg_server: Any, template_db: str) -> Iterator[str]:
    """2,000 synthetic chunks with vectors (enough for the worker's tuning), a store of its own."""
    from .conftest import create_database, drop_database

    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    vecs, texts, metas = synthetic.rows(2000, seed=9)
    synthetic.store(url, vecs, texts, metas)
    yield url
    drop_database(pg_server, name)


_GRAPH = (
    "select s.hnsw_m, s.hnsw_ef_construction, c.reloptions::text, "
    "to_regclass('pgrag.chunks_embedding_hnsw_new') is null "
    "from pgrag.settings s, pg_class c where c.oid = 'pgrag.chunks_embedding_hnsw'::regclass"
)


def test_reindex_rebuilds_the_graph_then_tunes_it(small_store: str) -> None:
    env = {"PGRAG_DATABASE_URL": small_store}
    r = run_pgrag("reindex", "--m", "8", "--ef-construction", "32", env=env)
    assert r.returncode == 0, r.stderr
    assert "m 8, ef_construction 32 (was 16, 64), 2,000 vectors" in r.stdout
    assert "ef_search" in r.stdout and "recall@10" in r.stdout
    with psycopg.connect(small_store) as conn:
        m, efc, options, no_new = conn.execute(_GRAPH).fetchone()  # type: ignore[misc]
        assert (m, efc, no_new) == (8, 32, True) and "m=8" in options
        tuned = conn.execute(
            "select tuned_by, chunks from pgrag.tuning order by id desc limit 1"
        ).fetchone()
        assert tuned == ("pgrag reindex", 2000)
        q = synthetic.queries(1)[0][0]
        assert len(s.search(conn, vector=q, model="synthetic", k=10, mode="vector").hits) == 10
    # by default the graph follows the store's size, never sparser than the current one
    with connect(small_store) as client:
        done, tuned_again = client.reindex(tune=False)
        assert (done.m, done.ef_construction, done.previous_m) == (16, 64, 8)
        assert tuned_again is None
        client.reindex(m=24, ef_construction=80, tune=False)
        done, _ = client.reindex(tune=False)
        assert (done.m, done.ef_construction) == (24, 80)
        done, _ = client.reindex(m=40, tune=False)  # ef_construction at least twice m
        assert (done.m, done.ef_construction) == (40, 80)


def test_reindex_without_tuning_keeps_the_measured_ef_search(small_store: str) -> None:
    env = {"PGRAG_DATABASE_URL": small_store}
    with psycopg.connect(small_store, autocommit=True) as conn:
        conn.execute("update pgrag.settings set ef_search = 200")
    r = run_pgrag("reindex", "--no-tune", env=env)
    assert r.returncode == 0, r.stderr
    assert "ef_search not measured (--no-tune)" in r.stdout
    with psycopg.connect(small_store) as conn:
        assert conn.execute("select ef_search from pgrag.settings").fetchone() == (200,)


def test_the_graph_follows_the_store_size() -> None:
    from pgrag import config

    assert config.graph_for(499_999) == (16, 64)
    assert config.graph_for(500_000) == config.graph_for(10_000_000) == (32, 200)


def test_a_reindex_that_died_is_finished_or_built_again(small_store: str) -> None:
    with psycopg.connect(small_store, autocommit=True) as conn:
        # died after dropping the old index, before the swap: the next run swaps the new one in
        conn.execute(
            "create index chunks_embedding_hnsw_new on pgrag.chunks "
            "using hnsw (embedding vector_cosine_ops) with (m = 12, ef_construction = 40)"
        )
        conn.execute("drop index pgrag.chunks_embedding_hnsw")
        done = filter_index.rebuild_store_index(small_store, m=20, ef_construction=60)
        assert (done.m, done.ef_construction, done.finished_earlier) == (12, 40, True)
        assert conn.execute(_GRAPH).fetchone()[:2] + (True,) == (12, 40, True)  # type: ignore[index]
        # died while building: the half-built index is dropped and the rebuild runs
        conn.execute(
            "create index chunks_embedding_hnsw_new on pgrag.chunks "
            "using hnsw (embedding vector_cosine_ops) with (m = 4, ef_construction = 8)"
        )
        conn.execute(
            "update pg_index set indisvalid = false "
            "where indexrelid = 'pgrag.chunks_embedding_hnsw_new'::regclass"
        )
        done = filter_index.rebuild_store_index(small_store, m=10, ef_construction=30)
        assert (done.m, done.ef_construction, done.previous_m) == (10, 30, 12)
        assert not done.finished_earlier
        m, efc, _, no_new = conn.execute(_GRAPH).fetchone()  # type: ignore[misc]
        assert (m, efc, no_new) == (10, 30, True)
        # died after building, before or while dropping the old index: both are valid, and
        # the finished one is swapped in, whatever the next run asks
        conn.execute(
            "create index chunks_embedding_hnsw_new on pgrag.chunks "
            "using hnsw (embedding vector_cosine_ops) with (m = 14, ef_construction = 28)"
        )
        done = filter_index.rebuild_store_index(small_store, m=20, ef_construction=60)
        assert (done.m, done.ef_construction, done.finished_earlier) == (14, 28, True)
        m, efc, _, no_new = conn.execute(_GRAPH).fetchone()  # type: ignore[misc]
        assert (m, efc, no_new) == (14, 28, True)


def test_reindex_refuses_a_graph_pgvector_cannot_build(small_store: str) -> None:
    env = {"PGRAG_DATABASE_URL": small_store}
    r = run_pgrag("reindex", "--m", "40", "--ef-construction", "50", env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("pgrag: error: ef_construction = 50 is less than twice m = 40")
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_pgrag("reindex", "--maintenance-work-mem", "lots", env=env)
    assert r.returncode == 2 and r.stderr.startswith(
        "pgrag: error: maintenance_work_mem 'lots' is not a memory size"
    )
    # the writer role may write chunks, not rebuild their index: one line naming the owner
    r = run_pgrag("reindex", env={**env, "PGOPTIONS": "-c role=pgrag_writer"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs the owner of pgrag.chunks" in r.stderr and "connect as" in r.stderr
    with psycopg.connect(small_store) as conn:
        assert conn.execute(_GRAPH).fetchone()[:2] == (16, 64)  # type: ignore[index]
