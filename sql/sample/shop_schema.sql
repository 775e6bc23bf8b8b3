-- The sample shop: customers, products, orders and their items (docs/sample-shop.md).
--
-- `pgrag sample load` (pgrag/sample.py) runs this file, COPYs the rows, then calls
-- shop.finish_load() and drops it, all in one transaction: the tables are created bare so the
-- bulk load neither maintains indexes nor checks foreign keys row by row, and a failure leaves
-- the previous sample untouched. By hand: run this file, load the rows, `call shop.finish_load()`.
--
-- Re-runnable: the schema is dropped first, with everything attached to it (triggers included;
-- pgrag re-declares its document types after a load).

drop schema if exists shop cascade;
create schema shop;

comment on schema shop is 'pgrag sample e-commerce data (pgrag sample load)';

create table shop.customers (
    customer_id   integer not null,
    name          text    not null,
    email         text    not null,
    segment       text    not null
        constraint customers_segment_check check (segment in ('VIP', 'Regular', 'New', 'Dormant')),
    registered_at date    not null,
    city          text,
    country       text
);

create table shop.products (
    product_id integer       not null,
    name       text          not null,
    category   text          not null,
    price      numeric(10,2) not null
);

create table shop.orders (
    order_id    integer not null,
    customer_id integer not null,
    order_date  date    not null,
    status      text    not null
        constraint orders_status_check
        check (status in ('pending', 'processing', 'shipped', 'delivered', 'cancelled'))
);

create table shop.order_items (
    order_item_id integer       not null,
    order_id      integer       not null,
    product_id    integer       not null,
    quantity      integer       not null constraint order_items_quantity_check check (quantity > 0),
    unit_price    numeric(10,2) not null,
    return_status text          not null default 'none'
        constraint order_items_return_status_check
        check (return_status in ('none', 'requested', 'completed'))
);

comment on table shop.customers is 'Shop customers; name and email are personal data';
comment on column shop.customers.segment is 'VIP, Regular, New (registered recently) or Dormant (no order in the last year)';
comment on table shop.orders is 'One row per order; status moves pending -> processing -> shipped -> delivered, or cancelled';
comment on column shop.order_items.unit_price is 'Price paid per unit (the list price, less any discount)';
comment on column shop.order_items.return_status is 'none, requested (return under way) or completed (refunded)';

-- Keys, foreign keys and indexes, built once the rows are in (faster than maintaining them
-- row by row during COPY). The sample loader calls this once and drops it.
create procedure shop.finish_load()
language plpgsql security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    alter table shop.customers   add constraint customers_pkey   primary key (customer_id);
    alter table shop.products    add constraint products_pkey    primary key (product_id);
    alter table shop.orders      add constraint orders_pkey      primary key (order_id);
    alter table shop.order_items add constraint order_items_pkey primary key (order_item_id);

    alter table shop.orders
        add constraint orders_customer_id_fkey
        foreign key (customer_id) references shop.customers on delete cascade;
    alter table shop.order_items
        add constraint order_items_order_id_fkey
        foreign key (order_id) references shop.orders on delete cascade;
    alter table shop.order_items
        add constraint order_items_product_id_fkey
        foreign key (product_id) references shop.products;

    create index orders_customer_id_idx      on shop.orders (customer_id);
    create index orders_order_date_idx       on shop.orders (order_date);
    create index order_items_order_id_idx    on shop.order_items (order_id);
    create index order_items_product_id_idx  on shop.order_items (product_id);
end
$$;
