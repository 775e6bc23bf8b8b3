-- The sample shop's document types, declared through pgrag's public SQL API, exactly as a
-- DBA would declare documents on their own schema. Needs schema shop (shop_schema.sql).
--
-- customer_profile  one chunk per customer: summary first (what an embedding model with a
--                   256-word-piece window reads), then the most recent orders, then "... and K
--                   more orders" past the cap in shop.doc_settings.
-- order_detail      one chunk per order, child of its customer's profile: the order, its items
--                   and return status, and its customer (name, tier).
--
-- A document's text depends on its own rows and its parent's, never on its siblings': an
-- order's text says nothing that changes when another order of the customer changes ("order n
-- of m", a cumulative spend), so a change to one order renders that order and its customer,
-- not the customer's other orders. Such facts live on the parent (the profile's order count
-- and total spent) or come from the exact statistics at search time (docs/documents.md).

create table if not exists shop.doc_settings (
    singleton boolean primary key default true check (singleton),
    recent_orders integer not null default 5 check (recent_orders between 0 and 100)
);
insert into shop.doc_settings default values on conflict do nothing;

-- One row per order with its total, categories and items as text. Grouped by every order
-- column so filters on customer_id push down into the grouping (index scans, not full scans).
create or replace view shop.order_summary as
select o.order_id,
       o.customer_id,
       o.order_date,
       o.status,
       coalesce(sum(i.quantity * i.unit_price), 0)::numeric(12, 2) as total,
       count(i.order_item_id) as item_count,
       coalesce(array_agg(distinct p.category order by p.category)
                    filter (where p.category is not null), '{}') as categories,
       coalesce(bool_or(i.return_status <> 'none'), false) as has_returns,
       coalesce(string_agg(
           format('%s x%s at $%s%s', p.name, i.quantity, i.unit_price,
                  case i.return_status when 'none' then ''
                       else format(' (returned: %s)', i.return_status) end),
           '; ' order by i.order_item_id) filter (where i.order_item_id is not null),
           'no items') as items_text
from shop.orders o
left join shop.order_items i on i.order_id = o.order_id
left join shop.products p on p.product_id = i.product_id
group by o.order_id, o.customer_id, o.order_date, o.status;

-- Just the numbers of each order (no text, no products), several times cheaper than
-- order_summary: what a question's totals join to (docs/search.md).
create or replace view shop.order_totals as
select o.order_id,
       o.customer_id,
       o.order_date,
       o.status,
       coalesce(sum(i.quantity * i.unit_price), 0)::numeric(12, 2) as total
from shop.orders o
left join shop.order_items i on i.order_id = o.order_id
group by o.order_id, o.customer_id, o.order_date, o.status;

create or replace view shop.customer_profile_doc as
select c.customer_id as source_key,
       concat_ws(E'\n',
           format('Customer %s (customer id %s) is a %s customer, registered in %s%s.',
                  c.name, c.customer_id, c.segment, extract(year from c.registered_at),
                  coalesce(format(', based in %s, %s', c.city, c.country), '')),
           format('%s orders, total spent $%s, last order %s.',
                  s.order_count, to_char(s.spent, 'FM999,999,990.00'),
                  coalesce(s.last_order::text, 'never')),
           case when cardinality(s.categories) > 0
                then format('Buys %s.', array_to_string(s.categories, ', ')) end,
           case when s.return_count > 0
                then format('%s returned items: %s.', s.return_count, s.returned)
                else 'No returns.' end,
           case when s.order_count > 0 then 'Recent orders:' end,
           recent.lines,
           case when s.order_count > cfg.recent_orders
                then format('... and %s more orders.', s.order_count - cfg.recent_orders) end
       ) as text,
       jsonb_build_object(
           'customer_id', c.customer_id,
           'name', c.name,
           'segment', c.segment,
           'registration_year', extract(year from c.registered_at)::integer,
           'order_ids', s.order_ids,
           'categories', to_jsonb(s.categories),
           'has_returns', s.return_count > 0,
           'return_count', s.return_count,
           'total_orders', s.order_count,
           'total_spent', s.spent,
           'last_order_date', s.last_order::text
       ) as metadata
from shop.customers c
cross join shop.doc_settings cfg
-- Two passes over the customer's orders: one over their items for the totals, categories and
-- returns together, one for the recent orders' lines, each grouped only for its own order
-- (offset 0 keeps that lateral from being pulled up into a join, which grouped every order
-- of the shop). Three passes and a grouping of every order of the customer took 0.3 ms a
-- render against 0.2 (docs/benchmarks.md, "The sample's customer view in two passes").
cross join lateral (
    select count(distinct o.order_id)::integer as order_count,
           coalesce(sum(i.quantity * i.unit_price) filter (where o.status <> 'cancelled'),
                    0)::numeric(12, 2) as spent,
           max(o.order_date) as last_order,
           coalesce(jsonb_agg(distinct o.order_id order by o.order_id), '[]'::jsonb) as order_ids,
           coalesce(array_agg(distinct p.category order by p.category)
                        filter (where p.product_id is not null), '{}') as categories,
           (count(*) filter (where i.return_status <> 'none' and p.product_id is not null))::integer
               as return_count,
           string_agg(format('%s (%s, order %s)', p.name, i.return_status, o.order_id), ', '
                      order by o.order_date, i.order_item_id)
               filter (where i.return_status <> 'none' and p.product_id is not null) as returned
    from shop.orders o
    left join shop.order_items i on i.order_id = o.order_id
    left join shop.products p on p.product_id = i.product_id
    where o.customer_id = c.customer_id
) s
cross join lateral (
    select string_agg(format('- Order %s on %s (%s, $%s): %s.',
                             x.order_id, x.order_date, x.status,
                             to_char(x.total, 'FM999,999,990.00'), x.items_text),
                      E'\n' order by x.order_date desc, x.order_id desc) as lines
    from (select o.order_id
          from shop.orders o
          where o.customer_id = c.customer_id
          order by o.order_date desc, o.order_id desc
          limit cfg.recent_orders) r
    cross join lateral (select * from shop.order_summary os where os.order_id = r.order_id
                        offset 0) x
) recent;

create or replace view shop.order_detail_doc as
select o.order_id as source_key,
       o.customer_id as parent_key,
       concat_ws(E'\n',
           format('Order %s by %s (customer id %s, %s customer) on %s: status %s, total $%s.',
                  o.order_id, c.name, c.customer_id, c.segment, o.order_date, o.status,
                  to_char(o.total, 'FM999,999,990.00')),
           format('Items: %s.', o.items_text),
           case when o.has_returns then 'This order has returned items.' end
       ) as text,
       jsonb_build_object(
           'order_id', o.order_id,
           'customer_id', o.customer_id,
           'customer_name', c.name,
           'segment', c.segment,
           'order_date', o.order_date::text,
           'status', o.status,
           'total', o.total,
           'categories', to_jsonb(o.categories),
           'has_returns', o.has_returns
       ) as metadata
from shop.order_summary o
join shop.customers c on c.customer_id = o.customer_id;

select pgrag.declare_document(
    'customer_profile',
    'shop.customer_profile_doc',
    jsonb_build_object(
        'shop.customers', 'select customer_id from changed',
        'shop.orders', 'select customer_id from changed',
        'shop.order_items',
            'select o.customer_id from changed c join shop.orders o on o.order_id = c.order_id',
        'shop.products',
            'select distinct o.customer_id from changed c
               join shop.order_items i on i.product_id = c.product_id
               join shop.orders o on o.order_id = i.order_id',
        'shop.doc_settings', 'select customer_id from shop.customers'
    ),
    null,
    '{"customer_id": "integer", "name": "text", "segment": "text", "registration_year": "integer",
      "order_ids": "integer[]", "categories": "text[]", "has_returns": "boolean",
      "return_count": "integer", "total_orders": "integer", "total_spent": "numeric",
      "last_order_date": "date"}'
);

-- An order's text depends on the order, its items, their products and its customer: a changed
-- order or item renders that order only (its key comes from the changed row itself).
select pgrag.declare_document(
    'order_detail',
    'shop.order_detail_doc',
    jsonb_build_object(
        'shop.orders', 'select order_id from changed',
        'shop.order_items', 'select order_id from changed',
        'shop.customers',
            'select o.order_id from changed c join shop.orders o on o.customer_id = c.customer_id',
        'shop.products',
            'select distinct i.order_id from changed c
               join shop.order_items i on i.product_id = c.product_id'
    ),
    'customer_profile',
    '{"order_id": "integer", "customer_id": "integer", "customer_name": "text", "segment": "text",
      "order_date": "date", "status": "text", "total": "numeric", "categories": "text[]",
      "has_returns": "boolean"}'
);

-- Words for the question parser (docs/declaring.md): what a question may call each type and
-- key beyond the words of their names, and other words for some values. Everything else the
-- parser knows comes from these declarations and from the values in the chunks.
select pgrag.describe_document(
    'customer_profile',
    'A customer of the shop: tier, home city, orders, spending and returns',
    array['customer', 'client', 'buyer', 'shopper', 'user', 'people'],
    '{"name": {"synonyms": ["customer name", "named"]},
      "segment": {"description": "the customer tier", "synonyms": ["tier"],
                  "values": {"Dormant": ["inactive", "lapsed"], "VIP": ["vips", "v.i.p."],
                             "Regular": ["regulars"]}},
      "total_spent": {"synonyms": ["spent", "spend", "spending", "revenue"]},
      "total_orders": {"synonyms": ["orders", "order count"]},
      "return_count": {"synonyms": ["returns", "returned items"]},
      "has_returns": {"synonyms": ["returned", "refund", "refunded"]},
      "registration_year": {"synonyms": ["registered", "joined", "signed up"]}}'
);

select pgrag.describe_document(
    'order_detail',
    'One order: date, status, total, items and returns, with its customer',
    array['order', 'purchase', 'bought', 'ordered', 'sale'],
    '{"customer_name": {"synonyms": ["customer", "buyer"]},
      "segment": {"synonyms": ["tier"],
                  "values": {"Dormant": ["inactive", "lapsed"], "VIP": ["vips", "v.i.p."],
                             "Regular": ["regulars"]}},
      "status": {"values": {"cancelled": ["canceled"], "delivered": ["received", "arrived"]}},
      "total": {"synonyms": ["amount", "value", "worth", "cost"]},
      "has_returns": {"synonyms": ["returned", "refund", "refunded"]},
      "order_date": {"synonyms": ["placed", "ordered", "bought"]}}'
);
