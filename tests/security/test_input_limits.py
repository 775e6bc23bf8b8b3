"""Every k from 1 to the documented maximum works on every search path, and every input limit
is one clear error, the same for SQL callers as for the Python client and the CLI (issue 15,
points 13 and 14).

Before: ``-k`` above 125 failed with "ef_search = 1008 is out of range" (even in text mode),
the SQL functions gave raw 22023 errors above 250 and "integer out of range" for a huge
``candidates``, and ``pgrag.text_search(repeat('refund ', 150000), 10)`` ran 20 s before failing
with 54000, since the SQL functions skipped the Python limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

from pgrag.cli import cli
from pgrag.errors import PgragError
from pgrag.limits import MAX_K
from pgrag.search import search
from tests.conftest import TestServer, create_database, drop_database
from tests.hostile import HashEmbedder, hash_vector
from tests.shop_fixture import load_tiny_shop

KS = [1, 125, 126, 250, 251, 1000, MAX_K]
VECTOR = "array_fill(0.05::real, array[384])::vector"


@pytest.fixture(scope="module")
def shop(pg_server: TestServer, template_db: str) -> Iterator[str]:
    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    with psycopg.connect(url, autocommit=True) as conn:
        load_tiny_shop(conn)
    yield url
    drop_database(pg_server, name)


@pytest.fixture
def conn(shop: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(shop, autocommit=True) as c:
        yield c


SQL_PATHS = {
    "search": f"select count(*) from pgrag.search('mouse', {VECTOR}, k => %s)",
    "hybrid_search": f"select count(*) from pgrag.hybrid_search('mouse', {VECTOR}, k => %s)",
    "vector_search": f"select count(*) from pgrag.vector_search({VECTOR}, k => %s)",
    "text_search": "select count(*) from pgrag.text_search('mouse', k => %s)",
}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("path", sorted(SQL_PATHS))
def test_every_k_works_in_sql(conn: psycopg.Connection[Any], path: str, k: int) -> None:
    conn.execute(SQL_PATHS[path], (k,))


@pytest.mark.parametrize("k", [0, -1, MAX_K + 1])
@pytest.mark.parametrize("path", sorted(SQL_PATHS))
def test_a_k_out_of_range_is_one_error_in_sql(
    conn: psycopg.Connection[Any], path: str, k: int
) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(SQL_PATHS[path], (k,))
    assert err.value.sqlstate == "PR006", err.value
    assert f"k = {k} is out of range" in str(err.value)


@pytest.mark.parametrize("mode", ["hybrid", "vector", "text"])
@pytest.mark.parametrize("k", KS)
def test_every_k_works_in_python(conn: psycopg.Connection[Any], mode: Any, k: int) -> None:
    search(conn, "mouse", vector=hash_vector("mouse"), mode=mode, k=k)


@pytest.mark.parametrize("mode", ["hybrid", "vector", "text"])
def test_a_k_out_of_range_is_one_error_in_python(conn: psycopg.Connection[Any], mode: Any) -> None:
    with pytest.raises(PgragError, match=f"k = {MAX_K + 1} is out of range"):
        search(conn, "mouse", vector=hash_vector("mouse"), mode=mode, k=MAX_K + 1)


def test_huge_candidates_and_ef_search_are_one_error(conn: psycopg.Connection[Any]) -> None:
    for arg in ("candidates", "ef_search", "rrf_k"):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(
                f"select count(*) from pgrag.search('mouse', {VECTOR}, {arg} => 2147483647)"
            )
        assert err.value.sqlstate == "PR006" and "out of range" in str(err.value), err.value


@pytest.mark.parametrize("mode", ["hybrid", "vector", "text"])
def test_the_cli_takes_every_k(shop: str, mode: str) -> None:
    for k in (126, MAX_K):
        r = CliRunner().invoke(
            cli,
            ["--database-url", shop, "search", "mouse", "--mode", mode, "-k", str(k)],
        )
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        cli, ["--database-url", shop, "search", "mouse", "--mode", mode, "-k", str(MAX_K + 1)]
    )
    assert r.exit_code == 2 and str(MAX_K + 1) in r.output, r.output


QUESTION_PATHS = {
    "text_search": "select count(*) from pgrag.text_search(%s, 10)",
    "hybrid_search": f"select count(*) from pgrag.hybrid_search(%s, {VECTOR}, 10)",
    "search": f"select count(*) from pgrag.search(%s, {VECTOR}, 10)",
    "text_query": "select pgrag.text_query(%s)",
}


@pytest.mark.parametrize("path", sorted(QUESTION_PATHS))
@pytest.mark.parametrize(
    ("question", "why"),
    [("refund " * 150_000, "characters long"), ("refund " * 101, "words")],
    ids=["long", "wordy"],
)
def test_sql_callers_get_the_question_limits(
    conn: psycopg.Connection[Any], path: str, question: str, why: str
) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(QUESTION_PATHS[path], (question,))
    assert err.value.sqlstate == "PR006" and why in str(err.value), err.value


def test_the_question_limits_agree(conn: psycopg.Connection[Any]) -> None:
    """The Python client refuses before any I/O with the server's numbers."""
    from pgrag import limits

    for name, value in {
        "k": limits.MAX_K,
        "question_chars": limits.MAX_QUESTION_CHARS,
        "question_words": limits.MAX_QUESTION_WORDS,
        "name_chars": limits.MAX_NAME_CHARS,
        "sql_chars": limits.MAX_SQL_CHARS,
    }.items():
        assert conn.execute("select pgrag._limit(%s)", (name,)).fetchone() == (value,), name
    assert np.isfinite(hash_vector("x")).all() and HashEmbedder.dimension == 384
