"""Questions -> metadata filters, the types that answer them, and what numbers they ask for: a
rule-based parser whose knowledge comes from the declarations and the data, and an optional LLM
parser.

``parse_question(question, vocabulary)`` (no I/O) reads a ``pgrag.vocabulary.Vocabulary``: the
declared types, their metadata keys and types, the words a declarer described
(``pgrag.describe_document``) and the values present in the chunks. From those, and from English
alone, it finds:

- values of text keys named in the question ("Gold", "Germany", "john smith"; plurals, declared
  value synonyms, and close spellings of names: "Jon Smith"), each with every key that holds it;
- identifiers: "<entity> 42" / "<entity> #42" for an integer key named <entity>_id (or <entity>id);
- booleans: the words of a boolean key ("shipped" for is_shipped), "not" / "no" / "without";
- comparisons: "more than $50", "at least two hours", "between 3 and 5 orders", mapped to the
  numeric key whose words are nearest;
- time phrases ("in March 2023", "last 3 months", "since 2024") on the date key the question
  names, or the type's only one;
- ranking ("top 5", "most", "many", "fewest ... by <key>") by a numeric key, and aggregates
  (how many, total, average, highest, lowest) that need exact statistics;
- the type the question is about: the one whose name, synonyms and keys it uses most.

A name-like phrase that matches no value is reported (``unknown_names``) so that the caller can
say "Cannot find that information in the provided data" rather than answer about someone else.

``LLMParser`` asks any OpenAI-compatible chat endpoint for the same fields as a JSON object; the
proposal is validated by the server's filter compiler (``check``, ``pgrag.check_filter``) and,
if it does not hold, the rule-based parse is used with a note saying why.
"""

from __future__ import annotations

import calendar
import datetime as dt
import difflib
import json
import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pgrag.errors import InvalidFilter, MissingDependency, PgragError
from pgrag.filters import value_fits
from pgrag.limits import check_question
from pgrag.vocabulary import (
    WORD_RE,
    KeyWords,
    TypeWords,
    Vocabulary,
    fold,
    name_words,
    same_word,
    singular,
    stem,
    tokens,
)

INTENTS = ("stats", "rank", "lookup", "search")
MAX_FUZZY = 5  # name-like phrases of one question matched against close spellings
MAX_NAMES_HOLDING = 5  # names a one-word phrase may stand for ("Smith": every Smith)
AGGREGATES = ("count", "sum", "avg", "max", "min")


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
class Mention:
    """A phrase that names a value of some metadata keys: a condition on whichever of them
    belongs to the type the question is about."""

    phrase: str
    keys: tuple[tuple[str, str], ...]  # (document type, key)
    condition: Any  # a value, or an operator object of the filter language
    how: str  # value, synonym, fuzzy, id, boolean, comparison, time
    span: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Link:
    """A value of a related type's key: the documents of ``via_type`` whose ``via_key`` matches
    ``condition`` give the values of ``key`` to filter the question's types on ("orders of Around
    the Horn": the company is a key of the customers, who share customer_id with their orders).
    The caller looks them up (``pgrag.ask``)."""

    phrase: str
    via_type: str
    via_key: str
    condition: Any
    key: str


@dataclass(frozen=True)
class RankBy:
    """Order the documents by a numeric key instead of by similarity."""

    key: str
    descending: bool
    limit: int | None
    phrase: str
    # every key the words could mean, best first: the key once the question's type is chosen
    # ("paid the most in fines" about members: total_fines, not the loans' fine)
    candidates: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParsedQuery:
    search_text: str
    filter: dict[str, Any]
    doc_types: tuple[str, ...]
    needs_stats: bool
    intent: str
    aggregate: str | None = None  # count, sum, avg, max, min
    rank_by: RankBy | None = None
    time_range: TimeRange | None = None
    mentions: tuple[Mention, ...] = ()
    unknown_names: tuple[str, ...] = ()  # name-like phrases that match no value
    links: tuple[Link, ...] = ()  # values to look up in a related type (parent or child)
    matched: tuple[Matched, ...] = ()
    notes: tuple[str, ...] = ()
    parser: str = "rules"  # "rules" or "llm"


# ---- vocabulary: English only ----

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
_SEASON_RE = re.compile(
    r"\b(?:spring|summer|autumn|fall|winter)(?:\s+(?:term\s+|semester\s+)?(?:of\s+)?"
    r"(?:19|20)\d\d)\b",
    re.I,
)


_NUMBER_RE = (
    r"(\d[\d,]{0,24}(?:\.\d{1,12})?(?![\d,])|"
    + "|".join(k for k in _NUMBER_WORDS if len(k) > 2)
    + r")"
)

# Words that are values of some key in many stores (a segment "New", a status "open") but mean
# something else in most questions: such a one-word value counts only written as declared
# (capitalised, not first) or right before a word for its type ("new customers").
_COMMON = set(
    """
    a an the and or of in on at to for by with from as is are was were be been has have had do
    does did not no yes none all any some each every other others new old open closed
    normal standard general first last next this that these those one two
    more most less least many much few top best good bad high low big small large long short
    total average count sum mean max min who what which when where why how
    """.split()  # noqa: SIM905 (a word list reads better as words)
)
# Capitalised words that begin questions or name things other than values.
_NOT_NAMES = {
    *(m.capitalize() for m in MONTHS),
    *"""
    Monday Tuesday Wednesday Thursday Friday Saturday Sunday What Which Who Whom Whose How When
    Where Why Show List Give Find Tell Did Do Does Is Are Was Were Has Have Had Can Could Would
    Should Please Among For In On Of Since Before After During From The A An And Or Not All Any
    Each Every Total Average Top Last This Next Yesterday Today Count Sum Name Names I My We Our
    Me Us You Your Their They He She His Her It Its Than Then Also Only Just Ignore Return
    Returns Print Output Reveal Forget Disregard Compare Between Both Either Neither
    Dr Dr. Mr Mr. Mrs Mrs. Ms Ms. Miss Mx Mx. Prof Prof. Professor Sir Dame
    """.split(),  # noqa: SIM905
}
_GENERIC_TYPE_WORDS = {
    "doc",
    "docs",
    "document",
    "detail",
    "details",
    "profile",
    "info",
    "record",
    "records",
    "summary",
    "row",
    "rows",
    "item",
    "data",
    "view",
    "entry",
}
_KEY_NOISE = {
    "has",
    "is",
    "was",
    "had",
    "have",
    "with",
    "any",
    "flag",
    "the",
    "of",
    "at",
    "on",
    "in",
    "by",
    "to",
    "a",
    "an",
    "and",
    "or",
    "for",
    "date",
    "day",
    "time",
    "id",
    "ids",
    "no",
    "num",
    "number",
    "nr",
    "code",
    "key",
}
_ID_TAILS = ("id", "no", "number", "nr", "code")
# Words of a direction before a value, and the words of the keys each points to: "from Lisbon to
# Paris" is origin Lisbon, destination Paris, where both keys hold both cities (English, not any
# schema's: the key words come from the declarations).
_DIRECTIONS: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        ("from", "depart", "departed", "departing", "departs", "leave", "leaving", "left",
         "picked", "collected"),
        frozenset({"from", "origin", "source", "departure", "depart", "sender", "start",
                   "pickup", "pick", "collection"}),
    ),
    **dict.fromkeys(
        ("to", "into", "toward", "towards", "arrive", "arrived", "arriving", "arrives",
         "dropped", "returned", "delivered"),
        frozenset({"to", "destination", "dest", "target", "arrival", "arrive", "recipient",
                   "end", "dropoff", "drop", "return", "delivery"}),
    ),
}  # fmt: skip

_NEGATOR_RE = re.compile(
    r"\b(?:not|no|never|without|non|none|neither|nor|excluding|except|yet\s+to\s+be)\b|n't\b", re.I
)
_MONEY_WORDS = {
    "total",
    "amount",
    "price",
    "cost",
    "spent",
    "spend",
    "revenue",
    "value",
    "paid",
    "sum",
    "fee",
    "balance",
    "sales",
    "charge",
    "income",
    "earning",
    "budget",
}

# Opposite states a yes/no key may be named by either of ("failed" is is_passed false, "won"
# is is_lost false): English words, each way.
_OPPOSITE_STATES = {
    a: b
    for x, y in (
        ("fail", "pass"), ("failed", "passed"), ("failing", "passing"), ("fails", "passes"),
        ("lose", "win"), ("lost", "won"), ("losing", "winning"),
        ("reject", "accept"), ("rejected", "accepted"),
        ("deny", "approve"), ("denied", "approved"),
        ("absent", "present"),
    )
    for a, b in ((x, y), (y, x))
}  # fmt: skip
# Words of a date key that name when its event starts: of several date keys none of which the
# question names, the time phrase is read on that one (with a note).
_START_WORDS = frozenset(
    {"start", "begin", "from", "pickup", "checkin", "created", "opened", "placed", "issued",
     "departure", "booked", "ordered", "signed", "enrolled", "joined", "registered"}
)  # fmt: skip
# Superlatives and ranking words of less of a measure ("the cheapest": smallest price first),
# with their opposites, so that a key described by one word is ranked by the other too; and
# words of a measure that name no key by themselves ("expensive", "cheap": money).
_OPPOSITES = {
    "cheap": "expensive",
    "short": "long",
    "small": "large",
    "low": "high",
    "light": "heavy",
    "few": "many",
    "thin": "thick",
    "narrow": "wide",
    "slow": "fast",
    "near": "far",
    "close": "far",
    "weak": "strong",
    "shallow": "deep",
}
_LESS = frozenset(_OPPOSITES)
# Units of measure after a number, by dimension and size: "more than 2 hours" is a key of
# minutes over 120, "over 30 kg" a key in kg, and a unit no key is in filters nothing (a fee
# is not a duration).
_UNITS: dict[str, tuple[str, float]] = {
    **dict.fromkeys(("second", "sec", "secs", "s"), ("time", 1.0)),
    **dict.fromkeys(("minute", "min", "mins"), ("time", 60.0)),
    **dict.fromkeys(("hour", "hr", "hrs", "h"), ("time", 3600.0)),
    **dict.fromkeys(("day",), ("time", 86400.0)),
    **dict.fromkeys(("week", "wk"), ("time", 604800.0)),
    **dict.fromkeys(("meter", "metre"), ("length", 1.0)),
    **dict.fromkeys(("km", "kilometer", "kilometre"), ("length", 1000.0)),
    **dict.fromkeys(("mile", "mi"), ("length", 1609.344)),
    **dict.fromkeys(("gram", "g"), ("mass", 1.0)),
    **dict.fromkeys(("kg", "kilo", "kilogram"), ("mass", 1000.0)),
    **dict.fromkeys(("lb", "lbs"), ("mass", 453.59237)),
}


def _unit(word: str | None) -> tuple[str, float] | None:
    return None if not word else _UNITS.get(singular(word.lower()), _UNITS.get(word.lower()))


_MEASURE_OF: dict[str, set[str]] = {
    # what a thing costs, not money it made (revenue, a total): "the cheapest car" is by its
    # daily rate
    **dict.fromkeys(
        ("cheap", "expensive", "costly", "pricey", "pricy"),
        {"price", "cost", "fee", "fare", "rate", "charge", "tariff"},
    ),
    **dict.fromkeys(("heavy", "light"), {"weight", "kg", "mass"}),
    **dict.fromkeys(("far", "near", "close"), {"distance", "km", "mile"}),
}
_MEASURE_ADJECTIVES = _LESS | set(_OPPOSITES.values()) | set(_MEASURE_OF)


def _measure_words(word: str) -> set[str]:
    """The words a key may be named by for a word of a question: itself, and for a word of a
    measure ("cheap", "long") its opposite and what it measures."""
    return (
        {word, _OPPOSITES.get(word, word)}
        | {less for less, more in _OPPOSITES.items() if more == word}
        | _MEASURE_OF.get(word, set())
    )


_OPS = {
    "more than": "$gt",
    "greater than": "$gt",
    "larger than": "$gt",
    "higher than": "$gt",
    "bigger than": "$gt",
    "over": "$gt",
    "above": "$gt",
    "exceeding": "$gt",
    "at least": "$gte",
    "no less than": "$gte",
    "not less than": "$gte",
    "a minimum of": "$gte",
    "less than": "$lt",
    "fewer than": "$lt",
    "lower than": "$lt",
    "smaller than": "$lt",
    "under": "$lt",
    "below": "$lt",
    "at most": "$lte",
    "no more than": "$lte",
    "not more than": "$lte",
    "up to": "$lte",
    "a maximum of": "$lte",
    # comparatives of a measure (the number's unit, or the words around it, name the key)
    "longer than": "$gt",
    "heavier than": "$gt",
    "farther than": "$gt",
    "further than": "$gt",
    "pricier than": "$gt",
    "costlier than": "$gt",
    "more expensive than": "$gt",
    "shorter than": "$lt",
    "lighter than": "$lt",
    "cheaper than": "$lt",
    "less expensive than": "$lt",
}
_COMPARE_RE = re.compile(
    r"\b(?P<op>"
    + "|".join(re.escape(op).replace(r"\ ", r"\s+") for op in sorted(_OPS, key=len, reverse=True))
    + r")\s+(?P<cur>[$\u20ac\u00a3])?\s*"
    + _NUMBER_RE
    + r"(?:\s*(?P<unit>[a-z]+))?",
    re.I,
)
_OR_MORE_RE = re.compile(
    r"(?P<cur>[$\u20ac\u00a3])?\b" + _NUMBER_RE + r"\s*(?:\+|or\s+(?P<dir>more|over|less|fewer|"
    r"under))\s*(?P<unit>[a-z]+)?",
    re.I,
)
_BETWEEN_RE = re.compile(
    r"\bbetween\s+(?P<cur>[$\u20ac\u00a3])?\s*"
    + _NUMBER_RE
    + r"\s+and\s+[$\u20ac\u00a3]?\s*"
    + _NUMBER_RE
    + r"(?:\s*(?P<unit>[a-z]+))?",
    re.I,
)
_TOP_RE = re.compile(r"\b(top|first|bottom|last)\s+" + _COUNT + r"\b", re.I)
_RANK_RE = re.compile(
    r"\b(most|highest|largest|biggest|greatest|many|lots\s+of|maximum|fewest|least|lowest"
    r"|smallest|minimum)\b",
    re.I,
)
# how a note ends when part of the question was left out of the filter: the statistics then
# count more than was asked, so none of them is the answer (pgrag.ask drops the headline)
NOT_FILTERED = "not filtered on"
_ASCENDING = {"fewest", "least", "lowest", "smallest", "minimum", "bottom"}
# superlatives of time, not of a measure ("the latest loans" are no late_count ranking)
_TIME_SUPERLATIVES = {"latest", "earliest", "newest", "oldest"}
_BY_RE = re.compile(
    r"\b(?:by|in\s+terms\s+of|ranked\s+by|sorted\s+by|ordered\s+by)\s+([a-z ]{2,40})", re.I
)
_AGGREGATE_RULES: list[tuple[str, re.Pattern[str]]] = [
    # (average first: "the average number of pages" is an average, not a count)
    ("avg", re.compile(r"\b(?:average|avg|mean)\b", re.I)),
    ("count", re.compile(r"\b(?:how\s+many|number\s+of|count(?:\s+of)?)\b", re.I)),
    ("sum", re.compile(r"\b(?:total|sum|how\s+much|combined|altogether|in\s+all|revenue)\b", re.I)),
    ("max", re.compile(r"\b(?:highest|maximum|max|largest|biggest)\b", re.I)),
    ("min", re.compile(r"\b(?:lowest|minimum|min|smallest)\b", re.I)),
]
_WHO_RE = re.compile(r"\b(?:who|whom|whose)\b", re.I)
_NAME_RE = re.compile(
    r"(?<![\w'])([A-Z][\w'.\-]*(?:\s+(?:[A-Z][\w'.\-]*|&|de|del|der|den|van|von|la|le|da|du|y"
    r"|of|and))*)"
)
_QUOTED_RE = re.compile(r"[\"\u201c]([^\"\u201d]{2,80})[\"\u201d]")


# ---- the index of a vocabulary (built once per Vocabulary) ----


@dataclass
class _Index:
    values: dict[tuple[str, ...], list[tuple[str, str, str, str]]]  # -> (type, key, value, how)
    max_len: int
    type_words: dict[str, set[str]]  # type -> stems of its name words and synonyms
    key_words: dict[tuple[str, str], list[str]]  # (type, key) -> its words (stems)
    names: dict[str, list[tuple[str, str, str]]]  # first letter -> (folded value, type, key)
    # a word of a name of two to six words -> (folded value, type, key): "smith" for "Alice
    # Smith" and "James Smith"
    name_words: dict[str, list[tuple[str, str, str]]]
    # the stems naming an entity: every type's words, and the <entity> of an <entity>_id key
    # (they name what a boolean key or a ranking is about, not the key itself)
    entity_words: set[str]


_indexes: weakref.WeakKeyDictionary[Vocabulary, _Index] = weakref.WeakKeyDictionary()


def _index(vocabulary: Vocabulary) -> _Index:
    hit = _indexes.get(vocabulary)
    if hit is not None:
        return hit
    values: dict[tuple[str, ...], list[tuple[str, str, str, str]]] = {}

    def add(words: list[str], entry: tuple[str, str, str, str]) -> None:
        if not words or len(words) > 10:
            return
        variants = {tuple(words), (*words[:-1], singular(words[-1]))}
        for v in variants:
            if entry not in values.setdefault(v, []):
                values[v].append(entry)

    type_words: dict[str, set[str]] = {}
    key_words: dict[tuple[str, str], list[str]] = {}
    names: dict[str, list[tuple[str, str, str]]] = {}
    words_of_names: dict[str, list[tuple[str, str, str]]] = {}
    for t in vocabulary.types.values():
        words = {stem(w) for w in name_words(t.name) if len(w) > 2}
        words -= {stem(w) for w in _GENERIC_TYPE_WORDS}
        for s in t.synonyms:
            words |= {stem(w) for w in tokens(s)}
        type_words[t.name] = words
        for k in t.keys.values():
            kw = [stem(w) for w in name_words(k.name) if w not in _KEY_NOISE]
            for s in k.synonyms:
                kw += [stem(w) for w in tokens(s) if w not in _KEY_NOISE]
            key_words[(t.name, k.name)] = kw
            if k.type not in ("text", "text[]"):
                continue
            for value in k.values:
                words_of = tokens(value)
                # a value needs a letter (a code of letters and digits counts: ZP474)
                if len(value.strip()) < 2 or not any(c.isalpha() for w in words_of for c in w):
                    continue
                add(words_of, (t.name, k.name, value, "value"))
                if len(words_of) <= 6:
                    folded = " ".join(words_of)
                    names.setdefault(folded[:1], []).append((folded, t.name, k.name))
                    if len(words_of) > 1:
                        for w in set(words_of):
                            words_of_names.setdefault(w, []).append((folded, t.name, k.name))
            for value, synonyms in k.value_synonyms.items():
                for s in synonyms:
                    add(tokens(s), (t.name, k.name, value, "synonym"))
                add(tokens(value), (t.name, k.name, value, "value"))
    built = _Index(
        values,
        max((len(k) for k in values), default=0),
        type_words,
        key_words,
        names,
        words_of_names,
        set().union(*type_words.values())
        | {
            stem(name_words(k.name)[0])
            for t in vocabulary.types.values()
            for k in t.keys.values()
            if len(name_words(k.name)) == 2 and name_words(k.name)[1] == "id"
        },
    )
    _indexes[vocabulary] = built
    return built


# ---- the rule-based parser ----


@dataclass
class _Tok:
    word: str  # lower case
    start: int
    end: int


def parse_question(
    question: str, vocabulary: Vocabulary, *, today: dt.date | None = None
) -> ParsedQuery:
    """Filters, types and intent for ``question`` from ``vocabulary``, by rules; no I/O."""
    check_question(question)
    today = today or dt.date.today()
    text = question.replace("\u2019", "'").replace("\u2018", "'")
    index = _index(vocabulary)
    toks = [_Tok(fold(m.group(0)), m.start(), m.end()) for m in WORD_RE.finditer(text)]
    matched: list[Matched] = []
    notes: list[str] = []
    mentions: list[Mention] = []
    taken: list[tuple[int, int]] = []
    types = vocabulary.types

    def free(a: int, b: int) -> bool:
        return all(b <= x or a >= y for x, y in taken)

    def take(a: int, b: int) -> None:
        taken.append((a, b))

    def negated(start: int) -> bool:
        """A negator at most two words before ``start``, in the same clause ("not delivered",
        "has not yet been delivered"; not "(not guests) used Table Tennis")."""
        found = list(_NEGATOR_RE.finditer(text[max(0, start - 40) : start]))
        if not found:
            return False
        between = text[max(0, start - 40) : start][found[-1].end() :]
        return not re.search(r"[(),;:.!?]", between) and len(tokens(between)) <= 2

    # 1. a time phrase; a season is none ("the spring of 2024": its months depend on where one
    # is), and the year it names is not read alone unless a value holds the phrase (below)
    time_range = _time_range(text, today, lambda m: free(*m.span()))
    season = _SEASON_RE.search(text)
    if season is not None and time_range is not None:
        begins = text.find(time_range.phrase)
        if begins <= season.end() and begins + len(time_range.phrase) >= season.start():
            time_range = None
    if time_range is not None:
        pos = text.find(time_range.phrase)
        take(pos, pos + len(time_range.phrase))
        matched.append(Matched(time_range.phrase, _describe_range(time_range)))

    # 2. identifiers: "<entity> 42" for integer keys named <entity>_id
    for t in types.values():
        for k in t.keys.values():
            if k.type != "integer":
                continue
            entities = _id_entities(k)
            if not entities:
                continue
            spellings = entities + [s for s in k.synonyms if not _id_form(s)]
            for spelling in spellings:
                pattern = (
                    r"\b"
                    + r"[\s_]+".join(re.escape(w) for w in tokens(spelling))
                    + r"s?\s*(?:#|ids?\b|no\.?|number|nr\.?)?\s*[:#]?\s*(\d{1,18})\b"
                )
                for m in re.finditer(pattern, text, re.I):
                    if not free(*m.span()) and not any(x.phrase == m.group(0) for x in mentions):
                        continue
                    number = int(m.group(1))
                    same = [x for x in mentions if x.how == "id" and x.span == m.span()]
                    if same and same[0].condition == number:
                        mentions[mentions.index(same[0])] = replace(
                            same[0], keys=(*same[0].keys, (t.name, k.name))
                        )
                        continue
                    mentions.append(
                        Mention(m.group(0), ((t.name, k.name),), number, "id", m.span())
                    )
                    take(*m.span())

    # 3. values of text keys, longest phrase first
    boolean_words = {
        x.word
        for x in toks
        if any(
            same_word(x.word, w) or same_word(_unprefixed(x.word), w)
            for t in types.values()
            for k in t.keys.values()
            if k.type == "boolean"
            for w in index.key_words[(t.name, k.name)]
        )
    }
    for n in range(min(index.max_len, len(toks)), 0, -1):
        for i in range(len(toks) - n + 1):
            span = (toks[i].start, toks[i + n - 1].end)
            if not free(*span):
                continue
            words = tuple(t.word for t in toks[i : i + n])
            entries = index.values.get(words) or index.values.get(
                (*words[:-1], singular(words[-1]))
            )
            if not entries:
                continue
            phrase = text[span[0] : span[1]]
            if n == 1 and words[0] in boolean_words:
                continue  # a boolean key's word ("guests": is_guest) before a one-word value
            if n == 1 and words[0] in _COMMON:
                following = toks[i + 1].word if i + 1 < len(toks) else ""
                entries = [
                    e
                    for e in entries
                    if stem(following) in index.type_words.get(e[0], set())
                    or (phrase == e[2] and phrase != phrase.lower() and i > 0)
                ]
                if not entries:
                    continue
            value_keys = tuple(dict.fromkeys((e[0], e[1]) for e in entries))
            values = list(dict.fromkeys(e[2] for e in entries))
            # one phrase, one value (a phrase holding several values of one key keeps them all)
            value: Any = values[0] if len(values) == 1 else {"$in": values}
            how = "synonym" if all(e[3] == "synonym" for e in entries) else "value"
            if negated(span[0]):
                value = {"$ne": values[0]} if len(values) == 1 else {"$nin": values}
            mentions.append(Mention(phrase, value_keys, value, how, span))
            take(*span)

    # 4. names the store does not hold: a close spelling, or unknown
    unknown: list[str] = []
    for tried, (phrase, span) in enumerate(_name_phrases(text)):
        if not free(*span):
            continue
        close = _closest_names(phrase, index) if tried < MAX_FUZZY else []
        if not close:
            close = _names_holding(phrase, index)
        if close:
            keys = tuple(dict.fromkeys((t, k) for _, t, k in close))
            found = list(dict.fromkeys(v for v, _, _ in close))
            # the declared spelling of the value (the index holds it lower-cased)
            spelled = [_original(vocabulary, keys, v) for v in found]
            value = spelled[0] if len(spelled) == 1 else {"$in": spelled}
            mentions.append(Mention(phrase, keys, value, "fuzzy", span))
            notes.append(f"{phrase!r} read as {' or '.join(map(repr, spelled))}")
            take(*span)
        elif phrase not in unknown:
            unknown.append(phrase)

    # 5. booleans: the words of a boolean key, but those naming an entity (index.entity_words)
    # when it has others: "accepting new patients" is not patient_insured, which the answer
    # then linked back to every department with an insured patient
    first = toks[0].word if toks else ""
    for t in types.values():
        for k in t.keys.values():
            if k.type != "boolean":
                continue
            kwords = index.key_words[(t.name, k.name)]
            kwords = [w for w in kwords if w not in index.entity_words] or kwords
            if not kwords:
                continue
            hits = [
                x
                for x in toks
                if free(x.start, x.end)
                and any(same_word(x.word, w) or same_word(_unprefixed(x.word), w) for w in kwords)
                and not (x is toks[0] and first in ("return", "show", "list"))
            ]
            if not hits:
                continue
            # a verb with its object is not the flag: "who recommended Burton Tracy", "orders
            # shipped to France" (at most one small word between the verb and a value)
            hits = [x for x in hits if not any(_object_of(text, x.end, m) for m in mentions)]
            if not hits:
                continue
            at = hits[0]
            # "not returned", "no returns", "unshipped", "non-refundable": false
            # (the word itself a key's word is no negation: "insured" for is_insured)
            flag = not negated(at.start) and any(same_word(at.word, w) for w in kwords)
            same = [x for x in mentions if x.how == "boolean" and x.span == (at.start, at.end)]
            if same and same[0].condition == flag:
                mentions[mentions.index(same[0])] = replace(
                    same[0], keys=(*same[0].keys, (t.name, k.name))
                )
                continue
            mentions.append(
                Mention(
                    text[at.start : at.end],
                    ((t.name, k.name),),
                    flag,
                    "boolean",
                    (at.start, at.end),
                )
            )

    # 6. comparisons of numbers
    for m, op, low, high in _comparisons(text):
        if not free(*m.span()):
            continue
        keys = _numeric_keys_near(
            vocabulary, index, toks, m.span(), m.group("unit"), bool(m.group("cur"))
        )
        if not keys:
            notes.append(
                f"{m.group(0).strip()!r}: no numeric key of the store matches it, {NOT_FILTERED}"
            )
            continue
        scale = _unit_scale(m.group("unit"), {k for _, k in keys})
        if scale is None:  # keys in units that differ: each would need its own number
            notes.append(f"{m.group(0).strip()!r}: its keys hold other units, {NOT_FILTERED}")
            continue
        if scale != 1.0:
            low, high = _scaled(low, scale), None if high is None else _scaled(high, scale)
        condition = {"$gte": low, "$lte": high} if op == "between" else {op: low}
        mentions.append(Mention(m.group(0).strip(), keys, condition, "comparison", m.span()))
        take(*m.span())

    if season is not None and not any(
        m.span[0] < season.end() and m.span[1] > season.start() for m in mentions
    ):
        notes.append(f"{season.group(0)!r}: a season is not read as dates, {NOT_FILTERED}")

    # 7. numbers asked for, and ranking
    rank = _rank(vocabulary, index, text, toks)
    plain = text  # the words of a ranking ("by total spent", "the highest total spent") ask
    if rank is not None:  # for an order, not a sum
        for phrase_match in (_BY_RE.search(text), _RANK_RE.search(text)):
            if phrase_match is not None:
                stop = (
                    phrase_match.end()
                    if phrase_match.re is _BY_RE
                    else _words_after(text, phrase_match.end(), 3)
                )
                plain = (
                    plain[: phrase_match.start()]
                    + " " * (stop - phrase_match.start())
                    + plain[stop:]
                )
    aggregate = next((name for name, rx in _AGGREGATE_RULES if rx.search(plain)), None)

    # 8. the type the question is about
    doc_types = _choose_types(
        vocabulary, index, toks, mentions, rank, text, taken, time_range is not None
    )
    if rank is not None and not any(rank.key in types[d].keys for d in doc_types):
        held = [k for k in rank.candidates if any(k in types[d].keys for d in doc_types)]
        if held:
            rank = replace(rank, key=held[0])
    if rank is not None and not any(rank.key in types[d].keys for d in doc_types):
        notes.append(
            f"{rank.phrase!r}: {'/'.join(doc_types)} has no key {rank.key}, ranked by similarity"
        )
        rank = None
    if rank is None and _RANK_RE.search(text) and not re.search(r"\bhow\s+many\b", text, re.I):
        # "who is the most frequent member on Table Tennis": no key to rank by; the document
        # of the thing named (the facility, whose text says who books it most) may hold it
        doc_types = tuple(sorted({*doc_types, *_identified_types(vocabulary, mentions)}))
    if len(doc_types) > 1 and time_range is not None:
        # a time phrase settles a tie: the types with a date key the question names ("joined
        # in 2012": join_date), else the finer-grained (child) types, which hold the events
        named = tuple(
            d for d in doc_types if _date_keys(vocabulary, index, toks, [d], named_only=True)
        )
        children = tuple(d for d in doc_types if vocabulary.types[d].parent_type is not None)
        doc_types = named or children or doc_types
    if time_range is not None:
        # "how much did Regular customers spend in 2023": the time is the events' (the child
        # type's dates), unless the question names a date of the type itself ("joined in 2012")
        moved: list[str] = []
        for d in doc_types:
            dated_children = [
                t.name
                for t in types.values()
                if t.parent_type == d and any(k.type == "date" for k in t.keys.values())
            ]
            if dated_children and not _date_keys(vocabulary, index, toks, [d], named_only=True):
                moved += dated_children
            else:
                moved.append(d)
        doc_types = tuple(sorted(dict.fromkeys(moved)))

    # 9. the filter, for the keys of the chosen types
    flt: dict[str, Any] = {}
    ors: list[dict[str, Any]] = []
    links: list[Link] = []
    schema = {k: v for t in doc_types for k, v in vocabulary.schemas()[t].items()}
    for mention in mentions:
        names = list(
            dict.fromkeys(
                k for t in doc_types for k in _preferred_keys(vocabulary, index, toks, mention, t)
            )
        )
        if not names:
            link = _link(vocabulary, mention, doc_types)
            if link is not None:
                links.append(link)
                matched.append(
                    Matched(
                        mention.phrase,
                        f"{link.key} of the {link.via_type} whose {link.via_key} "
                        f"{_show(link.condition)}",
                    )
                )
                continue
            owners = sorted({t for t, _ in mention.keys})
            notes.append(
                f"{mention.phrase!r} is about {', '.join(owners)}, not "
                f"{'/'.join(doc_types)}: {NOT_FILTERED}"
            )
            continue
        conditions = {
            k: c for k in names if (c := _for_key(schema[k], mention.condition)) is not None
        }
        negated_lists = [
            {"$not": {k: {"$contains": mention.condition["$ne"]}}}
            for k in names
            if k not in conditions
            and schema[k].endswith("[]")
            and isinstance(mention.condition, Mapping)
            and set(mention.condition) == {"$ne"}
            and _fits(schema[k], mention.condition)
        ]
        if negated_lists:  # "orders not in Books": none of its categories is Books
            matched.append(Matched(mention.phrase, json.dumps(negated_lists[0])))
            ors.append(negated_lists[0] if len(negated_lists) == 1 else {"$and": negated_lists})
        if not conditions:
            if not negated_lists:
                notes.append(
                    f"{mention.phrase!r} does not fit {', '.join(names)} "
                    f"({', '.join(schema[k] for k in names)}), {NOT_FILTERED}"
                )
            continue
        matched.append(
            Matched(mention.phrase, " or ".join(f"{k} {_show(c)}" for k, c in conditions.items()))
        )
        if len(conditions) == 1:
            ((key, condition),) = conditions.items()
            _merge(flt, ors, key, condition)
        else:
            ors.append({"$or": [{k: c} for k, c in conditions.items()]})
    if time_range is not None:
        date_keys = _date_keys(vocabulary, index, toks, doc_types)
        dates = [k.name for d in doc_types for k in vocabulary.types[d].keys.values()
                 if k.type == "date"]  # fmt: skip
        if date_keys:
            condition = time_range.as_filter()
            if len(date_keys) == 1:
                _merge(flt, ors, date_keys[0], condition)
            else:
                ors.append({"$or": [{k: condition} for k in date_keys]})
            if len(dates) > 1 and not _date_keys(
                vocabulary, index, toks, doc_types, named_only=True
            ):
                notes.append(
                    f"{time_range.phrase!r} read on {' or '.join(date_keys)}, of the date keys "
                    f"{', '.join(dates)} (name the one meant)"
                )
        elif dates:
            notes.append(
                f"{time_range.phrase!r}: {'/'.join(doc_types)} has several date keys "
                f"({', '.join(dates)}) and the question names none, {NOT_FILTERED}"
            )
        else:
            notes.append(
                f"{time_range.phrase!r}: {'/'.join(doc_types)} has no date key, {NOT_FILTERED}"
            )
    if len(ors) == 1:
        flt.update(ors[0])
    elif ors:
        flt["$and"] = ors

    if rank is not None:  # (a key no chosen type has was dropped when the types were chosen)
        order = "descending" if rank.descending else "ascending"
        matched.append(Matched(rank.phrase, f"ranked by {rank.key} {order}"))
    needs_stats = aggregate is not None and (rank is None or aggregate not in ("max", "min"))
    if needs_stats:
        matched.append(Matched(aggregate or "", "needs exact numbers"))
    if rank is not None:
        intent = "rank"
    elif needs_stats:
        intent = "stats"
    elif any(m.how in ("id", "value", "fuzzy") for m in mentions):
        intent = "lookup"
    else:
        intent = "search"
    return ParsedQuery(
        search_text=question,
        filter=flt,
        doc_types=doc_types,
        needs_stats=needs_stats,
        intent=intent,
        aggregate=aggregate,
        rank_by=rank,
        time_range=time_range,
        mentions=tuple(mentions),
        unknown_names=tuple(unknown),
        links=tuple(links),
        matched=tuple(matched),
        notes=tuple(notes),
    )


def _show(condition: Any) -> str:
    if isinstance(condition, Mapping):
        return json.dumps(condition, default=str)
    return "= " + json.dumps(condition, default=str)


def _merge(flt: dict[str, Any], ors: list[dict[str, Any]], key: str, condition: Any) -> None:
    """Add ``key: condition``. Two values of one key ("gold and silver members", "books and
    toys") are either of them ($in); other conditions on one key all apply."""

    def values(c: Any) -> list[Any] | None:
        if not isinstance(c, Mapping):
            return [c]
        if set(c) == {"$contains"}:
            return [c["$contains"]]
        if set(c) == {"$in"}:
            return list(c["$in"])
        return None

    if key not in flt:
        flt[key] = condition
        return
    old, new = values(flt[key]), values(condition)
    if old is not None and new is not None:
        flt[key] = {"$in": list(dict.fromkeys(old + new))}
    elif (
        isinstance(flt[key], Mapping)
        and isinstance(condition, Mapping)
        and not (set(flt[key]) & set(condition))
    ):
        flt[key] = {**flt[key], **condition}
    else:
        ors.append({"$and": [{key: flt.pop(key)}, {key: condition}]})


_LINKING = {"to", "from", "in", "into", "on", "at", "for", "with", "via", "by", "of", "the", "a"}


def _words_after(text: str, start: int, n: int) -> int:
    """The position after the ``n`` words that follow ``start``."""
    ends = [m.end() for m in WORD_RE.finditer(text, start)][:n]
    return ends[-1] if ends else start


def _object_of(text: str, end: int, mention: Mention) -> bool:
    """Whether ``mention`` follows position ``end`` with at most one small word between."""
    if mention.span[0] < end:
        return False
    between = tokens(text[end : mention.span[0]])
    return len(between) == 0 or (len(between) == 1 and between[0] in _LINKING)


def _unprefixed(word: str) -> str:
    """A word without a negating prefix (unshipped -> shipped, nonrefundable -> refundable,
    inactive -> active), or the word of a yes/no it is the opposite of (failed -> passed)."""
    if word in _OPPOSITE_STATES:
        return _OPPOSITE_STATES[word]
    for prefix in ("non", "un", "in"):
        if word.startswith(prefix) and len(word) - len(prefix) >= 4:
            return word[len(prefix) :]
    return word


def _for_key(type_name: str, condition: Any) -> Any:
    """``condition`` as the filter language writes it for a key of ``type_name`` (an array key
    contains a value), or None when it cannot apply there."""
    if type_name == "integer" and isinstance(condition, Mapping):
        condition = {op: _integer_bound(op, v) for op, v in condition.items()}
    if not _fits(type_name, condition):
        return None
    if not type_name.endswith("[]"):
        return condition
    if not isinstance(condition, Mapping):
        return {"$contains": condition}
    return condition if set(condition) == {"$in"} else None


def _integer_bound(op: str, v: Any) -> Any:
    """A bound with a fraction as an integer key compares it (more than 1609.3 km: more than
    1609), the same rows."""
    if not isinstance(v, float) or v.is_integer() or not math.isfinite(v):
        return v
    return math.floor(v) if op in ("$gt", "$lte") else math.ceil(v) if op in ("$gte", "$lt") else v


def _fits(type_name: str, value: Any) -> bool:
    """Whether every value in a condition (a value, or an operator object) fits the key's type."""
    if type_name.endswith("[]"):
        type_name = type_name[:-2]
    operands = value.values() if isinstance(value, Mapping) else [value]
    return all(
        value_fits(type_name, v)
        for operand in operands
        for v in (operand if isinstance(operand, list) else [operand])
    )


def _original(vocabulary: Vocabulary, keys: Sequence[tuple[str, str]], lower: str) -> str:
    for t, k in keys:
        for value in vocabulary.types[t].keys[k].values:
            if " ".join(tokens(value)) == lower:
                return value
    return lower


def _name_phrases(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Quoted phrases, runs of two or more capitalised words (leading question words off), and
    a capitalised word of three letters or more past the question's first word ("appointments
    in Atlantis": taken alone, a one-word name nothing holds answered about everything)."""
    out: list[tuple[str, tuple[int, int]]] = []
    for m in _QUOTED_RE.finditer(text):
        out.append((m.group(1), m.span(1)))
    for m in _NAME_RE.finditer(text):
        words = m.group(1).split()
        start = m.start(1)
        while words and (words[0].rstrip("'s") in _NOT_NAMES or words[0] in _NOT_NAMES):
            start = text.index(words[0], start) + len(words[0])
            words = words[1:]
        while words and words[-1] in _NOT_NAMES:
            words = words[:-1]
        while words and words[-1].lower() in ("of", "and", "&", "de", "van", "von", "la", "le"):
            words = words[:-1]
        if len(words) < 2 and not (words and start > 0 and len(words[0].strip(".,;:?!'")) >= 3):
            continue
        phrase = " ".join(words).rstrip(".,;:?!")
        if phrase.endswith("'s"):
            phrase = phrase[:-2]
        at = text.index(words[0], start)
        out.append((phrase, (at, at + len(phrase))))
    return out


def _names_holding(phrase: str, index: _Index) -> list[tuple[str, str, str]]:
    """The names of several words holding a one-word phrase as one of them ("Smith": "Alice
    Smith" and "James Smith"), when at most MAX_NAMES_HOLDING do: a surname asked alone was
    dropped, and the answer counted everyone."""
    wanted = tokens(phrase)
    if len(wanted) != 1 or len(wanted[0]) < 3:
        return []
    found = index.name_words.get(wanted[0], [])
    # a word of a name before a word of a title: the keys whose values holding it are the
    # shortest ("Ruth": the author Ruth Calloway, not the title "Baking with Grandma Ruth",
    # which then filtered the author's name as a title)
    shortest: dict[tuple[str, str], int] = {}
    for v, t, k in found:
        shortest[(t, k)] = min(shortest.get((t, k), 99), len(v.split()))
    if shortest:
        best = min(shortest.values())
        found = [(v, t, k) for v, t, k in found if shortest[(t, k)] == best]
    return found if 0 < len({v for v, _, _ in found}) <= MAX_NAMES_HOLDING else []


def _closest_names(phrase: str, index: _Index) -> list[tuple[str, str, str]]:
    """Values spelled like ``phrase`` (ratio >= 0.8 on lower-case words), the best ones."""
    wanted = " ".join(tokens(phrase))
    if not wanted:
        return []
    n = len(wanted.split())
    best: list[tuple[str, str, str]] = []
    best_ratio = 0.8
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)
    for value, t, k in index.names.get(wanted[:1], ()):
        if abs(len(value.split()) - n) > 1:
            continue
        matcher.set_seq1(value)
        if matcher.real_quick_ratio() < best_ratio or matcher.quick_ratio() < best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio + 1e-9:
            best, best_ratio = [(value, t, k)], ratio
        elif abs(ratio - best_ratio) <= 1e-9:
            best.append((value, t, k))
    return best


def _number(word: str) -> float | int:
    w = word.replace(",", "").lower()
    if w in _NUMBER_WORDS:
        return _NUMBER_WORDS[w]
    return float(w) if "." in w else int(w)


def _comparisons(text: str) -> list[tuple[re.Match[str], str, Any, Any]]:
    out: list[tuple[re.Match[str], str, Any, Any]] = []
    for m in _BETWEEN_RE.finditer(text):
        out.append((m, "between", _number(m.group(2)), _number(m.group(3))))
    for m in _COMPARE_RE.finditer(text):
        op = _OPS[" ".join(m.group("op").lower().split())]
        out.append((m, op, _number(m.group(3)), None))
    for m in _OR_MORE_RE.finditer(text):
        direction = (m.group("dir") or "more").lower()
        op = "$gte" if direction in ("more", "over") else "$lte"
        if m.group(0).strip().endswith("+") or m.group("dir"):
            out.append((m, op, _number(m.group(2)), None))
    return out


def _numeric_keys_near(
    vocabulary: Vocabulary,
    index: _Index,
    toks: Sequence[_Tok],
    span: tuple[int, int],
    unit: str | None,
    money: bool,
) -> tuple[tuple[str, str], ...]:
    """Per type, the numeric key a comparison at ``span`` is about: by the unit after the
    number, then the words before it, then anywhere; money words for a currency sign; the type's
    only numeric key when nothing names one."""
    before = [t.word for t in toks if t.end <= span[0]][-4:]
    elsewhere = [t.word for t in toks if t.end <= span[0] or t.start >= span[1]]
    money_words = {stem(x) for x in _MONEY_WORDS}
    measured = _unit(unit)
    chosen: list[tuple[str, str]] = []
    for t in vocabulary.types.values():
        scored: dict[str, float] = {}
        numeric = _measures(t)
        for k in numeric:
            words = index.key_words[(t.name, k.name)]
            score = 0.0
            if unit and any(same_word(unit, w) for w in words):
                score += 3
            elif measured and (ku := _key_unit(k.name)) is not None and ku[0] == measured[0]:
                score += 2.5  # hours asked, a key of minutes
            elif measured:
                continue  # a unit of measure is asked: only a key in that measure will do
            score += 2 * sum(any(same_word(b, w) for w in words) for b in before)
            score += 0.5 * sum(any(same_word(b, w) for w in words) for b in elsewhere)
            if money and any(w in money_words for w in words):
                score += 1.5
            if score > 0:
                scored[k.name] = score
        if scored:
            chosen.append((t.name, max(sorted(scored), key=lambda k: scored[k])))
        elif len(numeric) == 1 and (measured is None or _key_unit(numeric[0].name) == measured):
            chosen.append((t.name, numeric[0].name))  # (not a fee for "3 hours")
    return tuple(chosen)


def _key_unit(key: str) -> tuple[str, float] | None:
    """The unit a key's name ends in (delay_minutes, weight_kg, distance_km), if any."""
    return _unit(name_words(key)[-1]) if name_words(key) else None


def _unit_scale(unit: str | None, keys: set[str]) -> float | None:
    """What a number in ``unit`` is multiplied by to compare with the keys (hours against a key
    of minutes: 60); 1 without units; None when the keys hold the dimension in different
    units."""
    asked = _unit(unit)
    if asked is None:
        return 1.0
    scales = {asked[1] / ku[1] if (ku := _key_unit(k)) and ku[0] == asked[0] else 1.0
              for k in keys}  # fmt: skip
    return scales.pop() if len(scales) == 1 else None


def _scaled(x: Any, scale: float) -> Any:
    if scale == 1.0:
        return x
    y = x * scale
    return int(y) if float(y).is_integer() else round(y, 6)


def _id_form(spelling: str) -> str | None:
    """The entity an identifier's name names: customer_id -> customer, memid -> mem; else None."""
    words = name_words(spelling)
    if len(words) > 1 and words[-1] in _ID_TAILS:
        return " ".join(words[:-1])
    if len(words) == 1 and words[0].endswith("id") and len(words[0]) > 3:
        return words[0][:-2]
    return None


def _id_entities(key: KeyWords) -> list[str]:
    """The entities an identifier key names, by its name or its synonyms ("customer id")."""
    found = (_id_form(s) for s in (key.name, *key.synonyms))
    return list(dict.fromkeys(e for e in found if e))


def _is_id(key: KeyWords) -> bool:
    return key.type in ("integer", "text") and bool(_id_entities(key))


def _rank(vocabulary: Vocabulary, index: _Index, text: str, toks: Sequence[_Tok]) -> RankBy | None:
    """ "top 5 ... by revenue", "the most returns", "spent the most": a numeric key to order by."""
    top = _TOP_RE.search(text)
    limit = _count(top.group(2)) if top else None
    m = next(
        (
            x
            for x in _RANK_RE.finditer(text)
            if not re.search(r"\b(?:how|at)\s+$", text[: x.start()], re.I)
        ),
        None,
    )
    by = _BY_RE.search(text)
    if m is None and top is None:
        return _superlative(vocabulary, index, toks)
    descending = not (
        (m is not None and m.group(1).lower() in _ASCENDING)
        or (top is not None and top.group(1).lower() == "bottom")
    )
    weights: dict[int, float] = {}
    if by is not None:
        for tok in toks:
            if by.start(1) <= tok.start < by.end(1):
                weights[tok.start] = 3.0
    if m is not None:
        for tok in [x for x in toks if x.start >= m.end()][:3]:
            weights.setdefault(tok.start, 2.0)
        for tok in [x for x in toks if x.end <= m.start()][-3:]:
            weights.setdefault(tok.start, 1.0)
    # a word naming an entity counts half: the thing ranked more than the measure ("the most
    # experienced doctor": years_experience, described "experienced", not a doctor_count)
    for tok in toks:
        if tok.start in weights and stem(tok.word) in index.entity_words:
            weights[tok.start] /= 2
    scored: dict[str, float] = {}
    for t in vocabulary.types.values():
        for k in _measures(t):
            words = index.key_words[(t.name, k.name)]
            score = sum(
                w
                for tok in toks
                if (w := weights.get(tok.start, 0.0))
                and any(same_word(m, x) for m in _measure_words(tok.word) for x in words)
            )
            if score > 0:
                scored[k.name] = max(scored.get(k.name, 0.0), score)
    if not scored:
        return None
    candidates = tuple(sorted(scored, key=lambda k: (-scored[k], k)))
    phrase = " ".join(x.group(0) for x in (top, m, by) if x is not None)
    return RankBy(candidates[0], descending, limit, phrase, candidates)


def _measures(t: TypeWords) -> list[KeyWords]:
    """A type's numeric keys that are measures, not ids: what a question ranks or compares by."""
    return [k for k in t.keys.values() if k.type in ("integer", "numeric") and not _is_id(k)]


def _superlative(vocabulary: Vocabulary, index: _Index, toks: Sequence[_Tok]) -> RankBy | None:
    """ "the 3 longest books": a word in -est whose base (long, big, heavy, large) is a word of a
    numeric key (its name or a described synonym: pages described "long"), or the measure of a
    word of one (cheap: price), or whose next word names one ("the longest delay"), ranks by
    that key: largest first, smallest for a word of less (cheapest, shortest, lightest). Only
    such words: "the latest", "the best" name no key unless declared so."""
    for i, tok in enumerate(toks):
        w = tok.word.lower()
        if len(w) < 6 or not w.endswith("est") or w in _TIME_SUPERLATIVES:
            continue
        base = w[:-3]
        bases = {base, base + "e", base[:-1] if len(base) > 2 and base[-1] == base[-2] else base}
        if base.endswith("i"):
            bases.add(base[:-1] + "y")
        named = set().union(*(_measure_words(b) for b in bases))
        after = toks[i + 1].word.lower() if i + 1 < len(toks) else ""
        scored: dict[str, int] = {}
        for t in vocabulary.types.values():
            for k in _measures(t):
                words = index.key_words[(t.name, k.name)]
                score = int(any(same_word(b, x) or b == x for b in named for x in words))
                if (
                    after
                    and bases & _MEASURE_ADJECTIVES
                    and any(same_word(after, x) for x in words)
                ):
                    score += 2  # "the longest delay": delay_minutes, whatever long names
                if score:
                    scored[k.name] = scored.get(k.name, 0) + score
        if not scored:
            continue
        candidates = tuple(sorted(scored, key=lambda k: (-scored[k], k)))
        before = toks[i - 1].word.lower() if i > 0 else ""
        limit = _count(before) if before.isdigit() or before in _NUMBER_WORDS else None
        if before in ("a", "an"):
            limit = None
        return RankBy(candidates[0], not bases & _LESS, limit, tok.word, candidates)
    return None


def _choose_types(
    vocabulary: Vocabulary,
    index: _Index,
    toks: Sequence[_Tok],
    mentions: Sequence[Mention],
    rank: RankBy | None,
    text: str,
    taken: Sequence[tuple[int, int]],
    timed: bool,
) -> tuple[str, ...]:
    """The types the question is about, by points: named by the question (its name's words, its
    synonyms: 3 each); holding a value it names (2 per mention); having a key whose words it uses
    that not every type has (1 per word); the ranking key (1); a root type for "who" (1); a
    child type with dates for a time phrase (1). Ties: the named type when every other tied
    type's values link into it (a parent's or child's key through a shared identifier)."""
    if not vocabulary.types:
        return ()
    scores = {name: 0.0 for name in vocabulary.types}
    free_words = [t.word for t in toks if all(t.end <= a or t.start >= b for a, b in taken)]
    named_types: set[str] = set()
    for name in scores:
        words = index.type_words.get(name, set())
        named = {w for w in free_words if stem(w) in words}
        scores[name] += 3 * len(named)
        if named:
            named_types.add(name)
    for mention in mentions:
        for owner in {owner for owner, _ in mention.keys}:
            scores[owner] += 2
    for word in set(free_words):
        having = {
            name
            for name in scores
            for k in vocabulary.types[name].keys.values()
            if not _is_id(k) and any(same_word(word, w) for w in index.key_words[(name, k.name)])
        }
        if 0 < len(having) < len(scores):
            for name in having:
                scores[name] += 1
    if rank is not None:
        for t in vocabulary.types.values():
            if rank.key in t.keys:
                scores[t.name] += 1
    if _WHO_RE.search(text):
        for t in vocabulary.types.values():
            if t.parent_type is None:
                scores[t.name] += 1
    if timed:
        for t in vocabulary.types.values():
            if t.parent_type is not None and any(k.type == "date" for k in t.keys.values()):
                scores[t.name] += 1
    best = max(scores.values())
    if best <= 0:
        return tuple(sorted(vocabulary.types))
    tied = tuple(sorted(n for n, s in scores.items() if s == best))
    for name in sorted(named_types & set(tied)):
        others = [m for m in mentions if not any(o == name for o, _ in m.keys)]
        if all(_link(vocabulary, m, [name]) is not None for m in others):
            return (name,)
    return tied


def _link(vocabulary: Vocabulary, mention: Mention, doc_types: Sequence[str]) -> Link | None:
    """A mention of a key of the parent (or a child) of a chosen type, joined through an
    identifier key both types have (same name, same type)."""
    for d in doc_types:
        related = [vocabulary.types[d].parent_type] + [
            t.name for t in vocabulary.types.values() if t.parent_type == d
        ]
        for via_type, via_key in mention.keys:
            if via_type not in related or via_type is None:
                continue
            via, own = vocabulary.types[via_type].keys, vocabulary.types[d].keys
            shared = sorted(
                k for k in via if k in own and via[k].type == own[k].type and _is_id(via[k])
            )
            condition = _for_key(via[via_key].type, mention.condition)
            if shared and condition is not None:
                return Link(mention.phrase, via_type, via_key, condition, shared[0])
    return None


def _identified_types(vocabulary: Vocabulary, mentions: Sequence[Mention]) -> set[str]:
    """The types in which a mention's value names one document (a text key with about as many
    distinct values as documents: a name, a title)."""
    found: set[str] = set()
    for mention in mentions:
        for owner, key in mention.keys:
            t = vocabulary.types[owner]
            k = t.keys[key]
            if k.type == "text" and t.documents and k.distinct_values >= 0.9 * t.documents:
                found.add(owner)
    return found


def _preferred_keys(
    vocabulary: Vocabulary, index: _Index, toks: Sequence[_Tok], mention: Mention, doc_type: str
) -> list[str]:
    """Of the keys of ``doc_type`` that hold a mention's value, the ones it is about: the scalar
    key whose words are among the three before it ("recommended by X": recommended_by; a key
    named with "by" only after "by"), else the most identifying (most distinct values per
    document: a member's own name before the names they recommended)."""
    keys = [k for t, k in mention.keys if t == doc_type]
    if len(keys) <= 1:
        return keys
    t = vocabulary.types[doc_type]
    before = [x.word for x in toks if x.end <= mention.span[0]][-3:]
    # "from Lisbon", "to Paris", "departing Madrid": the key of that direction, by the nearest
    # direction word
    toward = next((_DIRECTIONS[w] for w in reversed(before) if w in _DIRECTIONS), None)
    if toward is not None:
        directed = [k for k in keys if any(w in toward for w in name_words(k))
                    or any(w in toward for s in t.keys[k].synonyms for w in tokens(s))]  # fmt: skip
        if directed:
            return directed
    passive = bool(before) and before[-1] == "by"
    # "recommended by X": the key named for that relation (recommended_by); "who recommended X"
    # (X the object): X's own document, which tells its relations both ways
    named = [
        k
        for k in keys
        if not t.keys[k].type.endswith("[]")
        and ("by" in name_words(k)) == passive
        and any(same_word(b, w) for b in before for w in index.key_words[(doc_type, k)])
    ]
    if named:
        return named

    def identifying(key: str) -> float:
        k = t.keys[key]
        return 0.0 if k.type.endswith("[]") else k.distinct_values / max(t.documents, 1)

    best = max(identifying(k) for k in keys)
    return [k for k in keys if identifying(k) == best] if best > 0 else keys


def _date_keys(
    vocabulary: Vocabulary,
    index: _Index,
    toks: Sequence[_Tok],
    doc_types: Sequence[str],
    *,
    named_only: bool = False,
) -> list[str]:
    """The date key a time phrase is about: the one whose words the question uses, else (unless
    ``named_only``) each type's only date key."""
    words = [t.word for t in toks]
    chosen: list[str] = []
    for name in doc_types:
        keys = [k for k in vocabulary.types[name].keys.values() if k.type == "date"]
        if not keys:
            continue
        scored = {
            k.name: sum(
                any(same_word(w, x) for x in index.key_words[(name, k.name)]) for w in words
            )
            for k in keys
        }
        top = max(scored.values())
        if top > 0:
            chosen += [k for k, s in scored.items() if s == top][:1]
        elif len(keys) == 1 and not named_only:
            chosen.append(keys[0].name)
        elif not named_only:
            # several, none named: the type's own date (order_date of an order type, month of
            # a member_month type), when exactly one is
            own = {stem(w) for w in name_words(name)}
            plain = {
                k.name: sum(stem(w) in own for w in name_words(k.name))
                + any(w in ("date", "month", "day") for w in name_words(k.name))
                for k in keys
            }
            best = max(plain.values())
            firsts = [k for k, v in plain.items() if v == best]
            if len(firsts) == 1 and best > 1:
                chosen.append(firsts[0])
                continue
            # else the date the event starts on (pickup_date before return_date), when one
            # key's words say so (the caller notes the choice)
            starts = [k.name for k in keys if set(name_words(k.name)) & _START_WORDS]
            if len(starts) == 1:
                chosen.append(starts[0])
    return list(dict.fromkeys(chosen))


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
    to = r"\s+(?:and|to|through|until|till|-)\s+"
    rules: list[tuple[str, Any]] = [
        # (ranges first: "between January 2025 and March 2025" kept January alone)
        (
            r"\b(?:between|from)\s+"
            + _MONTH
            + r"(?:,?\s+"
            + _YEAR
            + r")?"
            + to
            + _MONTH
            + r",?\s+"
            + _YEAR
            + r"\b",
            _month_to_month,
        ),
        (r"\b(?:between|from)\s+" + _YEAR + to + _YEAR + r"\b", _year_to_year),
        # single days: 2024-03-17, March 17(th)(,) 2024, 17(th) (of) March 2024
        (r"\b" + _YEAR + r"-(\d{1,2})-(\d{1,2})\b", _iso_day),
        (
            r"\b" + _MONTH + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+" + _YEAR + r"\b",
            _month_day_year,
        ),
        (
            r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r",?\s+" + _YEAR + r"\b",
            _day_month_year,
        ),
        # "since" and "from" hold the month or year they name; "after" starts past it
        (r"\b(since|after|from)\s+" + _MONTH + r"(?:,?\s+" + _YEAR + r")?\b", _since_month),
        (r"\b(since|after|from)\s+" + _YEAR + r"\b", _since_year),
        (r"\b" + _YEAR + r"\s+(?:(?:or|and)\s+(?:later|after|since)|onwards?)\b", _year_on),
        (r"\b" + _YEAR + r"\s+(?:or|and)\s+(?:earlier|before)\b", _year_until),
        (r"\bbefore\s+" + _MONTH + r"(?:,?\s+" + _YEAR + r")?\b", _before_month),
        (r"\bbefore\s+" + _YEAR + r"\b", _before_year),
        (r"\b" + _MONTH + r",?\s+(?:of\s+)?" + _YEAR + r"\b", _month_year),
        (r"\bq([1-4])\s+" + _YEAR + r"\b", _quarter),
        (r"\b(?:last|previous)\s+" + _MONTH + r"\b", _last_named_month),
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
            try:
                start, end = build(m, today)
            except (ValueError, OverflowError):  # "the last 3000 years": before year 1
                continue
            return TimeRange(start, end, m.group(0))
    return None


Span = tuple[dt.date | None, dt.date | None]


def _month_to_month(m: re.Match[str], _today: dt.date) -> Span:
    first, last = MONTHS[m.group(1).lower()], MONTHS[m.group(3).lower()]
    end_year = int(m.group(4))
    # "from November to February 2025": November of the year before
    start_year = int(m.group(2)) if m.group(2) else end_year - (first > last)
    start, end = dt.date(start_year, first, 1), _month_range(end_year, last)[1]
    if start > end:
        raise ValueError("a range that ends before it starts")
    return start, end


def _year_to_year(m: re.Match[str], _today: dt.date) -> Span:
    first, last = int(m.group(1)), int(m.group(2))
    if first > last:
        raise ValueError("a range that ends before it starts")
    return dt.date(first, 1, 1), dt.date(last, 12, 31)


def _iso_day(m: re.Match[str], _today: dt.date) -> Span:
    day = dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return day, day


def _month_day_year(m: re.Match[str], _today: dt.date) -> Span:
    day = dt.date(int(m.group(3)), MONTHS[m.group(1).lower()], int(m.group(2)))
    return day, day


def _day_month_year(m: re.Match[str], _today: dt.date) -> Span:
    day = dt.date(int(m.group(3)), MONTHS[m.group(2).lower()], int(m.group(1)))
    return day, day


def _since_month(m: re.Match[str], today: dt.date) -> Span:
    month = MONTHS[m.group(2).lower()]
    year = int(m.group(3)) if m.group(3) else _latest_year_for(month, today)
    if m.group(1).lower() == "after":  # after March: from April 1
        return _month_range(year, month)[1] + dt.timedelta(days=1), today
    return dt.date(year, month, 1), today


def _since_year(m: re.Match[str], today: dt.date) -> Span:
    year = int(m.group(2)) + (m.group(1).lower() == "after")  # after 2024: from 2025
    return dt.date(year, 1, 1), today


def _year_on(m: re.Match[str], today: dt.date) -> Span:
    return dt.date(int(m.group(1)), 1, 1), today


def _year_until(m: re.Match[str], _today: dt.date) -> Span:
    return None, dt.date(int(m.group(1)), 12, 31)


def _last_named_month(m: re.Match[str], today: dt.date) -> Span:
    """ "last March": the latest March that has ended (in March 2026, March 2025)."""
    month = MONTHS[m.group(1).lower()]
    return _month_range(today.year if month < today.month else today.year - 1, month)


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
You turn a question about a database into a search plan. Reply with one JSON object only:
{"filter": {...}, "doc_types": [...], "needs_stats": true|false, "intent": "..."}

The filter language (a JSON object; several keys in one object all apply):
- equality: {"key": "value"}; operators: {"key": {"$ne"|"$in"|"$nin": ...}}
- numbers and dates ('YYYY-MM-DD'): {"key": {"$gt"|"$gte"|"$lt"|"$lte": value}}
- arrays: {"key": {"$contains": "value"}}, any of: {"key": {"$in": [...]}}
- logic: {"$and": [..]}, {"$or": [..]}, {"$not": {..}}
Use only these document types, metadata keys (key: type) and, for text keys, values seen in the
data (a sample):
"""
_LLM_VALUES_PER_KEY = 20


@dataclass(frozen=True)
class LLMParser:
    """Proposes a ParsedQuery with an OpenAI-compatible chat model; validated before use."""

    base_url: str | None
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    # The filter language's check of a proposal (InvalidFilter if it does not hold), e.g.
    # ``lambda f, types: pgrag.filters.check_filter(conn, f, types)``; without it a proposal's
    # filter is checked by the search that uses it.
    check: Callable[[Mapping[str, Any], Sequence[str]], None] | None = field(
        default=None, repr=False, compare=False
    )

    def parse(
        self, question: str, vocabulary: Vocabulary, *, today: dt.date | None = None
    ) -> ParsedQuery:
        """The model's parse if it validates, else the rule-based parse with a note why."""
        today = today or dt.date.today()
        rules = parse_question(question, vocabulary, today=today)
        try:
            content = self._ask(question, vocabulary, today)
        except PgragError as exc:
            return replace(rules, notes=(*rules.notes, "LLM parser not used: " + str(exc)))
        try:
            return self._validate(content, rules, vocabulary)
        except (InvalidFilter, ValueError) as exc:
            note = "LLM parser's proposal rejected (" + str(exc) + "): used the rule-based parse"
            return replace(rules, notes=(*rules.notes, note))

    def messages(
        self, question: str, vocabulary: Vocabulary, today: dt.date
    ) -> list[dict[str, str]]:
        described: dict[str, Any] = {}
        for t in vocabulary.types.values():
            keys: dict[str, Any] = {}
            for k in t.keys.values():
                one: dict[str, Any] = {"type": k.type}
                if k.description:
                    one["description"] = k.description
                if k.synonyms:
                    one["synonyms"] = list(k.synonyms)
                if k.values:
                    one["values"] = list(k.values)[:_LLM_VALUES_PER_KEY]
                keys[k.name] = one
            described[t.name] = {"description": t.description, "keys": keys}
        system = (
            _LLM_SYSTEM
            + json.dumps(described, indent=1, sort_keys=True, default=str)
            + "\nToday is "
            + today.isoformat()
            + ".\nintent is one of: "
            + ", ".join(INTENTS)
            + ". needs_stats is true when the answer needs exact totals, counts or averages."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def _ask(self, question: str, vocabulary: Vocabulary, today: dt.date) -> str:
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
                messages=self.messages(question, vocabulary, today),
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

    def _validate(self, content: str, rules: ParsedQuery, vocabulary: Vocabulary) -> ParsedQuery:
        try:
            proposal = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ValueError("not JSON: " + exc.msg) from None
        if not isinstance(proposal, dict):
            raise ValueError("not a JSON object")
        raw_types = proposal.get("doc_types") or list(rules.doc_types)
        if not isinstance(raw_types, list) or not all(
            isinstance(d, str) and d in vocabulary.types for d in raw_types
        ):
            raise ValueError(
                "doc_types must be a list of "
                + ", ".join(sorted(vocabulary.types))
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
        return replace(
            rules,
            filter=flt,
            doc_types=doc_types,
            needs_stats=needs_stats,
            intent=str(intent),
            matched=(Matched(content[:200], "LLM proposal (validated)"),),
            notes=(),
            parser="llm",
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"
