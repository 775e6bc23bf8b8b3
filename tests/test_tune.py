"""pgrag tune: recall measured against exact search, ef_search stored and used by searches."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

import pgrag
from pgrag import migrate
from pgrag import tune as t
from pgrag.errors import ConfigError, PgragError
from pgrag.lab import synthetic

from . import search_plan
from .conftest import run_pgrag
from .embed_server import FakeEmbeddings

DIM = 384
ROWS = 4_000


def _load(url: str, rows: int = ROWS, clusters: int = 50) -> None:
    """Clustered unit vectors, the HNSW index rebuilt after the load."""
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(clusters, DIM)) * (clusters > 1)
    vecs = centers[rng.integers(0, clusters, size=rows)] + rng.normal(scale=1.2, size=(rows, DIM))
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    synthetic.store(url, vecs, [f"chunk {i}" for i in range(rows)], [{}] * rows)


def _search_ef(conn: psycopg.Connection[Any], **kw: Any) -> int:
    """The hnsw.ef_search a vector search runs with (pgrag._search_plan's choice, which
    pgrag._search sets for its statement)."""
    vec = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    plan = search_plan.plan(conn, vec, {}, **kw)
    conn.rollback()
    return int(plan["ef"])


def test_tune_stores_the_smallest_ef_search_reaching_the_target(db_url: str) -> None:
    _load(db_url)
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        result = t.tune(conn, target=0.9, queries=20, ladder=(40, 80, 160, 320, 640))
        assert result.source == "chunks" and result.queries == 20 and result.chunks == ROWS
        assert result.chosen is not None and result.applied and result.previous is None
        # the ladder stops at the first value reaching the target, and that one is chosen
        assert result.points[-1].ef_search == result.chosen
        assert result.points[-1].recall >= 0.9
        assert all(p.recall < 0.9 for p in result.points[:-1])
        chosen = result.chosen
    with psycopg.connect(db_url) as conn:  # a new session sees the database default
        register_vector(conn)
        assert t.current_setting(conn) == chosen
        assert _search_ef(conn) == max(chosen, 40)
        assert _search_ef(conn, ef_search=55) == 55  # an explicit value wins
        t.store(conn, 700)
        assert _search_ef(conn) == 700  # the session's own value follows the store at once
        t.store(conn, None)
        assert t.current_setting(conn) is None
        assert _search_ef(conn) == 40


def test_unreachable_target_stores_nothing_and_bad_arguments_are_config_errors(
    db_url: str,
) -> None:
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        with pytest.raises(PgragError, match="embed first"):
            t.tune(conn)
    _load(db_url, clusters=1)
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        # ef_search 1 and 2 on 4,000 uniform 384-d vectors (no neighbours worth the name): 20
        # queries never all find their exact top 10
        result = t.tune(conn, target=1.0, queries=20, ladder=(1, 2))
        assert result.chosen is None and not result.applied
        assert [p.ef_search for p in result.points] == [1, 2]
        assert t.current_setting(conn) is None
        for kw in ({"k": 0}, {"target": 1.5}, {"queries": 0}, {"ladder": (0, 5000)}):
            with pytest.raises(ConfigError):
                t.tune(conn, **kw)


def test_a_garbage_database_default_is_ignored_by_the_python_and_sql_searches(
    db_url: str,
) -> None:
    _load(db_url, rows=500)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "do $$ begin execute format('alter database %I set pgrag.ef_search = %L', "
            "current_database(), 'lots'); end $$"
        )
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        assert t.current_setting(conn) is None
        assert _search_ef(conn) == 40
        vec = (np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)).tolist()
        rows = conn.execute("select * from pgrag.search(%s::real[]::vector, 5)", (vec,)).fetchall()
        assert len(rows) == 5


def test_cli_tune_dry_run_json_and_reset(db_url: str) -> None:
    _load(db_url, rows=1_000)
    env = {"PGRAG_DATABASE_URL": db_url}
    out = run_pgrag("tune", "--dry-run", "--json", "--queries", "10", "--target", "0.5", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["chosen"] is not None and data["applied"] is False
    with psycopg.connect(db_url) as conn:
        assert t.current_setting(conn) is None
    out = run_pgrag("tune", "--queries", "10", "--target", "0.5", env=env)
    assert out.returncode == 0, out.stderr
    assert "stored as the store's" in out.stdout
    out = run_pgrag("tune", "--reset", env=env)
    assert out.returncode == 0 and "removed" in out.stdout
    out = run_pgrag("tune", "--target", "2", env=env)
    assert out.returncode == 2 and "--target" in out.stderr


def _insert_chunks(url: str, first: int, count: int) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text) "
            "select 't', i::text, 'chunk number ' || i "
            "from generate_series(%s::integer, %s::integer) i",
            (first, first + count - 1),
        )


def _measurements(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "select chunks, tuned_by, ef_search, recall, target from pgrag.tuning order by id"
        ).fetchall()


def test_embedding_tunes_the_store_out_of_the_box_and_again_when_it_doubles(
    db_url: str,
) -> None:
    # recall out of the box: nobody runs `pgrag tune`; the embedding run measures the store
    # once it holds AUTO_MIN_CHUNKS vectors, and again only when it doubled (or halved)
    fake = FakeEmbeddings()
    env = {"PGRAG_DATABASE_URL": db_url, **fake.env()}
    try:
        _insert_chunks(db_url, 1, t.AUTO_MIN_CHUNKS - 1)
        assert run_pgrag("embed", env=env).returncode == 0
        assert _measurements(db_url) == []  # below the minimum: nothing measured
        _insert_chunks(db_url, t.AUTO_MIN_CHUNKS, 200)
        out = run_pgrag("embed", env=env)
        assert out.returncode == 0, out.stderr
        assert (
            f"measured recall at {t.AUTO_MIN_CHUNKS + 199:,} chunks on {t.AUTO_QUERIES} chunks"
            in out.stdout
        ), out.stdout
        (first,) = _measurements(db_url)
        chunks, by, ef, recall, target = first
        # no questions in the query cache: measured on chunk vectors, with their margin
        assert (chunks, by) == (t.AUTO_MIN_CHUNKS + 199, "worker")
        assert target == pytest.approx(t.AUTO_CHUNK_TARGET)
        assert ef is not None and recall >= t.AUTO_CHUNK_TARGET
        _insert_chunks(db_url, 5_000, 300)  # 1.25x: not measured again
        assert run_pgrag("embed", env=env).returncode == 0
        assert len(_measurements(db_url)) == 1
        _insert_chunks(db_url, 10_000, 1_300)  # past twice the measured size
        assert run_pgrag("embed", env=env).returncode == 0
        rows = _measurements(db_url)
        assert len(rows) == 2 and rows[1][0] == t.AUTO_MIN_CHUNKS + 199 + 300 + 1_300
    finally:
        fake.close()
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        stored = conn.execute("select ef_search from pgrag.settings").fetchone()
        assert stored is not None and stored[0] == rows[1][2]
        # every session's searches use it at once, readers' too
        assert t.current_setting(conn) == stored[0]
        assert _search_ef(conn) == max(stored[0], 40)
        conn.execute("set role pgrag_reader")
        assert _search_ef(conn) == max(stored[0], 40)
        conn.rollback()
    with pgrag.connect(db_url) as client:
        tuning = client.status().tuning
    assert tuning is not None
    assert tuning["ef_search"] == stored[0] and tuning["tuned_by"] == "worker"
    assert tuning["recall"] >= t.AUTO_CHUNK_TARGET and tuning["chunks"] == rows[1][0]
    status = run_pgrag("status", env={"PGRAG_DATABASE_URL": db_url})
    assert status.returncode == 0, status.stderr
    assert f"recall:     ef_search {stored[0]}, recall@10 " in status.stdout, status.stdout
    assert f"at {rows[1][0]:,} chunks by worker" in status.stdout


def test_the_worker_trusts_real_questions_only_when_it_has_enough_of_them(db_url: str) -> None:
    # 50 query vectors could not tell recall 0.95 from 0.99 (a measured 0.996 was 0.93 on the
    # next questions): the worker measures on AUTO_QUERIES of them, real questions only when
    # the cache holds AUTO_MIN_QUESTIONS, and asks the promised recall of them with a margin
    _load(db_url, rows=1_000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        synthetic.seed_questions(conn, n=t.AUTO_MIN_QUESTIONS - 1)
        few = t.auto_tune(conn, tuned_by="worker")
        assert (few.source, few.queries) == ("chunks", t.AUTO_QUERIES)
        assert few.target == pytest.approx(t.AUTO_CHUNK_TARGET)
        synthetic.seed_questions(conn, n=t.AUTO_MIN_QUESTIONS, seed=14)
        cached = conn.execute("select count(*) from pgrag.query_cache").fetchone()
        assert cached is not None and cached[0] >= t.AUTO_MIN_QUESTIONS
        enough = t.auto_tune(conn, tuned_by="worker")
        assert (enough.source, enough.queries) == ("questions", min(cached[0], t.AUTO_QUERIES))
        assert enough.target == pytest.approx(t.AUTO_TARGET)
        assert t.AUTO_TARGET > 0.95  # the margin over the promise
        row = conn.execute(
            "select source, queries from pgrag.tuning order by id desc limit 1"
        ).fetchone()
        assert row == ("questions", enough.queries)


def test_an_administrators_setting_overrides_the_store_and_reset_removes_both(
    db_url: str,
) -> None:
    _load(db_url, rows=1_000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        result = t.tune(conn, target=0.5, queries=10, ladder=(40, 80))
        assert result.applied and t.current_setting(conn) == result.chosen
        conn.execute(
            "do $$ begin execute format('alter database %I set pgrag.ef_search = 300', "
            "current_database()); end $$"
        )
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert t.current_setting(conn) == 300 and _search_ef(conn) == 300
    out = run_pgrag(
        "tune", "--queries", "10", "--target", "0.5", env={"PGRAG_DATABASE_URL": db_url}
    )
    assert out.returncode == 0 and "pgrag.ef_search = 300 is set" in out.stderr, out.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        t.store(conn, None)
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert t.current_setting(conn) is None and _search_ef(conn) == 40


def test_duplicate_chunks_do_not_hold_recall_below_the_target(db_url: str) -> None:
    # identical texts have identical vectors: the index may return another of a tie than
    # exact search did, which is just as right
    rng = np.random.default_rng(3)
    distinct = rng.normal(size=(150, DIM))
    vecs = np.repeat(distinct, 10, axis=0)
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    synthetic.store(db_url, vecs, [f"text {i // 10}" for i in range(1_500)], [{}] * 1_500)
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        result = t.tune(conn, target=0.99, queries=20, ladder=(40, 80), apply=False)
    assert result.chosen == 40 and result.points[0].recall >= 0.99, result.points


def test_a_failed_measurement_is_logged_and_the_embedding_run_succeeds(db_url: str) -> None:
    # the vectors are stored: a lock or statement timeout while measuring is not the run's
    # failure (it used to exit 1, and kill a worker for good)
    fake = FakeEmbeddings()
    try:
        _insert_chunks(db_url, 1, t.AUTO_MIN_CHUNKS)
        with psycopg.connect(db_url) as holder:
            holder.execute("lock table pgrag.tuning in exclusive mode")  # until rollback
            url = db_url + ("&" if "?" in db_url else "?") + "options=-c%20lock_timeout%3D1s"
            out = run_pgrag("embed", env={"PGRAG_DATABASE_URL": url, **fake.env()})
            holder.rollback()
    finally:
        fake.close()
    assert out.returncode == 0, out.stderr
    assert "recall not measured" in out.stderr and "lock timeout" in out.stderr, out.stderr
    assert _measurements(db_url) == []


def test_an_earlier_releases_database_default_moves_into_the_store(empty_db_url: str) -> None:
    # before 0010, tune stored ALTER DATABASE ... SET pgrag.ef_search, which would now override
    # every later tuning: the migration moves it into pgrag.settings and resets it
    migrate.upgrade(empty_db_url, "0009")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(
            "do $$ begin execute format('alter database %I set pgrag.ef_search = 130', "
            "current_database()); end $$"
        )
    migrate.upgrade(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        row = conn.execute(
            "select current_setting('pgrag.ef_search', true), ef_search from pgrag.settings"
        ).fetchone()
        assert row is not None and not row[0] and row[1] == 130
        assert t.current_setting(conn) == 130


def test_the_worker_stores_the_best_value_when_the_graph_cannot_reach_the_target(
    db_url: str,
) -> None:
    # at 1,000,000 chunks the default graph reached 0.938 of 0.99: searching at the floor
    # (recall 0.53) would be worse than at the best value the graph gives
    _load(db_url, rows=1_000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        register_vector(conn)
        result = t.tune(conn, target=1.0, queries=10, ladder=(1, 2), store_best=True)
        if result.chosen is None:  # the usual case: ef_search 1 and 2 find few neighbours
            top = max(p.recall for p in result.points)
            best = min(p.ef_search for p in result.points if p.recall >= top - 0.005)
            assert t.current_setting(conn) == best
            row = conn.execute("select ef_search, best_ef_search from pgrag.tuning").fetchone()
            assert row == (None, best)
            # the graph is the store size's already: status names a denser one
            out = run_pgrag("status", env={"PGRAG_DATABASE_URL": db_url})
            assert (
                "a denser graph reaches more: `pgrag reindex --m 32 --ef-construction 200`"
                in out.stdout
            ), out.stdout


_GRAPH = "select hnsw_m, hnsw_ef_construction from pgrag.settings"


@contextlib.contextmanager
def _outgrown_store(db_url: str) -> Iterator[tuple[dict[str, str], Any]]:
    """1,500 chunks embedded and measured, their graph rebuilt by hand far sparser than the
    store's size wants (m 2, ef_construction 4), then 1,600 more waiting: the store doubled,
    so the worker measures it again after embedding them. The CLI's environment and an
    embedder, both on a fake embedding server."""
    from pgrag.embed.openai import OpenAIEmbedder

    fake = FakeEmbeddings()
    env = {"PGRAG_DATABASE_URL": db_url, **fake.env()}
    try:
        _insert_chunks(db_url, 1, 1_500)
        assert run_pgrag("embed", env=env).returncode == 0
        r = run_pgrag("reindex", "--m", "2", "--ef-construction", "4", "--no-tune", env=env)
        assert r.returncode == 0, r.stderr
        _insert_chunks(db_url, 10_000, 1_600)
        yield env, OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=DIM)
    finally:
        fake.close()


def test_the_worker_rebuilds_a_graph_the_store_outgrew_then_tunes_it(db_url: str) -> None:
    # recall out of the box at any size: when no ef_search reaches the target and the store
    # has outgrown its graph (here one built by hand far sparser than the store's size wants),
    # the worker rebuilds the index for the store's size, concurrently, and measures again
    from pgrag import filter_index
    from pgrag.worker import Worker

    lines: list[str] = []
    with (
        _outgrown_store(db_url) as (_, embedder),
        Worker(db_url, embedder, notice=lines.append) as w,
    ):
        assert w.drain().written == 1_600
        w.join_reindex()
        tuned = w.last_tune
    assert lines[0].startswith(
        "pgrag: the store index's graph (m 2, ef_construction 4) stops short of the recall "
        "target at 3,100 vectors: rebuilding it with m 16, ef_construction 64"
    ), lines
    assert lines[1].startswith("pgrag: store index rebuilt ("), lines
    assert "m 16, ef_construction 64" in lines[1] and "recall@10" in lines[1]
    with psycopg.connect(db_url) as conn:
        assert conn.execute(_GRAPH).fetchone() == (16, 64)
        assert conn.execute(
            "select to_regclass('pgrag.chunks_embedding_hnsw_new') is null"
        ).fetchone() == (True,)
        rows = conn.execute(
            "select chunks, tuned_by, ef_search from pgrag.tuning order by id"
        ).fetchall()
    # the sparse graph's measurement found no value; the new graph's reached the target
    assert [r[:2] for r in rows[-2:]] == [(3_100, "worker"), (3_100, "worker")]
    assert rows[-2][2] is None and rows[-1][2] is not None
    assert tuned is not None and tuned.chosen == rows[-1][2]
    # a store at the graph its size wants is left alone: the next measurement rebuilds nothing
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert filter_index.graph_behind(conn) is None


def test_a_worker_that_does_not_own_the_store_says_who_can_rebuild_it(db_url: str) -> None:
    from pgrag import filter_index
    from pgrag.worker import Worker

    lines: list[str] = []
    with _outgrown_store(db_url) as (env, embedder):
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("set role pgrag_writer")
            behind = filter_index.graph_behind(conn)
            assert behind is not None and not behind.owner
            assert (behind.current, behind.wanted) == ((2, 4), (16, 64))
        # the worker as the writer role: measured, nothing rebuilt, the owner's command said
        with Worker(db_url, embedder, notice=lines.append) as w:
            w.conn.execute("set role pgrag_writer")
            assert w.drain().written == 1_600
            w.join_reindex()
        assert lines == [
            "pgrag: the store index's graph (m 2, ef_construction 4) stops short of the recall "
            "target at 3,100 vectors: `pgrag reindex`, as the owner of pgrag.chunks, rebuilds "
            "it with m 16, ef_construction 64 (docs/search.md, 'The graph')"
        ]
        # --no-reindex (auto_reindex=False): measured, nothing rebuilt, nothing said
        _insert_chunks(db_url, 20_000, 3_200)
        lines.clear()
        with Worker(db_url, embedder, notice=lines.append, auto_reindex=False) as w:
            assert w.drain().written == 3_200
            assert w.last_tune is not None and w.last_tune.chosen is None
            w.join_reindex()
        assert lines == []
        out = run_pgrag("status", env=env)
    with psycopg.connect(db_url) as conn:
        assert conn.execute(_GRAPH).fetchone() == (2, 4)
    assert (
        "`pgrag reindex` rebuilds it for the store's size (m 16, ef_construction 64), as "
        "`pgrag worker` does when it owns the store" in out.stdout
    ), out.stdout


def _store_index_valid(url: str, name: str) -> bool:
    with psycopg.connect(url) as c:
        row = c.execute(
            "select x.indisvalid from pg_index x where x.indexrelid = to_regclass(%s)",
            (f"pgrag.{name}",),
        ).fetchone()
    return bool(row and row[0])


def test_stopping_the_worker_cancels_its_rebuild_and_keeps_the_old_index(db_url: str) -> None:
    from pgrag.worker import Worker

    from .conftest import wait_for

    lines: list[str] = []
    with (
        _outgrown_store(db_url) as (_, embedder),
        psycopg.connect(db_url) as writer,
        Worker(db_url, embedder, notice=lines.append) as w,
    ):
        # a transaction writing the chunks holds the concurrent build at its start
        writer.execute("update pgrag.chunks set updated_at = updated_at where id = 1")
        assert w.drain().written == 1_600
        wait_for(lambda: len(lines) == 1, "the worker started its rebuild")
        status = run_pgrag("status", env={"PGRAG_DATABASE_URL": db_url})
        assert "store index: being rebuilt (" in status.stdout, status.stdout
        w.stop.set()
        wait_for(lambda: len(lines) == 2, "the worker said what became of its rebuild")
        writer.rollback()
        w.join_reindex()
    assert lines[1] == (
        "pgrag: store index rebuild stopped with the worker: the old index stays as it was"
    ), lines
    with psycopg.connect(db_url) as conn:
        assert conn.execute(_GRAPH).fetchone() == (2, 4)
    assert _store_index_valid(db_url, "chunks_embedding_hnsw")


def test_a_stop_while_the_old_index_is_dropped_keeps_the_new_one_for_the_next_start(
    db_url: str,
) -> None:
    # a transaction left open on the chunks holds the drop of the old index without end: the
    # worker's stop must not wait for it; the new index, built, stays and the next start of
    # a worker swaps it in
    from pgrag.worker import Worker

    from .conftest import wait_for

    def new_index_valid() -> bool:
        return _store_index_valid(db_url, "chunks_embedding_hnsw_new")

    lines: list[str] = []
    with _outgrown_store(db_url) as (env, embedder):
        with psycopg.connect(db_url) as reader, Worker(db_url, embedder, notice=lines.append) as w:
            # a lock on the chunks, no snapshot held: the build does not wait for it, the drop
            # of the old index does
            reader.execute("lock table pgrag.chunks in access share mode")
            with psycopg.connect(db_url) as watch:
                held = watch.execute(
                    "select backend_xmin is null from pg_stat_activity where pid = %s",
                    (reader.info.backend_pid,),
                ).fetchone()
            assert held == (True,)
            assert w.drain().written == 1_600
            wait_for(new_index_valid, "the new index built")
            w.stop.set()
            wait_for(lambda: len(lines) == 2, "the worker said what became of its rebuild")
            w.join_reindex()
            reader.rollback()
        assert lines[1].startswith(
            "pgrag: store index rebuild stopped before the new store index replaced the old "
            "one: chunks_embedding_hnsw_new is built and serves searches beside the old one"
        ), lines
        assert new_index_valid()
        status = run_pgrag("status", env=env)
        assert (
            "store index: a rebuilt index (chunks_embedding_hnsw_new) waits beside the old one"
            in status.stdout
        ), status.stdout
        # a conversion of the store waits for the rebuild to be finished
        r = run_pgrag("db", "upgrade", "--tenant-partitions", "2", env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "a rebuild of the store index is unfinished" in r.stderr, r.stderr
        # the next worker finishes it when it starts
        lines.clear()
        with Worker(db_url, embedder, notice=lines.append) as w:
            w.join_reindex()
        assert lines[0] == (
            "pgrag: a rebuild of the store index left chunks_embedding_hnsw_new built beside "
            "the old one: swapping it in"
        ), lines
        assert lines[1].startswith("pgrag: store index swapped in ("), lines
    with psycopg.connect(db_url) as conn:
        assert conn.execute(_GRAPH).fetchone() == (16, 64)
        assert conn.execute(
            "select count(*) from pg_index x join pg_class i on i.oid = x.indexrelid "
            "where x.indrelid = 'pgrag.chunks'::regclass and i.relname like 'chunks_embedding%'"
        ).fetchone() == (1,)
    assert not new_index_valid()
