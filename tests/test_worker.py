"""The embedding worker against a real PostgreSQL and the real offline model.

Vectors match the model; concurrent workers; SIGKILL mid-batch; text changed while embedding;
the content cache; model mismatch and re-embedding; poison chunks and outages; the CLI.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from pgrag.embed import RetryPolicy
from pgrag.embed.onnx import OnnxEmbedder
from pgrag.embed.openai import OpenAIEmbedder
from pgrag.errors import ModelMismatch, NotMigrated
from pgrag.worker import DrainResult, Worker, as_vector

from .conftest import PATIENCE_S, wait_for
from .embed_server import (
    FakeEmbeddings,
    Recording,
    cli_env,
    default_embedder,
    fake_vector,
    start_cli,
    texts,
)
from .embed_server import run_cli as _run_cli

FAST = RetryPolicy(attempts=3, base_s=0.01, max_s=0.05)
LOCK_CLASS = 1885827687  # pgrag._chunk_lock_keys(): the advisory lock class of chunk claims


@pytest.fixture
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings()
    yield server
    server.close()


def insert(url: str, items: Sequence[str], doc_type: str = "t") -> list[int]:
    with psycopg.connect(url) as conn:
        start = conn.execute("select count(*) from pgrag.chunks").fetchone()
        assert start is not None
        return [
            int(
                conn.execute(
                    "insert into pgrag.chunks (doc_type, source_key, text) values (%s, %s, %s) "
                    "returning id",
                    (doc_type, f"{start[0] + i}", t),
                ).fetchone()[0]  # type: ignore[index]
            )
            for i, t in enumerate(items)
        ]


def stored(url: str) -> dict[int, tuple[str, np.ndarray | None, str | None]]:
    with psycopg.connect(url) as conn:
        register_vector(conn)
        rows = conn.execute(
            "select id, text, embedding, embedding_model from pgrag.chunks order by id"
        ).fetchall()
    return {r[0]: (r[1], None if r[2] is None else as_vector(r[2]), r[3]) for r in rows}


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
        return row[0] if row else None


def claim_locks(url: str) -> int:
    return int(
        scalar(
            url,
            f"select count(*) from pg_locks where locktype = 'advisory' and classid = {LOCK_CLASS}",
        )
    )


def run_cli(args: Sequence[str], env: dict[str, str]) -> Any:
    """``pgrag ARGS`` to its end (the deadline only guards against a hang)."""
    return _run_cli(args, env, timeout=PATIENCE_S)


def claim_holders(url: str) -> int:
    """Sessions holding chunk claims."""
    return int(
        scalar(
            url,
            "select count(distinct pid) from pg_locks "
            f"where locktype = 'advisory' and classid = {LOCK_CLASS}",
        )
    )


def lock_waiters(url: str) -> int:
    """Sessions of this database waiting on a heavyweight lock."""
    return int(
        scalar(
            url,
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and wait_event_type = 'Lock'",
        )
    )


@contextmanager
def holding_cache_entry(url: str, model: str, text: str) -> Iterator[None]:
    """An uncommitted content-cache row for ``text`` under ``model``: a worker storing a batch
    that holds this text waits (its insert into pgrag.embedding_cache) until the block ends and
    the row is rolled back. A batch held mid-way, by a lock, not caught by a stopwatch."""
    with psycopg.connect(url) as holder:
        holder.execute(
            "insert into pgrag.embedding_cache (model, content_hash, embedding) "
            "values (%s, pgrag.text_sha256(%s), array_fill(0.5, array[384])::vector)",
            (model, text),
        )
        try:
            yield
        finally:
            holder.rollback()


def assert_vectors_are_the_models(url: str, sample: int | None = None) -> None:
    rows = [(t, v) for t, v, _ in stored(url).values() if v is not None]
    rows = rows[:sample] if sample else rows
    expected = default_embedder().embed([t for t, _ in rows])
    got = np.stack([v for _, v in rows])
    assert np.allclose(got, expected, atol=1e-5)


def test_drain_stores_the_models_vectors(db_url: str) -> None:
    insert(db_url, list(texts(40)))
    with Worker(db_url, default_embedder(), batch_size=16) as w:
        w.check()
        assert w.queue().waiting == 40
        result = w.drain()
        assert (result.batches, result.written, result.model_texts) == (3, 40, 40)
        assert w.queue().waiting == 0
        assert w.drain().claimed == 0
    rows = stored(db_url)
    assert all(model == "sentence-transformers/all-MiniLM-L6-v2" for _, _, model in rows.values())
    assert scalar(db_url, "select embedding_model from pgrag.settings") == rows[1][2]
    assert_vectors_are_the_models(db_url)
    assert claim_locks(db_url) == 0


def test_concurrent_workers_embed_each_chunk_once(db_url: str) -> None:
    items = list(texts(120))
    insert(db_url, items)
    results: list[DrainResult] = []

    def run() -> None:
        with Worker(db_url, model, batch_size=8) as w:
            results.append(w.drain())

    def first_batch_waits_for_the_others(calls: int, _: Sequence[str]) -> None:
        # every worker claims a batch before the first goes to the model (claims need no
        # model), so that each gets work however the threads are scheduled
        if calls == 1:
            wait_for(lambda: claim_holders(db_url) == 3, "all three workers claimed a batch")

    model = Recording(default_embedder(), before=first_batch_waits_for_the_others)
    threads = [threading.Thread(target=run, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE_S)
    assert not any(t.is_alive() for t in threads), "a worker did not finish"
    assert sorted(model.texts) == sorted(items)  # none twice, none skipped
    assert sum(r.written for r in results) == 120
    assert all(r.batches > 0 for r in results), "every worker got work"
    assert all(v is not None for _, v, _ in stored(db_url).values())


@pytest.mark.chaos
def test_sigkill_mid_batch_loses_nothing(db_url: str) -> None:
    items = list(texts(800))
    insert(db_url, items)
    # the seventh batch of 32 (items 192 to 223) is held while it is stored, then the worker
    # is killed: six batches are in, whatever the machine's speed
    with holding_cache_entry(db_url, "sentence-transformers/all-MiniLM-L6-v2", items[200]):
        proc = start_cli(["embed", "--batch-size", "32"], cli_env(db_url))
        try:
            wait_for(lambda: lock_waiters(db_url) == 1, "the worker waits to store a batch")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    # its backend, let go, either stores the held batch or not; then it is gone
    wait_for(lambda: claim_locks(db_url) == 0, "the killed worker's claims are released")
    done = scalar(db_url, "select count(embedding) from pgrag.chunks")
    assert done in (192, 224)
    # nothing half-written: vector, model and timestamp together; the cache in step
    assert (
        scalar(
            db_url,
            "select count(*) from pgrag.chunks where (embedding is null) <> "
            "(embedding_model is null) or (embedding is null) <> (embedded_at is null)",
        )
        == 0
    )
    assert scalar(db_url, "select count(*) from pgrag.embedding_cache") == done
    model = Recording(default_embedder())
    with Worker(db_url, model, batch_size=64) as w:
        result = w.drain()
    assert result.written == 800 - done
    assert len(model.texts) == 800 - done  # no text embedded again
    assert scalar(db_url, "select count(embedding) from pgrag.chunks") == 800
    assert_vectors_are_the_models(db_url, sample=50)


def test_text_changed_while_embedding_stays_queued(db_url: str) -> None:
    ids = insert(db_url, list(texts(6)))
    writer = psycopg.connect(db_url, autocommit=True)
    writer.execute("set lock_timeout = '3s'")  # the claim holds no row lock: no waiting at all

    def change(calls: int, _: Sequence[str]) -> None:
        if calls == 1:
            writer.execute(
                "update pgrag.chunks set text = 'rewritten while embedding' where id = %s",
                (ids[2],),
            )

    model = Recording(default_embedder(), before=change)
    try:
        with Worker(db_url, model, batch_size=10) as w:
            first = w.run_batch()
            assert first is not None
            assert (first.claimed, first.written, first.changed) == (6, 5, 1)
            assert stored(db_url)[ids[2]][1] is None  # still waiting
            second = w.run_batch()
            assert second is not None and (second.claimed, second.written) == (1, 1)
            assert w.run_batch() is None
    finally:
        writer.close()
    text, vector, _ = stored(db_url)[ids[2]]
    assert text == "rewritten while embedding" and vector is not None
    assert_vectors_are_the_models(db_url)


def test_content_cache_never_pays_twice(db_url: str) -> None:
    same = "Order 17: two garden hoses, returned one."
    insert(db_url, [same, same, same, "something else"])
    model = Recording(default_embedder())
    with Worker(db_url, model, batch_size=10) as w:
        r = w.drain()
        assert (r.written, r.model_texts) == (4, 2)
        assert sorted(model.texts) == sorted([same, "something else"])
        # rebuild the whole store with unchanged texts: nothing goes to the model
        with psycopg.connect(db_url) as conn:
            conn.execute("delete from pgrag.chunks")
        insert(db_url, [same, "something else", same], doc_type="rebuilt")
        r = w.drain()
        assert (r.written, r.from_cache, r.model_texts) == (3, 3, 0)
    assert model.calls == 1
    assert_vectors_are_the_models(db_url)
    with Worker(db_url, model) as w:
        assert scalar(db_url, "select pgrag.prune_embedding_cache()") == 0


def test_another_model_is_refused_until_reembed(db_url: str, fake: FakeEmbeddings) -> None:
    insert(db_url, list(texts(5)))
    with Worker(db_url, default_embedder()) as w:
        w.drain()
    other = OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=384)
    insert(db_url, ["a new chunk"])
    with Worker(db_url, other, retry=FAST) as w:
        with pytest.raises(
            ModelMismatch,
            match=r"come from the model sentence-transformers/"
            r"all-MiniLM-L6-v2, not openai:fake-embed.*pgrag reembed --model",
        ):
            w.check()
        with pytest.raises(ModelMismatch):  # the store itself refuses, check() or not
            w.run_batch()
    assert stored(db_url)[6][1] is None and claim_locks(db_url) == 0
    # the ONNX build is the same model: accepted, and its vectors are never compared to others
    with Worker(db_url, OnnxEmbedder()) as w:
        w.check()
        assert w.drain().written == 1
    with Worker(db_url, other, retry=FAST) as w:
        assert w.begin_reembed() == 6
        assert scalar(db_url, "select count(embedding) from pgrag.chunks") == 0
        assert w.drain().written == 6
    rows = stored(db_url)
    assert {m for _, _, m in rows.values()} == {"openai:fake-embed"}
    assert all(
        v is not None and np.allclose(v, fake_vector(t, 384), atol=1e-6)
        for t, v, _ in rows.values()
    )
    # back to the default: every text comes from the content cache
    model = Recording(default_embedder())
    with Worker(db_url, model) as w:
        w.begin_reembed()
        assert w.drain().from_cache == 6
    assert model.texts == []


def test_reembed_with_another_dimension(db_url: str, fake: FakeEmbeddings) -> None:
    insert(db_url, list(texts(3)))
    small = OpenAIEmbedder("fake-small", base_url=fake.base_url, dimensions=8)
    with Worker(db_url, small) as w:
        with pytest.raises(Exception, match="dimension 8 does not match this store's 384"):
            w.check()
        w.begin_reembed()
        w.check()
        assert w.drain().written == 3
    assert scalar(db_url, "select embedding_dim from pgrag.settings") == 8
    assert "vector(8)" in scalar(
        db_url,
        "select format_type(atttypid, atttypmod) from pg_attribute "
        "where attrelid = 'pgrag.chunks'::regclass and attname = 'embedding'",
    )
    assert (
        scalar(db_url, "select count(*) from pg_indexes where indexname = 'chunks_embedding_hnsw'")
        == 1
    )


def test_poison_chunk_is_reported_not_looped_on(db_url: str, fake: FakeEmbeddings) -> None:
    fake.poison = "POISON"
    ids = insert(db_url, [*texts(7), "a POISON text"])
    e = OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=384)
    with Worker(db_url, e, batch_size=8, retry=FAST) as w:
        r = w.drain()
        assert (r.written, len(r.failures)) == (7, 1)
        assert r.failures[0].chunk_id == ids[-1] and "400" in r.failures[0].error
        assert not r.outage
        assert w.drain().claimed == 0  # skipped until its retry time: no loop
        assert (w.queue().waiting, w.queue().retrying) == (0, 1)
    res = run_cli(["embed"], cli_env(db_url, fake.env()))
    assert res.returncode == 0, res.stderr  # nothing ready now; the failure waits
    res = run_cli(["embed", "--retry-failed"], cli_env(db_url, fake.env()))
    assert res.returncode == 9
    assert f"chunk {ids[-1]}: " in res.stderr and "--retry-failed" in res.stderr
    assert scalar(db_url, "select attempts from pgrag.embed_errors") == 1
    with psycopg.connect(db_url) as conn:  # a new text is a new chance
        conn.execute("update pgrag.chunks set text = 'fixed' where id = %s", (ids[-1],))
    with Worker(db_url, e) as w:
        assert w.drain().written == 1
    assert scalar(db_url, "select count(*) from pgrag.embed_errors") == 0


def test_outage_is_retried_then_reported(db_url: str, fake: FakeEmbeddings) -> None:
    fake.always = 503
    insert(db_url, list(texts(12)))
    e = OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=384)
    with Worker(db_url, e, batch_size=4, retry=FAST) as w:
        r = w.drain()
    assert r.outage and r.batches == 1 and len(r.failures) == 4  # stops, does not hammer
    assert len(fake.requests) == FAST.attempts
    assert scalar(db_url, "select count(embedding) from pgrag.chunks") == 0
    assert scalar(db_url, "select count(*) from pgrag.embed_errors") == 4
    res = run_cli(["embed"], cli_env(db_url, fake.env()))
    assert res.returncode == 9 and "is failing" in res.stderr


def test_worker_wakes_on_notify_and_stops_on_sigterm(db_url: str, fake: FakeEmbeddings) -> None:
    proc = start_cli(["worker", "--batch-size", "2", "--poll", "600"], cli_env(db_url, fake.env()))
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            wait_for(
                lambda: (
                    scalar(
                        db_url,
                        "select count(*) from pg_stat_activity "
                        "where query = 'listen \"pgrag_render\"'",
                    )
                    == 1
                ),
                "the worker listens",
            )
            insert(db_url, ["first"])
            conn.execute("notify pgrag_chunks, 't'")
            wait_for(
                lambda: scalar(db_url, "select count(embedding) from pgrag.chunks") == 1,
                "the worker woke up and embedded the first chunk",
            )
            # SIGTERM while a batch is in flight (held as it is stored): that batch is
            # finished, no other is taken
            with holding_cache_entry(db_url, "openai:fake-embed", "third"):
                insert(db_url, ["second", "third", "fourth", "fifth"])
                conn.execute("notify pgrag_chunks, 't'")
                wait_for(lambda: lock_waiters(db_url) == 1, "the worker waits to store a batch")
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped after 3 chunks" in err
    assert scalar(db_url, "select count(embedding) from pgrag.chunks") == 3
    assert claim_locks(db_url) == 0


def test_cli_embed_progress_and_mismatch(db_url: str, fake: FakeEmbeddings) -> None:
    insert(db_url, list(texts(5)))
    res = run_cli(["embed", "--batch-size", "2"], cli_env(db_url, fake.env()))
    assert res.returncode == 0, res.stderr
    assert "embedded 5 chunks" in res.stdout and "5 texts through the model" in res.stdout
    res = run_cli(["embed"], cli_env(db_url, fake.env()))
    assert res.returncode == 0 and "nothing to embed" in res.stdout
    res = run_cli(["embed"], cli_env(db_url, fake.env("other-model")))
    assert res.returncode == 5
    assert res.stderr.strip().count("\n") == 0 and "pgrag reembed --model" in res.stderr
    res = run_cli(["reembed", "--yes"], cli_env(db_url, fake.env("other-model")))
    assert res.returncode == 0, res.stderr
    assert "5 chunks queued" in res.stdout and "embedded 5 chunks" in res.stdout


def test_unmigrated_database_is_a_clear_error(empty_db_url: str) -> None:
    with pytest.raises(NotMigrated, match="pgrag db upgrade"):
        Worker(empty_db_url, default_embedder()).open()


def test_a_superuser_worker_says_which_queued_types_it_leaves(db_url: str) -> None:
    """A superuser's session runs no other role's declared SQL (docs/security.md): its worker
    leaves those types' queue entries, and says so once, not at every poll."""
    from .test_security import as_role

    with psycopg.connect(db_url, autocommit=True) as conn:
        writer = conn.execute("select writer_role from pgrag.settings").fetchone()
        assert writer is not None
        conn.execute(
            f"create schema wq; create table wq.t (id integer primary key, v text not null); "
            f"alter table wq.t owner to {writer[0]}; grant usage on schema wq to {writer[0]}"
        )
    with psycopg.connect(as_role(db_url, writer[0]), autocommit=True) as w:
        w.execute(
            "select pgrag.declare_document('wq_t', 'select id as source_key, v as text "
            'from wq.t\', \'{"wq.t": "select id from changed"}\')'
        )
        w.execute("select pgrag.set_sync('wq_t', 'queue')")
        w.execute("insert into wq.t values (1, 'one')")
    said: list[str] = []
    with Worker(db_url, default_embedder(), notice=said.append) as worker:
        assert worker.render_batch() is None and worker.render_batch() is None
    assert len(said) == 1 and "this session does not render" in said[0], said
    assert "run the worker" in said[0]
    with psycopg.connect(db_url) as conn:  # still queued, for a worker that may render it
        assert conn.execute(
            "select count(*) from pgrag.render_queue where doc_type = 'wq_t'"
        ).fetchone() == (1,)


def test_the_worker_prunes_the_statistics_caches_record_of_writes(db_url: str) -> None:
    """Every write to a table that cached statistics read adds a row to pgrag.stats_changes,
    which storing a result prunes: a database written far more often than its statistics are
    asked for would grow it until then. The worker prunes it too once it holds 1,000 rows, and
    leaves it alone below that."""
    add = (
        "insert into pgrag.stats_changes (xid, relid) "
        "select g::text::xid8, 'pgrag.chunks'::regclass from generate_series(%s::int, %s::int) g"
    )  # (transactions long finished: ids far below any running one)
    count = "select count(*) from pgrag.stats_changes"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("delete from pgrag.stats_changes")
        conn.execute(add, (3, 1001))
        with Worker(db_url, default_embedder()) as w:
            w.drain()
        assert conn.execute(count).fetchone() == (999,)  # under the threshold: left
        conn.execute(add, (2, 2))
        with Worker(db_url, default_embedder()) as w:
            w.drain()
        assert conn.execute(count).fetchone() == (0,)
