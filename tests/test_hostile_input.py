"""Hostile input: fuzzed filters, questions, declarations and CLI arguments; oversized inputs.

Every input must end in a result or a PgragError (never another exception, never a hang), and
the guards of tests/hostile.py (a canary table, write counters on the shop's tables, event
triggers on DDL outside pgrag's objects) must see nothing. bench/fuzz.py runs the same
strategies with many more cases (figures in docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pgrag import documents
from pgrag.ask import ask
from pgrag.cli import cli
from pgrag.embed.cache import QueryCache
from pgrag.errors import (
    ConfigError,
    DimensionMismatch,
    InvalidFilter,
    PgragError,
    mapped_database_errors,
)
from pgrag.filters import MAX_DEPTH, filter_param, parse_filter_json
from pgrag.limits import MAX_QUESTION_CHARS, MAX_QUESTION_WORDS, check_question, count_words
from pgrag.parse import parse_question
from pgrag.search import search
from pgrag.vocabulary import Vocabulary, forget_vocabulary

from . import conftest
from .hostile import (
    HashEmbedder,
    declarations,
    filter_json_text,
    filters,
    fingerprint,
    hash_vector,
    install_guards,
    questions,
)
from .shop_fixture import SHOP_SCHEMAS, load_tiny_shop

SCHEMA = {k: v for schema in SHOP_SCHEMAS.values() for k, v in schema.items()}
VOCABULARY = Vocabulary.from_schemas(
    SHOP_SCHEMAS,
    {t: {"categories": ["Books", "Electronics"], "segment": ["VIP", "New"]} for t in SHOP_SCHEMAS},
)


def filter_keys(flt: Any) -> set[str]:
    """Every metadata key a filter names, under $and / $or / $not too."""
    if isinstance(flt, list):
        return set().union(*(filter_keys(f) for f in flt)) if flt else set()
    if not isinstance(flt, dict):
        return set()
    keys: set[str] = set()
    for k, v in flt.items():
        keys |= filter_keys(v) if k.startswith("$") else {k}
    return keys


# A compiled filter's SQL with its quoted literals taken out ('...' and E'...', quotes doubled
# or backslash-escaped): what is left may only be fixed words and operators. A key or value that
# leaked into the SQL text would show up as anything else.
_LITERAL = re.compile(r"E'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'")
_SAFE_SQL = re.compile(
    r"(?:c\.metadata|c\.doc_type|L|::jsonb\[\]|::jsonb|::jsonpath|::text\[\]|@>|@\?|any|not|"
    r"and|or|true|false|=|<>|[()\s])*"
)


def compile_sql(conn: psycopg.Connection[Any], f: Any) -> str:
    """The server's compilation of a filter (InvalidFilter as the client gets it)."""
    with mapped_database_errors():
        row = conn.execute(
            "select pgrag._filter_sql(%s::jsonb, %s::jsonb)", (filter_param(f), Jsonb(SCHEMA))
        ).fetchone()
    assert row is not None
    return str(row[0])


FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def shop_url(pg_server: conftest.TestServer, template_db: str) -> Iterator[str]:
    name = conftest.create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    with psycopg.connect(url, autocommit=True) as conn:
        superuser = conn.execute("select rolsuper from pg_roles where rolname = current_user")
        row = superuser.fetchone()
        if not row or not row[0]:
            conftest.drop_database(pg_server, name)
            pytest.skip("the guards' event triggers need a superuser")
        with conn.transaction():
            load_tiny_shop(conn)
    install_guards(url)
    yield url
    conftest.drop_database(pg_server, name)


@pytest.fixture(scope="module")
def guarded(shop_url: str) -> Iterator[tuple[str, tuple[Any, ...]]]:
    before = fingerprint(shop_url)
    yield shop_url, before
    assert fingerprint(shop_url) == before, "a hostile input wrote to the canary or the shop"


@pytest.fixture(scope="module")
def shop_conn(guarded: tuple[str, tuple[Any, ...]]) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(guarded[0], autocommit=True) as conn:
        # a hang fails the test, not the suite (a guard, not a speed target)
        conn.execute(
            "select set_config('statement_timeout', %s, false)", (f"{conftest.PATIENCE_S:.0f}s",)
        )
        yield conn


EMBEDDER = QueryCache(HashEmbedder())


# ---------------------------------------------------------------- filters


@settings(FUZZ, max_examples=2000)
@given(f=filters)
def test_fuzzed_filters_compile_or_are_refused_and_never_become_sql(
    shop_conn: psycopg.Connection[Any], f: Any
) -> None:
    try:
        compiled = compile_sql(shop_conn, f)
    except InvalidFilter:
        event("refused")
        return
    event("compiled")
    assert _SAFE_SQL.fullmatch(_LITERAL.sub("L", compiled)), compiled


@settings(FUZZ, max_examples=1000)
@given(text=filter_json_text)
def test_fuzzed_filter_json_parses_or_is_refused(text: str) -> None:
    with contextlib.suppress(InvalidFilter):
        parse_filter_json(text)


@settings(FUZZ)
@given(f=filters, mode=st.sampled_from(["hybrid", "text", "vector"]))
def test_fuzzed_filters_search_or_fail_cleanly(
    shop_conn: psycopg.Connection[Any], f: Any, mode: Any
) -> None:
    try:
        search(shop_conn, "orders", filter=f, mode=mode, embedder=EMBEDDER, stats=True)
        event("searched")
    except PgragError as exc:
        event(f"refused: {type(exc).__name__}")


# ---------------------------------------------------------------- questions


@settings(FUZZ, max_examples=1000)
@given(q=questions)
def test_fuzzed_questions_parse_or_are_refused(q: str) -> None:
    try:
        parsed = parse_question(q, VOCABULARY)
    except ConfigError:
        return
    assert filter_keys(parsed.filter) <= set(SCHEMA)  # the parser's keys are declared ones


@settings(FUZZ)
@given(q=questions, mode=st.sampled_from(["hybrid", "text"]))
def test_fuzzed_questions_search_and_ask(
    shop_conn: psycopg.Connection[Any], q: str, mode: Any
) -> None:
    with contextlib.suppress(PgragError):
        search(shop_conn, q, mode=mode, embedder=EMBEDDER)
    forget_vocabulary()
    try:
        result = ask(shop_conn, q, embedder=EMBEDDER, use_env_llm=False)
    except PgragError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("answered")
    assert result.answer is not None


# ---------------------------------------------------------------- declarations


@settings(FUZZ, max_examples=120)
@given(d=declarations)
def test_fuzzed_declarations_declare_or_fail_cleanly(
    shop_conn: psycopg.Connection[Any], d: Any
) -> None:
    try:
        documents.declare(
            shop_conn,
            d.name,
            d.source,
            d.watches,
            parent=d.parent,
            metadata_schema=d.metadata_schema,
        )
    except PgragError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("declared")
    # declared: the name was an identifier, and the type goes away cleanly
    assert re.fullmatch(r"[a-z][a-z0-9_]{0,39}", d.name)
    documents.drop(shop_conn, d.name)


def test_injections_that_used_to_escape_their_quoting(
    shop_conn: psycopg.Connection[Any],
) -> None:
    """Before check_one_statement and the quoted trigger body, these ran their DROP."""
    src = "select customer_id as source_key, name as text from shop.customers"
    escape = "select 1) as q(k); drop table public.canary; select k from (select 1"
    dollar = (
        "select customer_id from changed where $body$ $body$; begin perform 1; end $body$ <> ''"
    )
    cases = [
        (src + "; drop table public.canary", {}),
        (src, {"shop.customers": escape}),
        (src, {"shop.customers": dollar}),
    ]
    for source, watches in cases:
        with pytest.raises(PgragError, match="does not compile"):
            documents.declare(shop_conn, "fz_escape", source, watches)
    # a key query holding the body's old dollar quote is now just a string in it
    documents.declare(
        shop_conn,
        "fz_dollar",
        src,
        {"shop.customers": "select customer_id from changed where $body$ x $body$ <> ''"},
    )
    documents.drop(shop_conn, "fz_dollar")
    with pytest.raises(psycopg.Error, match="multi-query"):
        shop_conn.execute(
            "select pgrag.declare_stats('order_detail', 'select ''{}''::jsonb) as s(stats); "
            "drop table public.canary; select * from (select 1')"
        )


# ---------------------------------------------------------------- the CLI


@settings(FUZZ, max_examples=60)
@given(
    command=st.sampled_from(["search", "ask"]),
    q=questions,
    flt=st.one_of(st.none(), filter_json_text),
    k=st.one_of(st.none(), st.sampled_from(["0", "1", "10000", "1000000000", "-1", "x", "1e3"])),
    doc_type=st.one_of(st.none(), st.sampled_from(["order_detail", "nope", "a'; drop --"])),
)
def test_fuzzed_cli_arguments_end_in_one_line(
    guarded: tuple[str, Any], command: str, q: str, flt: str | None, k: str | None, doc_type: Any
) -> None:
    args = ["--database-url", guarded[0], command, "--json"]
    if command == "search":
        args += ["--mode", "text"]
    args += [] if flt is None else ["--filter", flt]
    args += [] if k is None else ["-k", k]
    args += [] if doc_type is None else ["--doc-type", doc_type]
    args += ["--", q]
    result = CliRunner().invoke(cli, args, env={"PGRAG_EMBEDDER": "test-hash"})
    # click exits 2 on bad usage; pgrag's errors each have their code; never a traceback
    event(f"exit {result.exit_code}")
    if isinstance(result.exception, SystemExit) or result.exception is None:
        assert result.exit_code in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), result.output
    else:
        raise AssertionError(f"{args!r} raised {result.exception!r}")


@pytest.fixture(autouse=True)
def _hash_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGRAG_EMBEDDER=test-hash` in the CLI tests: the hash embedder, not the model."""
    import pgrag.search as search_mod

    real = search_mod.query_cache_for

    def query_cache_for(embedder: Any = None) -> QueryCache:
        if embedder in (None, "test-hash"):
            return EMBEDDER
        return real(embedder)

    monkeypatch.setattr(search_mod, "query_cache_for", query_cache_for)


# ---------------------------------------------------------------- oversized inputs


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"segment": "VIP"}
    for _ in range(depth):
        node = {"$not": node}
    return node


def _nested_list(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node]
    return node


# (what, search's arguments, error, message, statements that carry it: 0 when Python refuses
# it before any statement, 1 when the search statement refuses it on the server)
OVERSIZED: list[tuple[str, dict[str, Any], type[PgragError], str, int]] = [
    ("a 1 MB question", {"query": "where are my orders " * 52_429}, ConfigError, "10,000", 0),
    ("a question of 3,333 negations", {"query": "-x " * 3_333, "mode": "text"}, ConfigError,
     "words", 0),
    ("k = 10^9", {"k": 10**9}, ConfigError, "k = 1000000000 is out of range", 1),
    ("a filter nested 10,000 deep", {"filter": _nested(10_000)}, InvalidFilter,
     f"more than {MAX_DEPTH} levels", 0),
    ("an array nested 10,000 deep", {"filter": {"$and": _nested_list(10_000)}}, InvalidFilter,
     "nested", 0),
    ("a vector of the wrong dimension", {"vector": [0.1] * 3}, DimensionMismatch, "dimension 3",
     1),
    ("a vector of 20,000 dimensions", {"vector": [0.1] * 20_000}, DimensionMismatch, "16,000", 0),
    ("NaN in a vector", {"vector": [float("nan")] * 384}, ConfigError, "NaN", 0),
    ("a NUL in a question", {"query": "orders\x00"}, ConfigError, "NUL", 0),
    ("a lone surrogate", {"query": "orders \ud800"}, ConfigError, "surrogate", 0),
    ("a NUL in a document type", {"doc_types": ["order\x00detail"]}, ConfigError, "NUL", 0),
]  # fmt: skip


class _Model(HashEmbedder):
    """The hash embedder, recording every text it is given."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        self.texts.extend(texts)
        return super().embed(texts)


@pytest.mark.parametrize(
    ("what", "kwargs", "error", "message", "statements"),
    OVERSIZED,
    ids=[o[0] for o in OVERSIZED],
)
def test_oversized_inputs_are_refused_before_any_work(
    shop_conn: psycopg.Connection[Any],
    what: str,  # noqa: ARG001
    kwargs: dict[str, Any],
    error: type[PgragError],
    message: str,
    statements: int,
) -> None:
    """Refused up front, whatever the machine's speed (a mechanism, not a stopwatch): the
    oversized input reaches neither the model nor, except for the one search statement that
    refuses it (k by ``pgrag._search_plan``, for SQL callers too; a dimension by the
    statement's guard), the server."""
    model = _Model()
    call: dict[str, Any] = {"query": "orders", "embedder": QueryCache(model), **kwargs}
    if "vector" in call:
        call["mode"] = "vector"
    sent: list[Any] = []

    class Recorded(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Recorded:
            if query not in (QueryCache.GET, QueryCache.PUT):  # the short question's cache
                sent.append(query)
            return super().execute(query, params, **kw)

    shop_conn.cursor_factory = Recorded
    try:
        with pytest.raises(error, match=re.escape(message)):
            search(shop_conn, **call)
    finally:
        shop_conn.cursor_factory = psycopg.Cursor
    # the short question may be embedded before a filter or k is looked at; nothing else is
    assert set(model.texts) <= {"orders"}, model.texts[0][:100]
    assert len(sent) == statements, sent
    shop_conn.execute("select 1")  # the connection (and the server) still answer


def test_a_self_containing_filter_is_refused() -> None:
    f: dict[str, Any] = {}
    f["$not"] = f
    with pytest.raises(InvalidFilter, match="nested"):
        filter_param(f)


def test_limits_of_the_ask_path(shop_conn: psycopg.Connection[Any]) -> None:
    longest = ("word " * MAX_QUESTION_WORDS).strip()
    ask(shop_conn, longest, embedder=EMBEDDER, use_env_llm=False)  # at the limit: answered
    with pytest.raises(ConfigError, match="words"):
        ask(shop_conn, longest + " more", embedder=EMBEDDER, use_env_llm=False)
    with pytest.raises(ConfigError, match="characters long"):
        parse_question("x" * (MAX_QUESTION_CHARS + 1), VOCABULARY)
    url = shop_conn.info.dsn
    cli_big = CliRunner().invoke(
        cli, ["--database-url", url, "search", "--mode", "text", "x" * 2_000_000]
    )
    assert cli_big.exit_code == 2 and "characters long" in cli_big.output


def test_declaration_arguments_postgres_cannot_hold_are_document_errors(
    shop_conn: psycopg.Connection[Any],
) -> None:
    for name, source, watches in [
        ("fz\x00", "shop.customers", {}),
        ("fz", "select 1\ud800", {}),
        ("fz", "shop.customers", {"shop.customers": 5}),
        ("fz", "shop.customers", ["shop.customers"]),
        (None, "shop.customers", {}),
    ]:
        with pytest.raises(PgragError):
            documents.declare(shop_conn, name, source, watches)  # type: ignore[arg-type]


def test_a_search_vector_is_used_as_given(shop_conn: psycopg.Connection[Any]) -> None:
    """The hash embedder is what the fuzz tests search with: check it is a valid query vector."""
    v = hash_vector("orders")
    assert v.shape == (384,) and np.isclose(np.linalg.norm(v), 1.0)
    search(shop_conn, "orders", vector=v, mode="vector")


def _letters(i: int) -> str:
    """A word of letters only, different for each i (aa, ab, ...)."""
    word = ""
    for _ in range(3):
        word = "abcdefghijklmnopqrstuvwxyz"[i % 26] + word
        i //= 26
    return "q" + word


def _terms(conn: psycopg.Connection[Any], text: str) -> int:
    """The terms PostgreSQL's parser makes of ``text`` (the lexemes of its tsquery)."""
    row = conn.execute("select websearch_to_tsquery('simple', %s)::text", (text,)).fetchone()
    return len(re.findall(r"'(?:[^']|'')*'", row[0] if row else ""))


@pytest.mark.parametrize("sep", [" ", "_", "-", ".", "/", "@", ":", "+", "..", " .. ", "_-_"])
def test_question_words_are_counted_as_postgres_splits_them(
    shop_conn: psycopg.Connection[Any], sep: str
) -> None:
    # \w+ counted 400 words joined by `_` as one, and PostgreSQL made 400 terms of them
    for n in (1, 2, 10, 99, 400):
        text = sep.join(_letters(i) for i in range(n))
        assert count_words(text) >= _terms(shop_conn, text), (sep, n)
    with pytest.raises(ConfigError, match="words"):
        check_question(sep.join(_letters(i) for i in range(400)))
    with pytest.raises(ConfigError, match="words"):
        search(shop_conn, sep.join(_letters(i) for i in range(400)), mode="text")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(["ab", "x1", "7", "é", "日本", "_", "-", ".", "/", "@", ":", "+", "..",
                         " ", "'", "~", "http://", "e+5", "1.5"]),
        max_size=60,
    )
)  # fmt: skip
def test_question_word_count_is_close_to_postgres_terms(
    shop_conn: psycopg.Connection[Any], parts: list[str]
) -> None:
    text = "".join(parts)
    try:
        terms = _terms(shop_conn, text)
    except psycopg.Error:
        shop_conn.rollback()
        return
    assert terms <= 1.5 * count_words(text) + 1, (text, terms, count_words(text))
