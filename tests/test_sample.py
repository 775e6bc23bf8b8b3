"""The sample shop: deterministic, realistic enough, guaranteed demo rows, all-or-nothing loads."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

from pgrag.cli.sample import sample as sample_group
from pgrag.errors import ConfigError, PgragError
from pgrag.lab import sample
from pgrag.lab.sample import SampleStats, load_sample

from .conftest import run_pgrag

SMALL = 300  # customers: ~3,000 orders, ~7,500 items, well under a second

CHECKSUM = """
select md5(concat_ws(',',
    (select md5(string_agg(t::text, ';' order by customer_id)) from shop.customers t),
    (select md5(string_agg(t::text, ';' order by product_id)) from shop.products t),
    (select md5(string_agg(t::text, ';' order by order_id)) from shop.orders t),
    (select md5(string_agg(t::text, ';' order by order_item_id)) from shop.order_items t)))
"""


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
        return row[0] if row else None


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query.encode()).fetchall()


def checksum(url: str) -> str:
    return str(scalar(url, CHECKSUM))


# ---------------------------------------------------------------- determinism, re-loading


def test_same_seed_same_rows_other_seed_other_rows(db_url: str) -> None:
    first = load_sample(db_url, customers=SMALL, seed=7, progress=False)
    a = checksum(db_url)
    again = load_sample(db_url, customers=SMALL, seed=7, progress=False)
    assert checksum(db_url) == a
    assert (again.orders, again.order_items) == (first.orders, first.order_items)
    load_sample(db_url, customers=SMALL, seed=8, progress=False)
    assert checksum(db_url) != a


def test_generation_is_deterministic_across_chunks() -> None:
    size = sample.CHUNK_CUSTOMERS + 250  # two chunks
    one = list(sample.generate(size, 3))
    two = list(sample.generate(size, 3))
    assert len(one) == 2
    for a, b in zip(one, two, strict=True):
        assert a.orders_copy == b.orders_copy and a.items_copy == b.items_copy
        assert list(a.customer_rows()) == list(b.customer_rows())
    # ids continue across chunks
    assert one[1].first_id == sample.CHUNK_CUSTOMERS + 1


def test_reload_replaces_the_previous_sample(db_url: str) -> None:
    load_sample(db_url, customers=500, seed=1, progress=False)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # what other parts of pgrag do: attach triggers to the shop tables
        conn.execute(
            "create function public.touch() returns trigger language plpgsql as "
            "$$ begin return new; end $$"
        )
        conn.execute(
            "create trigger touch after insert on shop.orders "
            "for each row execute function public.touch()"
        )
    stats = load_sample(db_url, customers=SMALL, seed=2, progress=False)
    assert scalar(db_url, "select count(*) from shop.customers") == SMALL
    assert scalar(db_url, "select count(*) from shop.orders") == stats.orders
    assert scalar(db_url, "select count(*) from shop.order_items") == stats.order_items
    assert scalar(db_url, "select max(customer_id) from shop.customers") == SMALL
    assert scalar(db_url, "select count(*) from pg_trigger where tgname = 'touch'") == 0


# ---------------------------------------------------------------- guaranteed rows


@pytest.mark.parametrize("seed", [0, 42, 2**40 + 17])
def test_guaranteed_fixtures(db_url: str, seed: int) -> None:
    load_sample(db_url, customers=sample.MIN_CUSTOMERS, seed=seed, progress=False)

    assert rows(
        db_url, "select customer_id, segment from shop.customers where name = 'John Smith'"
    ) == [(1, "VIP")]
    assert scalar(db_url, "select count(*) from shop.orders where customer_id = 1") >= 6
    returned = {
        r[0]
        for r in rows(
            db_url,
            "select p.name from shop.orders o join shop.order_items i using (order_id) "
            "join shop.products p using (product_id) "
            "where o.customer_id = 1 and i.return_status in ('requested', 'completed')",
        )
    }
    assert {"Wireless Mouse", "Bluetooth Headphones"} <= returned

    january = rows(
        db_url,
        "select o.order_id, o.status, array_agg(p.name order by p.name) "
        "from shop.orders o join shop.order_items i using (order_id) "
        "join shop.products p using (product_id) "
        "where o.customer_id = 123 and o.order_date between '2024-01-01' and '2024-01-31' "
        "and o.status in ('pending', 'processing', 'shipped') group by 1, 2",
    )
    assert len(january) >= 2
    assert all(names for _, _, names in january)

    vip_returners = scalar(
        db_url,
        "select count(*) from (select c.customer_id from shop.customers c "
        "join shop.orders o using (customer_id) join shop.order_items i using (order_id) "
        "where c.segment = 'VIP' and i.return_status <> 'none' "
        "group by 1 having count(*) >= 3) t",
    )
    assert vip_returners >= 5


# ---------------------------------------------------------------- distributions


@pytest.fixture(scope="module")
def loaded(pg_server: Any, template_db: str) -> Iterator[tuple[str, SampleStats]]:
    from .conftest import create_database, drop_database

    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    stats = load_sample(url, customers=3000, seed=42, progress=False)
    yield url, stats
    drop_database(pg_server, name)


def test_counts_and_catalogue(loaded: tuple[str, SampleStats]) -> None:
    url, stats = loaded
    assert stats.customers == scalar(url, "select count(*) from shop.customers") == 3000
    assert stats.products == scalar(url, "select count(*) from shop.products") == 50
    assert stats.orders == scalar(url, "select count(*) from shop.orders")
    assert stats.order_items == scalar(url, "select count(*) from shop.order_items")
    assert stats.returned_items == scalar(
        url, "select count(*) from shop.order_items where return_status <> 'none'"
    )
    assert 8.5 <= stats.orders / stats.customers <= 11.5
    assert 2.3 <= stats.order_items / stats.orders <= 2.7
    assert scalar(url, "select count(distinct category) from shop.products") == 8
    assert scalar(url, "select count(*) from shop.products where name = 'Wireless Mouse'") == 1
    assert stats.elapsed_s > 0


def test_segments(loaded: tuple[str, SampleStats]) -> None:
    url, _ = loaded
    share = dict(rows(url, "select segment, count(*)::float / 3000 from shop.customers group by 1"))
    for segment, want in zip(sample.SEGMENTS, sample.SEGMENT_SHARE, strict=True):
        assert abs(share[segment] - want) < 0.04, (segment, share)
    per_segment = dict(
        (seg, (float(n), float(spend)))
        for seg, n, spend in rows(
            url,
            "select c.segment, avg(coalesce(o.n, 0)), avg(coalesce(o.spend, 0)) "
            "from shop.customers c left join ("
            "  select o.customer_id, count(distinct o.order_id) n, "
            "         sum(i.quantity * i.unit_price) spend "
            "  from shop.orders o join shop.order_items i using (order_id) group by 1"
            ") o using (customer_id) group by 1",
        )
    )
    assert per_segment["VIP"][0] > per_segment["Regular"][0] > per_segment["New"][0]
    assert per_segment["VIP"][1] > 3 * per_segment["Regular"][1]
    # Dormant: nothing in the last year; New: registered recently, few orders
    assert (
        scalar(
            url,
            "select count(*) from shop.orders o join shop.customers c using (customer_id) "
            "where c.segment = 'Dormant' and o.order_date >= '2024-01-01'",
        )
        == 0
    )
    assert scalar(
        url, "select min(registered_at) from shop.customers where segment = 'New'"
    ) >= dt.date(2024, 6, 1)
    assert (
        scalar(
            url,
            "select max(n) from (select count(*) n from shop.orders o "
            "join shop.customers c using (customer_id) where c.segment = 'New' "
            "group by customer_id) t",
        )
        <= 5
    )
    # nobody orders before registering
    assert (
        scalar(
            url,
            "select count(*) from shop.orders o join shop.customers c using (customer_id) "
            "where o.order_date < c.registered_at",
        )
        == 0
    )


def test_orders_and_items(loaded: tuple[str, SampleStats]) -> None:
    url, _ = loaded
    first, last = rows(url, "select min(order_date), max(order_date) from shop.orders")[0]
    assert dt.date(2022, 1, 1) <= first and last <= dt.date(2024, 12, 31)
    # old orders are settled, the last days' orders are still on their way
    assert (
        scalar(
            url,
            "select count(*) from shop.orders where order_date < '2024-11-01' "
            "and status not in ('delivered', 'cancelled') and customer_id <> 123",
        )
        == 0
    )
    assert (
        scalar(
            url,
            "select count(*) from shop.orders "
            "where order_date > '2024-12-20' and status = 'delivered'",
        )
        == 0
    )
    cancelled = scalar(url, "select avg((status = 'cancelled')::int) from shop.orders")
    assert 0.03 <= cancelled <= 0.08
    assert (
        scalar(
            url,
            "select count(*) from (select order_id from shop.order_items group by 1 "
            "having count(*) not between 1 and 4 or count(*) <> count(distinct product_id)) t",
        )
        == 0
    )
    # returns: ~8% of delivered items, and only delivered items
    rate = scalar(
        url,
        "select avg((i.return_status <> 'none')::int) from shop.order_items i "
        "join shop.orders o using (order_id) where o.status = 'delivered'",
    )
    assert 0.06 <= rate <= 0.10
    assert (
        scalar(
            url,
            "select count(*) from shop.order_items i join shop.orders o using (order_id) "
            "where o.status <> 'delivered' and i.return_status <> 'none'",
        )
        == 0
    )
    assert (
        scalar(url, "select count(*) from shop.order_items where return_status = 'requested'") > 0
    )
    # prices: the list price or a discount on it
    assert (
        scalar(
            url,
            "select count(*) from shop.order_items i join shop.products p using (product_id) "
            "where i.unit_price > p.price or i.unit_price < 0.7 * p.price",
        )
        == 0
    )


def test_people_look_real(loaded: tuple[str, SampleStats]) -> None:
    url, _ = loaded
    assert scalar(url, "select count(*) from shop.customers where name !~ '^\\S+ \\S+$'") == 0
    assert (
        scalar(
            url,
            "select count(*) from shop.customers "
            "where email !~ '^[a-z0-9._]+@[a-z.]+$' "
            "or position(lower(regexp_replace(split_part(name, ' ', 2), '[^A-Za-z]', '', 'g')) "
            "in email) = 0",
        )
        == 0
    )
    assert scalar(url, "select count(distinct email) from shop.customers") == 3000
    assert scalar(url, "select count(*) from shop.customers where name = 'John Smith'") == 1


def test_keys_indexes_and_statistics(loaded: tuple[str, SampleStats]) -> None:
    url, _ = loaded
    constraints = {
        r[0]
        for r in rows(
            url,
            "select conname from pg_constraint where connamespace = 'shop'::regnamespace "
            "and contype in ('p', 'f')",
        )
    }
    assert constraints == {
        "customers_pkey",
        "products_pkey",
        "orders_pkey",
        "order_items_pkey",
        "orders_customer_id_fkey",
        "order_items_order_id_fkey",
        "order_items_product_id_fkey",
    }
    indexes = {
        r[0] for r in rows(url, "select indexname from pg_indexes where schemaname = 'shop'")
    }
    assert {
        "orders_customer_id_idx",
        "orders_order_date_idx",
        "order_items_order_id_idx",
        "order_items_product_id_idx",
    } <= indexes
    assert scalar(url, "select to_regprocedure('shop.finish_load()')") is None
    assert (
        scalar(url, "select reltuples from pg_class where oid = 'shop.order_items'::regclass") > 0
    )
    # on delete cascade, as documents and demos expect
    with psycopg.connect(url) as conn, conn.transaction(force_rollback=True):
        conn.execute("delete from shop.customers where customer_id = 2")
        left = conn.execute(
            "select count(*) from shop.order_items i join shop.orders o using (order_id) "
            "where o.customer_id = 2"
        ).fetchone()
        assert left == (0,)


def test_binary_copy_encoder_round_trips(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "create temp table enc (i integer, d date, n numeric(10,2), s text) on commit drop"
    )
    ints = np.array([1, -5, 2**31 - 1, 0], dtype=np.int64)
    days = np.array([0, -1, 9132, 8766], dtype=np.int64)
    cents = np.array([1, 5, 999_999, 0], dtype=np.int64)
    codes = np.array([0, 1, 2, 1], dtype=np.int64)
    payload = sample.encode_binary_copy(
        [
            sample._int4(ints),
            sample._date(days),
            sample._numeric_cents(cents),
            sample._text(codes, ("a", "", "héllo")),
        ]
    )
    with conn.cursor() as cur, cur.copy("copy enc from stdin (format binary)") as copy:
        copy.write(payload)
    got = conn.execute("select i, d, n::text, s from enc").fetchall()
    assert got == [
        (1, dt.date(2000, 1, 1), "0.01", "a"),
        (-5, dt.date(1999, 12, 31), "0.05", ""),
        (2**31 - 1, dt.date(2025, 1, 1), "9999.99", "héllo"),
        (0, dt.date(2024, 1, 1), "0.00", ""),
    ]


# ---------------------------------------------------------------- failures change nothing


def _superuser(url: str) -> bool:
    return bool(scalar(url, "select rolsuper from pg_roles where rolname = current_user"))


FAIL_DURING_COPY = """
create function public.sabotage() returns event_trigger language plpgsql as $$
begin
    if exists (select 1 from pg_event_trigger_ddl_commands()
               where object_identity = 'shop.order_items') then
        alter table shop.order_items add constraint sabotage check (order_item_id < 1000);
    end if;
end $$;
create event trigger sabotage on ddl_command_end when tag in ('CREATE TABLE')
    execute function public.sabotage();
"""

FAIL_BUILDING_INDEXES = """
create function public.sabotage() returns event_trigger language plpgsql as $$
begin
    raise exception 'no indexes today';
end $$;
create event trigger sabotage on ddl_command_start when tag in ('CREATE INDEX')
    execute function public.sabotage();
"""


@pytest.mark.parametrize(
    "sabotage",
    [FAIL_DURING_COPY, FAIL_BUILDING_INDEXES],
    ids=["during-copy", "building-indexes"],
)
def test_failure_mid_load_keeps_the_previous_sample(db_url: str, sabotage: str) -> None:
    if not _superuser(db_url):
        pytest.skip("event triggers need a superuser")
    load_sample(db_url, customers=SMALL, seed=11, progress=False)
    before = checksum(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sabotage.encode())
    with pytest.raises(PgragError, match="rolled back") as info:
        load_sample(db_url, customers=SMALL + 100, seed=12, progress=False)
    assert isinstance(info.value.__cause__, psycopg.Error)
    assert checksum(db_url) == before
    assert scalar(db_url, "select count(*) from shop.customers") == SMALL


def test_interrupted_load_keeps_the_previous_sample(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_sample(db_url, customers=SMALL, seed=11, progress=False)
    before = checksum(db_url)
    real = sample.generate

    def interrupted(customers: int, seed: int) -> Iterator[sample.Chunk]:
        for chunk in real(customers, seed):
            yield chunk  # COPYed by the loader, then Ctrl-C
            raise KeyboardInterrupt

    monkeypatch.setattr(sample, "generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_sample(db_url, customers=SMALL + 100, seed=12, progress=False)
    assert checksum(db_url) == before


@pytest.mark.parametrize(
    ("customers", "seed", "says"),
    [(199, 42, "200"), (10_000_001, 42, "10,000,000"), (1000, -1, "negative")],
)
def test_bad_arguments(empty_db_url: str, customers: int, seed: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_sample(empty_db_url, customers=customers, seed=seed, progress=False)
    assert scalar(empty_db_url, "select to_regnamespace('shop')") is None


def test_loads_into_a_database_without_pgrag(empty_db_url: str) -> None:
    stats = load_sample(empty_db_url, customers=SMALL, progress=False)
    assert scalar(empty_db_url, "select count(*) from shop.customers") == stats.customers


def test_caller_connection_and_transaction(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("select 1")  # a transaction is open: the load is a savepoint in it
        load_sample(conn, customers=SMALL, progress=False)
        conn.rollback()
    assert scalar(db_url, "select to_regnamespace('shop')") is None


# ---------------------------------------------------------------- the command


def test_cli_load(db_url: str) -> None:
    from pgrag.cli.main import _State

    result = CliRunner().invoke(
        sample_group,
        ["load", "--customers", str(SMALL), "--seed", "5", "--no-progress"],
        obj=_State(db_url),
    )
    assert result.exit_code == 0, result.output
    assert "customers:" in result.output and f"{SMALL:,}" in result.output
    assert scalar(db_url, "select count(*) from shop.customers") == SMALL
    by_cli = checksum(db_url)
    load_sample(db_url, customers=SMALL, seed=5, progress=False)
    assert checksum(db_url) == by_cli


def test_cli_rejects_too_few_customers(db_url: str) -> None:
    from pgrag.cli.main import _State

    result = CliRunner().invoke(
        sample_group, ["load", "--customers", "10", "--no-progress"], obj=_State(db_url)
    )
    assert isinstance(result.exception, ConfigError)
    assert "200" in str(result.exception)


def test_cli_end_to_end(db_url: str) -> None:
    done = run_pgrag(
        "--database-url", db_url, "sample", "load", "--customers", "300", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert "orders:" in done.stdout
    assert scalar(db_url, "select count(*) from shop.customers") == 300
    # the shop's documents are declared and rendered, and match their views
    assert "declared customer_profile, order_detail" in done.stdout
    assert (
        scalar(db_url, "select count(*) from pgrag.chunks where doc_type = 'customer_profile'")
        == 300
    )
    assert scalar(
        db_url, "select count(*) from pgrag.chunks where doc_type = 'order_detail'"
    ) == scalar(db_url, "select count(*) from shop.orders")
    checked = run_pgrag("--database-url", db_url, "verify")
    assert checked.returncode == 0 and "all chunks match" in checked.stdout, checked.stdout

    bad = run_pgrag("--database-url", db_url, "sample", "load", "--customers", "20")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "200" in bad.stderr
    assert "Traceback" not in bad.stderr
