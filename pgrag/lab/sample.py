"""The sample shop: a deterministic, fast generator for schema ``shop`` (docs/sample-shop.md).

``load_sample(url_or_conn)`` drops and recreates schema ``shop`` from
``sql/sample/shop_schema.sql``, streams generated rows with binary ``COPY ... (FREEZE)``, then
builds the keys, foreign keys and indexes and runs ANALYZE, all in one transaction: a failure
leaves the previous sample as it was.

Rows are generated per chunk of customers with numpy, from ``numpy.random.default_rng([seed,
chunk])``: the same seed and size give the same rows, byte for byte. Orders and order items are
encoded to PostgreSQL's binary COPY format by numpy too (no Python loop per row). A few fixed
rows (customer 1 "John Smith", customer 123, five more VIP customers with returns) are put in
by hand, whatever the seed, for the demo questions (FIXTURE_CUSTOMERS, FIXTURE_ORDERS).
"""

from __future__ import annotations

import datetime as dt
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from tqdm import tqdm

from pgrag.errors import ConfigError, PgragError, from_database

MIN_CUSTOMERS = 200  # the guaranteed fixtures use customer ids up to 123
MAX_CUSTOMERS = 10_000_000  # order_item_id is an integer: ~25 items per customer at most 2^31
CHUNK_CUSTOMERS = 5_000  # rows per generation step: ~50k orders, ~125k items

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ByteMatrix = npt.NDArray[np.uint8]

# ---------------------------------------------------------------- the catalogue

CATEGORIES: tuple[str, ...] = (
    "Electronics",
    "Books",
    "Clothing",
    "Home & Kitchen",
    "Sports",
    "Toys",
    "Beauty",
    "Grocery",
)


@dataclass(frozen=True)
class Product:
    name: str
    category: str
    price_cents: int
    popularity: float  # relative weight in a basket


# product_id is the position in this tuple, plus one.
PRODUCTS: tuple[Product, ...] = (
    Product("Wireless Mouse", "Electronics", 2499, 5.0),
    Product("Mechanical Keyboard", "Electronics", 8999, 3.0),
    Product("Bluetooth Headphones", "Electronics", 7999, 4.0),
    Product("USB-C Hub", "Electronics", 3499, 3.5),
    Product("27-inch 4K Monitor", "Electronics", 32900, 1.5),
    Product("Portable SSD 1TB", "Electronics", 10999, 2.0),
    Product("Smartwatch", "Electronics", 19999, 1.5),
    Product("Noise-Cancelling Earbuds", "Electronics", 14999, 2.0),
    Product("The Pragmatic Programmer", "Books", 4250, 1.5),
    Product("Designing Data-Intensive Applications", "Books", 4599, 1.5),
    Product("Atomic Habits", "Books", 1699, 3.0),
    Product("The Silent Patient", "Books", 1299, 2.0),
    Product("Sapiens: A Brief History of Humankind", "Books", 1999, 2.0),
    Product("Salt, Fat, Acid, Heat", "Books", 2499, 1.5),
    Product("Cotton T-Shirt", "Clothing", 1499, 4.5),
    Product("Slim Fit Jeans", "Clothing", 4999, 3.0),
    Product("Hooded Sweatshirt", "Clothing", 3999, 2.5),
    Product("Waterproof Rain Jacket", "Clothing", 8900, 1.5),
    Product("Wool Socks (3-Pack)", "Clothing", 1799, 3.0),
    Product("Running Shoes", "Clothing", 10995, 2.5),
    Product("Leather Belt", "Clothing", 2999, 1.5),
    Product("Stainless Steel Water Bottle", "Home & Kitchen", 2199, 3.5),
    Product("Chef's Knife", "Home & Kitchen", 5999, 1.5),
    Product("Non-Stick Frying Pan", "Home & Kitchen", 3499, 2.0),
    Product("French Press Coffee Maker", "Home & Kitchen", 2749, 2.0),
    Product("Electric Kettle", "Home & Kitchen", 3999, 2.0),
    Product("Bamboo Cutting Board", "Home & Kitchen", 1899, 1.5),
    Product("Robot Vacuum Cleaner", "Home & Kitchen", 24900, 1.0),
    Product("Yoga Mat", "Sports", 2999, 3.0),
    Product("Adjustable Dumbbells", "Sports", 17900, 1.0),
    Product("Resistance Bands Set", "Sports", 1999, 2.5),
    Product("Cycling Helmet", "Sports", 6499, 1.0),
    Product("Tennis Racket", "Sports", 11900, 1.0),
    Product("Foam Roller", "Sports", 2499, 1.5),
    Product("LEGO Classic Brick Box", "Toys", 3499, 2.0),
    Product("Wooden Train Set", "Toys", 4499, 1.0),
    Product("Remote Control Car", "Toys", 4999, 1.5),
    Product("Jigsaw Puzzle (1000 Pieces)", "Toys", 1599, 1.5),
    Product("Plush Teddy Bear", "Toys", 1999, 1.5),
    Product("Vitamin C Serum", "Beauty", 2400, 2.0),
    Product("Hydrating Face Cream", "Beauty", 3200, 2.0),
    Product("Electric Toothbrush", "Beauty", 6999, 1.5),
    Product("Ionic Hair Dryer", "Beauty", 5499, 1.0),
    Product("Sunscreen SPF 50", "Beauty", 1450, 2.5),
    Product("Organic Coffee Beans 1kg", "Grocery", 2299, 3.5),
    Product("Green Tea (100 Bags)", "Grocery", 999, 2.5),
    Product("Extra Virgin Olive Oil 1L", "Grocery", 1649, 2.0),
    Product("Dark Chocolate Bar", "Grocery", 349, 3.0),
    Product("Almond Butter", "Grocery", 899, 1.5),
    Product("Sparkling Water (12-Pack)", "Grocery", 699, 2.0),
)
PRODUCT_IDS: dict[str, int] = {p.name: i + 1 for i, p in enumerate(PRODUCTS)}

# Share of delivered items sent back, per category (about 8% over all delivered items).
_RETURN_RATE: dict[str, float] = {
    "Electronics": 0.10,
    "Books": 0.04,
    "Clothing": 0.16,
    "Home & Kitchen": 0.07,
    "Sports": 0.08,
    "Toys": 0.06,
    "Beauty": 0.05,
    "Grocery": 0.01,
}
# Mean of the extra units bought (quantity = 1 + Poisson(mean)).
_EXTRA_UNITS: dict[str, float] = {
    "Electronics": 0.05,
    "Books": 0.1,
    "Clothing": 0.35,
    "Home & Kitchen": 0.15,
    "Sports": 0.2,
    "Toys": 0.25,
    "Beauty": 0.5,
    "Grocery": 1.3,
}

# ---------------------------------------------------------------- people

FIRST_NAMES: tuple[str, ...] = (
    "James", "Mary", "John", "Patricia", "Robert", "Jennifer", "Michael", "Linda", "William",
    "Elizabeth", "David", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah",
    "Charles", "Karen", "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark",
    "Margaret", "Paul", "Sandra", "Steven", "Ashley", "Andrew", "Emily", "Joshua", "Donna",
    "Kevin", "Michelle", "Brian", "Carol", "George", "Amanda", "Edward", "Melissa", "Ryan",
    "Deborah", "Jacob", "Stephanie", "Gary", "Rebecca", "Nicholas", "Laura", "Eric", "Sharon",
    "Jonathan", "Cynthia", "Oliver", "Amelia", "Noah", "Olivia", "Liam", "Emma", "Lucas", "Mia",
    "Hannah", "Elias", "Sofia", "Mateo", "Chloe", "Leon", "Ines", "Hugo", "Clara", "Luca",
    "Giulia", "Finn", "Freya", "Arjun", "Priya", "Kenji", "Yuki", "Wei", "Mei", "Omar", "Layla",
)  # fmt: skip
LAST_NAMES: tuple[str, ...] = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez",
    "Martinez", "Hernandez", "Lopez", "Wilson", "Anderson", "Thomas", "Taylor", "Moore",
    "Jackson", "Martin", "Lee", "Thompson", "White", "Harris", "Clark", "Lewis", "Robinson",
    "Walker", "Young", "Allen", "King", "Wright", "Scott", "Green", "Baker", "Adams", "Nelson",
    "Hill", "Campbell", "Mitchell", "Roberts", "Carter", "Phillips", "Evans", "Turner", "Parker",
    "Collins", "Edwards", "Stewart", "Morris", "Murphy", "Cook", "Rogers", "O'Brien", "Kelly",
    "Murray", "Patel", "Singh", "Chen", "Wang", "Kim", "Nguyen", "Tanaka", "Sato", "Muller",
    "Schmidt", "Schneider", "Fischer", "Dubois", "Moreau", "Rossi", "Bianchi", "Johansson",
    "Larsen", "Novak", "Kowalski", "Silva", "Santos", "Fernandez", "Cohen", "Ali",
)  # fmt: skip
EMAIL_DOMAINS: tuple[str, ...] = (
    "example.com",
    "example.net",
    "example.org",
    "mail.example",
    "inbox.example",
)
# (city, country, weight)
CITIES: tuple[tuple[str, str, float], ...] = (
    ("New York", "United States", 6),
    ("Los Angeles", "United States", 4),
    ("Chicago", "United States", 3),
    ("Houston", "United States", 2),
    ("Boston", "United States", 2),
    ("Seattle", "United States", 2),
    ("Austin", "United States", 1.5),
    ("Toronto", "Canada", 2.5),
    ("Vancouver", "Canada", 1.5),
    ("London", "United Kingdom", 4),
    ("Manchester", "United Kingdom", 1.5),
    ("Edinburgh", "United Kingdom", 1),
    ("Dublin", "Ireland", 1),
    ("Berlin", "Germany", 2.5),
    ("Munich", "Germany", 1.5),
    ("Hamburg", "Germany", 1),
    ("Paris", "France", 2.5),
    ("Lyon", "France", 1),
    ("Madrid", "Spain", 1.5),
    ("Barcelona", "Spain", 1.5),
    ("Rome", "Italy", 1),
    ("Milan", "Italy", 1.5),
    ("Amsterdam", "Netherlands", 1.5),
    ("Stockholm", "Sweden", 1),
    ("Copenhagen", "Denmark", 1),
    ("Warsaw", "Poland", 1),
    ("Sydney", "Australia", 2),
    ("Melbourne", "Australia", 1.5),
    ("Tokyo", "Japan", 1.5),
    ("Singapore", "Singapore", 1),
)
NO_ADDRESS_SHARE = 0.01  # customers with no city and country on file

# ---------------------------------------------------------------- time and segments

PG_EPOCH = dt.date(2000, 1, 1)  # binary COPY dates count days from here
FIRST_ORDER_DATE = dt.date(2022, 1, 1)
LAST_ORDER_DATE = dt.date(2024, 12, 31)  # "today" in the sample
DORMANT_LAST_ORDER = dt.date(2023, 10, 31)  # Dormant: nothing in the last year

SEGMENTS: tuple[str, ...] = ("VIP", "Regular", "New", "Dormant")
VIP, REGULAR, NEW, DORMANT = range(4)
SEGMENT_SHARE = (0.10, 0.50, 0.25, 0.15)
# Registration window per segment (inclusive).
_REGISTERED: tuple[tuple[dt.date, dt.date], ...] = (
    (dt.date(2018, 1, 1), dt.date(2022, 12, 31)),
    (dt.date(2019, 1, 1), dt.date(2024, 3, 31)),
    (dt.date(2024, 7, 1), dt.date(2024, 12, 15)),
    (dt.date(2019, 1, 1), dt.date(2022, 12, 31)),
)
_LAST_ORDER: tuple[dt.date, ...] = (
    LAST_ORDER_DATE,
    LAST_ORDER_DATE,
    LAST_ORDER_DATE,
    DORMANT_LAST_ORDER,
)
# Orders per customer: minimum + Poisson(mean), capped. Means give ~10 orders per customer.
_ORDERS_MIN = (12, 1, 0, 1)
_ORDERS_EXTRA_MEAN = (18.0, 10.5, 2.0, 4.0)
_ORDERS_MAX = (80, 40, 5, 15)
# Taste for expensive products: log-weight += bias * log(price).
_PRICE_BIAS = (0.45, 0.0, -0.1, -0.1)
_VIP_EXTRA_UNITS = 0.25

STATUSES: tuple[str, ...] = ("pending", "processing", "shipped", "delivered", "cancelled")
PENDING, PROCESSING, SHIPPED, DELIVERED, CANCELLED = range(5)
# Status by the order's age in days (up to and including each bound), rows sum to 1.
_AGE_BOUNDS = np.array([3, 10, 30], dtype=np.int64)
_STATUS_BY_AGE = np.array(
    [
        [0.45, 0.30, 0.20, 0.00, 0.05],
        [0.05, 0.20, 0.68, 0.00, 0.07],
        [0.00, 0.02, 0.30, 0.62, 0.06],
        [0.00, 0.00, 0.00, 0.95, 0.05],
    ]
)
RETURN_STATUSES: tuple[str, ...] = ("none", "requested", "completed")
RET_NONE, RET_REQUESTED, RET_COMPLETED = range(3)
_REQUESTED_WITHIN_DAYS = 60  # a return on a recent order may still be under way
_DISCOUNTS = np.array([0, 10, 20], dtype=np.int64)  # percent
_DISCOUNT_SHARE = (0.85, 0.10, 0.05)

# ---------------------------------------------------------------- guaranteed fixtures


@dataclass(frozen=True)
class FixtureCustomer:
    customer_id: int
    name: str
    email: str
    segment: str
    registered_at: dt.date
    city: str
    country: str


@dataclass(frozen=True)
class FixtureItem:
    product: str
    quantity: int = 1
    return_status: str = "none"


@dataclass(frozen=True)
class FixtureOrder:
    customer_id: int
    order_date: dt.date
    status: str
    items: tuple[FixtureItem, ...]


JOHN_SMITH_ID = 1
PENDING_ORDERS_CUSTOMER_ID = 123
VIP_RETURNER_IDS = (1, 10, 20, 30, 40, 50)

FIXTURE_CUSTOMERS: tuple[FixtureCustomer, ...] = (
    FixtureCustomer(
        1, "John Smith", "john.smith@example.com", "VIP", dt.date(2019, 3, 14), "Boston",
        "United States",
    ),
    FixtureCustomer(
        10, "Sophie Wagner", "sophie.wagner@example.net", "VIP", dt.date(2019, 8, 2), "Munich",
        "Germany",
    ),
    FixtureCustomer(
        20, "Liam O'Brien", "liam.obrien@example.com", "VIP", dt.date(2020, 1, 21), "Dublin",
        "Ireland",
    ),
    FixtureCustomer(
        30, "Ava Thompson", "ava.thompson@mail.example", "VIP", dt.date(2018, 11, 5),
        "Manchester", "United Kingdom",
    ),
    FixtureCustomer(
        40, "Lucas Dubois", "lucas.dubois@example.org", "VIP", dt.date(2020, 6, 30), "Lyon",
        "France",
    ),
    FixtureCustomer(
        50, "Mia Johansson", "mia.johansson@inbox.example", "VIP", dt.date(2019, 12, 9),
        "Stockholm", "Sweden",
    ),
    FixtureCustomer(
        123, "Maria Garcia", "maria.garcia@example.com", "Regular", dt.date(2021, 9, 2),
        "Madrid", "Spain",
    ),
)  # fmt: skip


def _returner_orders(cid: int, first: dt.date, products: Sequence[str]) -> list[FixtureOrder]:
    """Two delivered orders with three returned items (two refunded, one under way)."""
    p1, p2, p3, p4 = products
    return [
        FixtureOrder(
            cid,
            first,
            "delivered",
            (
                FixtureItem(p1, 1, "completed"),
                FixtureItem(p2, 1, "completed"),
                FixtureItem(p3, 2),
            ),
        ),
        FixtureOrder(
            cid, first + dt.timedelta(days=300), "delivered", (FixtureItem(p4, 1, "requested"),)
        ),
    ]


FIXTURE_ORDERS: tuple[FixtureOrder, ...] = (
    # John Smith returned a Wireless Mouse and Bluetooth Headphones, and is returning shoes.
    FixtureOrder(
        1,
        dt.date(2023, 2, 11),
        "delivered",
        (FixtureItem("Wireless Mouse", 1, "completed"), FixtureItem("Mechanical Keyboard")),
    ),
    FixtureOrder(
        1,
        dt.date(2024, 5, 20),
        "delivered",
        (FixtureItem("Bluetooth Headphones", 1, "completed"), FixtureItem("USB-C Hub")),
    ),
    FixtureOrder(
        1, dt.date(2024, 11, 18), "delivered", (FixtureItem("Running Shoes", 1, "requested"),)
    ),
    # Customer 123: two January 2024 orders still on their way.
    FixtureOrder(
        123,
        dt.date(2024, 1, 8),
        "shipped",
        (FixtureItem("Mechanical Keyboard"), FixtureItem("USB-C Hub")),
    ),
    FixtureOrder(
        123,
        dt.date(2024, 1, 22),
        "processing",
        (FixtureItem("Yoga Mat"), FixtureItem("Stainless Steel Water Bottle", 2)),
    ),
    *_returner_orders(
        10,
        dt.date(2023, 3, 4),
        ("Slim Fit Jeans", "Hooded Sweatshirt", "Cotton T-Shirt", "Smartwatch"),
    ),
    *_returner_orders(
        20,
        dt.date(2023, 4, 17),
        ("Noise-Cancelling Earbuds", "Portable SSD 1TB", "Atomic Habits", "Tennis Racket"),
    ),
    *_returner_orders(
        30,
        dt.date(2023, 1, 29),
        ("Waterproof Rain Jacket", "Running Shoes", "Wool Socks (3-Pack)", "Ionic Hair Dryer"),
    ),
    *_returner_orders(
        40,
        dt.date(2023, 5, 8),
        ("27-inch 4K Monitor", "Mechanical Keyboard", "USB-C Hub", "Robot Vacuum Cleaner"),
    ),
    *_returner_orders(
        50,
        dt.date(2023, 2, 20),
        ("Electric Toothbrush", "Hydrating Face Cream", "Vitamin C Serum", "Adjustable Dumbbells"),
    ),
)

# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class SampleStats:
    """What one load wrote, and how long it took (wall clock, seconds)."""

    customers: int
    products: int
    orders: int
    order_items: int
    returned_items: int
    seed: int
    elapsed_s: float


# ---------------------------------------------------------------- loading


def schema_file() -> Path:
    """The path of sql/sample/shop_schema.sql (source tree or wheel)."""
    from pgrag.migrate import sql_dir

    return sql_dir() / "sample" / "shop_schema.sql"


def validate(customers: int, seed: int) -> None:
    """Raise ConfigError unless ``customers`` and ``seed`` can make a sample."""
    if not MIN_CUSTOMERS <= customers <= MAX_CUSTOMERS:
        raise ConfigError(
            f"--customers {customers} is out of range: use {MIN_CUSTOMERS:,} to "
            f"{MAX_CUSTOMERS:,} (the guaranteed demo customers need at least {MIN_CUSTOMERS}; "
            f"order item ids must fit an integer)"
        )
    if seed < 0:
        raise ConfigError(f"--seed {seed} is negative: use a whole number 0 or above")


def load_sample(
    url_or_conn: str | psycopg.Connection[Any],
    *,
    customers: int = 1000,
    seed: int = 42,
    progress: bool = True,
) -> SampleStats:
    """Replace schema ``shop`` with a generated sample of ``customers`` customers.

    One transaction: on any failure nothing changes (the previous sample, if any, stays). Given a
    connection, the load runs in ``conn.transaction()``: a savepoint when the caller has a
    transaction open (the caller then commits), else a transaction of its own.
    About 10 orders per customer and 2.5 items per order.
    """
    validate(customers, seed)
    if isinstance(url_or_conn, psycopg.Connection):
        return _load(url_or_conn, customers, seed, progress)
    from pgrag.connection import connect_once

    with connect_once(url_or_conn) as conn:
        return _load(conn, customers, seed, progress)


def _load(conn: psycopg.Connection[Any], customers: int, seed: int, progress: bool) -> SampleStats:
    started = time.perf_counter()
    show = progress and sys.stderr.isatty()
    orders = items = returned = 0
    try:
        with (
            conn.transaction(),
            tqdm(
                total=customers,
                unit=" customers",
                unit_scale=True,
                desc="sample shop",
                disable=not show,
                leave=False,
            ) as bar,
        ):
            _prepare(conn)
            _copy_products(conn)
            for chunk in generate(customers, seed):
                _copy_chunk(conn, chunk)
                orders += chunk.orders
                items += chunk.items
                returned += chunk.returned
                bar.update(chunk.customers)
                bar.set_postfix_str(f"{orders:,} orders, {items:,} items", refresh=False)
            bar.set_postfix_str("keys, foreign keys and indexes")
            conn.execute("call shop.finish_load()")
            conn.execute("drop procedure shop.finish_load()")
            bar.set_postfix_str("analyze")
            conn.execute("analyze shop.customers, shop.products, shop.orders, shop.order_items")
    except psycopg.Error as exc:
        raise _load_failed(exc) from exc
    return SampleStats(
        customers=customers,
        products=len(PRODUCTS),
        orders=orders,
        order_items=items,
        returned_items=returned,
        seed=seed,
        elapsed_s=time.perf_counter() - started,
    )


def _prepare(conn: psycopg.Connection[Any]) -> None:
    """Recreate schema shop (bare tables) and give the index builds some memory."""
    from pgrag.migrate import run_sql_file

    conn.execute(
        "select set_config('maintenance_work_mem', '256MB', true) "
        "where (select setting::bigint from pg_settings where name = 'maintenance_work_mem') "
        "< 262144"  # kB
    )
    run_sql_file(conn, schema_file())


def _load_failed(exc: psycopg.Error) -> PgragError:
    mapped = from_database(exc)
    if mapped is not None:
        return mapped
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return PgragError(
            f"cannot load the sample shop ({first}): nothing changed; use a role that may "
            "create schemas in this database (or owns schema shop)"
        )
    return PgragError(
        f"loading the sample shop failed and was rolled back ({first}): the previous sample, if "
        "any, is unchanged; fix the cause and run `pgrag sample load` again"
    )


# ---------------------------------------------------------------- COPY


def _copy_statement(table: str, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL("copy {} ({}) from stdin (format binary, freeze)").format(
        sql.Identifier("shop", table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )


def _copy_products(conn: psycopg.Connection[Any]) -> None:
    stmt = _copy_statement("products", ("product_id", "name", "category", "price"))
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        copy.set_types(["int4", "text", "text", "numeric"])
        for i, p in enumerate(PRODUCTS, start=1):
            copy.write_row((i, p.name, p.category, _cents_to_decimal(p.price_cents)))


def _cents_to_decimal(cents: int) -> Decimal:
    return Decimal(cents).scaleb(-2)


_CUSTOMER_COLUMNS = ("customer_id", "name", "email", "segment", "registered_at", "city", "country")
_ORDER_COLUMNS = ("order_id", "customer_id", "order_date", "status")
_ITEM_COLUMNS = (
    "order_item_id",
    "order_id",
    "product_id",
    "quantity",
    "unit_price",
    "return_status",
)


def _copy_chunk(conn: psycopg.Connection[Any], chunk: Chunk) -> None:
    with conn.cursor() as cur:
        with cur.copy(_copy_statement("customers", _CUSTOMER_COLUMNS)) as copy:
            copy.set_types(["int4", "text", "text", "text", "date", "text", "text"])
            for row in chunk.customer_rows():
                copy.write_row(row)
        with cur.copy(_copy_statement("orders", _ORDER_COLUMNS)) as copy:
            copy.write(chunk.orders_copy)
        with cur.copy(_copy_statement("order_items", _ITEM_COLUMNS)) as copy:
            copy.write(chunk.items_copy)


# PostgreSQL's binary COPY format: signature, flags, header extension length; -1 ends the data.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_TRAILER = b"\xff\xff"


@dataclass(frozen=True)
class _Block:
    data: ByteMatrix  # (rows, bytes): the field length then the value, padded on the right
    valid: BoolArray | None  # which bytes are real (None: all of them)


def _fixed(values: npt.NDArray[Any], big_endian: str) -> _Block:
    """A fixed-width field (int4 '>i4', int2 words...) for every row."""
    raw = np.ascontiguousarray(values, dtype=big_endian)
    n = raw.shape[0]
    width = raw.dtype.itemsize * (raw.shape[1] if raw.ndim == 2 else 1)
    data = np.empty((n, 4 + width), dtype=np.uint8)
    data[:, :4] = np.frombuffer(width.to_bytes(4, "big"), dtype=np.uint8)
    data[:, 4:] = raw.view(np.uint8).reshape(n, width)
    return _Block(data, None)


def _int4(values: IntArray) -> _Block:
    return _fixed(values, ">i4")


def _date(days_since_2000: IntArray) -> _Block:
    return _fixed(days_since_2000, ">i4")


def _numeric_cents(cents: IntArray) -> _Block:
    """numeric(10,2) below 10,000.00: digits in base 10,000 [units, hundredths * 100]."""
    words = np.empty((cents.shape[0], 6), dtype=np.int64)
    words[:, 0] = 2  # ndigits
    words[:, 1] = 0  # weight of the first digit
    words[:, 2] = 0  # sign: positive
    words[:, 3] = 2  # display scale
    words[:, 4] = cents // 100
    words[:, 5] = (cents % 100) * 100
    return _fixed(words, ">i2")


def _text(codes: IntArray, vocabulary: Sequence[str]) -> _Block:
    """A text field drawn from a small vocabulary (statuses)."""
    encoded = [v.encode() for v in vocabulary]
    width = 4 + max(len(e) for e in encoded)
    table = np.zeros((len(encoded), width), dtype=np.uint8)
    valid = np.zeros((len(encoded), width), dtype=np.bool_)
    for i, e in enumerate(encoded):
        table[i, :4] = np.frombuffer(len(e).to_bytes(4, "big"), dtype=np.uint8)
        table[i, 4 : 4 + len(e)] = np.frombuffer(e, dtype=np.uint8)
        valid[i, : 4 + len(e)] = True
    return _Block(table[codes], valid[codes])


def encode_binary_copy(blocks: Sequence[_Block]) -> bytes:
    """Whole rows in binary COPY format (with signature and trailer), built without a loop."""
    n = blocks[0].data.shape[0]
    count = np.empty((n, 2), dtype=np.uint8)
    count[:] = np.frombuffer(len(blocks).to_bytes(2, "big"), dtype=np.uint8)
    matrix = np.concatenate([count, *(b.data for b in blocks)], axis=1)
    if all(b.valid is None for b in blocks):
        body = matrix.tobytes()
    else:
        valid = np.concatenate(
            [
                np.ones((n, 2), dtype=np.bool_),
                *(
                    np.ones(b.data.shape, dtype=np.bool_) if b.valid is None else b.valid
                    for b in blocks
                ),
            ],
            axis=1,
        )
        body = matrix[valid].tobytes()  # row-major: each row's real bytes, in order
    return _COPY_HEADER + body + _COPY_TRAILER


# ---------------------------------------------------------------- generation


@dataclass(frozen=True)
class Chunk:
    """One generation step: customers [first_id, first_id + customers) and their orders."""

    first_id: int
    names: list[str]
    emails: list[str]
    segments: IntArray
    registered: IntArray  # days since 2000-01-01
    cities: list[str | None]
    countries: list[str | None]
    orders: int
    items: int
    returned: int
    orders_copy: bytes
    items_copy: bytes

    @property
    def customers(self) -> int:
        return len(self.names)

    def customer_rows(self) -> Iterator[tuple[Any, ...]]:
        registered = (np.datetime64(PG_EPOCH, "D") + self.registered).tolist()
        segments = self.segments.tolist()
        for i in range(self.customers):
            yield (
                self.first_id + i,
                self.names[i],
                self.emails[i],
                SEGMENTS[segments[i]],
                registered[i],
                self.cities[i],
                self.countries[i],
            )


def _days(d: dt.date) -> int:
    return (d - PG_EPOCH).days


def generate(customers: int, seed: int) -> Iterator[Chunk]:
    """The sample's rows, chunk by chunk; the same arguments give the same chunks."""
    next_order = next_item = 1
    for index, lo in enumerate(range(0, customers, CHUNK_CUSTOMERS)):
        n = min(CHUNK_CUSTOMERS, customers - lo)
        rng = np.random.default_rng([seed, index])
        chunk = _generate_chunk(rng, lo + 1, n, next_order, next_item)
        next_order += chunk.orders
        next_item += chunk.items
        yield chunk


_LOG_POPULARITY = np.log([p.popularity for p in PRODUCTS])
_LOG_PRICE = np.log([p.price_cents / 100 for p in PRODUCTS])
_PRICE_CENTS = np.array([p.price_cents for p in PRODUCTS], dtype=np.int64)
_CATEGORY_OF = np.array([CATEGORIES.index(p.category) for p in PRODUCTS], dtype=np.int64)
_RETURN_BY_PRODUCT = np.array([_RETURN_RATE[p.category] for p in PRODUCTS])
_EXTRA_BY_PRODUCT = np.array([_EXTRA_UNITS[p.category] for p in PRODUCTS])
# (segment, product) log-weights for a basket
_BASKET_LOGW = np.stack([_LOG_POPULARITY + bias * _LOG_PRICE for bias in _PRICE_BIAS])
_CITY_P = np.array([c[2] for c in CITIES]) / sum(c[2] for c in CITIES)
_MAX_ITEMS = 4
_NON_ALNUM = re.compile(r"[^a-z0-9]")


def _generate_chunk(
    rng: np.random.Generator, first_id: int, n: int, first_order: int, first_item: int
) -> Chunk:
    ids = np.arange(first_id, first_id + n, dtype=np.int64)

    # ---- customers
    segments = rng.choice(len(SEGMENTS), size=n, p=SEGMENT_SHARE).astype(np.int64)
    reg_lo = np.array([_days(w[0]) for w in _REGISTERED], dtype=np.int64)[segments]
    reg_hi = np.array([_days(w[1]) for w in _REGISTERED], dtype=np.int64)[segments]
    registered = reg_lo + rng.integers(0, reg_hi - reg_lo + 1)
    first = rng.integers(0, len(FIRST_NAMES), size=n)
    last = rng.integers(0, len(LAST_NAMES), size=n)
    # Customer 1 is the only John Smith.
    clash = (first == FIRST_NAMES.index("John")) & (last == LAST_NAMES.index("Smith"))
    last[clash] = LAST_NAMES.index("Smith") + 1
    pattern = rng.integers(0, 4, size=n)
    domain = rng.integers(0, len(EMAIL_DOMAINS), size=n)
    city = rng.choice(len(CITIES), size=n, p=_CITY_P)
    no_address = rng.random(n) < NO_ADDRESS_SHARE

    names = [f"{FIRST_NAMES[f]} {LAST_NAMES[la]}" for f, la in zip(first, last, strict=True)]
    emails = [
        _email(FIRST_NAMES[f], LAST_NAMES[la], int(p), int(cid), EMAIL_DOMAINS[d])
        for f, la, p, cid, d in zip(first, last, pattern, ids, domain, strict=True)
    ]
    cities: list[str | None] = [
        None if na else CITIES[c][0] for c, na in zip(city, no_address, strict=True)
    ]
    countries: list[str | None] = [
        None if na else CITIES[c][1] for c, na in zip(city, no_address, strict=True)
    ]
    for fx in FIXTURE_CUSTOMERS:
        i = fx.customer_id - first_id
        if 0 <= i < n:
            names[i], emails[i] = fx.name, fx.email
            cities[i], countries[i] = fx.city, fx.country
            segments[i] = SEGMENTS.index(fx.segment)
            registered[i] = _days(fx.registered_at)

    # ---- orders: how many, when, in what state
    seg_min = np.array(_ORDERS_MIN, dtype=np.int64)[segments]
    seg_max = np.array(_ORDERS_MAX, dtype=np.int64)[segments]
    counts = np.minimum(
        seg_min + rng.poisson(np.array(_ORDERS_EXTRA_MEAN)[segments]), seg_max
    ).astype(np.int64)
    owner = np.repeat(np.arange(n), counts)  # customer position of each order
    window_lo = np.maximum(registered, _days(FIRST_ORDER_DATE))[owner]
    window_hi = np.array([_days(d) for d in _LAST_ORDER], dtype=np.int64)[segments[owner]]
    order_date = window_lo + rng.integers(0, window_hi - window_lo + 1)
    age = _days(LAST_ORDER_DATE) - order_date
    cumulative = np.cumsum(_STATUS_BY_AGE, axis=1)[np.searchsorted(_AGE_BOUNDS, age)]
    status = (rng.random(age.shape[0])[:, None] >= cumulative[:, :-1]).sum(axis=1)

    # ---- items: 1-4 distinct products per order (weighted sampling without replacement)
    n_orders = owner.shape[0]
    k = rng.integers(1, _MAX_ITEMS + 1, size=n_orders)
    keys = _BASKET_LOGW[segments[owner]] + rng.gumbel(size=(n_orders, len(PRODUCTS)))
    top = np.argpartition(-keys, _MAX_ITEMS - 1, axis=1)[:, :_MAX_ITEMS]
    top = np.take_along_axis(
        top, np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1), axis=1
    )
    product = top[np.arange(_MAX_ITEMS) < k[:, None]].astype(np.int64)  # 0-based
    item_order = np.repeat(np.arange(n_orders), k)
    vip_extra = np.where(segments[owner[item_order]] == VIP, _VIP_EXTRA_UNITS, 0.0)
    quantity = 1 + rng.poisson(_EXTRA_BY_PRODUCT[product] + vip_extra)
    discount = _DISCOUNTS[rng.choice(len(_DISCOUNTS), size=product.shape[0], p=_DISCOUNT_SHARE)]
    unit_cents = (_PRICE_CENTS[product] * (100 - discount) + 50) // 100
    delivered = status[item_order] == DELIVERED
    returned = delivered & (rng.random(product.shape[0]) < _RETURN_BY_PRODUCT[product])
    recent = age[item_order] <= _REQUESTED_WITHIN_DAYS
    under_way = recent & (rng.random(product.shape[0]) < 0.7)
    ret = np.where(returned, np.where(under_way, RET_REQUESTED, RET_COMPLETED), RET_NONE)

    # ---- the guaranteed rows
    fx_orders = [o for o in FIXTURE_ORDERS if 0 <= o.customer_id - first_id < n]
    if fx_orders:
        fx_items = [(j, it) for j, o in enumerate(fx_orders) for it in o.items]
        owner = np.concatenate([owner, [o.customer_id - first_id for o in fx_orders]])
        order_date = np.concatenate([order_date, [_days(o.order_date) for o in fx_orders]])
        status = np.concatenate([status, [STATUSES.index(o.status) for o in fx_orders]])
        item_order = np.concatenate([item_order, [n_orders + j for j, _ in fx_items]])
        fx_product = [PRODUCT_IDS[it.product] - 1 for _, it in fx_items]
        product = np.concatenate([product, fx_product])
        quantity = np.concatenate([quantity, [it.quantity for _, it in fx_items]])
        unit_cents = np.concatenate([unit_cents, _PRICE_CENTS[fx_product]])
        ret = np.concatenate([ret, [RETURN_STATUSES.index(it.return_status) for _, it in fx_items]])

    # ---- ids: orders by date (then customer), items by order
    by_date = np.lexsort((owner, order_date))
    rank = np.empty_like(by_date)
    rank[by_date] = np.arange(by_date.shape[0])
    item_rank = rank[item_order]
    by_order = np.argsort(item_rank, kind="stable")
    total_orders = int(by_date.shape[0])
    total_items = int(by_order.shape[0])

    orders_copy = encode_binary_copy(
        [
            _int4(first_order + np.arange(total_orders)),
            _int4(ids[owner[by_date]]),
            _date(order_date[by_date]),
            _text(status[by_date], STATUSES),
        ]
    )
    items_copy = encode_binary_copy(
        [
            _int4(first_item + np.arange(total_items)),
            _int4(first_order + item_rank[by_order]),
            _int4(product[by_order] + 1),
            _int4(quantity[by_order]),
            _numeric_cents(unit_cents[by_order]),
            _text(ret[by_order], RETURN_STATUSES),
        ]
    )
    return Chunk(
        first_id=first_id,
        names=names,
        emails=emails,
        segments=segments,
        registered=registered,
        cities=cities,
        countries=countries,
        orders=total_orders,
        items=total_items,
        returned=int((ret != RET_NONE).sum()),
        orders_copy=orders_copy,
        items_copy=items_copy,
    )


def _email(first: str, last: str, pattern: int, customer_id: int, domain: str) -> str:
    f = _NON_ALNUM.sub("", first.lower())
    la = _NON_ALNUM.sub("", last.lower())
    local = (f"{f}.{la}", f"{f}{la}", f"{f[0]}{la}", f"{f}_{la}")[pattern]
    return f"{local}{customer_id}@{domain}"
