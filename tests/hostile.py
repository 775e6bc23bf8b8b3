"""Hostile inputs for the fuzz tests (tests/test_hostile_input.py) and bench/fuzz.py.

Strategies for filters, questions, document declarations and CLI arguments, a fast
deterministic embedder, and the *guards*: a canary table and event triggers that count, outside
any transaction (sequences do not roll back), every write to the canary or the sample shop and
every DDL statement outside pgrag's own objects. A fuzz run passes when every input ended in a
result or a PgragError and the guards saw nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from hypothesis import strategies as st

from tests.shop_fixture import SHOP_SCHEMAS

DIM = 384


class HashEmbedder:
    """Deterministic unit vectors from a text's sha256: no model, microseconds per text."""

    name = "test:hash"
    dimension = DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([hash_vector(t) for t in texts]).astype(np.float32)


def hash_vector(text: str, dim: int = DIM) -> np.ndarray[Any, np.dtype[np.float32]]:
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


# ---- hostile text ----

INJECTIONS = [
    "a'); drop table public.canary; --",
    "'; delete from public.canary; --",
    '"; drop table public.canary; --',
    "x' or '1'='1",
    "1) as q(k); delete from public.canary; select k from (select 1",
    "select 1) as s; drop table public.canary; select * from (select 1",
    "$$; drop table public.canary; $$",
    "$body$; drop table public.canary; $body$",
    "$f$ $u$ $fn$",
    "%s %(x)s %I %L %%",
    "{}",
    "\\'; truncate shop.customers; --",
    "pgrag.chunks",
    "public.canary",
    "shop.customers",
    "select pg_sleep(30)",
    "'); select pg_terminate_backend(pg_backend_pid()); --",
    "$.a ? (@ > 1) || true",
    '@."x" == 1',
    "-- comment",
    "/* unterminated",
    "\x00",
    "\ud800",
    "ünïcödé ✓ 🙂 \u202e",
    "Robert'); DROP TABLE Students;--",
    "a" * 300,
]

hostile_text = st.one_of(
    st.sampled_from(INJECTIONS),
    st.text(max_size=40),
    st.builds(lambda a, b: a + b, st.sampled_from(INJECTIONS), st.text(max_size=10)),
)

# ---- filters ----

_KEYS = sorted({k for schema in SHOP_SCHEMAS.values() for k in schema}) + ["doc_type"]
_OPERATORS = ["$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$contains", "$not"]
_LOGICAL = ["$and", "$or", "$not"]

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["VIP", "Books", "2024-01-31", "2024-02-30", "delivered", "order_detail"]),
    hostile_text,
)
filter_key = st.one_of(st.sampled_from(_KEYS + _OPERATORS + _LOGICAL), hostile_text)


def _json_tree(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(filter_key, children, max_size=4),
        ),
        max_leaves=12,
    )


_TEXT_KEYS = ["name", "segment", "status", "customer_name", "doc_type"]
filters: st.SearchStrategy[Any] = st.one_of(
    # well-formed filters whose values are hostile: they compile, and run
    st.dictionaries(st.sampled_from(_TEXT_KEYS), hostile_text, min_size=1, max_size=3),
    st.dictionaries(
        st.sampled_from(_TEXT_KEYS),
        st.dictionaries(st.sampled_from(["$eq", "$ne"]), hostile_text, min_size=1, max_size=2)
        | st.fixed_dictionaries({"$in": st.lists(hostile_text, max_size=5)}),
        min_size=1,
        max_size=2,
    ),
    st.fixed_dictionaries({"categories": st.fixed_dictionaries({"$contains": hostile_text})}),
    # anything at all
    st.dictionaries(filter_key, _json_tree(json_scalar), max_size=4),
    _json_tree(json_scalar),  # not even an object
)
filter_json_text = st.one_of(
    filters.map(lambda f: json.dumps(f, ensure_ascii=False)),
    hostile_text,
    st.sampled_from(["{", '{"a": NaN}', '{"a": 1, "a": 2}', "[" * 5000, '{"a":' * 3000]),
)

# ---- questions ----

questions = st.one_of(
    hostile_text,
    st.sampled_from(
        [
            "VIP customers who returned Books in January 2024",
            "how many orders were not delivered yet?",
            "orders of John Smith since March 2024",
            "customer 1'; drop table public.canary; -- total spent",
            "-x " * 40,
            "What did customer 1 buy last 3 months?",
        ]
    ),
    st.builds(
        lambda a, b: f"{a} customers {b} in 2024", st.sampled_from(INJECTIONS), st.text(max_size=20)
    ),
)

# ---- document declarations ----

_GOOD_SOURCE = "select customer_id as source_key, name as text from shop.customers"
_GOOD_WATCH = {"shop.customers": "select customer_id from changed"}

declaration_names = st.one_of(
    st.sampled_from(["fz_ok", "fz_two", "Fz", "1fz", "fz-x", "fz x", "fz" + "x" * 60]),
    hostile_text,
)
sources = st.one_of(
    st.just(_GOOD_SOURCE),
    st.sampled_from(
        [
            _GOOD_SOURCE + "; drop table public.canary",
            "select 1 as source_key, 'x' as text) as s; drop table public.canary; "
            "select * from (select 1",
            "with d as (delete from public.canary returning 1) select 1 as source_key, 'x' as text",
            "public.canary",
            "shop.customers; drop table public.canary",
            "select 1 as source_key",
            "values (1, 'a')",
        ]
    ),
    st.builds(lambda t: _GOOD_SOURCE + " where name <> " + t, hostile_text),
    hostile_text,
)
watch_queries = st.one_of(
    st.just("select customer_id from changed"),
    st.sampled_from(
        [
            "select 1) as q(k); delete from public.canary; select k from (select 1",
            "select customer_id from changed where $body$ x $body$ <> ''",
            "select customer_id from changed where $body$; delete from public.canary; $body$ <> ''",
            "select customer_id from changed -- trailing comment",
            "delete from public.canary returning 1",
        ]
    ),
    hostile_text,
)
watches = st.one_of(
    st.just(_GOOD_WATCH),
    st.dictionaries(
        st.one_of(st.sampled_from(["shop.customers", "public.canary", "shop.nope"]), hostile_text),
        watch_queries,
        max_size=2,
    ),
)
metadata_schemas = st.one_of(
    st.none(),
    st.dictionaries(
        hostile_text,
        st.one_of(st.sampled_from(["text", "integer", "date[]"]), hostile_text),
        max_size=3,
    ),
)


@dataclass(frozen=True)
class Declaration:
    name: Any
    source: Any
    watches: Any
    parent: Any
    metadata_schema: Any


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# well-formed declarations carrying hostile text where text belongs: they declare
valid_declarations = st.builds(
    Declaration,
    name=st.sampled_from(["fz_ok", "fz_two"]),
    source=st.builds(lambda t: _GOOD_SOURCE + " where name <> " + _literal(t), hostile_text),
    watches=st.builds(
        lambda t: {
            "shop.customers": "select customer_id from changed where name <> " + _literal(t)
        },
        hostile_text,
    ),
    parent=st.none(),
    metadata_schema=st.dictionaries(hostile_text, st.sampled_from(["text", "integer"]), max_size=3),
)
declarations = valid_declarations | st.builds(
    Declaration,
    name=declaration_names,
    source=sources,
    watches=watches,
    parent=st.one_of(st.none(), st.sampled_from(["customer_profile", "nope"]), hostile_text),
    metadata_schema=metadata_schemas,
)

# ---- the guards ----

GUARDS_SQL = """
create table public.canary (id integer primary key, secret text not null);
insert into public.canary values (1, 'keep'), (2, 'me');
create sequence public.guard_writes;
create sequence public.guard_ddl;
create function public.guard_touch() returns trigger language plpgsql as $$
begin
    perform nextval('public.guard_writes');
    return null;
end $$;
create trigger guard_touch after insert or update or delete or truncate on public.canary
    for each statement execute function public.guard_touch();
create trigger guard_touch after insert or update or delete or truncate on shop.customers
    for each statement execute function public.guard_touch();
create trigger guard_touch after insert or update or delete or truncate on shop.orders
    for each statement execute function public.guard_touch();
create trigger guard_touch after insert or update or delete or truncate on shop.order_items
    for each statement execute function public.guard_touch();
create function public.guard_ddl() returns event_trigger language plpgsql as $$
declare
    r record;
begin
    -- pgrag's own objects: anything in schemas pgrag and pgrag_docs, its pgrag_* triggers on
    -- watched tables (and, when dropped, the rules of its views)
    for r in select * from pg_event_trigger_ddl_commands() loop
        if coalesce(r.schema_name, '') not in ('pgrag', 'pgrag_docs')
           and not (r.object_type = 'trigger' and r.object_identity like 'pgrag\\_%')
           -- the grants on the functions pgrag generates (an event trigger sees no name for them)
           and not (r.command_tag in ('GRANT', 'REVOKE') and r.object_type = 'FUNCTION') then
            perform nextval('public.guard_ddl');
        end if;
    end loop;
end $$;
create function public.guard_drop() returns event_trigger language plpgsql as $$
declare
    r record;
begin
    for r in select * from pg_event_trigger_dropped_objects() loop
        if coalesce(r.schema_name, '') not in ('pgrag', 'pgrag_docs')
           and not (r.object_type = 'trigger' and r.object_identity like 'pgrag\\_%')
           and not (r.object_type = 'rule' and r.object_identity like '% on pgrag.%')
           and not (r.object_type = 'rule' and r.object_identity like '% on pgrag_docs.%') then
            perform nextval('public.guard_ddl');
        end if;
    end loop;
end $$;
create event trigger guard_ddl on ddl_command_end execute function public.guard_ddl();
create event trigger guard_drop on sql_drop execute function public.guard_drop();
"""

_FINGERPRINT = """
select (select md5(string_agg(t::text, ',' order by t.id)) from public.canary t),
       (select md5(string_agg(t::text, ',' order by t.customer_id)) from shop.customers t),
       (select md5(string_agg(t::text, ',' order by t.order_id)) from shop.orders t),
       (select md5(string_agg(t::text, ',' order by t.order_item_id)) from shop.order_items t),
       (select pg_sequence_last_value('public.guard_writes')),
       (select pg_sequence_last_value('public.guard_ddl')),
       (select count(*) from pg_event_trigger where evtname like 'guard%')
"""


def install_guards(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(GUARDS_SQL.encode())


def fingerprint(url: str) -> tuple[Any, ...]:
    """The canary's and the shop's contents, and the guards' counters (None: never touched)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_FINGERPRINT).fetchone()
    assert row is not None
    return tuple(row)
