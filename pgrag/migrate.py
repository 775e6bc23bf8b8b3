"""Alembic, driven from Python and the CLI; the SQL files it applies.

Each alembic revision runs its frozen ``sql/incremental`` file; the head revision then re-applies
every ``sql/idempotent`` file (views, functions, triggers). Downgrades run ``sql/downgrade``.
The files ship inside the wheel (``pgrag/_sql``, ``pgrag/_alembic``); from a source checkout
they are read from the top-level ``sql/`` and ``alembic/``.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgrag import config
from pgrag.connection import connect_once, resolve_url
from pgrag.errors import (
    ConfigError,
    DimensionMismatch,
    MissingExtension,
    NotMigrated,
    PgragError,
    from_database,
)

VERSION_TABLE = "pgrag_alembic_version"
# pg_advisory_xact_lock key: two migrators on one database run one after the other.
MIGRATION_LOCK_KEY = 7_061_727_261_670  # "pgrag" in a number
# Alembic keeps its running context in module globals: one command at a time per process.
_ALEMBIC_LOCK = threading.Lock()


def _packaged_or_source(packaged: str, source: str) -> Path:
    here = Path(str(resources.files("pgrag")))
    inside = here / packaged
    if inside.is_dir():
        return inside
    beside = here.parent / source
    if beside.is_dir():
        return beside
    raise PgragError(f"pgrag's {source}/ files are missing from {here}: reinstall pgrag-relational")


def sql_dir() -> Path:
    return _packaged_or_source("_sql", "sql")


def alembic_dir() -> Path:
    return _packaged_or_source("_alembic", "alembic")


# ---- applying SQL files (used by the alembic revisions) ----


def run_sql_file(conn: Any, path: Path) -> None:
    """Run one .sql file through the driver, with no parameter parsing.

    ``conn`` is a SQLAlchemy Connection (inside alembic) or a psycopg Connection. The body is
    sent as is, so ``format('%I')`` and ``'{"a":1}'`` reach PostgreSQL untouched (STYLE.md 2).
    """
    body = path.read_text(encoding="utf-8")
    if isinstance(conn, psycopg.Connection):
        conn.execute(body.encode())  # bytes: no placeholder parsing
    else:
        conn.exec_driver_sql(body, execution_options={"no_parameters": True})


def apply_incremental(conn: Any, name: str) -> None:
    run_sql_file(conn, sql_dir() / "incremental" / name)


def apply_downgrade(conn: Any, name: str) -> None:
    run_sql_file(conn, sql_dir() / "downgrade" / name)


def idempotent_files() -> list[Path]:
    """The idempotent files (``sql/idempotent/NN_*.sql``), in the order they are applied."""
    return sorted((sql_dir() / "idempotent").glob("*.sql"))


def apply_idempotent(conn: Any) -> None:
    """Apply every idempotent file once, then drop the functions of schema pgrag they no longer
    define (``sql/migrate/``). Run in the migration's transaction, when it ends at head: the files
    hold the one current definition of each function, for head's tables."""
    run_sql_file(conn, sql_dir() / "migrate" / "store_shape.sql")
    run_sql_file(conn, sql_dir() / "migrate" / "before_idempotent.sql")
    for path in idempotent_files():
        run_sql_file(conn, path)
    run_sql_file(conn, sql_dir() / "migrate" / "after_idempotent.sql")


# ---- migration options handed to alembic's env.py ----


@dataclass(frozen=True)
class MigrationOptions:
    url: str
    dimension: int | None = None
    hnsw_m: int | None = None
    hnsw_ef_construction: int | None = None
    reader_role: str | None = None
    writer_role: str | None = None
    drop_data: bool = False  # a downgrade may drop tables that hold rows
    tenant_partitions: str | None = None  # the store's shape (sql/migrate/store_shape.sql)
    # called with each step of long work the SQL reports (its notices that begin "pgrag: ")
    progress: Callable[[str], None] | None = None


def _alembic_config(options: MigrationOptions) -> Any:
    from alembic.config import Config

    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(alembic_dir()))
    cfg.attributes["pgrag_options"] = options
    return cfg


@contextlib.contextmanager
def _alembic_errors() -> Iterator[None]:
    """Alembic's and the database's failures as one-line PgragErrors (the transaction is
    already rolled back: a failed migration changes nothing)."""
    from alembic.util import CommandError
    from sqlalchemy.exc import DBAPIError

    try:
        yield
    except CommandError as exc:
        raise ConfigError(
            f"{exc}: `pgrag db history` lists the revisions (head is {head()})"
        ) from exc
    except DBAPIError as exc:
        orig = exc.orig
        if isinstance(orig, psycopg.Error):
            mapped = from_database(orig)
            if mapped is not None:
                raise mapped from exc
            first = str(orig).strip().splitlines()[0]
            if isinstance(orig, psycopg.errors.LockNotAvailable):  # (a lock the step waits for)
                hint = orig.diag.message_hint
                raise PgragError(
                    f"migration rolled back, nothing changed: {first}"
                    + (f"; {hint}" if hint else "; run it again when the database is quieter")
                ) from exc
            raise PgragError(
                f"migration failed and was rolled back ({first}): nothing changed; "
                f"report this with `pgrag db current` and the server version"
            ) from exc
        raise


def upgrade(
    url: str,
    revision: str = "head",
    *,
    dimension: int | None = None,
    hnsw_m: int | None = None,
    hnsw_ef_construction: int | None = None,
    reader_role: str | None = None,
    writer_role: str | None = None,
    tenant_partitions: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Migrate the database at ``url`` up to ``revision`` in one transaction.

    At head (also when the database is there already) the idempotent files are applied in that
    transaction, once; below head a database has pgrag's tables only.

    ``reader_role`` / ``writer_role`` (default PGRAG_READER_ROLE / PGRAG_WRITER_ROLE, else
    pgrag_reader / pgrag_writer) name the roles revision 0006 creates when missing
    (docs/security.md); like the dimension, they are fixed at that revision.

    ``tenant_partitions`` (``none``, ``list`` or N) converts the chunk store to that shape at
    head (docs/scaling.md, "Partitioned chunk stores"); None keeps the store as it is.
    ``progress`` is called with each step of a conversion (a copy, an index built).
    """
    from alembic import command

    options = MigrationOptions(
        url,
        config.embedding_dim(dimension),
        hnsw_m,
        hnsw_ef_construction,
        config.role_name("reader", reader_role),
        config.role_name("writer", writer_role),
        tenant_partitions=_at_head_only(config.tenant_partitions(tenant_partitions), revision),
        progress=progress,
    )
    preflight(url, options)
    with _ALEMBIC_LOCK, _alembic_errors():
        command.upgrade(_alembic_config(options), revision)


def upgrade_sql(
    revision: str = "head",
    *,
    start: str | None = None,
    dimension: int | None = None,
    hnsw_m: int | None = None,
    hnsw_ef_construction: int | None = None,
    reader_role: str | None = None,
    writer_role: str | None = None,
    tenant_partitions: str | None = None,
) -> str:
    """The upgrade from ``start`` (default: an empty database) to ``revision`` as one SQL
    script, without connecting (``alembic upgrade [START:]REVISION --sql``): a DBA reviews it,
    then runs it with ``psql -v ON_ERROR_STOP=1 -f``. It does what :func:`upgrade` does in its
    transaction, after a first statement that stops it unless the database is at ``start``;
    the checks :func:`upgrade` makes beforehand in Python (a dimension or role names other than
    those the database was migrated with) it does not make: on a migrated database the stored
    ones stay."""
    from alembic import command

    options = MigrationOptions(
        "",
        config.embedding_dim(dimension),
        hnsw_m,
        hnsw_ef_construction,
        config.role_name("reader", reader_role),
        config.role_name("writer", writer_role),
        tenant_partitions=_at_head_only(config.tenant_partitions(tenant_partitions), revision),
    )
    cfg = _alembic_config(options)
    buffer = io.StringIO()
    cfg.output_buffer = buffer
    with _ALEMBIC_LOCK, _alembic_errors():
        command.upgrade(cfg, revision if start is None else f"{start}:{revision}", sql=True)
    return buffer.getvalue()


def _at_head_only(tenant_partitions: str | None, revision: str) -> str | None:
    """The store's shape is changed at head only (where the idempotent files follow)."""
    if tenant_partitions is not None and revision not in ("head", head()):
        raise ConfigError(
            f"--tenant-partitions applies at head, not at revision {revision}: "
            "migrate to head with it (`pgrag db upgrade --tenant-partitions ...`)"
        )
    return tenant_partitions


def downgrade(url: str, revision: str, *, drop_data: bool = False) -> None:
    """Migrate the database at ``url`` down to ``revision`` ("base" removes pgrag entirely).

    A step that would drop a table holding rows (chunks, declared documents, caches, eval
    runs...) is refused with ConfigError, and nothing changes, unless ``drop_data``.
    """
    from alembic import command

    options = MigrationOptions(url, drop_data=drop_data)
    preflight(url, options)
    with _ALEMBIC_LOCK, _alembic_errors():
        command.downgrade(_alembic_config(options), revision)


def current(url: str) -> str | None:
    """The revision the database is at, or None before the first migration."""
    with connect_once(url) as conn:
        return current_on(conn)


def current_on(conn: psycopg.Connection[Any]) -> str | None:
    """``current`` on a connection the caller already holds."""
    exists = conn.execute(
        "select to_regclass(%s) is not null", (f"public.{VERSION_TABLE}",)
    ).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(
        sql.SQL("select version_num from {}").format(sql.Identifier("public", VERSION_TABLE))
    ).fetchone()
    return str(row[0]) if row else None


def store_shape(url: str) -> dict[str, Any] | None:
    """The chunk store's partitions (``pgrag._store_shape()``): None for one table."""
    with connect_once(url) as conn:
        row = conn.execute("select pgrag._store_shape()").fetchone()
    return row[0] if row else None


_REVISION = re.compile(r'^(down_revision|revision)\s*=\s*"([^"]*)"', re.M)


def head() -> str:
    """pgrag's head revision, read from the revision files' ``revision`` and
    ``down_revision`` lines (the one no other revision follows): every command that checks
    the database's revision asks, and loading alembic to answer took a fifth of a second."""
    revisions: set[str] = set()
    parents: set[str | None] = set()
    for path in (alembic_dir() / "versions").glob("*.py"):
        found = {str(m[1]): str(m[2]) for m in _REVISION.finditer(path.read_text(encoding="utf-8"))}
        revisions.add(found["revision"])
        parents.add(found.get("down_revision"))
    heads = revisions - parents
    if len(heads) != 1:
        raise PgragError(
            f"pgrag's revisions in {alembic_dir()} have {len(heads)} heads: reinstall "
            "pgrag-relational"
        )
    return str(heads.pop())


def history() -> list[tuple[str, str]]:
    """(revision, message) from base to head."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(alembic_dir()))
    revs = list(script.walk_revisions())
    return [(str(r.revision), str(r.doc or "")) for r in reversed(revs)]


def require_head(url: str) -> None:
    """Raise NotMigrated unless the database is at pgrag's head revision."""
    check_head(current(url))


def check_head(at: str | None) -> None:
    """Raise NotMigrated unless revision ``at`` is pgrag's head."""
    want = head()
    if at != want:
        where = "has no pgrag schema" if at is None else f"is at revision {at}"
        raise NotMigrated(f"the database {where}, pgrag needs {want}: run `pgrag db upgrade`")


def preflight(url: str, options: MigrationOptions) -> None:
    """Checks that must fail before alembic starts: reachable, pgvector, same dimension."""
    with connect_once(url) as conn:
        _check_vector(conn)
        _check_create(conn)
        migrated = conn.execute("select to_regclass('pgrag.settings') is not null").fetchone()
        if not migrated or not migrated[0]:
            return
        _check_roles(conn, options)
        if options.dimension is None:
            return
        stored = conn.execute("select embedding_dim from pgrag.settings").fetchone()
        if stored and stored[0] != options.dimension:
            raise DimensionMismatch(
                f"this database was migrated with embedding dimension {stored[0]}, "
                f"not {options.dimension}: drop --dimension / PGRAG_EMBEDDING_DIM, "
                f"or migrate a fresh database for the new dimension"
            )


def _check_create(conn: psycopg.Connection[Any]) -> None:
    """A first migration creates schemas pgrag and pgrag_docs (CREATE on the database) and the
    version table in schema public (CREATE on it: only its owner has it since PostgreSQL 15)."""
    row = conn.execute(
        "select to_regnamespace('pgrag') is null"
        "   and not has_database_privilege(current_database(), 'CREATE'),"
        " to_regclass(%s) is null and not has_schema_privilege('public', 'CREATE'),"
        " current_user, current_database()",
        (f"public.{VERSION_TABLE}",),
    ).fetchone()
    assert row is not None
    no_schema, no_public, user, database = row
    if no_schema:
        raise ConfigError(
            f"{user} may not create schemas in database {database}: have its owner run "
            f"`grant create on database {database} to {user};`, or migrate as the owner"
        )
    if no_public:
        raise ConfigError(
            f"{user} may not create tables in schema public, where pgrag keeps its revision "
            f"({VERSION_TABLE}): have the owner run `grant create on schema public to {user};`, "
            "or migrate as the database owner"
        )


def _check_vector(conn: psycopg.Connection[Any]) -> None:
    """pgvector must be installed on the server, and created in the database or creatable by
    this role (a superuser, or CREATE on the database when the extension is trusted)."""
    row = conn.execute(
        "select exists (select 1 from pg_available_extensions where name = 'vector'),"
        " exists (select 1 from pg_extension where extname = 'vector'),"
        " (select rolsuper from pg_roles where rolname = current_user)"
        "  or (coalesce((select bool_or(trusted) from pg_available_extension_versions"
        "                where name = 'vector'), false)"
        "      and has_database_privilege(current_database(), 'CREATE')),"
        " current_database(), current_user"
    ).fetchone()
    assert row is not None
    available, created, may_create, database, user = row
    if not available:
        raise MissingExtension(
            "the server has no pgvector extension: install pgvector on it "
            "(https://github.com/pgvector/pgvector#installation), use the "
            "pgvector/pgvector:pg17 image, or unset PGRAG_DATABASE_URL for the embedded server"
        )
    if not created and not may_create:
        raise MissingExtension(
            f"extension vector is not created in database {database} and {user} may not "
            f"create it: ask an administrator to run `create extension vector` in {database}, "
            f"then migrate again"
        )


def _check_roles(conn: psycopg.Connection[Any], options: MigrationOptions) -> None:
    """Refuse role names other than those the database was migrated with (revision 0006)."""
    has_roles = conn.execute(
        "select count(*) = 2 from pg_attribute where attrelid = 'pgrag.settings'::regclass "
        "and attname in ('reader_role', 'writer_role') and not attisdropped"
    ).fetchone()
    if not has_roles or not has_roles[0]:
        return
    row = conn.execute("select reader_role, writer_role from pgrag.settings").fetchone()
    if row is None:
        return
    for kind, asked, stored in (
        ("reader", options.reader_role, row[0]),
        ("writer", options.writer_role, row[1]),
    ):
        if asked is not None and asked != stored:
            raise ConfigError(
                f"this database was migrated with {kind} role {stored}, not {asked}: drop "
                f"--{kind}-role / PGRAG_{kind.upper()}_ROLE (the role names are fixed)"
            )


def session_settings(options: MigrationOptions) -> dict[str, str]:
    """The pgrag.* settings the incremental SQL reads with current_setting()."""
    values: dict[str, int | str] = {
        "pgrag.embedding_dim": options.dimension or config.DEFAULT_EMBEDDING_DIM,
        "pgrag.hnsw_m": options.hnsw_m or config.DEFAULT_HNSW_M,
        "pgrag.hnsw_ef_construction": options.hnsw_ef_construction
        or config.DEFAULT_HNSW_EF_CONSTRUCTION,
        "pgrag.drop_data": "on" if options.drop_data else "off",
    }
    values["pgrag.reader_role"] = options.reader_role or config.DEFAULT_READER_ROLE
    values["pgrag.writer_role"] = options.writer_role or config.DEFAULT_WRITER_ROLE
    values["pgrag.tenant_partitions"] = options.tenant_partitions or ""
    return {k: str(v) for k, v in values.items()}


def run_env(context: Any) -> None:
    """The body of alembic/env.py, for pgrag's CLI and for plain ``alembic``.

    Plain alembic (no options from pgrag's CLI) gets pgrag's one-line errors and exit codes
    instead of a traceback that quotes the whole SQL file."""
    options: MigrationOptions | None = context.config.attributes.get("pgrag_options")
    if options is not None:
        _run(context, options)
        return
    import sys

    try:
        with _alembic_errors():
            offline = context.is_offline_mode()
            options = _options_from_alembic_cli(context, resolve=not offline)
            if offline:
                _run_offline(context, options)
                return
            preflight(options.url, options)
            _run(context, options)
    except PgragError as exc:
        print(f"pgrag: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


def _run(context: Any, options: MigrationOptions) -> None:
    from sqlalchemy import create_engine, pool

    if context.is_offline_mode():
        _run_offline(context, options)
        return
    # Any libpq URL or key=value string: psycopg connects, SQLAlchemy only drives alembic.
    target = options.url
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(target),
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        if options.progress is not None:
            report = options.progress
            driver = connection.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)

            def notice(diag: psycopg.errors.Diagnostic) -> None:
                text = diag.message_primary or ""
                if text.startswith("pgrag: "):
                    report(text.removeprefix("pgrag: "))

            driver.add_notice_handler(notice)
        context.configure(
            connection=connection,
            version_table=VERSION_TABLE,
            version_table_schema="public",
            transactional_ddl=True,
            transaction_per_migration=False,
        )
        with context.begin_transaction():
            connection.exec_driver_sql(
                "select pg_advisory_xact_lock(%(key)s)", {"key": MIGRATION_LOCK_KEY}
            )
            for name, value in session_settings(options).items():
                connection.exec_driver_sql(
                    "select set_config(%(name)s, %(value)s, true)",
                    {"name": name, "value": value},
                )
            context.run_migrations()
            at = context.get_context().get_current_revision()
            if at == head():
                apply_idempotent(connection)
            elif at is None:  # base: nothing of pgrag stays, not even its version table
                driver = connection.connection.driver_connection
                assert isinstance(driver, psycopg.Connection)
                driver.execute(
                    sql.SQL("drop table if exists {}").format(
                        sql.Identifier("public", VERSION_TABLE)
                    )
                )
    engine.dispose()


def _run_offline(context: Any, options: MigrationOptions) -> None:
    """``alembic upgrade [FROM:]TO --sql`` (and ``pgrag db upgrade --sql``): the migration as
    one SQL script for a DBA to review and run (``psql -1 -v ON_ERROR_STOP=1 -f``). Downgrades
    run online only: each step first checks that it drops no table holding rows."""
    context.configure(
        url="postgresql+psycopg://",
        version_table=VERSION_TABLE,
        version_table_schema="public",
        transactional_ddl=True,
        transaction_per_migration=False,
        literal_binds=True,
    )
    if _is_downgrade(context):  # before any output: no partial script
        raise ConfigError(
            "pgrag downgrades run online only (each step first checks it drops no table "
            "holding rows): drop --sql, and run the downgrade on a copy to review it"
        )
    with context.begin_transaction():
        out = context.get_context().impl.static_output
        out(_literal_sql("select pg_advisory_xact_lock({});", MIGRATION_LOCK_KEY))
        out(_revision_guard(_resolve(context, context.get_context().opts.get("starting_rev"))))
        for name, value in session_settings(options).items():
            out(_literal_sql("select set_config({}, {}, true);", name, value))
        context.run_migrations()
        if _destination(context) == head():
            out(_sql_file_text(sql_dir() / "migrate" / "store_shape.sql"))
            out(_sql_file_text(sql_dir() / "migrate" / "before_idempotent.sql"))
            for path in idempotent_files():
                out(_sql_file_text(path))
            out(_sql_file_text(sql_dir() / "migrate" / "after_idempotent.sql"))


def _revision_guard(start: str | None) -> str:
    """The script's first statement: stop unless the database is at ``start`` (None: has no
    pgrag yet), so a script made for another revision changes nothing."""
    body = (
        "do $guard$ declare at text; begin "
        "if to_regclass('public.{table}') is not null then "
        "execute 'select version_num from public.{table}' into at; end if; "
        "if at is distinct from {start} then raise exception using errcode = 'PR006', "
        "message = format('this script upgrades from revision %s, and the database is at %s', "
        "coalesce({start}, 'base'), coalesce(at, 'base')), "
        "hint = 'make the script from the database''s revision: pgrag db upgrade --sql "
        "<revision>:head'; end if; end $guard$;"
    )
    return (
        sql.SQL(body).format(table=sql.SQL(VERSION_TABLE), start=sql.Literal(start)).as_string(None)
    )


def _literal_sql(template: str, *values: object) -> str:
    query = sql.SQL(template).format(*(sql.Literal(v) for v in values))
    return query.as_string(None)


def _sql_file_text(path: Path) -> str:
    return f"-- {path.parent.name}/{path.name}\n" + path.read_text(encoding="utf-8").rstrip()


def _destination(context: Any) -> str | None:
    """The revision an offline run ends at, resolved ("head" -> its id; base -> None)."""
    return _resolve(context, context.get_context().opts.get("destination_rev"))


def _is_downgrade(context: Any) -> bool:
    """Whether an offline run goes down (``alembic downgrade FROM:TO --sql``)."""
    start = context.get_context().opts.get("starting_rev")
    if start is None:
        return False
    order = [None] + [str(r.revision) for r in reversed(list(_script(context).walk_revisions()))]
    end = _destination(context)
    return order.index(end) < order.index(_resolve(context, start))


def _script(context: Any) -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(context.config)


def _resolve(context: Any, revision: str | None) -> str | None:
    if revision is None:
        return None
    resolved = _script(context).get_revision(revision)
    return None if resolved is None else str(resolved.revision)


def _options_from_alembic_cli(context: Any, *, resolve: bool = True) -> MigrationOptions:
    """Options of plain alembic (``-x key=value``, else the environment). ``resolve``: find
    the server now (an offline run needs none)."""
    x = context.get_x_argument(as_dictionary=True)
    url = x.get("url") or context.config.get_main_option("sqlalchemy.url") or None
    if url is None:
        url = resolve_url(None) if resolve else ""

    def _int(key: str) -> int | None:
        raw = x.get(key)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"-x {key}={raw!r} is not a whole number") from None

    return MigrationOptions(
        url=url,
        dimension=config.embedding_dim(_int("dimension")),
        hnsw_m=_int("hnsw_m"),
        hnsw_ef_construction=_int("hnsw_ef_construction"),
        reader_role=config.role_name("reader", x.get("reader_role")),
        writer_role=config.role_name("writer", x.get("writer_role")),
        drop_data=str(x.get("drop_data", "")).lower() in ("1", "on", "yes", "true"),
        tenant_partitions=config.tenant_partitions(x.get("tenant_partitions")),
    )


def revision_upgrade(incremental: str) -> None:
    """What every alembic revision's upgrade() does: its frozen incremental file. The
    idempotent files are applied once, after the last revision (``run_env``)."""
    from alembic import op

    migration = op.get_context()
    if migration.as_sql:  # offline (--sql): the file goes into the script
        migration.impl.static_output(_sql_file_text(sql_dir() / "incremental" / incremental))
        return
    apply_incremental(op.get_bind(), incremental)


def revision_downgrade(downgrade_file: str) -> None:
    """What every alembic revision's downgrade() does: remove the idempotent files' objects (the
    first step does; the later ones find none), then its downgrade file."""
    from alembic import op

    bind = op.get_bind()
    driver = bind.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    refuse_data_loss(driver, downgrade_file)
    refuse_partitioned_store(driver)
    apply_downgrade(bind, "idempotent.sql")
    apply_downgrade(bind, downgrade_file)


# Configuration and caches, not data: recreated (or recomputed) after the next upgrade.
_NOT_DATA = {
    ("pgrag", "settings"),
    ("pgrag", "stats_cache"),
    ("pgrag", "stats_changes"),
    ("pgrag", "stats_cache_horizon"),
    ("pgrag", "tuning"),  # measurements, taken again by the worker or `pgrag tune`
}
# `drop table [if exists] a.x[, b.y ...]`: every name in the list, schema-qualified (pgrag's
# downgrade files always qualify; test_migrations checks each drop statement is read whole).
_DROP_TABLE = re.compile(
    r"^\s*drop\s+table\s+(?:if\s+exists\s+)?(\w+\.\w+(?:\s*,\s*\w+\.\w+)*)", re.I | re.M
)
_DROP_SCHEMA = re.compile(r"^\s*drop\s+schema\s+(?:if\s+exists\s+)?(\w+)", re.I | re.M)


def tables_dropped_by(downgrade_file: str) -> list[tuple[str, str]]:
    """(schema, table) of every table a downgrade file drops, read from its SQL."""
    body = (sql_dir() / "downgrade" / downgrade_file).read_text(encoding="utf-8")
    found = []
    for m in _DROP_TABLE.finditer(body):
        for name in m.group(1).split(","):
            schema, _, table = name.strip().partition(".")
            found.append((schema, table))
    schemas = [m.group(1) for m in _DROP_SCHEMA.finditer(body)]
    return found + [(schema, "*") for schema in schemas]


def refuse_partitioned_store(conn: psycopg.Connection[Any]) -> None:
    """Raise ConfigError if the chunk store is partitioned: the downgrade files know the
    one-table store only (revision 0006's drops the tenant column, a partitioned store's key)."""
    row = conn.execute(
        "select c.relkind = 'p' from pg_class c where c.oid = to_regclass('pgrag.chunks')"
    ).fetchone()
    if row and row[0]:
        raise ConfigError(
            "the chunk store is partitioned by tenant, and downgrades know the one-table store "
            "only: nothing was changed; first `pgrag db upgrade --tenant-partitions none`"
        )


def refuse_data_loss(conn: psycopg.Connection[Any], downgrade_file: str) -> None:
    """Raise ConfigError if this downgrade step drops tables holding rows, unless the
    migration runs with ``pgrag.drop_data = on`` (``--drop-data``, ``-x drop_data=yes``)."""
    row = conn.execute("select current_setting('pgrag.drop_data', true)").fetchone()
    if row and row[0] == "on":
        return
    tables: list[tuple[str, str]] = []
    for schema, name in tables_dropped_by(downgrade_file):
        if name == "*":
            tables += [
                (str(r[0]), str(r[1]))
                for r in conn.execute(
                    "select schemaname, tablename from pg_tables where schemaname = %s "
                    "order by tablename",
                    (schema,),
                )
            ]
        else:
            tables.append((schema, name))
    holding = []
    for schema, name in tables:
        if (schema, name) in _NOT_DATA:
            continue
        try:
            with conn.transaction():  # a savepoint: a refusal leaves the migration's open
                found = conn.execute(
                    sql.SQL("select exists (select from {})").format(sql.Identifier(schema, name))
                ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            raise ConfigError(
                f"downgrading past {downgrade_file.removesuffix('.sql')} drops {schema}.{name}, "
                "which this role may not read to check it is empty: nothing was changed; "
                "downgrade as the role that migrated the database (the owner of its tables)"
            ) from None
        if found and found[0]:
            holding.append(f"{schema}.{name}")
    if holding:
        step = downgrade_file.removesuffix(".sql")
        raise ConfigError(
            f"downgrading past {step} would drop {', '.join(holding)}, which hold rows: "
            "nothing was changed; "
            "export what you need, then downgrade again with --drop-data "
            "(plain alembic: -x drop_data=yes)"
        )
