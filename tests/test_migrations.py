"""Migrations as a DBA runs them: up, down, up again; from the wheel; with plain alembic."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from pgrag import migrate
from pgrag.errors import ConfigError, DimensionMismatch, PgragError
from pgrag.server import bin_dir

from .conftest import PATIENCE_S, REPO


def schema_dump(url: str) -> str:
    out = subprocess.run(
        [str(bin_dir() / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # pg_dump 17+ prints a random \restrict key per run
    return "\n".join(
        ln for ln in out.splitlines() if not ln.startswith(("\\restrict", "\\unrestrict"))
    )


def scalar(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
        return row[0] if row else None


def test_upgrade_downgrade_upgrade_leaves_identical_schema(empty_db_url: str) -> None:
    before = schema_dump(empty_db_url)
    migrate.upgrade(empty_db_url)
    first = schema_dump(empty_db_url)
    assert "pgrag.chunks" in first
    migrate.downgrade(empty_db_url, "base")
    base = schema_dump(empty_db_url)
    assert "pgrag." not in base
    assert scalar(empty_db_url, "select count(*) from pg_extension where extname='vector'") == 0
    # nothing remains of what upgrade made, not even alembic's version table
    assert base == before
    migrate.upgrade(empty_db_url)
    assert schema_dump(empty_db_url) == first


def test_downgrade_keeps_a_vector_extension_it_did_not_create(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("create extension vector")
    migrate.upgrade(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    assert scalar(empty_db_url, "select count(*) from pg_extension where extname='vector'") == 1


def test_chunk_store_shape(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        cols: dict[str, Any] = dict(
            conn.execute(
                "select attname, format_type(atttypid, atttypmod) from pg_attribute "
                "where attrelid = 'pgrag.chunks'::regclass and attnum > 0 and not attisdropped"
            ).fetchall()
        )
        indexes = {
            r[0]: r[1]
            for r in conn.execute(
                "select indexname, indexdef from pg_indexes where schemaname = 'pgrag'"
            )
        }
    assert cols["embedding"] == "vector(384)"
    assert cols["content_hash"] == "bytea" and cols["tsv"] == "tsvector"
    for name in ("id", "doc_type", "source_key", "parent_id", "text", "metadata"):
        assert name in cols
    for name in ("embedding_model", "embedded_at", "updated_at"):
        assert name in cols
    assert "hnsw (embedding vector_cosine_ops)" in indexes["chunks_embedding_hnsw"]
    assert "m='16'" in indexes["chunks_embedding_hnsw"]
    assert "gin (tsv)" in indexes["chunks_tsv_gin"]
    assert "gin (metadata jsonb_path_ops)" in indexes["chunks_metadata_gin"]
    assert "WHERE (embedding IS NULL)" in indexes["chunks_pending"]
    assert "WHERE (tsv IS NULL)" in indexes["chunks_tsv_pending"]


def test_chunk_rows_hash_tsvector_and_cascade(conn: psycopg.Connection) -> None:
    parent = conn.execute(
        "insert into pgrag.chunks (doc_type, source_key, text) values ('p', '1', 'Café \\x41')"
        " returning id, content_hash, tsv"
    ).fetchone()
    assert parent is not None
    assert bytes(parent[1]) == hashlib.sha256("Café \\x41".encode()).digest()
    assert parent[2] is None  # (since 0011 written by pgrag: the worker fills it in)
    conn.execute("select pgrag.index_text()")
    tsv = conn.execute("select tsv::text from pgrag.chunks where id = %s", (parent[0],))
    assert "café" in str(tsv.fetchone())
    conn.execute(
        "insert into pgrag.chunks (doc_type, source_key, parent_id, text) "
        "values ('c', '1', %s, 'x')",
        (parent[0],),
    )
    conn.execute("delete from pgrag.chunks where id = %s", (parent[0],))
    row = conn.execute("select count(*) from pgrag.chunks where doc_type = 'c'").fetchone()
    assert row == (0,)
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text) values ('p', '2', 'a'), "
            "('p', '2', 'b')"
        )


def test_dimension_and_hnsw_options_are_chosen_at_migration(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, dimension=768, hnsw_m=24, hnsw_ef_construction=100)
    assert scalar(empty_db_url, "select embedding_dim from pgrag.settings") == 768
    typ = scalar(
        empty_db_url,
        "select format_type(atttypid, atttypmod) from pg_attribute "
        "where attrelid = 'pgrag.chunks'::regclass and attname = 'embedding'",
    )
    assert typ == "vector(768)"
    idx = str(
        scalar(
            empty_db_url,
            "select indexdef from pg_indexes where indexname = 'chunks_embedding_hnsw'",
        )
    )
    assert "m='24'" in idx and "ef_construction='100'" in idx
    with pytest.raises(DimensionMismatch, match="migrated with embedding dimension 768"):
        migrate.upgrade(empty_db_url, dimension=384)
    migrate.upgrade(empty_db_url)  # no dimension asked: fine, keeps 768
    with psycopg.connect(empty_db_url) as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute("select pgrag.check_dimension(384)")
        assert err.value.sqlstate == "PR002"


def test_wrong_dimension_vector_is_refused(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.DataException, match="expected 384 dimensions"):
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text, embedding) "
            "values ('x', '1', 't', %s)",
            (np.ones(3, dtype=np.float32),),
        )


def test_hnsw_index_serves_top_k(db_url: str) -> None:
    rng = np.random.default_rng(7)
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        with conn.cursor().copy(
            "copy pgrag.chunks (doc_type, source_key, text, embedding) from stdin"
        ) as copy:
            for i in range(3000):
                copy.write_row(("t", str(i), f"text {i}", rng.standard_normal(384).astype("f4")))
        conn.commit()
        conn.execute("analyze pgrag.chunks")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "explain select id from pgrag.chunks order by embedding <=> %s limit 10",
                (rng.standard_normal(384).astype("f4"),),
            )
        )
    assert "chunks_embedding_hnsw" in plan, plan


def test_sql_files_reach_the_server_untouched(empty_db_url: str) -> None:
    path = Path(__file__).parent / "sql" / "percent_and_colon.sql"
    with psycopg.connect(empty_db_url) as conn:
        migrate.run_sql_file(conn, path)
        rows = conn.execute("select doc::text, label from percent_colon order by id").fetchall()
    assert rows == [('{"a": 1}', '"my schema"."T"'), ('{"b": ":name"}', "ratio 50%")]
    # the same file through SQLAlchemy, as alembic runs it
    from sqlalchemy import create_engine

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(empty_db_url))
    with engine.begin() as sa_conn:
        sa_conn.exec_driver_sql("drop table percent_colon")
        migrate.run_sql_file(sa_conn, path)
    engine.dispose()
    assert scalar(empty_db_url, "select label from percent_colon where id = 1") == '"my schema"."T"'


def test_failed_migration_changes_nothing(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("create schema pgrag")  # upgrade's `create schema pgrag` will fail
    with pytest.raises(PgragError, match="rolled back"):
        migrate.upgrade(empty_db_url)
    assert migrate.current(empty_db_url) is None
    assert scalar(empty_db_url, "select count(*) from pg_extension where extname='vector'") == 0


def test_concurrent_upgrades_serialize(empty_db_url: str) -> None:
    """Three processes migrate one database at once: one migrates, the others wait and no-op."""
    code = "import sys, pgrag.migrate as m; m.upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, empty_db_url], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=PATIENCE_S)
        assert p.returncode == 0, err
    assert migrate.current(empty_db_url) == migrate.head()
    threads = [threading.Thread(target=migrate.upgrade, args=(empty_db_url,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=PATIENCE_S)
        assert not t.is_alive()


def test_unknown_revision_is_a_clear_error(empty_db_url: str) -> None:
    with pytest.raises(ConfigError, match="db history"):
        migrate.upgrade(empty_db_url, "9999")


def test_plain_alembic_upgrade_and_downgrade(empty_db_url: str) -> None:
    alembic = str(Path(sys.executable).parent / "alembic")
    env = {**os.environ, "PGRAG_DATABASE_URL": empty_db_url}
    for args in (["upgrade", "head"], ["downgrade", "base"], ["upgrade", "head"]):
        subprocess.run([alembic, *args], cwd=REPO, env=env, check=True, capture_output=True)
    assert migrate.current(empty_db_url) == migrate.head()
    dim = subprocess.run(
        [alembic, "-x", f"url={empty_db_url}", "-x", "dimension=512", "upgrade", "head"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert dim.returncode != 0 and "migrated with embedding dimension 384" in dim.stderr


def test_installed_wheel_migrates_without_the_source_tree(
    empty_db_url: str, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("pgrag_relational-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import pgrag, pgrag.migrate as m;"
        f"assert pgrag.__file__.startswith({str(site)!r}), pgrag.__file__;"
        "assert '_sql' in str(m.sql_dir()) and '_alembic' in str(m.alembic_dir());"
        "import sys; m.upgrade(sys.argv[1]); print(m.current(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, empty_db_url],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(site)},
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == migrate.head()


def test_frozen_incremental_files_do_not_change() -> None:
    frozen = REPO / "sql" / "incremental" / "frozen.txt"
    for line in frozen.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        digest, name = line.split()
        actual = hashlib.sha256((REPO / "sql" / "incremental" / name).read_bytes()).hexdigest()
        assert actual == digest, f"{name} is frozen (released): add a new incremental file instead"


TSV_0001 = "tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED"


def same_but_the_tsvectors_place(dump: str, reference: str) -> bool:
    """Two schema dumps alike but for where pgrag.chunks.tsv is in the table: downgraded
    below 0011 it is the generated column of 0001 again, made anew, so last (PostgreSQL cannot
    make a plain column generated in place)."""

    def lines(d: str) -> list[str]:
        return [ln.rstrip(",") for ln in d.splitlines() if TSV_0001 not in ln]

    return TSV_0001 in dump and TSV_0001 in reference and lines(dump) == lines(reference)


def test_downgrade_below_documents_removes_every_generated_object(empty_db_url: str) -> None:
    from .shop_fixture import load_tiny_shop

    def pgrag_schema() -> str:
        out = subprocess.run(
            [
                str(bin_dir() / "pg_dump"),
                "--schema-only",
                "--schema=pgrag",
                "--no-owner",
                empty_db_url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return "\n".join(ln for ln in out.splitlines() if not ln.startswith("\\"))

    migrate.upgrade(empty_db_url, "0001")
    reference = pgrag_schema()
    migrate.upgrade(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        load_tiny_shop(conn)  # customer_profile <- order_detail, with triggers on shop.*
        conn.execute(
            "select pgrag.declare_document('order_line', "
            "'select order_item_id as source_key, order_id as parent_key, "
            "quantity::text as text from shop.order_items', "
            "'{\"shop.order_items\": \"select order_item_id from changed\"}', 'order_detail')"
        )  # a third level: children must be dropped before their parents
    migrate.downgrade(empty_db_url, "0001", drop_data=True)
    assert same_but_the_tsvectors_place(pgrag_schema(), reference)
    triggers = scalar(empty_db_url, "select count(*) from pg_trigger where tgname like 'pgrag_%'")
    assert triggers == 0


def test_downgrade_of_0006_restores_0005_exactly(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0005")
    at_0005 = schema_dump(empty_db_url)
    migrate.upgrade(empty_db_url)
    assert "chunks_read" in schema_dump(empty_db_url)  # the tenant policy
    migrate.downgrade(empty_db_url, "0005")
    assert same_but_the_tsvectors_place(schema_dump(empty_db_url), at_0005)
    with psycopg.connect(empty_db_url) as conn:  # and functions' privileges are the defaults
        acl = conn.execute(
            "select count(*) from pg_proc where pronamespace = 'pgrag'::regnamespace "
            "and proacl is not null"
        ).fetchone()
    assert acl == (0,)


def test_0010_waits_for_the_queue_of_rows_at_most_5_s_and_downgrades_exactly(
    empty_db_url: str,
) -> None:
    """0010 stores the rows a commit's key queries read uncompressed (SET STORAGE, an ACCESS
    EXCLUSIVE lock on pgrag.sync_queue, which writers recording rows take too): held by an
    open transaction, the migration waits 5 s for it, then fails in one line, changing
    nothing; once it is free it runs; its downgrade restores 0009 exactly."""
    from pgrag.errors import PgragError

    migrate.upgrade(empty_db_url, "0009")
    at_0009 = schema_dump(empty_db_url)
    with psycopg.connect(empty_db_url) as writer:
        writer.execute(
            "insert into pgrag.sync_queue (doc_type, source_table, op) "
            "values ('x', 'pg_class', 'INSERT')"
        )
        with pytest.raises(PgragError, match="pgrag.sync_queue is held by a transaction"):
            migrate.upgrade(empty_db_url)
        writer.rollback()
    assert scalar(empty_db_url, "select version_num from public.pgrag_alembic_version") == "0009"
    migrate.upgrade(empty_db_url)
    storage = (
        "select attstorage from pg_attribute "
        "where attrelid = 'pgrag.sync_queue'::regclass and attname = 'changed'"
    )
    assert scalar(empty_db_url, storage) == "e"
    migrate.downgrade(empty_db_url, "0009")
    assert same_but_the_tsvectors_place(schema_dump(empty_db_url), at_0009)


def test_role_names_are_chosen_at_migration_and_then_fixed(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, reader_role="pgrag_t_reads", writer_role="pgrag_t_writes")
    assert scalar(empty_db_url, "select writer_role from pgrag.settings") == "pgrag_t_writes"
    assert scalar(empty_db_url, "select has_table_privilege('pgrag_t_reads', "
                  "'pgrag.chunks', 'select')") is True  # fmt: skip
    assert scalar(empty_db_url, "select has_table_privilege('pgrag_t_reads', "
                  "'pgrag.chunks', 'insert')") is False  # fmt: skip
    with pytest.raises(ConfigError, match="migrated with reader role pgrag_t_reads"):
        migrate.upgrade(empty_db_url, reader_role="someone_else")
    migrate.upgrade(empty_db_url)  # no names asked: fine, keeps them


def test_a_migrator_without_createrole_gets_the_dba_statements(empty_db_url: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(empty_db_url)["dbname"]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("create extension if not exists vector")
        conn.execute(
            "do $$ begin if not exists (select from pg_roles where rolname = 'pgrag_t_owner') "
            "then create role pgrag_t_owner login; end if; end $$"
        )
        conn.execute(f'alter database "{dbname}" owner to pgrag_t_owner'.encode())
        conn.execute("grant create on schema public to pgrag_t_owner")
    as_owner = empty_db_url + ("&" if "?" in empty_db_url else "?") + "user=pgrag_t_owner"
    with pytest.raises(ConfigError, match="may not create roles") as err:
        migrate.upgrade(as_owner, reader_role="pgrag_t_r_missing", writer_role="pgrag_t_w_missing")
    assert "create role pgrag_t_r_missing nologin" in str(err.value.__cause__ or err.value)
    assert migrate.current(empty_db_url) is None  # nothing changed


def test_every_drop_table_of_the_downgrades_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # refuse_data_loss checks the tables tables_dropped_by finds: a drop it misses would lose
    # rows unchecked. Every `drop table` statement, each name of a list included.
    for path in sorted((migrate.sql_dir() / "downgrade").glob("*.sql")):
        body = path.read_text(encoding="utf-8")
        names = []
        for stmt in re.findall(r"\bdrop\s+table\s+([^;]*);", body, re.I):
            stmt = re.sub(
                r"^if\s+exists\s+|\s+(cascade|restrict)\s*$", "", stmt.strip(), flags=re.I
            )
            names += [tuple(n.strip().split(".")) for n in stmt.split(",")]
        for schema in re.findall(r"\bdrop\s+schema\s+(?:if\s+exists\s+)?(\w+)", body, re.I):
            names.append((schema, "*"))
        assert sorted(migrate.tables_dropped_by(path.name)) == sorted(names), path.name
    (tmp_path / "downgrade").mkdir()
    (tmp_path / "downgrade" / "x.sql").write_text(
        "drop table a.x, b.y;\nDROP TABLE IF EXISTS c.z ,d.w;\ndrop schema e cascade;\n"
    )
    monkeypatch.setattr(migrate, "sql_dir", lambda: tmp_path)
    assert migrate.tables_dropped_by("x.sql") == [
        ("a", "x"), ("b", "y"), ("c", "z"), ("d", "w"), ("e", "*")
    ]  # fmt: skip


def test_a_downgrade_check_it_may_not_run_says_so(db_url: str) -> None:
    # the caches are closed to the reader: checking they are empty is refused, clearly
    url = db_url + ("&" if "?" in db_url else "?") + "options=-c%20role%3Dpgrag_reader"
    with psycopg.connect(url) as conn, pytest.raises(ConfigError, match="may not read"):
        migrate.refuse_data_loss(conn, "0003_embeddings.sql")


def test_a_reader_role_that_would_see_every_tenant_is_refused(empty_db_url: str) -> None:
    # roles are reused as they are: a reader with BYPASSRLS, or a member of the writer role,
    # would see every tenant's chunks
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(
            "do $$ begin if not exists (select from pg_roles where rolname = 'pgrag_t_bypass') "
            "then create role pgrag_t_bypass nologin bypassrls; end if; end $$"
        )
    with pytest.raises(ConfigError, match="pgrag_t_bypass has BYPASSRLS") as err:
        migrate.upgrade(empty_db_url, reader_role="pgrag_t_bypass", writer_role="pgrag_t_w1")
    assert "nobypassrls" in str(err.value.__cause__ or err.value)
    assert migrate.current(empty_db_url) is None  # nothing changed
    migrate.upgrade(empty_db_url, reader_role="pgrag_t_r2", writer_role="pgrag_t_w2")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("grant pgrag_t_w2 to pgrag_t_r2")
    try:
        with pytest.raises(PgragError, match="pgrag_t_r2 is a member of pgrag_t_w2"):
            migrate.upgrade(empty_db_url)
    finally:
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            conn.execute("revoke pgrag_t_w2 from pgrag_t_r2")


def test_the_head_revision_is_alembics() -> None:
    # read from the revision files without loading alembic (every command checks it)
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(migrate.alembic_dir()))
    assert migrate.head() == script.get_current_head()
    assert [r for r, _ in migrate.history()][-1] == migrate.head()


def test_0011_leaves_the_tsvector_to_pgrag_and_downgrades_to_the_generated_column(
    empty_db_url: str,
) -> None:
    """0011 makes pgrag.chunks.tsv a plain column that pgrag writes (its values kept); its
    downgrade computes it again as 0010 did, every value equal, only placed last in the table."""
    migrate.upgrade(empty_db_url, "0010")
    at_0010 = schema_dump(empty_db_url)
    generated = (
        "select attgenerated from pg_attribute "
        "where attrelid = 'pgrag.chunks'::regclass and attname = 'tsv'"
    )
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text) "
            "values ('p', '1', 'Zebras running'), ('p', '2', 'a second text')"
        )
    migrate.upgrade(empty_db_url)
    assert scalar(empty_db_url, generated) == ""
    same = (
        "select count(*) from pgrag.chunks "
        "where tsv is not distinct from to_tsvector('english'::regconfig, text)"
    )
    assert scalar(empty_db_url, same) == 2  # (kept)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("update pgrag.chunks set tsv = null where source_key = '2'")
    migrate.downgrade(empty_db_url, "0010")
    assert scalar(empty_db_url, generated) == "s"
    assert scalar(empty_db_url, same) == 2  # (computed again, the NULL too)
    assert same_but_the_tsvectors_place(schema_dump(empty_db_url), at_0010)


def test_0011_waits_for_the_store_at_most_5_s(empty_db_url: str) -> None:
    """0011 alters pgrag.chunks (an ACCESS EXCLUSIVE lock, which every search takes too): held
    by an open transaction, the migration waits 5 s for it, then fails in one line, changing
    nothing; once it is free it runs."""
    from pgrag.errors import PgragError

    migrate.upgrade(empty_db_url, "0010")
    with psycopg.connect(empty_db_url) as reader:
        reader.execute("select count(*) from pgrag.chunks")  # a search's lock, held
        with pytest.raises(PgragError, match="pgrag.chunks is held by a transaction"):
            migrate.upgrade(empty_db_url)
        reader.rollback()
    assert scalar(empty_db_url, "select version_num from public.pgrag_alembic_version") == "0010"
    migrate.upgrade(empty_db_url)
    assert migrate.current(empty_db_url) == migrate.head()
