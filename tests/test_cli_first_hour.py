"""The command line in a user's first hour (issue 20): exit codes and one-line errors as the
README's table promises, group listings of whole sentences, a start-up that imports only what
the command needs, and embedding progress that reads well in a log."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner

from pgrag import migrate
from pgrag.cli import cli
from pgrag.embed.progress import EmbedProgress, duration
from pgrag.server import EmbeddedServer

from .conftest import PATIENCE_S, run_pgrag
from .embed_server import FakeEmbeddings, cli_env, start_cli, texts, wait_until


@pytest.fixture
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings()
    yield server
    server.close()


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The one line on stderr of a command that failed with ``code``; no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def declare_note_type(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "select pgrag.declare_document('note', 'select 1 as source_key, ''a note'' as text')"
        )


def insert_chunks(url: str, n: int) -> None:
    with psycopg.connect(url) as conn:
        for i, text in enumerate(texts(n)):
            conn.execute(
                "insert into pgrag.chunks (doc_type, source_key, text) values ('t', %s, %s)",
                (str(i), text),
            )


def count(url: str, query: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return int(row[0])


# ---------------------------------------------------------------- 11: exit codes and messages

STORE_COMMANDS = [
    ["search", "returned headphones"],
    ["search", "--mode", "text", "returned headphones"],
    ["ask", "who returned headphones?"],
    ["status"],
    ["verify"],
    ["verify", "note"],
    ["documents", "list"],
    ["embed"],
    ["worker"],
    ["tune", "--dry-run"],
    ["filter-index", "list"],
    ["stats-cache", "list"],
    ["eval-runs"],
]


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=" ".join)
def test_a_command_on_an_unmigrated_database_says_run_db_upgrade(
    empty_db_url: str, fake: FakeEmbeddings, args: list[str]
) -> None:
    r = run_pgrag(*args, env={"PGRAG_DATABASE_URL": empty_db_url, **fake.env()})
    one_line_error(r, 4, "pgrag db upgrade")


@pytest.mark.parametrize("args", [a for a in STORE_COMMANDS if a[0] in {"search", "ask", "tune"}])
def test_a_command_on_the_first_revision_says_run_db_upgrade(
    empty_db_url: str, fake: FakeEmbeddings, args: list[str]
) -> None:
    migrate.upgrade(empty_db_url, migrate.history()[0][0])
    r = run_pgrag(*args, env={"PGRAG_DATABASE_URL": empty_db_url, **fake.env()})
    one_line_error(r, 4, "pgrag db upgrade")


def test_a_missing_object_at_head_stays_a_database_error(db_url: str) -> None:
    # at head, a missing table is the user's own (here: a source that does not exist)
    r = run_pgrag(
        "documents",
        "declare",
        "x",
        "--source",
        "select source_key, text from no_such_table",
        env={"PGRAG_DATABASE_URL": db_url},
    )
    assert r.returncode != 4, r.stderr
    assert "pgrag db upgrade" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "no_such_type"],
        ["search", "--doc-type", "no_such_type", "headphones"],
        ["search", "--mode", "text", "--doc-type", "no_such_type", "headphones"],
        ["ask", "--doc-type", "no_such_type", "who returned headphones?"],
    ],
    ids=" ".join,
)
def test_an_unknown_document_type_is_a_declaration_error_naming_the_declared_ones(
    db_url: str, fake: FakeEmbeddings, args: list[str]
) -> None:
    declare_note_type(db_url)
    r = run_pgrag(*args, env={"PGRAG_DATABASE_URL": db_url, **fake.env()})
    one_line_error(r, 6, "no_such_type", "declared: note")
    assert r.stdout == ""


def test_ctrl_c_during_embed_exits_130_and_keeps_what_was_embedded(
    db_url: str, fake: FakeEmbeddings
) -> None:
    insert_chunks(db_url, 40)
    fake.gate = threading.Event()  # 20 batches of 2: the first waits at the embedder
    proc = start_cli(["embed", "--batch-size", "2"], cli_env(db_url, fake.env()))
    try:
        wait_until(lambda: any(len(r["input"]) == 2 for r in fake.requests))
        proc.send_signal(signal.SIGINT)  # while that batch is at the embedder
        fake.gate.set()
        out, err = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    embedded = count(db_url, "select count(embedding) from pgrag.chunks")
    assert 2 <= embedded < 40  # the batch in flight was finished and kept, not the others
    assert f"embedded {embedded} chunks" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("pgrag: interrupted") and f"the {embedded} chunks" in last, err
    assert "pgrag embed" in last and "Traceback" not in err
    assert count(db_url, "select count(*) from pgrag.chunks where embedding is null") == (
        40 - embedded
    )


def test_dropping_a_missing_filter_index_is_an_error(db_url: str) -> None:
    declare_note_type(db_url)
    env = {"PGRAG_DATABASE_URL": db_url}
    r = run_pgrag("filter-index", "drop", '{"doc_type": "note"}', env=env)
    one_line_error(r, 1, "no such filter index", "pgrag filter-index list")
    assert r.stdout == ""
    r = run_pgrag("filter-index", "drop", "--if-exists", '{"doc_type": "note"}', env=env)
    assert r.returncode == 0, r.stderr
    assert "no such filter index" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["search", "-k", "0", "headphones"],
        ["search", "-k", "-1", "headphones"],
        ["ask", "-k", "0", "who returned headphones?"],
    ],
    ids=" ".join,
)
def test_a_bad_k_is_one_line_and_exit_2(args: list[str]) -> None:
    # no database: the arguments are refused before anything connects
    r = run_pgrag(*args)
    line = one_line_error(r, 2, "'-k'", f"pgrag {args[0]} --help")
    assert "Usage:" not in r.stderr and line.startswith("pgrag: error: ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--no-such-option"], "no such option"),
        (["no-such-command"], "no such command"),
        (["ask"], "missing argument"),
        (["server", "start", "--bogus"], "no such option"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    one_line_error(run_pgrag(*args), 2, needle, "--help")


def test_an_empty_search_is_a_command_line_error() -> None:
    for query in ("", "   "):
        for mode in ("hybrid", "text"):
            r = run_pgrag("search", "--mode", mode, query)
            line = one_line_error(r, 2, "empty", "pgrag search '")
            assert "vector=" not in line and "mode=" not in line


def test_an_empty_question_is_a_command_line_error(db_url: str, fake: FakeEmbeddings) -> None:
    for question in ("", "   "):
        r = run_pgrag("ask", question, env={"PGRAG_DATABASE_URL": db_url, **fake.env()})
        line = one_line_error(r, 2, "empty")
        assert "vector=" not in line and "pass " not in line


# ---------------------------------------------------------------- 12: group listings


def all_groups() -> list[tuple[list[str], click.Group]]:
    found: list[tuple[list[str], click.Group]] = []

    def walk(path: list[str], group: click.Group) -> None:
        found.append((path, group))
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if isinstance(sub, click.Group):
                walk([*path, name], sub)

    walk([], cli)
    return found


def listing(help_text: str) -> dict[str, str]:
    """The "Commands:" section of a --help: each command's text, wrapped lines joined."""
    rows: dict[str, str] = {}
    name = None
    section = help_text.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
    for line in section.splitlines():
        head = re.match(r"^  (\S+)\s+(.*)$", line)
        if head:
            name = head.group(1)
            rows[name] = head.group(2).strip()
        elif name is not None:
            joiner = "" if rows[name].endswith("-") else " "
            rows[name] += joiner + line.strip()
    return rows


@pytest.mark.parametrize("width", [60, 80, 100])
def test_every_group_lists_each_command_with_a_whole_first_sentence(width: int) -> None:
    for path, group in all_groups():
        result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=width)
        assert result.exit_code == 0, result.output
        rows = listing(result.output)
        ctx = click.Context(group)
        assert sorted(rows) == group.list_commands(ctx), path
        for name, text in rows.items():
            where = f"`pgrag {' '.join([*path, name])}`: {text!r}"
            assert text.endswith("."), where
            assert not text.endswith(("...", "…", "e.g.", "i.e.", "etc.")), where
            command = group.get_command(ctx, name)
            assert command is not None
            whole = " ".join((command.help or "").split())
            assert whole.startswith(text), where  # not cut: the docstring's own first sentence
            assert whole[len(text) :][:1] in ("", " "), where
            assert len(text) <= 80, where  # one line of a 100-column listing


def test_every_listed_command_loads_under_its_own_name() -> None:
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name


# ---------------------------------------------------------------- 13: start-up

# What a command that neither searches nor embeds must not import: the client's pool and
# pgvector, numpy, migrations' SQLAlchemy, progress bars, the models and their HTTP clients,
# and pgrag's own search, documents and embedding code.
HEAVY = {
    "numpy",
    "psycopg_pool",
    "pgvector",
    "sqlalchemy",
    "alembic",
    "tqdm",
    "torch",
    "sentence_transformers",
    "transformers",
    "onnxruntime",
    "tokenizers",
    "httpx",
    "openai",
}
HEAVY_PGRAG = ("pgrag.db", "pgrag.documents", "pgrag.search", "pgrag.worker", "pgrag.embed")

PROBE = """
import json, sys
from pgrag.cli import main
try:
    main()
except SystemExit:
    pass
print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(args: list[str], env: dict[str, str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY_PGRAG))


def test_version_and_server_url_import_only_what_they_need(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
    assert heavy(imported_by(["--version"], env)) == []
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    try:
        env["PGRAG_DATA_DIR"] = str(tmp_path / "data")
        assert heavy(imported_by(["server", "url"], env)) == []
    finally:
        server.stop()


# ---------------------------------------------------------------- 15 and 6: embedding progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_off_a_terminal_is_plain_lines_with_rate_and_time_left() -> None:
    out, clock = io.StringIO(), Clock()
    progress = EmbedProgress(2326, stream=out, clock=clock)
    for _ in range(10):  # 10 batches of 100 chunks, 10 s each: 10 chunks/s
        clock.now += 10
        progress.update(100)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # a line at each tenth of the total, not one per batch
    assert [ln.split(" chunks")[0] for ln in lines] == [
        "embedding: 300/2,326",
        "embedding: 500/2,326",
        "embedding: 700/2,326",
        "embedding: 1,000/2,326",
    ]
    assert lines[-1] == "embedding: 1,000/2,326 chunks (42%), 10.0 chunks/s, about 2 min 13 s left"
    clock.now += 60  # a slow stretch: a line at least every 30 s even within a tenth
    progress.update(1)
    assert out.getvalue().splitlines()[-1].startswith("embedding: 1,001/2,326 chunks (43%)")
    for _ in range(13):
        clock.now += 10
        progress.update(100)
    progress.update(25)
    assert out.getvalue().splitlines()[-1].endswith("(100%), 8.0 chunks/s, done in 4 min 50 s")


def test_rebuild_progress_off_a_terminal_is_plain_lines_too(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("create table public.notes (id int primary key, body text)")
        conn.execute(
            "insert into public.notes select g, 'note ' || g from generate_series(1, 50) g"
        )
        conn.execute(
            "select pgrag.declare_document('note', 'select id as source_key, body as text "
            'from public.notes\', \'{"public.notes": "select id from changed"}\'::jsonb)'
        )
    out = run_pgrag("rebuild", "note", env={"PGRAG_DATABASE_URL": db_url})
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr
    assert any(
        line.startswith("note: 50/50 documents (100%)") for line in out.stderr.splitlines()
    ), out.stderr


def test_no_progress_when_disabled_or_nothing_to_do() -> None:
    out = io.StringIO()
    for progress in (EmbedProgress(10, stream=out, enabled=False), EmbedProgress(0, stream=out)):
        progress.update(5)
        progress.close()
    assert out.getvalue() == ""


def test_durations_read_like_a_person_says_them() -> None:
    assert [duration(s) for s in (0.4, 45, 60, 157, 3600, 3900, 7322)] == [
        "0 s",
        "45 s",
        "1 min",
        "2 min 37 s",
        "1 h 0 min",
        "1 h 5 min",
        "2 h 2 min",
    ]


def test_embed_into_a_log_prints_plain_progress_lines(db_url: str, fake: FakeEmbeddings) -> None:
    insert_chunks(db_url, 10)
    proc = start_cli(["embed", "--batch-size", "2"], cli_env(db_url, fake.env()))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("embedding: ")]
    assert [ln.split(" chunks")[0] for ln in lines] == [
        f"embedding: {n}/10" for n in (2, 4, 6, 8, 10)
    ]
    assert all("chunks/s" in ln for ln in lines)
    assert all(" left" in ln for ln in lines[:-1]) and "done in" in lines[-1]
    assert "embedded 10 chunks" in out


def test_the_demo_shows_embedding_progress_and_the_time_left(
    db_url: str, fake: FakeEmbeddings, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from pgrag.lab.demo import run_demo

    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    run_demo(
        db_url,
        questions=["What products did John Smith return?"],
        say=said.append,
        embedder="openai:fake-embed",
        progress=True,
    )
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("embedding: ")]
    assert len(lines) >= 2 and "\r" not in err, err
    assert "about" in lines[0] and lines[0].endswith(" left"), lines[0]
    assert "(100%)" in lines[-1]
    assert any(s.startswith("embedding the chunks with openai:fake-embed") for s in said), said
