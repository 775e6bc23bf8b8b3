"""The chunk store partitioned by tenant (``pgrag db upgrade --tenant-partitions``,
sql/migrate/store_shape.sql, docs/scaling.md): conversions both ways, a tenant's search reading
its own partition, the global search merging every partition's top k, the writes (a tenant that
changes moves the chunk, a deleted parent takes its children), ``pgrag verify`` and the refusals.

The CRM of tests/test_security.py (three tenants, accounts without a tenant value, shared FAQ
chunks), its store converted after it was written and embedded; the tenant-isolation property
of test_security runs here again on the partitioned store (imported below).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from pgrag import migrate
from pgrag.cli.main import cli
from pgrag.errors import ConfigError, IndexBuildFailed, PgragError

from . import search_plan
from .conftest import TestServer, run_pgrag
from .test_security import (  # noqa: F401  (the property runs on this module's crm)
    HNSW_ONLY,
    READER,
    TENANTS,
    WRITER,
    Crm,
    as_role,
    clients,
    make_crm,
    test_no_query_filter_or_k_returns_another_tenants_row,
)


@pytest.fixture(scope="module")
def crm(pg_server: TestServer, template_db: str) -> Iterator[Crm]:
    yield from make_crm(pg_server, template_db, tenant_partitions="list")


def _partitions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Each partition of pgrag.chunks and its bound."""
    return {
        str(r[0]): str(r[1])
        for r in conn.execute(
            "select c.relname, pg_get_expr(c.relpartbound, c.oid) from pg_inherits h "
            "join pg_class c on c.oid = h.inhrelid "
            "where h.inhparent = 'pgrag.chunks'::regclass order by 1"
        )
    }


def _where(conn: psycopg.Connection[Any]) -> dict[str, set[str | None]]:
    """The tenants each partition holds."""
    found: dict[str, set[str | None]] = {}
    for part, tenant in conn.execute(
        "select tableoid::regclass::text, tenant from pgrag.chunks group by 1, 2"
    ):
        found.setdefault(part, set()).add(tenant)
    return found


def test_a_partition_per_tenant_one_for_shared_chunks_and_a_default(crm: Crm) -> None:
    with psycopg.connect(crm.url) as conn:
        parts = _partitions(conn)
        held = _where(conn)
        shape = conn.execute("select store from pgrag.status()").fetchone()
    # acme, globex, initech, '' (accounts without a tenant value), the shared ones, the default
    assert len(parts) == 6 and parts["chunks_shared"] == "FOR VALUES IN (NULL)"
    assert parts["chunks_default"] == "DEFAULT"
    assert held["pgrag.chunks_shared"] == {None}
    assert all(len(t) == 1 for t in held.values())  # one tenant per partition
    assert {next(iter(t)) for t in held.values()} == {*TENANTS, "", None}
    assert shape == ({"by": "tenant", "strategy": "list", "partitions": 6, "default_rows": 0},)
    # nothing was lost: every chunk kept its id and its vector
    assert len(crm.tenant_of) == 40 + 80 + 2 and all(v is not None for v in crm.vectors.values())


def _verified(url: str) -> list[Any]:
    """pgrag.verify() as the writer, which declared the types (pgrag runs no other role's
    declared SQL in a superuser's session)."""
    with psycopg.connect(as_role(url, WRITER)) as conn:
        return conn.execute("select * from pgrag.verify()").fetchall()


def test_the_converted_store_is_in_sync(crm: Crm) -> None:
    with psycopg.connect(as_role(crm.url, WRITER)) as conn:
        assert conn.execute("select * from pgrag.verify()").fetchall() == []


def _explain(
    url: str,
    tenant: str | None,
    doc_types: list[str] | None,
    flt: dict[str, Any] | None = None,
    *,
    hnsw_only: bool = False,
) -> str:
    """The search's plan as a reader of ``tenant`` (``hnsw_only``: the planner told to walk an
    HNSW graph wherever it can, as in a large store)."""
    with psycopg.connect(as_role(url, READER)) as conn:
        register_vector(conn)
        if tenant is not None:
            conn.execute("select set_config('pgrag.tenant', %s, false)", (tenant,))
        if hnsw_only:
            conn.execute(HNSW_ONLY)
        q = np.ones(384, dtype=np.float32)
        cur = conn.execute(
            "select * from pgrag._search_plan('vector', null, %s::real[]::vector, null, 10, "
            "%s::jsonb, %s, null, null, null, null, null, null)",
            (q.tolist(), json.dumps(flt) if flt else None, doc_types),
        )
        row = cur.fetchone()
        assert row is not None and cur.description is not None
        plan = dict(zip([c.name for c in cur.description], row, strict=True))
        lines = search_plan.run_plan(conn, q, plan, explain=True, analyze=False)
        return "\n".join(str(r[0]) for r in lines)


def test_a_tenants_search_reads_its_own_partition(crm: Crm) -> None:
    """Partition pruning, in the plan: acme's search of its tickets reads acme's partition and
    no other; with the shared FAQ among the types, the shared partition too; a session of no
    tenant, the shared one only."""
    with psycopg.connect(crm.url) as conn:
        parts = {
            str(r[1]) or "''": str(r[0])
            for r in conn.execute(
                "select distinct tableoid::regclass::text, coalesce(tenant, 'shared') "
                "from pgrag.chunks"
            )
        }
    acme = parts["acme"].removeprefix("pgrag.")
    tickets = _explain(crm.url, "acme", ["crm_ticket"])
    assert _mentioned(tickets) == {acme}
    both = _explain(crm.url, "acme", ["crm_ticket", "crm_faq"])
    assert _mentioned(both) == {acme, "chunks_shared"}
    assert _mentioned(_explain(crm.url, None, None)) == {"chunks_shared"}


def _mentioned(plan: str) -> set[str]:
    """The partitions the plan reads the searched chunks from (alias c; the parents' join, p,
    may find a parent in any partition)."""
    return set(re.findall(r"Scan (?:using \S+ )?on (chunks_\w+) c(?:_\d+)?$", plan, re.M))


def test_a_search_over_every_tenant_merges_the_partitions_top_k(crm: Crm) -> None:
    """The writer sees every tenant: its vector search is the exact top k over all chunks."""
    ids = np.array(sorted(crm.vectors))
    mat = np.stack([crm.vectors[i] for i in ids])
    mat = mat / np.linalg.norm(mat, axis=1, keepdims=True)
    rng = np.random.default_rng(3)
    with psycopg.connect(as_role(crm.url, WRITER)) as conn:
        register_vector(conn)
        for _ in range(10):
            q = mat[rng.integers(len(ids))] + rng.normal(0, 0.05, mat.shape[1])
            truth = ids[np.argsort(-(mat @ (q / np.linalg.norm(q))))[:10]]
            got = [
                r[0]
                for r in conn.execute(
                    "select id from pgrag.vector_search(%s::real[]::vector, 10)",
                    (q.astype(np.float32).tolist(),),
                )
            ]
            assert got == truth.tolist()


def test_writes_move_chunks_between_partitions_and_deletes_cascade(
    pg_server: TestServer, template_db: str
) -> None:
    """A render of a tenant that changed moves its chunk to the new tenant's partition; a new
    tenant lands in the default partition until the next conversion gives it its own; deleting
    a parent chunk takes its children and their embedder errors (the foreign keys' cascade, done
    by the trigger pgrag_chunks_cascade)."""
    made = make_crm(pg_server, template_db, tenant_partitions="list")
    crm = next(made)
    try:
        with psycopg.connect(as_role(crm.url, WRITER), autocommit=True) as conn:
            conn.execute("update crm.tickets set tenant_id = 'globex' where ticket_id = 10")
            conn.execute("update crm.accounts set tenant_id = 'umbrella' where account_id = 2")
            conn.execute("update crm.tickets set tenant_id = 'umbrella' where account_id = 2")
            rows: dict[str, str] = dict(
                conn.execute(
                    "select source_key, tableoid::regclass::text from pgrag.chunks "
                    "where doc_type = 'crm_ticket' and source_key in ('10', '20', '21')"
                ).fetchall()
            )
            globex = conn.execute(
                "select distinct tableoid::regclass::text from pgrag.chunks "
                "where tenant = 'globex' and source_key <> '10'"
            ).fetchone()
            assert globex is not None and rows["10"] == globex[0]
            assert rows["20"] == rows["21"] == "pgrag.chunks_default"
            assert _verified(crm.url) == []
        with psycopg.connect(crm.url) as conn:  # the owner counts the default partition
            status = conn.execute("select store from pgrag.status()").fetchone()
            assert status is not None and status[0]["default_rows"] == 3
        # the next conversion gives umbrella its own partition
        migrate.upgrade(crm.url, tenant_partitions="list")
        with psycopg.connect(as_role(crm.url, WRITER), autocommit=True) as conn:
            held = _where(conn)
            assert ("pgrag.chunks_default" not in held) and {"umbrella"} in held.values()
            parent = conn.execute(
                "select id from pgrag.chunks where doc_type = 'crm_account' and source_key = '3'"
            ).fetchone()
            assert parent is not None
            children = [
                r[0]
                for r in conn.execute(
                    "select id from pgrag.chunks where parent_id = %s", (parent[0],)
                )
            ]
            assert len(children) == 2
            conn.execute(
                "insert into pgrag.embed_errors (chunk_id, model, content_hash, attempts, error, "
                "retry_at) select id, 'm', content_hash, 1, 'x', now() from pgrag.chunks "
                "where id = %s",
                (children[0],),
            )
            conn.execute("delete from pgrag.chunks where id = %s", (parent[0],))
            left = conn.execute(
                "select (select count(*) from pgrag.chunks where id = any(%s)), "
                "(select count(*) from pgrag.embed_errors)",
                (children,),
            ).fetchone()
            assert left == (0, 0)
    finally:
        made.close()


def test_verify_reports_a_document_stored_under_two_tenants(crm: Crm) -> None:
    with psycopg.connect(crm.url) as conn:  # (rolled back)
        conn.execute(
            "insert into pgrag.chunks (doc_type, source_key, text, tenant) "
            "select doc_type, source_key, text, 'globex' from pgrag.chunks "
            "where doc_type = 'crm_account' and tenant = 'acme' order by id limit 1"
        )
        found = conn.execute("select * from pgrag.verify('crm_account')").fetchall()
        conn.rollback()
    stored_twice = [f for f in found if f[2].startswith("stored 2 times")]
    assert len(stored_twice) == 1 and "'acme'" in stored_twice[0][2]
    assert "'globex'" in stored_twice[0][2]


def test_back_to_one_table_and_to_hash_partitions(pg_server: TestServer, template_db: str) -> None:
    made = make_crm(pg_server, template_db, tenant_partitions="4")
    crm = next(made)
    try:
        with psycopg.connect(crm.url) as conn:
            assert len(_partitions(conn)) == 4
            assert _verified(crm.url) == []
            before = conn.execute(
                "select id, text, tenant from pgrag.chunks order by id"
            ).fetchall()
        migrate.upgrade(crm.url, tenant_partitions="none")
        with psycopg.connect(crm.url, autocommit=True) as conn:
            assert conn.execute("select store from pgrag.status()").fetchone() == (None,)
            constraints = {
                r[0]
                for r in conn.execute(
                    "select conname from pg_constraint where conrelid = 'pgrag.chunks'::regclass "
                    "or confrelid = 'pgrag.chunks'::regclass"
                )
            }
            assert {
                "chunks_pkey",
                "chunks_doc_type_source_key_key",
                "chunks_parent_id_fkey",
                "embed_errors_chunk_id_fkey",
            } <= constraints
            after = conn.execute("select id, text, tenant from pgrag.chunks order by id").fetchall()
            assert after == before
            assert _verified(crm.url) == []
            # new chunks take ids after the old ones
            with psycopg.connect(as_role(crm.url, WRITER), autocommit=True) as writer:
                writer.execute("insert into crm.faq values (3, 'Q?', 'A.')")
            new = conn.execute("select max(id) from pgrag.chunks").fetchone()
            assert new is not None and new[0] > before[-1][0]
        # a downgrade knows the one-table store only: from here it may run
        migrate.upgrade(crm.url, tenant_partitions="list")
        with pytest.raises(ConfigError, match="--tenant-partitions none"):
            migrate.downgrade(crm.url, "0009")
    finally:
        made.close()


_FILTER_GRAPHS = (
    "select p.relname, i.relname, x.indisvalid from pg_inherits hi "
    "join pg_index x on x.indexrelid = hi.inhrelid join pg_class i on i.oid = x.indexrelid "
    "join pg_class p on p.oid = x.indrelid where hi.inhparent = to_regclass(%s) order by 1"
)


def test_a_filter_index_is_built_partition_by_partition_and_searches_use_it(crm: Crm) -> None:
    """`pgrag filter-index add` on a partitioned store: the index made on the parent alone,
    each partition's graph built concurrently and attached; a run that stopped after one
    partition is gone on with; a tenant's filtered search walks its partition's graph of the
    filter; list shows the partitions' rows and size; drop takes every graph; --sql, which
    prints one CREATE INDEX CONCURRENTLY, is refused."""
    from click.testing import CliRunner

    from pgrag import filter_index

    flt = {"status": "open"}
    runner = CliRunner()
    got = runner.invoke(
        cli, ["--database-url", crm.url, "filter-index", "add", "--sql", json.dumps(flt)]
    )
    assert got.exit_code == 2, got.output
    assert "partitioned by tenant" in got.output and "Traceback" not in got.output
    with psycopg.connect(crm.url, autocommit=True) as conn:
        p = filter_index.plan(conn, flt)
        assert b" on only pgrag.chunks " in p.create
        partitions = list(_partitions(conn))
        # a run stopped after its first partition: the parent, and one graph attached
        conn.execute(p.create)
        row = conn.execute("select to_regclass(%s)::oid", (f"pgrag.{p.name}",)).fetchone()
        assert row is not None
        oid = int(row[0])
        todo = conn.execute(
            "select index_name, state, create_ddl, attach_ddl from pgrag._index_partition_plan(%s)",
            (p.name,),
        ).fetchall()
        assert len(todo) == len(partitions) and {t[1] for t in todo} == {"missing"}
        conn.execute(str(todo[0][2]).encode())
        conn.execute(str(todo[0][3]).encode())
        conn.execute(str(todo[1][2]).encode())  # built, not yet attached
        kept = conn.execute(
            "select to_regclass('pgrag.' || %s)::oid, to_regclass('pgrag.' || %s)::oid",
            (todo[0][0], todo[1][0]),
        ).fetchone()
        assert len(conn.execute(_FILTER_GRAPHS, (f"pgrag.{p.name}",)).fetchall()) == 1
        states = conn.execute(
            "select state from pgrag._index_partition_plan(%s)", (p.name,)
        ).fetchall()
        assert [r[0] for r in states[:1]] == ["built"] and len(states) == len(partitions) - 1
        listed = filter_index.find(conn, p.name)
        assert listed is not None and not listed.valid and not listed.building
    env = {"PGRAG_DATABASE_URL": crm.url}
    try:
        r = run_pgrag("filter-index", "add", json.dumps(flt), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{p.name} built" in r.stdout, r.stdout
        with psycopg.connect(crm.url) as conn:
            graphs = conn.execute(_FILTER_GRAPHS, (f"pgrag.{p.name}",)).fetchall()
            assert [g[0] for g in graphs] == partitions and all(g[2] for g in graphs)
            # the graphs built before were kept, not built again
            assert (
                conn.execute(
                    "select to_regclass('pgrag.' || %s)::oid, to_regclass('pgrag.' || %s)::oid",
                    (todo[0][0], todo[1][0]),
                ).fetchone()
                == kept
            )
            listed = filter_index.find(conn, p.name)
            open_tickets = conn.execute(
                "select count(*) from pgrag.chunks where metadata @> %s::jsonb", (json.dumps(flt),)
            ).fetchone()
        assert listed is not None and listed.valid and listed.filter == flt
        assert open_tickets is not None and listed.rows == open_tickets[0] > 0
        assert listed.size_bytes > 0
        again = run_pgrag("filter-index", "add", json.dumps(flt), env=env)
        assert again.returncode == 0 and "exists already" in again.stdout, again.stdout
        # acme's search with the filter walks acme's graph of it
        with psycopg.connect(crm.url) as conn:
            row = conn.execute(
                "select c.relname from pgrag.chunks k join pg_class c on c.oid = k.tableoid "
                "where k.tenant = 'acme' limit 1"
            ).fetchone()
        assert row is not None
        acme = str(row[0])
        acme_graph = next(g[1] for g in graphs if g[0] == acme)
        plan = _explain(crm.url, "acme", ["crm_ticket"], flt, hnsw_only=True)
        assert f"Index Scan using {acme_graph} on {acme}" in plan, plan
        # a graph built on a partition and never attached (a process killed between the two)
        # goes with the index: DROP INDEX alone would leave it, written at every write
        with psycopg.connect(crm.url, autocommit=True) as conn:
            conn.execute(
                str(todo[0][2]).replace(str(todo[0][0]), f"chunks_hnsw_{oid}_stray").encode()
            )
    finally:
        r = run_pgrag("filter-index", "drop", json.dumps(flt), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    with psycopg.connect(crm.url) as conn:
        assert filter_index.list_indexes(conn) == []
        left = conn.execute(
            "select relname from pg_class where relname like %s", (f"chunks\\_hnsw\\_{oid}\\_%",)
        ).fetchall()
    assert left == []


def test_a_filter_index_build_stopped_by_an_open_transaction_is_listed_and_dropped_whole(
    crm: Crm,
) -> None:
    """A partition's concurrent build that fails (here: statement_timeout, while another
    session's snapshot holds the build up) leaves the parent index half built, listed with its
    filter as INVALID, and the partition's invalid graph behind (the same session's lock holds
    its drop up): the error says so, and `drop` takes the parent and that graph."""
    from pgrag import filter_index

    flt = {"status": "pending"}
    limited = psycopg.conninfo.make_conninfo(crm.url, options="-c statement_timeout=2000")
    with psycopg.connect(crm.url) as blocker:
        blocker.execute("set transaction isolation level repeatable read")
        # a snapshot and a lock on every partition, held: the build waits for the snapshot,
        # the drop of its invalid graph for the lock
        blocker.execute("select count(*) from pgrag.chunks").fetchone()
        with pytest.raises(IndexBuildFailed, match="left behind") as failed:
            filter_index.add(limited, flt)
        blocker.rollback()
    assert "filter-index drop" in str(failed.value)
    with psycopg.connect(crm.url) as conn:
        p = filter_index.plan(conn, flt)
        listed = filter_index.find(conn, p.name)
        assert listed is not None and not listed.valid and listed.filter == flt
        row = conn.execute("select to_regclass(%s)::oid", (f"pgrag.{p.name}",)).fetchone()
        assert row is not None
        pattern = f"chunks\\_hnsw\\_{row[0]}\\_%"
        graphs = conn.execute("select relname from pg_class where relname like %s", (pattern,))
        assert len(graphs.fetchall()) == 1  # the failed partition's: invalid, not attached
    env = {"PGRAG_DATABASE_URL": crm.url}
    r = run_pgrag("filter-index", "list", env=env)
    assert f"{p.name}  {json.dumps(flt)}" in r.stdout and "INVALID" in r.stdout, r.stdout
    r = run_pgrag("filter-index", "drop", json.dumps(flt), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    with psycopg.connect(crm.url) as conn:
        assert filter_index.find(conn, p.name) is None
        left = conn.execute("select relname from pg_class where relname like %s", (pattern,))
        assert left.fetchall() == []


_GRAPHS = (
    "select p.relname, i.reloptions::text from pg_inherits h "
    "join pg_class p on p.oid = h.inhrelid "
    "join pg_index x on x.indrelid = p.oid join pg_class i on i.oid = x.indexrelid "
    "join pg_inherits hi on hi.inhrelid = x.indexrelid "
    "where h.inhparent = 'pgrag.chunks'::regclass "
    "and hi.inhparent = 'pgrag.chunks_embedding_hnsw'::regclass order by 1"
)


def test_reindex_rebuilds_every_partitions_graph_and_goes_on_where_a_run_stopped(
    crm: Crm,
) -> None:
    from pgrag import filter_index

    with psycopg.connect(crm.url) as conn:
        partitions = [r[0] for r in conn.execute(_GRAPHS).fetchall()]
    assert len(partitions) >= 3
    # a run stopped after its first partition: the parent and that graph are kept

    def after_the_first() -> bool:
        with psycopg.connect(crm.url) as c:
            row = c.execute(
                "select count(*) from pg_inherits "
                "where inhparent = to_regclass('pgrag.chunks_embedding_hnsw_new')"
            ).fetchone()
        return bool(row and row[0] >= 1)

    with pytest.raises(IndexBuildFailed, match="stopped before the new store index was built"):
        filter_index.rebuild_store_index(
            crm.url, m=8, ef_construction=32, should_stop=after_the_first
        )
    env = {"PGRAG_DATABASE_URL": crm.url}
    with psycopg.connect(crm.url, autocommit=True) as conn:
        behind = filter_index.graph_behind(conn)
        assert behind is not None and behind.partial and behind.unfinished
    status = run_pgrag("status", env=env)
    assert "store index: chunks_embedding_hnsw_new is not built yet" in status.stdout, status.stdout
    try:
        r = run_pgrag("reindex", "--m", "8", "--ef-construction", "32", "--no-tune", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "m 8, ef_construction 32 (was 16, 64)" in r.stdout, r.stdout
        with psycopg.connect(crm.url) as conn:
            graphs = conn.execute(_GRAPHS).fetchall()
            assert [g[0] for g in graphs] == partitions
            assert all("m=8" in g[1] and "ef_construction=32" in g[1] for g in graphs), graphs
            assert conn.execute(
                "select hnsw_m, hnsw_ef_construction, "
                "to_regclass('pgrag.chunks_embedding_hnsw_new') is null from pgrag.settings"
            ).fetchone() == (8, 32, True)
        # a tenant's search still reads its own partition
        assert len(_mentioned(_explain(crm.url, "acme", ["crm_ticket"]))) == 1
        # a stopped run asked for another graph than the next one: begun again with the next's
        with pytest.raises(IndexBuildFailed, match="stopped before"):
            filter_index.rebuild_store_index(
                crm.url, m=12, ef_construction=48, should_stop=after_the_first
            )
    finally:
        r = run_pgrag("reindex", "--m", "16", "--ef-construction", "64", "--no-tune", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    with psycopg.connect(crm.url) as conn:
        graphs = conn.execute(_GRAPHS).fetchall()
    assert all("m=16" in g[1] and "ef_construction=64" in g[1] for g in graphs), graphs


def test_bad_shapes_are_refused_before_anything_runs(crm: Crm) -> None:
    for bad in ("0", "1", "2000", "hash", "-3"):
        with pytest.raises(ConfigError, match="not none, list or a number"):
            migrate.upgrade(crm.url, tenant_partitions=bad)
    with pytest.raises(ConfigError, match="applies at head"):
        migrate.upgrade(crm.url, "0009", tenant_partitions="list")


def test_new_documents_are_rendered_into_their_tenants_partition(
    pg_server: TestServer, template_db: str
) -> None:
    """New rows of a tenant-scoped type and of a shared one become chunks (the render's insert
    path, not only its update); a type dropped, declared again and refreshed renders all its
    documents."""
    made = make_crm(pg_server, template_db, tenant_partitions="list")
    crm = next(made)
    try:
        with psycopg.connect(as_role(crm.url, WRITER), autocommit=True) as conn:
            conn.execute(
                "insert into crm.tickets values (9001, 1, 'globex', 'open', 'brand new issue')"
            )
            conn.execute("insert into crm.faq values (77, 'A new question?', 'An answer.')")
            got: dict[str, str] = dict(
                conn.execute(
                    "select source_key, tableoid::regclass::text from pgrag.chunks "
                    "where source_key in ('9001', '77')"
                ).fetchall()
            )
            globex = conn.execute(
                "select distinct tableoid::regclass::text from pgrag.chunks "
                "where tenant = 'globex' and source_key <> '9001'"
            ).fetchone()
            assert globex is not None and got == {"9001": globex[0], "77": "pgrag.chunks_shared"}
            assert conn.execute("select count(*) from pgrag.render_errors").fetchone() == (0,)
        with psycopg.connect(crm.url, autocommit=True) as conn:  # (the tables' owner)
            conn.execute("select pgrag.drop_document('crm_faq')")
            conn.execute(
                "select pgrag.declare_document('crm_faq', $$select f.faq_id as source_key, "
                "f.question || E'\\n' || f.answer as text, jsonb_build_object('faq_id', f.faq_id) "
                'as metadata from crm.faq f$$, \'{"crm.faq": "select faq_id from changed"}\', '
                'metadata_schema => \'{"faq_id": "integer"}\')'
            )
            conn.execute("select pgrag.refresh('crm_faq')")
            n = conn.execute(
                "select count(*) from pgrag.chunks where doc_type = 'crm_faq'"
            ).fetchone()
            assert n == (3,)
            assert _verified(crm.url) == []
    finally:
        made.close()


def test_a_conversion_refuses_what_it_would_destroy_and_keeps_what_it_can(
    pg_server: TestServer, template_db: str
) -> None:
    """Another role's view of the chunks, or a table with a column of their row type, stops the
    conversion, named, and nothing changes; a grant, FORCE ROW LEVEL SECURITY, a storage option
    and a filter index with its filter come through it; under a publication of every table the
    store's updates go on; statistics can still be cached."""
    made = make_crm(pg_server, template_db)
    crm = next(made)
    try:
        # a view (found before the copy), a column of the row type (found at the drop)
        for make, named, undo in (
            ("create view public.chunk_count as select count(*) from pgrag.chunks",
             "view chunk_count", "drop view public.chunk_count"),
            ("create table public.snapshot (c pgrag.chunks)", "snapshot",
             "drop table public.snapshot"),
        ):  # fmt: skip
            with psycopg.connect(crm.url, autocommit=True) as conn:
                conn.execute(make)
            with pytest.raises(PgragError, match=f"would drop what depends on it: .*{named}"):
                migrate.upgrade(crm.url, tenant_partitions="list")
            with psycopg.connect(crm.url, autocommit=True) as conn:
                assert conn.execute("select pgrag._store_shape()").fetchone() == (None,)
                conn.execute(undo)
        with psycopg.connect(crm.url, autocommit=True) as conn:
            conn.execute("create publication everything for all tables")
            conn.execute("grant select on pgrag.chunks to pg_monitor")
            conn.execute("alter table pgrag.chunks force row level security")
            conn.execute("alter table pgrag.chunks set (autovacuum_vacuum_scale_factor = 0.05)")
        from pgrag import filter_index

        filter_index.add(crm.url, {"status": "open"})
        with psycopg.connect(crm.url, autocommit=True) as conn:
            keys_before = conn.execute("select pgrag._filter_index_keys()").fetchone()
        migrate.upgrade(crm.url, tenant_partitions="list")
        with psycopg.connect(crm.url, autocommit=True) as conn:
            assert conn.execute(
                "select has_table_privilege('pg_monitor', 'pgrag.chunks', 'select')"
            ).fetchone() == (True,)
            assert conn.execute(
                "select relforcerowsecurity from pg_class where oid = 'pgrag.chunks'::regclass"
            ).fetchone() == (True,)
            options = conn.execute(
                "select reloptions from pg_class where oid = 'pgrag.chunks_shared'::regclass"
            ).fetchone()
            assert options == (["autovacuum_vacuum_scale_factor=0.05"],)
            assert conn.execute("select pgrag._filter_index_keys()").fetchone() == keys_before
            assert keys_before is not None and keys_before[0] == ["status"]
            conn.execute("select pgrag.cache_stats('crm_account')")
            # published: each partition is identified by its unique index on id
            assert {
                r[0]
                for r in conn.execute(
                    "select c.relreplident from pg_inherits h join pg_class c "
                    "on c.oid = h.inhrelid where h.inhparent = 'pgrag.chunks'::regclass"
                )
            } == {"i"}
            with psycopg.connect(as_role(crm.url, WRITER), autocommit=True) as writer:
                writer.execute("update crm.accounts set seats = seats + 1 where account_id = 1")
            assert conn.execute("select * from pgrag.render_errors").fetchall() == []
            assert _verified(crm.url) == []
            conn.execute("drop publication everything")
    finally:
        made.close()
