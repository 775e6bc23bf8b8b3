"""The README's SQL and Python snippets run, in order, on the database the demo leaves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from .conftest import REPO, psql_file, run_pgrag
from .embed_server import FakeEmbeddings


def snippet(section: str, language: str) -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"## {section}\n.*?```{language}\n(.*?)```", readme, re.S)
    assert found, f"README section {section!r} has no {language} block"
    return found.group(1)


def test_the_readme_snippets_run_in_order_after_the_demo(db_url: str, tmp_path: Path) -> None:
    fake = FakeEmbeddings()  # the demo's model would do the same, slower
    env = {"PGRAG_DATABASE_URL": db_url, **fake.env()}
    try:
        loaded = run_pgrag("sample", "load", "--customers", "200", "--no-progress", env=env)
        assert loaded.returncode == 0, loaded.stderr
        embedded = run_pgrag("embed", env=env)
        assert embedded.returncode == 0, embedded.stderr

        sql_file = tmp_path / "ten_lines.sql"
        sql_file.write_text(snippet("Ten lines of SQL", "sql"), encoding="utf-8")
        psql_file(db_url, sql_file)
        with psycopg.connect(db_url) as conn:
            types = {r[0]: r[1] for r in conn.execute(
                "select doc_type, count(*) from pgrag.chunks group by 1")}  # fmt: skip
        # the snippet adds a type and replaces none of the demo's
        assert set(types) == {"customer_profile", "order_detail", "product_sales"}, types

        python = subprocess.run(
            [sys.executable, "-c", snippet("Ten lines of Python", "python")],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}, **env},
            capture_output=True,
            text=True,
        )
        assert python.returncode == 0, python.stderr
        assert "customer_profile" in python.stdout and "Exact answer" in python.stdout, (
            python.stdout
        )
    finally:
        fake.close()
