"""What the question parser knows of a store: the declared types, their metadata keys with types,
the words described for them (``pgrag.describe_document``) and the values present in the chunks.

``load_vocabulary(conn)`` reads it in one statement (``pgrag.vocabulary()``, as the session sees
the chunks: row-level security keeps one tenant's values out of another's parse) and caches it
for ``VOCABULARY_TTL_S`` per database, role and tenant. ``Vocabulary.from_schemas`` builds one
without a database (tests, offline parsing). Nothing here names a type or key of any dataset.
"""

from __future__ import annotations

import functools
import re
import threading
import time
import unicodedata
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg

VOCABULARY_TTL_S = 300.0
MAX_VALUES_PER_KEY = 5000

_LOAD: LiteralString = "select pgrag.vocabulary(%s)"
# What row-level security on the chunks depends on: the roles, and the tenant the session is
# bound to (pgrag.current_tenant() follows the login role's binding, not only the setting).
_WHO: LiteralString = "select current_user, session_user, coalesce(pgrag.current_tenant(), '')"
MAX_CACHED = 64  # vocabularies kept (per database, role and tenant); the oldest goes first


@dataclass(frozen=True)
class KeyWords:
    """One metadata key: its declared type, its described words, the values present."""

    name: str
    type: str  # text, integer, numeric, boolean, date, text[], integer[]
    description: str = ""
    synonyms: tuple[str, ...] = ()
    values: Mapping[str, int] = field(default_factory=dict)  # value -> documents carrying it
    distinct_values: int = 0
    value_synonyms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    min: Any = None  # dates as ISO text, numbers as numbers (None when unknown)
    max: Any = None


@dataclass(frozen=True)
class TypeWords:
    """One declared document type as the parser sees it."""

    name: str
    keys: Mapping[str, KeyWords]
    parent_type: str | None = None
    description: str = ""
    synonyms: tuple[str, ...] = ()
    has_stats: bool = False
    documents: int = 0


@dataclass(frozen=True, eq=False)  # compared by identity: the parser caches its index per one
class Vocabulary:
    types: Mapping[str, TypeWords]

    def only(self, names: Sequence[str]) -> Vocabulary:
        """The same vocabulary restricted to the types ``names`` (unknown names ignored); the
        same object for the same names, so the parser's index of it is built once."""
        key = tuple(sorted(set(names)))
        with _cache_lock:
            cached = _subsets.get(self, {}).get(key)
            if cached is None:
                cached = Vocabulary({n: t for n, t in self.types.items() if n in key})
                _subsets.setdefault(self, {})[key] = cached
        return cached

    def schemas(self) -> dict[str, dict[str, str]]:
        """{type: {key: declared type}}, the filter language's view."""
        return {t.name: {k.name: k.type for k in t.keys.values()} for t in self.types.values()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Vocabulary:
        """From ``pgrag.vocabulary()``'s JSON."""
        types: dict[str, TypeWords] = {}
        for name, t in sorted(data.items()):
            keys: dict[str, KeyWords] = {}
            for key, k in sorted((t.get("keys") or {}).items()):
                keys[key] = KeyWords(
                    name=key,
                    type=str(k.get("type", "text")),
                    description=str(k.get("description") or ""),
                    synonyms=_strings(k.get("synonyms")),
                    values={str(v): int(n) for v, n in (k.get("values") or {}).items()},
                    distinct_values=int(k.get("distinct_values") or 0),
                    value_synonyms={
                        str(v): _strings(s) for v, s in (k.get("value_synonyms") or {}).items()
                    },
                    min=k.get("min"),
                    max=k.get("max"),
                )
            types[name] = TypeWords(
                name=name,
                keys=keys,
                parent_type=t.get("parent_type"),
                description=str(t.get("description") or ""),
                synonyms=_strings(t.get("synonyms")),
                has_stats=bool(t.get("has_stats")),
                documents=int(t.get("documents") or 0),
            )
        return cls(types)

    @classmethod
    def from_schemas(
        cls,
        schemas: Mapping[str, Mapping[str, str]],
        values: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
        *,
        parents: Mapping[str, str] | None = None,
        described: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Vocabulary:
        """A vocabulary without a database: ``schemas`` {type: {key: type}}, ``values`` {type:
        {key: [values]}}, ``parents`` {type: parent type}, ``described`` {type: what
        ``pgrag.describe_document`` takes: description, synonyms, keys}."""
        data: dict[str, Any] = {}
        for name, schema in schemas.items():
            words = (described or {}).get(name, {})
            keys: dict[str, Any] = {}
            for key, type_name in schema.items():
                present = list((values or {}).get(name, {}).get(key, ()))
                info: dict[str, Any] = {
                    "type": type_name,
                    "values": {v: 1 for v in present},
                    "distinct_values": len(set(present)),
                }
                kw = (words.get("keys") or {}).get(key, {})
                info.update(
                    description=kw.get("description"),
                    synonyms=kw.get("synonyms"),
                    value_synonyms=kw.get("values"),
                )
                keys[key] = info
            data[name] = {
                "parent_type": (parents or {}).get(name),
                "description": words.get("description"),
                "synonyms": words.get("synonyms"),
                "keys": keys,
            }
        return cls.from_json(data)


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value if isinstance(v, str) and v.strip())
    return ()


# ---- words ----

WORD_RE = re.compile(r"[^\W_]+")


def fold(word: str) -> str:
    """A word as questions and values are compared: case-folded, accents off (Århus -> arhus)."""
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def tokens(text: str) -> list[str]:
    """The words of a text (letters and digits of any script), folded."""
    return [fold(w) for w in WORD_RE.findall(text)]


def singular(word: str) -> str:
    """A plural's singular, roughly: orders -> order, categories -> category, boxes -> box."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "xes", "sses")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A crude stem for matching a key's words with a question's: returned, returns -> return."""
    w = singular(word.lower())
    for suffix in ("ations", "ation", "ings", "ing", "ed", "er", "ers"):
        if len(w) - len(suffix) >= 4 and w.endswith(suffix):
            w = w[: -len(suffix)]
            break
    if len(w) > 4 and w[-1] == w[-2] and w[-1] not in "aeiouls":
        w = w[:-1]  # shipp(ed) -> ship
    return w


@functools.lru_cache(maxsize=65536)
def same_word(a: str, b: str) -> bool:
    """Whether two words are forms of one: equal stems, or a shared start of 5+ letters
    (registered / registration)."""
    sa, sb = stem(a), stem(b)
    # (either may be a stem already, which the crude stem cuts again: neutered -> neuter -> neut)
    if sa in (sb, b) or a == sb:
        return True
    n = 0
    for x, y in zip(sa, sb, strict=False):
        if x != y:
            break
        n += 1
    return n >= 5


def name_words(name: str) -> list[str]:
    """The words of an identifier: last_order_date -> last, order, date; companyName -> company,
    name."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return tokens(spaced.replace("_", " "))


# ---- loading ----

_cache: dict[tuple[str, ...], tuple[float, Vocabulary]] = {}
_cache_lock = threading.Lock()
_subsets: weakref.WeakKeyDictionary[Vocabulary, dict[tuple[str, ...], Vocabulary]] = (
    weakref.WeakKeyDictionary()
)


def load_vocabulary(conn: psycopg.Connection[Any], *, fresh: bool = False) -> Vocabulary:
    """The store's vocabulary as this session sees it (cached per database, role and tenant for
    VOCABULARY_TTL_S; ``fresh`` reads it again)."""
    who = conn.execute(_WHO).fetchone()
    key = (str(conn.info.host), str(conn.info.port), str(conn.info.dbname), *map(str, who or ()))
    if not fresh:
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < VOCABULARY_TTL_S:
            return hit[1]
    row = conn.execute(_LOAD, (MAX_VALUES_PER_KEY,)).fetchone()
    vocabulary = Vocabulary.from_json(row[0] if row and row[0] else {})
    with _cache_lock:
        _cache[key] = (time.monotonic(), vocabulary)
        while len(_cache) > MAX_CACHED:
            del _cache[min(_cache, key=lambda k: _cache[k][0])]
    return vocabulary


def forget_vocabulary() -> None:
    """Drop every cached vocabulary (after declaring or describing types)."""
    with _cache_lock:
        _cache.clear()


__all__ = [
    "KeyWords",
    "TypeWords",
    "Vocabulary",
    "forget_vocabulary",
    "load_vocabulary",
    "name_words",
    "same_word",
    "singular",
    "stem",
    "fold",
    "tokens",
]
