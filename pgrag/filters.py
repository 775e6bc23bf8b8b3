"""The metadata filter language, seen from Python: parsing it, and checking what must not reach
the server.

The language itself (keys, operators, value types, limits) and its compiler live in SQL, once:
``pgrag._filter_sql`` in sql/idempotent/25_filters_int.sql, which the search, the statistics,
the filter indexes and SQL callers share (docs/filters-and-answers.md):

    {"tier": "gold", "is_member": true}
    {"placed_on": {"$gte": "2024-01-01", "$lt": "2024-02-01"}, "state": {"$ne": "closed"}}
    {"tags": {"$contains": "garden"}, "$or": [{"amount": {"$gt": 100}}, {"tier": "gold"}]}

Here: ``parse_filter_json`` reads a filter given as JSON text (the CLI's ``--filter``);
``filter_param`` turns a Python filter into the ``jsonb`` parameter the SQL API takes, refusing
(InvalidFilter) what JSON or PostgreSQL cannot carry (NaN, NUL characters, lone surrogates,
structures nested past any filter's depth, or containing themselves); ``value_fits`` says
whether a value has a key type's JSON form, for code that builds filters without a database
(the server checks every filter again).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgrag.errors import InvalidFilter, mapped_database_errors

FILTER_TYPES = ("text", "integer", "numeric", "boolean", "date", "text[]", "integer[]")
DOC_TYPE_KEY = "doc_type"

# Equal to pgrag._limit('filter_depth' / 'filter_nodes' / 'filter_chars') (tests/test_limits.py):
# checked here before sending, so that a structure Python cannot even serialize is refused.
MAX_DEPTH = 32
MAX_NODES = 200_000
MAX_FILTER_CHARS = 1_000_000
# Containers (objects and arrays) nested inside each other: checked without recursion, so a
# filter nested 10,000 deep (or a Python structure that contains itself) is refused instead of
# exhausting the interpreter's stack.
MAX_NESTING = 2 * MAX_DEPTH + 4
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def filter_param(filter: Mapping[str, Any] | None) -> Jsonb | None:
    """A filter as the SQL API's ``jsonb`` parameter (None: no filter). Dates become
    'YYYY-MM-DD'; InvalidFilter for what JSON or PostgreSQL cannot carry."""
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise InvalidFilter(
            f"the filter must be an object, not {_json_type(filter)} ({_show(filter)}): "
            'write e.g. {"status": "open"}'
        )
    check_shape(filter)
    return Jsonb(filter, dumps=_dumps)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, default=_json_default, allow_nan=False, ensure_ascii=False)
    except ValueError:
        raise InvalidFilter(
            "filter contains NaN or infinity, which is not JSON: use a finite number"
        ) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return list(value)
    raise InvalidFilter(
        f"filter value {value!r} is not JSON ({type(value).__name__}): use a string, a number, "
        "true/false, a date, or a list of them"
    )


def check_shape(filter: Any) -> None:
    """Refuse (InvalidFilter) a filter nested too deeply or too large, a key that is not a
    string, or text PostgreSQL cannot hold, walking it iteratively."""
    stack: list[tuple[Any, int]] = [(filter, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InvalidFilter(
                f"filter has more than {MAX_NODES:,} values: simplify it, or filter on a "
                "broader key"
            )
        if isinstance(node, str):
            _check_text(node)
            continue
        if isinstance(node, Mapping):
            for key in node:
                if not isinstance(key, str):
                    raise InvalidFilter(f"filter key {key!r} is not a string: use a metadata key")
                _check_text(key)
            children: Iterable[Any] = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > MAX_NESTING:
            raise InvalidFilter(
                f"filter is nested more than {MAX_DEPTH} levels deep: flatten its $and/$or/$not"
            )
        stack.extend((child, depth + 1) for child in children)


def check_filter(
    conn: psycopg.Connection[Any], filter: Mapping[str, Any], doc_types: Sequence[str] | None
) -> None:
    """Check ``filter`` against the metadata of ``doc_types`` (all when None) with the server's
    compiler (``pgrag.check_filter``): InvalidFilter (or DocumentError) naming what is valid."""
    with mapped_database_errors(), conn.transaction():  # a savepoint: a refusal aborts nothing
        conn.execute(
            "select pgrag.check_filter(%s::jsonb, %s::text[])",
            (filter_param(filter), None if doc_types is None else list(doc_types)),
        )


def value_fits(type_name: str, value: Any) -> bool:
    """Whether ``value`` has the JSON form of a metadata key of ``type_name`` (an array type: of
    one element), as the filter language requires; the server checks every filter again."""
    return _coerce(type_name.removesuffix("[]"), value) is not _INVALID


def parse_filter_json(text: str) -> dict[str, Any]:
    """A filter given as JSON text (the CLI's ``--filter``), as a dict; InvalidFilter if not."""
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidFilter(
            f"filter is {len(text):,} characters long: keep it under {MAX_FILTER_CHARS:,}"
        )
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_nan_or_infinity
        )
    except json.JSONDecodeError as exc:
        raise InvalidFilter(
            f"filter is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            """write a JSON object, e.g. '{"status": "open", "total": {"$gt": 100}}'"""
        ) from None
    except RecursionError:
        raise InvalidFilter(
            f"filter is nested too deeply: keep it under {MAX_DEPTH} levels"
        ) from None
    if not isinstance(value, dict):
        raise InvalidFilter(
            f"filter must be a JSON object, not {_json_type(value)}: "
            """write e.g. '{"status": "open"}'"""
        )
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidFilter(
                f"filter key {key!r} appears twice in one object: combine the conditions, "
                'e.g. {"total": {"$gt": 10, "$lt": 20}}, or use "$and"'
            )
        result[key] = value
    return result


def _no_nan_or_infinity(name: str) -> Any:
    raise InvalidFilter(f"filter contains {name}, which is not JSON: use a finite number")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _show(value: Any) -> str:
    try:
        shown = json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        shown = "..." if isinstance(value, list | tuple | Mapping) else repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _check_text(value: Any) -> None:
    """Refuse strings PostgreSQL cannot hold (NUL, lone surrogates) before they reach it."""
    if not isinstance(value, str):
        return
    if "\x00" in value:
        raise InvalidFilter(
            "a filter value contains a NUL character, which PostgreSQL text cannot hold: remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFilter(
            "a filter value is not valid Unicode (a lone surrogate): send UTF-8 text"
        ) from None


_INVALID = object()


def _coerce(type_name: str, value: Any) -> Any:
    """The JSON value for ``value`` as ``type_name``, or _INVALID."""
    if type_name == "text":
        return value if isinstance(value, str) else _INVALID
    if type_name == "boolean":
        return value if isinstance(value, bool) else _INVALID
    if isinstance(value, bool):
        return _INVALID
    if type_name == "integer":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        return _INVALID
    if type_name == "numeric":
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        return _INVALID
    if type_name == "date":
        if isinstance(value, dt.datetime):
            return _INVALID
        if isinstance(value, dt.date):
            return value.isoformat()
        if isinstance(value, str) and _DATE_RE.fullmatch(value):
            try:
                dt.date.fromisoformat(value)
            except ValueError:
                return _INVALID
            return value
        return _INVALID
    return _INVALID
