"""Size and content limits on what callers hand pgrag, checked before any I/O.

Every public entry point that takes free text (a question, a document type name, a source
query) or a query vector checks it here first, so an oversized or malformed input is refused
with a one-line PgragError instead of reaching PostgreSQL as a driver error, a stack-depth
failure, or minutes of work (docs/reliability.md lists what each limit guards against).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg

from pgrag.errors import ConfigError, DimensionMismatch, PgragError

# The numbers below are the server's (pgrag._limit in sql/idempotent/00_core_int.sql), which
# SQL callers meet; the client checks them first, before any I/O (tests/security/
# test_input_limits.py checks they agree).

# Results of one search.
MAX_K = 10_000
# A question is read by an embedder with a window of a few hundred word pieces and by full text
# search; 10,000 characters is far past both. (A 1 MB question made websearch_to_tsquery exceed
# PostgreSQL's max_stack_depth after ten seconds.)
MAX_QUESTION_CHARS = 10_000
# Full text ranking costs grow with the query's terms (ts_rank_cd's, which ranked until
# 2026-12, with their square): measured with ts_rank_cd on
# 2,300 matching chunks, 100 terms rank in 0.4 to 1.1 s, 400 in 6 s to over a minute. A question
# is refused past 100 words (an embedder's window is about 190 words anyway).
MAX_QUESTION_WORDS = 100
# pgvector's own limit on a vector's dimensions.
MAX_VECTOR_DIM = 16_000
# Document type names are identifiers; other names (tables, doc_types lists) as long as any
# PostgreSQL identifier could be, schema-qualified and quoted.
MAX_NAME_CHARS = 300
# A source query or key query of a document declaration, or a statistics query.
MAX_SQL_CHARS = 100_000

# Words as PostgreSQL's text search parser makes terms of them, or a few more (the limit is
# checked before any I/O, so the parser is approximated, on the safe side):
#   * a run of letters, or of digits, is a term; `_` separates terms (\w+ counted `a_b_c` as
#     one word where the parser makes three: 400 words joined by `_` passed as one);
#   * `-`, `.`, `/`, `@`, `+` separate runs too, and a hyphenated word (`a-b-c`) is also a term
#     of its own (`a-b-c`, `a`, `b`, `c`): counted once more;
#   * two or more signs in a row (`..`, `/_`) can be a term without any letter (a file name).
# A URL, an e-mail, a file name or a number makes fewer terms than this counts; a few rare
# mixes of signs and non-ASCII letters make up to about half again as many.
_WORD = re.compile(r"\d+|[^\W\d_]+")
_HYPHENATED = re.compile(r"[^\W_]+(?:-[^\W_]+)+")
_SIGNS = re.compile(r"(?:[^\w\s]|_){2,}")


def count_words(text: str) -> int:
    """About the number of terms PostgreSQL's text search parser makes of ``text``, at least
    as many for words joined by spaces, `_`, `-`, `.`, `/`, `@`, `:` or `+`."""
    return sum(len(pattern.findall(text)) for pattern in (_WORD, _HYPHENATED, _SIGNS))


def check_text(
    value: Any,
    what: str,
    *,
    limit: int = MAX_QUESTION_CHARS,
    error: type[PgragError] = ConfigError,
) -> str:
    """``value`` if it is text PostgreSQL can hold and at most ``limit`` characters long.

    Refuses (``error``) anything else: not a string, too long, a NUL character, a lone
    surrogate (not UTF-8).
    """
    if not isinstance(value, str):
        raise error(f"{what} must be text, not {type(value).__name__}: pass a string")
    if len(value) > limit:
        raise error(f"{what} is {len(value):,} characters long: keep it to {limit:,} or fewer")
    if "\x00" in value:
        raise error(
            f"{what} contains a NUL character, which PostgreSQL text cannot hold: remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{what} is not valid Unicode (a lone surrogate): send UTF-8 text") from None
    return value


def check_question(value: Any, what: str = "the question") -> str:
    """``check_text`` for a question, which must also have at most MAX_QUESTION_WORDS words."""
    text = check_text(value, what)
    words = count_words(text)
    if words > MAX_QUESTION_WORDS:
        raise ConfigError(
            f"{what} has {words:,} words: ask in {MAX_QUESTION_WORDS} words or fewer "
            "(full text ranking slows down with the square of the words)"
        )
    return text


def check_names(values: Sequence[Any], what: str) -> list[str]:
    """A list of names (``doc_types``...), each checked with ``check_text``."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ConfigError(f"{what} must be a list of names, not {type(values).__name__}")
    return [check_text(v, f"a name in {what}", limit=MAX_NAME_CHARS) for v in values]


def check_connection(conn: Any, what: str) -> None:
    """``conn`` a psycopg connection, as the module functions take (a ``pgrag.Client`` given
    instead failed deep inside with an AttributeError)."""
    if not isinstance(conn, psycopg.Connection):
        hint = (
            f"call client.{what}(...) on a pgrag Client"
            if type(conn).__name__ == "Client"
            else "pass psycopg.connect(url)"
        )
        raise ConfigError(f"{what}() takes a psycopg connection, not {type(conn).__name__}: {hint}")


def check_query_vector(vector: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A query vector as a flat float32 array: finite, with 1 to MAX_VECTOR_DIM dimensions.

    The store's own dimension is checked by the search statement (DimensionMismatch).
    """
    try:
        arr = np.asarray(vector, dtype=np.float32).ravel()
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            "the query vector is not a list of numbers: pass floats, e.g. an embedder's output"
        ) from None
    if arr.size > MAX_VECTOR_DIM:
        raise DimensionMismatch(
            f"the query vector has {arr.size:,} dimensions; pgvector holds at most "
            f"{MAX_VECTOR_DIM:,}: pass a vector of the store's dimension"
        )
    if arr.size == 0 or not bool(np.all(np.isfinite(arr))):
        raise ConfigError("the query vector is empty or holds NaN/infinity: embed again")
    return arr
