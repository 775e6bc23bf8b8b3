"""Questions → metadata filters and intent: a rule-based parser, and an optional LLM parser.

``parse_question`` reads tiers (VIP, dormant...), returns, categories (the names the caller found
in the data), order status ("not delivered yet"), customer ids and names, and time phrases
("in January 2024", "last 3 months", "since March 2024", "yesterday"), and says whether the
question needs exact numbers ("total", "how many", "average"...). Its filter is written for the
preferred document type, with values of its keys' types (``pgrag.filters.value_fits``).

``LLMParser`` asks any OpenAI-compatible chat endpoint for the same fields as a JSON object;
the proposal is validated by the server's filter compiler (``check``, ``pgrag.check_filter``)
and, if it does not hold, the rule-based
parse is used with a note saying why.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pgrag.errors import InvalidFilter, MissingDependency, PgragError
from pgrag.filters import value_fits
from pgrag.limits import check_question

CUSTOMER_PROFILE = "customer_profile"
ORDER_DETAIL = "order_detail"

# The sample shop's document types (sql/sample/shop_documents.sql); pass your own.
SHOP_SCHEMAS: dict[str, dict[str, str]] = {
    CUSTOMER_PROFILE: {
        "customer_id": "integer",
        "name": "text",
        "order_ids": "integer[]",
        "segment": "text",
        "registration_year": "integer",
        "categories": "text[]",
        "has_returns": "boolean",
        "return_count": "integer",
        "total_orders": "integer",
        "total_spent": "numeric",
        "last_order_date": "date",
    },
    ORDER_DETAIL: {
        "order_id": "integer",
        "customer_id": "integer",
        "customer_name": "text",
        "order_date": "date",
        "status": "text",
        "total": "numeric",
        "categories": "text[]",
        "has_returns": "boolean",
        "segment": "text",
    },
}
SEGMENTS = ("VIP", "Regular", "New", "Dormant")
ORDER_STATUSES = ("pending", "processing", "shipped", "delivered", "cancelled")
UNDELIVERED = ("delivered", "cancelled")  # $nin: what "not delivered yet" excludes
INTENTS = ("stats", "customers", "products", "orders", "lookup")

# Which metadata key carries each notion, per document type.
_RETURN_KEY = {CUSTOMER_PROFILE: "has_returns", ORDER_DETAIL: "has_returns"}
_DATE_KEY = {CUSTOMER_PROFILE: "last_order_date", ORDER_DETAIL: "order_date"}


@dataclass(frozen=True)
class TimeRange:
    """Inclusive dates; None is open-ended."""

    start: dt.date | None
    end: dt.date | None
    phrase: str

    def as_filter(self) -> dict[str, str]:
        ops: dict[str, str] = {}
        if self.start is not None:
            ops["$gte"] = self.start.isoformat()
        if self.end is not None:
            ops["$lte"] = self.end.isoformat()
        return ops


@dataclass(frozen=True)
class Matched:
    """A phrase of the question and what the parser made of it (for explanations)."""

    phrase: str
    meaning: str


@dataclass(frozen=True)
class ParsedQuery:
    search_text: str
    filter: dict[str, Any]
    doc_types: tuple[str, ...]
    needs_stats: bool
    intent: str
    customer_id: int | None = None
    customer_name: str | None = None
    order_id: int | None = None
    time_range: TimeRange | None = None
    segments: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    matched: tuple[Matched, ...] = ()
    notes: tuple[str, ...] = ()
    parser: str = "rules"  # "rules" or "llm"


# ---- vocabulary ----

MONTHS = {  # month names and abbreviations -> month number (also pgrag.lab.eval.faithfulness)
    name: i
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
_MONTH = r"(" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"((?:19|20)\d{2})"
_NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_COUNT = r"(\d{1,4}|" + "|".join(_NUMBER_WORDS) + r")"
_UNIT = r"(day|week|month|quarter|year)s?"

_SEGMENT_PATTERNS = [
    ("VIP", re.compile(r"\bv\.?i\.?p\.?s?\b", re.I)),
    ("Dormant", re.compile(r"\b(?:dormant|inactive|lapsed)\b", re.I)),
    (
        "New",
        re.compile(
            r"\bnew(?:ly\s+registered)?\s+(?:customers?|users?|buyers?|clients?|members?)\b", re.I
        ),
    ),
    (
        "Regular",
        re.compile(
            r"\b(?:regulars\b|regular\s+(?:customers?|users?|buyers?|clients?|members?)\b)", re.I
        ),
    ),
]
_UNDELIVERED_RE = re.compile(
    r"\b(?:undelivered|not\s+(?:yet\s+)?(?:been\s+)?delivered(?:\s+yet)?"
    r"|(?:have|has|had|were|was|are|is)n'?t\s+(?:yet\s+)?(?:been\s+)?delivered(?:\s+yet)?"
    r"|(?:have|has|had)\s+not\s+(?:yet\s+)?been\s+delivered(?:\s+yet)?"
    r"|yet\s+to\s+be\s+delivered|awaiting\s+delivery|in\s+transit|still\s+on\s+the\s+way"
    r"|open\s+orders?|outstanding\s+orders?)",
    re.I,
)
_STATUS_RE = re.compile(
    r"\b(pending|processing|shipped|delivered|cancell?ed)\b(?!\s+(?:date|address))", re.I
)
_RETURN_RE = re.compile(r"\b(?:return(?:s|ed|ing)?|refund(?:s|ed)?)\b", re.I)
_STATS_RE = re.compile(
    r"\b(?:total|how\s+many|how\s+much|average|avg|mean|sum|count|number\s+of|revenue"
    r"|percent(?:age)?|median|max(?:imum)?|min(?:imum)?|highest|lowest|most|least"
    r"|top\s+\d+)\b",
    re.I,
)
_CUSTOMER_ID_RE = re.compile(r"\bcustomer\s*(?:#|id\b|no\.?|number)?\s*[:#]?\s*(\d{1,18})\b", re.I)
_ORDER_ID_RE = re.compile(r"\border\s*(?:#|id\b|no\.?|number)?\s*[:#]?\s*(\d{1,18})\b", re.I)
_ORDER_WORDS_RE = re.compile(
    r"\b(?:orders?|ordered|purchases?|purchased|bought|buy|buys|buying|products?|items?"
    r"|deliver\w*|ship\w*|revenue|sales|sold|order\s+value)\b",
    re.I,
)
_PRODUCT_WORDS_RE = re.compile(r"\b(?:products?|items?|bought|buy|buys|purchased)\b", re.I)
_WHO_RE = re.compile(
    r"\b(?:who|whom|whose|(?:which|what|list|show|find)\s+(?:\w+\s+)?(?:customers|clients|users))\b",
    re.I,
)
_CUSTOMER_WORDS_RE = re.compile(r"\b(?:customers?|clients?|users?|people|buyers?)\b", re.I)
# A capitalised name word: John, Li, McDonald, O'Brien, Mary-Jane.
_NAME_WORD = r"(?:[A-Z]')?[A-Z][a-z]*[A-Z]?[a-z]+(?:-[A-Z][a-z]+)?"
_NAME_RE = re.compile(r"(?=\b(" + _NAME_WORD + r")\s+(" + _NAME_WORD + r")\b)")
_NOT_NAMES = {
    *(m.capitalize() for m in MONTHS),
    *"""
    Monday Tuesday Wednesday Thursday Friday Saturday Sunday What Which Who Whom Whose How When
    Where Why Show List Give Find Tell Did Do Does Is Are Was Were Has Have Had Can Could Would
    Should Please Among For In On Of Since Before After During From The A An And Or Not All Any
    Each Every Customer Customers Order Orders Product Products Total Average Regular New Dormant
    Vip Top Last This Next Return Returns Returned Yesterday Today
    """.split(),  # noqa: SIM905 (a word list reads better as words)
}


def _name_pattern(name: str) -> re.Pattern[str]:
    words = name.split()
    return re.compile(r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)", re.I)


def _category_variants(name: str) -> list[str]:
    low = name.strip().lower()
    variants = {low}
    if low.endswith("s") and len(low) > 3:
        variants.add(low[:-1])
    else:
        variants.add(low + "s")
    return sorted(variants, key=len, reverse=True)


# ---- the rule-based parser ----


def parse_question(
    question: str,
    *,
    categories: Sequence[str],
    today: dt.date | None = None,
    known_names: Sequence[str] = (),
    schemas: Mapping[str, Mapping[str, str]] | None = None,
) -> ParsedQuery:
    """Filters and intent for ``question``, by rules; no I/O.

    ``categories`` are the category names found in the data (matched case-insensitively, also
    singular/plural); ``known_names`` are customer names to recognise before the capitalised
    word-pair rule; ``schemas`` (default SHOP_SCHEMAS) decide which keys a filter may use:
    a rule whose key the preferred document type lacks is dropped with a note.
    """
    check_question(question)
    today = today or dt.date.today()
    schemas = SHOP_SCHEMAS if schemas is None else schemas
    text = question.replace("\u2019", "'").replace("\u2018", "'")
    matched: list[Matched] = []
    notes: list[str] = []
    taken: list[tuple[int, int]] = []  # spans already explained (ids, names, categories)

    def take(m: re.Match[str], meaning: str, group: int = 0) -> None:
        matched.append(Matched(m.group(group), meaning))
        taken.append(m.span(group))

    def free(m: re.Match[str]) -> bool:
        a, b = m.span()
        return all(b <= x or a >= y for x, y in taken)

    customer_id: int | None = None
    if (m := _CUSTOMER_ID_RE.search(text)) is not None:
        customer_id = int(m.group(1))
        take(m, "customer_id = " + str(customer_id))
    order_id: int | None = None
    if (m := _ORDER_ID_RE.search(text)) is not None and free(m):
        order_id = int(m.group(1))
        take(m, "order_id = " + str(order_id))

    segments: list[str] = []
    for segment, pattern in _SEGMENT_PATTERNS:
        if (m := pattern.search(text)) is not None and free(m):
            segments.append(segment)
            take(m, "segment = " + segment)

    found_categories: list[str] = []
    for name in sorted(dict.fromkeys(categories), key=len, reverse=True):
        for variant in _category_variants(name):
            hit = re.search(r"(?<!\w)" + re.escape(variant) + r"(?!\w)", text, re.I)
            if hit is not None and free(hit):
                found_categories.append(name)
                take(hit, "category " + name)
                break
    found_categories.sort(key=list(categories).index)

    customer_name = _find_name(text, known_names, take, free)

    undelivered = _UNDELIVERED_RE.search(text)
    statuses: list[str] = []
    if undelivered is not None:
        take(undelivered, "status not in delivered, cancelled")
    else:
        for m in _STATUS_RE.finditer(text):
            status = m.group(1).lower().replace("canceled", "cancelled")
            if status not in statuses:
                statuses.append(status)
                take(m, "status = " + status)

    returns = None
    first_word = text.lstrip().split(" ", 1)[0].lower()
    for m in _RETURN_RE.finditer(text):
        if m.start() == len(text) - len(text.lstrip()) and first_word == "return":
            continue  # "Return the ..." is an imperative, not a product return
        returns = m
        break

    time_range = _time_range(text, today, free)
    if time_range is not None:
        matched.append(Matched(time_range.phrase, _describe_range(time_range)))

    stats_hits = [m.group(0) for m in _STATS_RE.finditer(text)]
    needs_stats = bool(stats_hits)
    if needs_stats:
        matched.append(Matched(", ".join(stats_hits), "needs exact numbers"))

    # The preferred document type.
    who = _WHO_RE.search(text) is not None
    order_signal = (
        _ORDER_WORDS_RE.search(text) is not None
        or bool(statuses)
        or undelivered is not None
        or order_id is not None
        or time_range is not None
    )
    customer_signal = who or bool(segments) or _CUSTOMER_WORDS_RE.search(text) is not None
    if undelivered is not None or statuses or order_id is not None:
        doc_types: tuple[str, ...] = (ORDER_DETAIL,)
    elif who:
        doc_types = (CUSTOMER_PROFILE,)
    elif order_signal or returns is not None:
        doc_types = (ORDER_DETAIL,)
    elif customer_signal:
        doc_types = (CUSTOMER_PROFILE,)
    else:
        doc_types = (CUSTOMER_PROFILE, ORDER_DETAIL)
    primary = doc_types[0] if len(doc_types) == 1 else None

    if needs_stats:
        intent = "stats"
    elif primary == CUSTOMER_PROFILE:
        intent = "customers"
    elif primary == ORDER_DETAIL:
        intent = "products" if _PRODUCT_WORDS_RE.search(text) else "orders"
    else:
        intent = "lookup"

    # The filter, for the keys the preferred document type(s) have.
    known = [schemas[d] for d in doc_types if d in schemas]
    keys = set.intersection(*(set(s) for s in known)) if known else set()
    wanted: list[tuple[str, Any, str]] = []
    if customer_id is not None:
        wanted.append(("customer_id", customer_id, "customer " + str(customer_id)))
    if order_id is not None:
        wanted.append(("order_id", order_id, "order " + str(order_id)))
    if segments:
        value: Any = segments[0] if len(segments) == 1 else {"$in": segments}
        wanted.append(("segment", value, "segment"))
    if found_categories:
        value = (
            {"$contains": found_categories[0]}
            if len(found_categories) == 1
            else {"$in": found_categories}
        )
        wanted.append(("categories", value, "categories"))
    if undelivered is not None:
        wanted.append(("status", {"$nin": list(UNDELIVERED)}, undelivered.group(0)))
    elif statuses:
        wanted.append(
            ("status", statuses[0] if len(statuses) == 1 else {"$in": statuses}, "status")
        )
    if returns is not None:
        key = _RETURN_KEY.get(primary or CUSTOMER_PROFILE, "has_returns")
        wanted.append((key, True, returns.group(0)))
        matched.append(Matched(returns.group(0), key + " = true"))
    if time_range is not None:
        key = _DATE_KEY.get(primary or ORDER_DETAIL, "order_date")
        wanted.append((key, time_range.as_filter(), time_range.phrase))

    flt: dict[str, Any] = {}
    schema: dict[str, str] = {}
    for one in known:
        schema.update(one)
    for key, value, why in wanted:
        if key not in keys:
            notes.append(
                f"{why!r} needs the metadata key {key!r}, which {'/'.join(doc_types)} lacks: "
                "not filtered on"
            )
            continue
        # the rules only emit values of the key's declared type; say so if not
        if not _fits(schema[key], value):
            notes.append(f"{why!r} not filtered on: filter key {key!r} expects {schema[key]}")
            continue
        flt[key] = value

    return ParsedQuery(
        search_text=question,
        filter=flt,
        doc_types=doc_types,
        needs_stats=needs_stats,
        intent=intent,
        customer_id=customer_id,
        customer_name=customer_name,
        order_id=order_id,
        time_range=time_range,
        segments=tuple(segments),
        categories=tuple(found_categories),
        matched=tuple(matched),
        notes=tuple(notes),
    )


def _fits(type_name: str, value: Any) -> bool:
    """Whether every value in a rule's condition (a value, or an operator object) fits."""
    operands = value.values() if isinstance(value, Mapping) else [value]
    return all(
        value_fits(type_name, v)
        for operand in operands
        for v in (operand if isinstance(operand, list) else [operand])
    )


def _find_name(text: str, known_names: Sequence[str], take: Any, free: Any) -> str | None:
    """A known name in ``text``, else the first capitalised word pair that can be a name."""
    for name in sorted(known_names, key=len, reverse=True):
        m = _name_pattern(name.strip()).search(text) if name.strip() else None
        if m is not None and free(m):
            take(m, "customer name " + name)
            return name
    for m in _NAME_RE.finditer(text):
        first, last = m.group(1), m.group(2)
        if first in _NOT_NAMES or last in _NOT_NAMES or first.upper() == "VIP":
            continue
        whole = re.compile(re.escape(first) + r"\s+" + re.escape(last)).match(text, m.start(1))
        if whole is None or not free(whole):
            continue
        take(whole, "customer name " + first + " " + last)
        return first + " " + last
    return None


# ---- time phrases ----


def _add_months(day: dt.date, months: int) -> dt.date:
    index = day.year * 12 + day.month - 1 + months
    year, month = divmod(index, 12)
    last = calendar.monthrange(year, month + 1)[1]
    return dt.date(year, month + 1, min(day.day, last))


def _month_range(year: int, month: int) -> tuple[dt.date, dt.date]:
    return dt.date(year, month, 1), dt.date(year, month, calendar.monthrange(year, month)[1])


def _latest_year_for(month: int, today: dt.date) -> int:
    """The year of the most recent ``month`` that has begun (in March, "in May" is last May)."""
    return today.year if month <= today.month else today.year - 1


def _count(word: str | None) -> int:
    if word is None:
        return 1
    return int(word) if word.isdigit() else _NUMBER_WORDS[word.lower()]


def _time_range(text: str, today: dt.date, free: Any) -> TimeRange | None:
    """The first time phrase of ``text``, as dates (relative phrases are counted from today)."""
    rules: list[tuple[str, Any]] = [
        (r"\b(?:since|after|from)\s+" + _MONTH + r"(?:,?\s+" + _YEAR + r")?\b", _since_month),
        (r"\b(?:since|after|from)\s+" + _YEAR + r"\b", _since_year),
        (r"\bbefore\s+" + _MONTH + r"(?:,?\s+" + _YEAR + r")?\b", _before_month),
        (r"\bbefore\s+" + _YEAR + r"\b", _before_year),
        (r"\b" + _MONTH + r",?\s+(?:of\s+)?" + _YEAR + r"\b", _month_year),
        (r"\bq([1-4])\s+" + _YEAR + r"\b", _quarter),
        (r"\b(?:last|past|previous)\s+" + _COUNT + r"\s+" + _UNIT + r"\b", _last_n),
        (r"\b(last|past|previous|this|current)\s+" + _UNIT + r"\b", _last_one),
        (r"\b(yesterday|today)\b", _day_word),
        (r"\b(?:in|during|for|of|throughout)\s+(?:the\s+year\s+)?" + _YEAR + r"\b", _year),
        (r"\b(?:in|during|for|of|throughout)\s+" + _MONTH + r"\b", _month_alone),
    ]
    for pattern, build in rules:
        for m in re.finditer(pattern, text, re.I):
            if not free(m):
                continue
            start, end = build(m, today)
            return TimeRange(start, end, m.group(0))
    return None


Span = tuple[dt.date | None, dt.date | None]


def _since_month(m: re.Match[str], today: dt.date) -> Span:
    month = MONTHS[m.group(1).lower()]
    year = int(m.group(2)) if m.group(2) else _latest_year_for(month, today)
    return dt.date(year, month, 1), today


def _since_year(m: re.Match[str], today: dt.date) -> Span:
    return dt.date(int(m.group(1)), 1, 1), today


def _before_month(m: re.Match[str], today: dt.date) -> Span:
    month = MONTHS[m.group(1).lower()]
    year = int(m.group(2)) if m.group(2) else _latest_year_for(month, today)
    return None, dt.date(year, month, 1) - dt.timedelta(days=1)


def _before_year(m: re.Match[str], _today: dt.date) -> Span:
    return None, dt.date(int(m.group(1)) - 1, 12, 31)


def _month_year(m: re.Match[str], _today: dt.date) -> Span:
    return _month_range(int(m.group(2)), MONTHS[m.group(1).lower()])


def _quarter(m: re.Match[str], _today: dt.date) -> Span:
    q, year = int(m.group(1)), int(m.group(2))
    start = dt.date(year, 3 * q - 2, 1)
    return start, _month_range(year, 3 * q)[1]


def _last_n(m: re.Match[str], today: dt.date) -> Span:
    return _window(_count(m.group(1)), m.group(2).lower(), today)


def _window(n: int, unit: str, today: dt.date) -> Span:
    """The last ``n`` units, rolling, ending today."""
    if unit == "day":
        return today - dt.timedelta(days=n), today
    if unit == "week":
        return today - dt.timedelta(weeks=n), today
    months = {"month": 1, "quarter": 3, "year": 12}[unit] * n
    return _add_months(today, -months), today


def _last_one(m: re.Match[str], today: dt.date) -> Span:
    which, unit = m.group(1).lower(), m.group(2).lower()
    if which in ("this", "current"):
        if unit == "day":
            return today, today
        if unit == "week":
            return today - dt.timedelta(days=today.weekday()), today
        if unit == "month":
            return today.replace(day=1), today
        if unit == "quarter":
            return dt.date(today.year, 3 * ((today.month - 1) // 3) + 1, 1), today
        return dt.date(today.year, 1, 1), today
    if which in ("last", "previous"):
        # "last month" / "last year": the previous calendar month / year.
        if unit == "month":
            prev = _add_months(today.replace(day=1), -1)
            return _month_range(prev.year, prev.month)
        if unit == "year":
            return dt.date(today.year - 1, 1, 1), dt.date(today.year - 1, 12, 31)
        if unit == "quarter":
            first = dt.date(today.year, 3 * ((today.month - 1) // 3) + 1, 1)
            start = _add_months(first, -3)
            return start, first - dt.timedelta(days=1)
    # "past week", "last week", "past month", "last day": a rolling window ending today.
    return _window(1, unit, today)


def _day_word(m: re.Match[str], today: dt.date) -> Span:
    day = today - dt.timedelta(days=1) if m.group(1).lower() == "yesterday" else today
    return day, day


def _year(m: re.Match[str], _today: dt.date) -> Span:
    year = int(m.group(1))
    return dt.date(year, 1, 1), dt.date(year, 12, 31)


def _month_alone(m: re.Match[str], today: dt.date) -> Span:
    month = MONTHS[m.group(1).lower()]
    return _month_range(_latest_year_for(month, today), month)


def _describe_range(r: TimeRange) -> str:
    if r.start is not None and r.end is not None:
        return "from " + r.start.isoformat() + " to " + r.end.isoformat()
    if r.start is not None:
        return "from " + r.start.isoformat()
    assert r.end is not None
    return "until " + r.end.isoformat()


# ---- the LLM parser ----

_LLM_SYSTEM = """\
You turn a question about a shop's data into a search plan. Reply with one JSON object only:
{"filter": {...}, "doc_types": [...], "needs_stats": true|false, "intent": "...",
 "customer_name": null|"...", "customer_id": null|123}

The filter language (a JSON object; several keys in one object all apply):
- equality: {"segment": "VIP"}; operators: {"key": {"$ne"|"$in"|"$nin": ...}}
- numbers and dates ('YYYY-MM-DD'): {"key": {"$gt"|"$gte"|"$lt"|"$lte": value}}
- arrays: {"categories": {"$contains": "Books"}}, any of: {"categories": {"$in": [...]}}
- logic: {"$and": [..]}, {"$or": [..]}, {"$not": {..}}
Use only these document types and metadata keys (key: type):
"""


@dataclass(frozen=True)
class LLMParser:
    """Proposes a ParsedQuery with an OpenAI-compatible chat model; validated before use."""

    base_url: str | None
    model: str
    api_key: str | None = field(default=None, repr=False)
    schemas: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: SHOP_SCHEMAS)
    timeout_s: float = 30.0
    # The filter language's check of a proposal (InvalidFilter if it does not hold), e.g.
    # ``lambda f, types: pgrag.filters.check_filter(conn, f, types)``; without it a proposal's
    # filter is checked by the search that uses it.
    check: Callable[[Mapping[str, Any], Sequence[str]], None] | None = field(
        default=None, repr=False, compare=False
    )

    def parse(
        self,
        question: str,
        *,
        categories: Sequence[str],
        today: dt.date | None = None,
        known_names: Sequence[str] = (),
    ) -> ParsedQuery:
        """The model's parse if it validates, else the rule-based parse with a note why."""
        today = today or dt.date.today()
        rules = parse_question(
            question,
            categories=categories,
            today=today,
            known_names=known_names,
            schemas=self.schemas,
        )
        try:
            content = self._ask(question, categories, today)
        except PgragError as exc:
            return replace(rules, notes=(*rules.notes, "LLM parser not used: " + str(exc)))
        try:
            return self._validate(question, content, rules)
        except (InvalidFilter, ValueError) as exc:
            note = "LLM parser's proposal rejected (" + str(exc) + "): used the rule-based parse"
            return replace(rules, notes=(*rules.notes, note))

    def messages(
        self, question: str, categories: Sequence[str], today: dt.date
    ) -> list[dict[str, str]]:
        system = (
            _LLM_SYSTEM
            + json.dumps(self.schemas, indent=1, sort_keys=True)
            + "\nSegments: "
            + ", ".join(SEGMENTS)
            + ". Order statuses: "
            + ", ".join(ORDER_STATUSES)
            + ". Categories: "
            + json.dumps(list(categories))
            + ". Today is "
            + today.isoformat()
            + ".\nintent is one of: "
            + ", ".join(INTENTS)
            + ". needs_stats is true when the answer needs exact totals, counts or averages."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def _ask(self, question: str, categories: Sequence[str], today: dt.date) -> str:
        try:
            import openai
        except ImportError as exc:
            raise MissingDependency(
                "the LLM parser needs the openai package: pip install 'pgrag-relational[openai]'"
            ) from exc
        client: Any = openai.OpenAI(
            base_url=self.base_url,
            api_key=self.api_key or "unused",
            timeout=self.timeout_s,
            max_retries=0,
        )
        try:
            response = client.chat.completions.create(
                model=self.model,
                messages=self.messages(question, categories, today),
                response_format={"type": "json_object"},
                temperature=0,
            )
        except openai.OpenAIError as exc:
            raise PgragError(
                "the chat endpoint failed (" + type(exc).__name__ + ": " + _first_line(exc) + ")"
            ) from exc
        content = response.choices[0].message.content if response.choices else None
        if not isinstance(content, str):
            raise PgragError("the chat endpoint returned no message content")
        return content

    def _validate(self, question: str, content: str, rules: ParsedQuery) -> ParsedQuery:
        try:
            proposal = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ValueError("not JSON: " + exc.msg) from None
        if not isinstance(proposal, dict):
            raise ValueError("not a JSON object")
        raw_types = proposal.get("doc_types") or list(rules.doc_types)
        if not isinstance(raw_types, list) or not all(
            isinstance(d, str) and d in self.schemas for d in raw_types
        ):
            raise ValueError(
                "doc_types must be a list of "
                + ", ".join(sorted(self.schemas))
                + ", not "
                + json.dumps(raw_types)[:80]
            )
        doc_types = tuple(dict.fromkeys(raw_types))
        flt = proposal.get("filter") or {}
        if not isinstance(flt, dict):
            raise ValueError("filter must be an object")
        if self.check is not None:
            self.check(flt, doc_types)
        needs_stats = proposal.get("needs_stats", rules.needs_stats)
        if not isinstance(needs_stats, bool):
            raise ValueError("needs_stats must be true or false")
        intent = proposal.get("intent")
        if intent not in INTENTS:
            intent = rules.intent
        customer_id = proposal.get("customer_id")
        if customer_id is not None and (
            isinstance(customer_id, bool) or not isinstance(customer_id, int)
        ):
            raise ValueError("customer_id must be an integer or null")
        customer_name = proposal.get("customer_name")
        if customer_name is not None and not isinstance(customer_name, str):
            raise ValueError("customer_name must be a string or null")
        return ParsedQuery(
            search_text=question,
            filter=flt,
            doc_types=doc_types,
            needs_stats=needs_stats,
            intent=str(intent),
            customer_id=customer_id,
            customer_name=customer_name or None,
            order_id=rules.order_id,
            time_range=rules.time_range,
            segments=rules.segments,
            categories=rules.categories,
            matched=(Matched(content[:200], "LLM proposal (validated)"),),
            notes=(),
            parser="llm",
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"
