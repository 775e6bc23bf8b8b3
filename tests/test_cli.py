"""The CLI as users run it: help everywhere, exit codes, one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import click
import psycopg
import pytest

from pgrag import migrate
from pgrag.cli import cli
from pgrag.server import EmbeddedServer

from .conftest import REPO, run_pgrag


def all_commands() -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []

    def walk(prefix: str, cmd: click.Command) -> None:
        found.append((prefix, cmd))
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(f"{prefix} {name}".strip(), sub)

    walk("", cli)
    return found


@pytest.mark.parametrize("path", [p for p, _ in all_commands()])
def test_every_command_has_help_and_is_in_the_readme(path: str) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [*path.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    cmd = dict(all_commands())[path]
    assert (cmd.help or "").strip(), f"`pgrag {path}` has no help text"
    if path:
        readme = (REPO / "README.md").read_text()
        assert f"pgrag {path}" in readme, f"`pgrag {path}` is not in README.md"


def assert_one_line_error(result: object, code: int, *needles: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == code, (result.returncode, stderr)  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_malformed_url() -> None:
    r = run_pgrag("--database-url", "postgresql://x:y@host:notaport/db", "status")
    assert_one_line_error(r, 2, "malformed database URL", "postgresql://")


def test_unreachable_server() -> None:
    r = run_pgrag("status", env={"PGRAG_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"})
    assert_one_line_error(r, 3, "cannot connect to 127.0.0.1:1/x", "check that the server runs")


def test_not_migrated(empty_db_url: str) -> None:
    r = run_pgrag("status", env={"PGRAG_DATABASE_URL": empty_db_url})
    assert_one_line_error(r, 4, "no pgrag schema", "pgrag db upgrade")


def test_dimension_mismatch(db_url: str) -> None:
    r = run_pgrag("db", "upgrade", "--dimension", "768", env={"PGRAG_DATABASE_URL": db_url})
    assert_one_line_error(r, 5, "migrated with embedding dimension 384, not 768")


def test_data_dir_not_writable() -> None:
    r = run_pgrag("server", "start", env={"PGRAG_DATA_DIR": "/proc/pgrag-nope"})
    assert_one_line_error(r, 3, "/proc/pgrag-nope", "PGRAG_DATA_DIR")


def test_data_dir_of_another_version(tmp_path: Path) -> None:
    (tmp_path / "PG_VERSION").write_text("15\n")
    r = run_pgrag("status", env={"PGRAG_DATA_DIR": str(tmp_path)})
    assert_one_line_error(r, 3, "PostgreSQL 15 cluster", "pg_upgrade")


def test_server_without_pgvector(tmp_path: Path, pginstall_without_pgvector: Path) -> None:
    server = EmbeddedServer(tmp_path / "novec", binaries=pginstall_without_pgvector)
    url = server.start()
    try:
        for args in (["db", "upgrade"], ["status"]):
            r = run_pgrag(*args, env={"PGRAG_DATABASE_URL": url})
            assert_one_line_error(r, 3, "no pgvector extension", "install pgvector")
    finally:
        server.stop()


def test_external_url_is_used_instead_of_the_embedded_server(tmp_path: Path) -> None:
    second = EmbeddedServer(tmp_path / "second")
    url = second.start()
    untouched = tmp_path / "embedded-default"
    env = {"PGRAG_DATABASE_URL": url, "PGRAG_DATA_DIR": str(untouched)}
    try:
        r = run_pgrag("db", "upgrade", env=env)
        assert r.returncode == 0, r.stderr
        assert "migrated base -> 0001" in r.stdout or "->" in r.stdout
        r = run_pgrag("status", env=env)
        assert r.returncode == 0, r.stderr
        assert "revision:" in r.stdout
        r = run_pgrag("db", "current", env=env)
        assert r.stdout.strip() == f"{migrate.head()} (head)"
        with psycopg.connect(url) as conn:
            assert conn.execute("select to_regclass('pgrag.chunks')::text").fetchone() == (
                "pgrag.chunks",
            )
        assert not (untouched / "PG_VERSION").exists()  # the embedded default never started
    finally:
        second.stop()


def test_server_commands_on_the_embedded_default(tmp_path: Path) -> None:
    env = {"PGRAG_DATA_DIR": str(tmp_path / "data")}
    try:
        r = run_pgrag("server", "status", env=env)
        assert r.returncode == 3 and "running:        no" in r.stdout
        r = run_pgrag("server", "start", env=env)
        assert r.returncode == 0, r.stderr
        url = r.stdout.strip().splitlines()[-1]
        assert run_pgrag("server", "url", env=env).stdout.strip() == url
        r = run_pgrag("server", "psql", "-At", "-c", "select 40 + 2", env=env)
        assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
        r = run_pgrag("db", "upgrade", env=env)
        assert r.returncode == 0, r.stderr
        r = run_pgrag("status", env=env)
        assert r.returncode == 0 and "chunks:" in r.stdout, r.stderr
        # short of base: what the database now lacks, and what brings it back
        r = run_pgrag("db", "downgrade", "0009", env=env)
        assert r.returncode == 0 and "-> 0009" in r.stdout, r.stderr
        assert "note: below head" in r.stderr and "`pgrag rebuild`" in r.stderr, r.stderr
        assert run_pgrag("db", "upgrade", env=env).returncode == 0
        r = run_pgrag("db", "downgrade", "base", env=env)
        assert r.returncode == 0 and "-> base" in r.stdout, r.stderr
        assert "note" not in r.stderr
    finally:
        r = run_pgrag("server", "stop", env=env)
        assert r.returncode == 0 and "stopped" in r.stdout
