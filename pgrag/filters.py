"""The metadata filter language, compiled to one boolean SQL expression with bound parameters.

A filter is a JSON object over the metadata keys of the document types searched (their
declared schema: key → ``text``, ``integer``, ``numeric``, ``boolean``, ``date``, ``text[]``,
``integer[]``), plus ``doc_type``::

    {"segment": "VIP", "has_returns": true}
    {"order_date": {"$gte": "2024-01-01", "$lt": "2024-02-01"}, "status": {"$ne": "delivered"}}
    {"categories": {"$contains": "Books"}, "$or": [{"total": {"$gt": 100}}, {"segment": "VIP"}]}

SQL shape (measured with EXPLAIN, see docs/filters-and-answers.md):

- equality and array containment of one object level are merged into a single
  ``metadata @> %(f0)s::jsonb``, which the ``gin (metadata jsonb_path_ops)`` index serves;
  a key of a filter index (``split_keys``) gets an ``@>`` of its own;
- ``$in`` is ``metadata @> any(%(f1)s::jsonb[])`` (a bitmap index scan with one index search
  per value);
- ranges of one object level are merged into a single ``metadata @? %(f2)s::jsonpath`` built
  from schema keys and JSON-encoded values (a filter index's key: one of its own). A range
  is two-valued: a missing key or a stored value of another type is false, never NULL and
  never a cast error;
- ``$ne``, ``$nin`` and ``$not`` are ``not (...)`` of the above (true when the key is missing).

No key or value ever becomes SQL text: keys live only inside the bound jsonb / jsonpath values,
and every value is a bound parameter. ``compile_filter`` does no I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg.abc import AdaptContext

from pgrag.errors import DocumentError, InvalidFilter

FILTER_TYPES = ("text", "integer", "numeric", "boolean", "date", "text[]", "integer[]")

MAX_DEPTH = 32
MAX_TERMS = 1_000
MAX_IN_VALUES = 10_000
MAX_FILTER_CHARS = 1_000_000
# Containers (objects and arrays) nested inside each other, and JSON values in all: checked
# without recursion before compiling, so a filter nested 10,000 deep (or a Python structure
# that contains itself) is refused instead of exhausting the interpreter's stack.
MAX_NESTING = 2 * MAX_DEPTH + 4
MAX_NODES = 200_000

LOGICAL_OPERATORS = ("$and", "$or", "$not")
RANGE_OPERATORS = ("$gt", "$gte", "$lt", "$lte")
_SCALAR_OPERATORS = ("$eq", "$ne", "$in", "$nin")
_ORDERED_TYPES = ("integer", "numeric", "date")
_ARRAY_OPERATORS = ("$eq", "$contains", "$ne", "$in", "$nin")
DOC_TYPE_KEY = "doc_type"

METADATA_COLUMN = sql.Identifier("metadata")
DOC_TYPE_COLUMN = sql.Identifier("doc_type")

_JSONPATH_OPS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_EXAMPLES: dict[str, str] = {
    "text": '"VIP"',
    "integer": "3",
    "numeric": "99.5",
    "boolean": "true",
    "date": '"2024-01-31"',
    "text[]": '"Books" (or a list, ["Books", "Toys"])',
    "integer[]": "42 (or a list, [42, 43])",
}
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_PREFIX_RE = re.compile(r"[a-z_][a-z0-9_]*")


class CompiledFilter(sql.Composed):
    """A boolean SQL expression whose values are named placeholders, with their ``params``.

    It is a ``sql.Composed``: format it into a statement (``sql.SQL("... where {}")``) and
    execute that statement with ``params`` merged into its own named parameters. Adding it to
    other Composables (``+``) keeps the SQL but not ``params``.
    """

    def __init__(self, seq: Sequence[Any], params: Mapping[str, Any]) -> None:
        super().__init__(seq)
        self.params: dict[str, Any] = dict(params)


def inline_params(
    expr: sql.Composable, params: Mapping[str, Any], context: AdaptContext | None = None
) -> str:
    """The SQL text of ``expr`` with every named placeholder replaced by its value, quoted as a
    literal: what ``pgrag.estimate_rows`` plans for the filter's row estimate. Pass the
    connection as ``context`` to quote for its encoding and settings (without one, psycopg
    quotes for libpq's last connection). Raises ValueError for a placeholder written into SQL
    text instead of as a ``sql.Placeholder``."""
    return with_literals(expr, params).as_string(context)


def with_literals(expr: sql.Composable, params: Mapping[str, Any]) -> sql.Composable:
    """``expr`` with every named placeholder replaced by ``sql.Literal`` of its value: for SQL
    that takes no parameters (an index predicate, ``pgrag.estimate_rows``). Raises ValueError
    for a placeholder written into SQL text instead of as a ``sql.Placeholder``."""
    if isinstance(expr, sql.Composed):
        return sql.Composed([with_literals(part, params) for part in expr])
    if isinstance(expr, sql.Placeholder):
        text = expr.as_string(None)  # "%(name)s"
        return sql.Literal(params[text[2 : text.index(")")]])
    if isinstance(expr, sql.SQL) and "%" in expr.as_string(None):
        raise ValueError(
            f"cannot inline {expr.as_string(None)!r}: write its placeholders as sql.Placeholder"
        )
    return expr


def operators_for(type_name: str) -> tuple[str, ...]:
    """The operators valid on a metadata key of ``type_name``."""
    if type_name.endswith("[]"):
        return _ARRAY_OPERATORS
    if type_name in _ORDERED_TYPES:
        return _SCALAR_OPERATORS + RANGE_OPERATORS
    return _SCALAR_OPERATORS


def check_schema(schema: Mapping[str, str]) -> None:
    """Raise DocumentError if a declared type is not one of FILTER_TYPES."""
    for key, type_name in schema.items():
        if type_name not in FILTER_TYPES:
            raise DocumentError(
                f"metadata key {key!r} is declared as {type_name!r}: declare one of "
                f"{', '.join(FILTER_TYPES)}"
            )


def union_schema(schemas: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The union of several document types' schemas; a key declared twice needs one type."""
    merged: dict[str, str] = {}
    for schema in schemas:
        check_schema(schema)
        for key, type_name in schema.items():
            seen = merged.setdefault(key, type_name)
            if seen != type_name:
                raise DocumentError(
                    f"metadata key {key!r} is {seen} in one document type and {type_name} in "
                    "another: declare it with one type, or search the document types separately"
                )
    return merged


def compile_filter(
    filter: Mapping[str, Any] | None,
    schema: Mapping[str, str],
    *,
    column: sql.Composable = METADATA_COLUMN,
    doc_type_column: sql.Composable = DOC_TYPE_COLUMN,
    param_prefix: str = "pgrag_f",
    split_keys: Collection[str] = (),
) -> CompiledFilter:
    """Compile ``filter`` to a boolean SQL expression; None or ``{}`` compiles to ``true``.

    ``schema`` maps each metadata key to its type (FILTER_TYPES). Raises InvalidFilter for an
    unknown key or operator, a value of the wrong type, or a filter too large or too deep.
    Placeholders are named ``<param_prefix><n>``; pass ``result.params`` with the statement.

    ``split_keys``: the keys of the store's filter indexes (pgrag/filter_index.py). Each gets a
    condition of its own, in a canonical form (sorted ranges and array elements, integral
    numbers as integers), so that the planner finds a filter index's predicate among the
    conditions; the other keys of a level stay merged in one ``@>`` (and one ``@?``), which
    the planner estimates jointly.
    """
    check_schema(schema)
    if not _PREFIX_RE.fullmatch(param_prefix):
        raise ValueError("param_prefix must be a lower-case identifier like 'pgrag_f'")
    if filter is None:
        return CompiledFilter([sql.SQL("true")], {})
    check_shape(filter)
    compiler = _Compiler(schema, column, doc_type_column, param_prefix, frozenset(split_keys))
    expr = compiler.object(filter, depth=1, where="the filter")
    return CompiledFilter([expr], compiler.params)


def check_shape(filter: Any) -> None:
    """Refuse (InvalidFilter) a filter nested too deeply or too large, walking it iteratively."""
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
        if isinstance(node, Mapping):
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
            """write a JSON object, e.g. '{"segment": "VIP", "total": {"$gt": 100}}'"""
        ) from None
    except RecursionError:
        raise InvalidFilter(
            f"filter is nested too deeply: keep it under {MAX_DEPTH} levels"
        ) from None
    if not isinstance(value, dict):
        raise InvalidFilter(
            f"filter must be a JSON object, not {_json_type(value)}: "
            """write e.g. '{"segment": "VIP"}'"""
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


class _Compiler:
    def __init__(
        self,
        schema: Mapping[str, str],
        column: sql.Composable,
        doc_type_column: sql.Composable,
        prefix: str,
        split_keys: frozenset[str],
    ) -> None:
        self.split_keys = split_keys
        self.schema = schema
        self.column = column
        self.doc_type_column = doc_type_column
        self.prefix = prefix
        self.params: dict[str, Any] = {}
        self.terms = 0

    # ---- parameters and counting ----

    def bind(self, value: Any) -> sql.Placeholder:
        name = self.prefix + str(len(self.params))
        self.params[name] = value
        return sql.Placeholder(name)

    def count(self) -> None:
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise InvalidFilter(
                f"filter has more than {MAX_TERMS} conditions: simplify it, or use $in lists "
                f"(up to {MAX_IN_VALUES:,} values) instead of many alternatives"
            )

    def valid_keys(self) -> str:
        keys = sorted(self.schema)
        return ", ".join([DOC_TYPE_KEY, *keys, *LOGICAL_OPERATORS])

    # ---- objects and logic ----

    def object(self, node: Any, *, depth: int, where: str) -> sql.Composable:
        if depth > MAX_DEPTH:
            raise InvalidFilter(
                f"filter is nested more than {MAX_DEPTH} levels deep: flatten its $and/$or/$not"
            )
        if not isinstance(node, Mapping):
            raise InvalidFilter(
                f"{where} must be an object, not {_json_type(node)} ({_show(node)}): "
                'write e.g. {"segment": "VIP"}'
            )
        parts: list[sql.Composable] = []
        contains: dict[str, Any] = {}
        ranges: dict[str, list[str]] = {}
        for key, value in node.items():
            if not isinstance(key, str):
                raise InvalidFilter(f"filter key {key!r} is not a string: use a metadata key")
            if key in ("$and", "$or"):
                parts.append(self.logical(key, value, depth=depth))
            elif key == "$not":
                self.count()
                inner = self.object(value, depth=depth + 1, where="the value of $not")
                parts.append(sql.SQL("(not {})").format(inner))
            elif key == DOC_TYPE_KEY:
                parts.append(self.doc_type(value))
            elif key in self.schema:
                canonical = depth == 1 and key in self.split_keys
                parts.extend(self.field(key, self.schema[key], value, contains, ranges, canonical))
            elif key.startswith("$"):
                raise InvalidFilter(
                    f"unknown operator {key!r} at the level of keys: use $and, $or or $not "
                    "here, and comparison operators inside a key, e.g. "
                    '{"total": {"$gt": 100}}'
                )
            else:
                raise InvalidFilter(
                    f"unknown filter key {key!r}: valid keys are {self.valid_keys()}"
                )
        # A filter index's key gets its own condition, in one canonical form: the planner uses
        # a partial index only when the query's conditions include its predicate, identical.
        # The other keys stay merged, estimated jointly (per-key conditions would be estimated
        # as independent: 100x too few rows for two correlated keys).
        # (top level only: pgrag.filter_index_keys() reads a filter's top-level keys, and nested
        # levels must compile alike whichever filter indexes exist)
        split = self.split_keys if depth == 1 else frozenset()
        head: list[sql.Composable] = []
        merged = {k: v for k, v in contains.items() if k not in split}
        if merged:
            head.append(self.containment(merged))
        for key, value in contains.items():
            if key in split:
                head.append(self.containment({key: _canonical(value)}))
        merged_ranges = [c for k, cs in ranges.items() if k not in split for c in cs]
        if merged_ranges:
            head.append(self.jsonpath(merged_ranges))
        for key, conditions in ranges.items():
            if key in split:
                head.append(self.jsonpath(sorted(conditions)))
        parts = head + parts
        if not parts:
            return sql.SQL("true")
        if len(parts) == 1:
            return parts[0]
        return sql.SQL("({})").format(sql.SQL(" and ").join(parts))

    def containment(self, pairs: Mapping[str, Any]) -> sql.Composable:
        return sql.SQL("{} @> {}::jsonb").format(self.column, self.bind(json.dumps(pairs)))

    def jsonpath(self, conditions: list[str]) -> sql.Composable:
        path = "$ ? (" + " && ".join(conditions) + ")"
        return sql.SQL("{} @? {}::jsonpath").format(self.column, self.bind(path))

    def logical(self, op: str, value: Any, *, depth: int) -> sql.Composable:
        self.count()
        if not isinstance(value, list | tuple) or not value:
            raise InvalidFilter(
                f"{op} takes a non-empty array of filter objects, not {_show(value)}: "
                f'write e.g. {{"{op}": [{{"segment": "VIP"}}, {{"has_returns": true}}]}}'
            )
        items = [self.object(item, depth=depth + 1, where="each item of " + op) for item in value]
        if len(items) == 1:
            return items[0]
        joiner = " and " if op == "$and" else " or "
        return sql.SQL("({})").format(sql.SQL(joiner).join(items))

    # ---- doc_type ----

    def doc_type(self, value: Any) -> sql.Composable:
        ops = value.items() if isinstance(value, Mapping) else [("$eq", value)]
        if not ops:
            raise InvalidFilter('doc_type has an empty operator object: write {"$eq": "..."}')
        parts: list[sql.Composable] = []
        for op, operand in ops:
            self.count()
            if op in ("$eq", "$ne"):
                name = self.doc_type_name(operand)
                sign = sql.SQL("=" if op == "$eq" else "<>")
                parts.append(
                    sql.SQL("{} {} {}").format(self.doc_type_column, sign, self.bind(name))
                )
            elif op in ("$in", "$nin"):
                names = [self.doc_type_name(x) for x in self.in_list(DOC_TYPE_KEY, op, operand)]
                expr = sql.SQL("{} = any({}::text[])").format(
                    self.doc_type_column, self.bind(names)
                )
                parts.append(expr if op == "$in" else sql.SQL("(not {})").format(expr))
            else:
                raise InvalidFilter(
                    f"unknown operator {op!r} for doc_type: valid operators are $eq, $ne, $in, $nin"
                )
        return parts[0] if len(parts) == 1 else sql.SQL("({})").format(sql.SQL(" and ").join(parts))

    def doc_type_name(self, value: Any) -> str:
        _check_text(DOC_TYPE_KEY, value)
        if not isinstance(value, str):
            raise InvalidFilter(
                f'doc_type expects a document type name (a string, e.g. "order_detail"), '
                f"got {_json_type(value)} {_show(value)}"
            )
        return value

    # ---- metadata keys ----

    def field(
        self,
        key: str,
        type_name: str,
        value: Any,
        contains: dict[str, Any],
        ranges: dict[str, list[str]],
        canonical: bool = False,
    ) -> list[sql.Composable]:
        """``canonical``: values in one form (a filter index's key, see ``object``)."""
        if isinstance(value, Mapping):
            if not value:
                raise InvalidFilter(
                    f"filter key {key!r} has an empty operator object: give a value or e.g. "
                    f'{{"$eq": {_EXAMPLES[type_name]}}}'
                )
            ops = list(value.items())
        else:
            ops = [("$eq", value)]
        valid = operators_for(type_name)
        is_array = type_name.endswith("[]")
        parts: list[sql.Composable] = []
        for op, operand in ops:
            self.count()
            if op not in valid:
                raise InvalidFilter(
                    f"unknown operator {op!r} for filter key {key!r} ({type_name}): valid "
                    f"operators are {', '.join(valid)}"
                )
            if is_array:
                parts.extend(self.array_op(key, type_name, op, operand, contains, canonical))
            elif op == "$eq":
                contains[key] = self.value(key, type_name, operand)
            elif op == "$ne":
                one = self.value(key, type_name, operand)
                one = _canonical(one) if canonical else one
                parts.append(
                    sql.SQL("(not {} @> {}::jsonb)").format(
                        self.column, self.bind(json.dumps({key: one}))
                    )
                )
            elif op in ("$in", "$nin"):
                values = [self.value(key, type_name, x) for x in self.in_list(key, op, operand)]
                values = _canonical_list(values) if canonical else values
                parts.append(self.any_of(key, values, negate=op == "$nin"))
            else:
                checked = self.value(key, type_name, operand)
                if canonical:
                    checked = _canonical(checked)
                ranges.setdefault(key, []).append(
                    "@." + json.dumps(key) + " " + _JSONPATH_OPS[op] + " " + json.dumps(checked)
                )
        return parts

    def array_op(
        self,
        key: str,
        type_name: str,
        op: str,
        operand: Any,
        contains: dict[str, Any],
        canonical: bool = False,
    ) -> list[sql.Composable]:
        element_type = type_name.removesuffix("[]")
        if op in ("$eq", "$contains", "$ne"):
            raw = operand if isinstance(operand, list | tuple) else [operand]
            if not raw:
                raise InvalidFilter(
                    f"filter key {key!r} {op} needs at least one element: e.g. "
                    f"{_EXAMPLES[type_name]}"
                )
            elements = [self.value(key, type_name, x, element_type) for x in raw]
            if op == "$ne":
                one = json.dumps({key: _canonical(elements) if canonical else elements})
                return [sql.SQL("(not {} @> {}::jsonb)").format(self.column, self.bind(one))]
            merged = contains.setdefault(key, [])
            merged.extend(e for e in elements if e not in merged)
            return []
        values = [
            [self.value(key, type_name, x, element_type)] for x in self.in_list(key, op, operand)
        ]
        values = _canonical_list(values) if canonical else values
        return [self.any_of(key, values, negate=op == "$nin")]

    def any_of(self, key: str, values: list[Any], *, negate: bool) -> sql.Composable:
        if not values:
            return sql.SQL("true" if negate else "false")
        if len(values) == 1:
            expr = sql.SQL("{} @> {}::jsonb").format(
                self.column, self.bind(json.dumps({key: values[0]}))
            )
        else:
            objects = [json.dumps({key: v}) for v in values]
            expr = sql.SQL("{} @> any({}::jsonb[])").format(self.column, self.bind(objects))
        return sql.SQL("(not {})").format(expr) if negate else expr

    def in_list(self, key: str, op: str, operand: Any) -> list[Any]:
        if not isinstance(operand, list | tuple):
            raise InvalidFilter(
                f"{op} on filter key {key!r} takes an array of values, not {_json_type(operand)}"
                f' ({_show(operand)}): write e.g. {{"{op}": ["a", "b"]}}'
            )
        if len(operand) > MAX_IN_VALUES:
            raise InvalidFilter(
                f"{op} on filter key {key!r} has {len(operand):,} values: keep it to "
                f"{MAX_IN_VALUES:,} or fewer, or filter on a broader key"
            )
        return list(operand)

    def value(self, key: str, type_name: str, value: Any, element_type: str | None = None) -> Any:
        """``value`` as the JSON value stored for a ``type_name`` key, or InvalidFilter."""
        want = element_type or type_name
        _check_text(key, value)
        checked = _coerce(want, value)
        if checked is _INVALID:
            expected = f"{type_name} elements ({want})" if element_type is not None else type_name
            raise InvalidFilter(
                f"filter key {key!r} expects {expected}, got {_json_type(value)} {_show(value)}:"
                f' write e.g. {{"{key}": {_EXAMPLES[type_name]}}}'
                + (" (dates are 'YYYY-MM-DD')" if want == "date" else "")
            )
        return checked


_INVALID = object()


def _check_text(key: str, value: Any) -> None:
    """Refuse strings PostgreSQL cannot hold (NUL, lone surrogates) before they reach it."""
    if not isinstance(value, str):
        return
    if "\x00" in value:
        raise InvalidFilter(
            f"filter value for {key!r} contains a NUL character, which PostgreSQL text cannot "
            "hold: remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFilter(
            f"filter value for {key!r} is not valid Unicode (a lone surrogate): send UTF-8 text"
        ) from None


def _canonical(value: Any) -> Any:
    """One JSON form per value: integral numbers as integers, arrays sorted without repeats
    (containment ignores order and repeats; jsonb keeps a number's written scale)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return sorted({_canonical(v) for v in value})
    return value


def _canonical_list(values: list[Any]) -> list[Any]:
    """``$in`` / ``$nin`` operands in one form: canonical values, sorted, without repeats."""
    texts = {json.dumps(_canonical(v)) for v in values}
    return [json.loads(t) for t in sorted(texts)]


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
