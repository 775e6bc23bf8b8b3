-- pgrag on Northwind, a schema nobody at pgrag wrote (docs/northwind.md walks through it).
-- Load Northwind first (its tables land in schema public), migrate pgrag, then run this file:
--   psql -X -v ON_ERROR_STOP=1 -d "$URL" -f examples/northwind/documents.sql
-- Only pgrag's public SQL API is used: pgrag.declare_document, pgrag.declare_stats and
-- pgrag.refresh.

-- One row per order with its lines as text and its total (after discount).
create or replace view public.nw_order_summary as
select o.order_id, o.customer_id, o.order_date, o.shipped_date, o.ship_country,
       s.company_name as shipper,
       round(sum(d.unit_price * d.quantity * (1 - d.discount))::numeric, 2) as total,
       array_agg(distinct c.category_name order by c.category_name) as categories,
       string_agg(format('%s x%s at $%s%s', p.product_name, d.quantity,
                         round(d.unit_price::numeric, 2),
                         case when d.discount > 0
                              then format(' (%s%% off)', round(d.discount::numeric * 100)) end),
                  '; ' order by p.product_name) as lines
from public.orders o
join public.order_details d on d.order_id = o.order_id
join public.products p on p.product_id = d.product_id
left join public.categories c on c.category_id = p.category_id
left join public.shippers s on s.shipper_id = o.ship_via
group by o.order_id, o.customer_id, o.order_date, o.shipped_date, o.ship_country, s.company_name;

-- Customer profile: who they are, what they buy, their latest orders.
create or replace view public.nw_customer_doc as
select c.customer_id as source_key,
       concat_ws(E'\n',
           format('%s (customer %s), %s, %s. Contact: %s, %s.', c.company_name, c.customer_id,
                  c.city, c.country, c.contact_name, c.contact_title),
           format('%s orders totalling $%s, first %s, last %s.', s.order_count,
                  to_char(s.spent, 'FM999,999,990.00'), coalesce(s.first_order::text, 'never'),
                  coalesce(s.last_order::text, 'never')),
           case when s.categories is not null
                then format('Buys %s.', array_to_string(s.categories, ', ')) end,
           recent.lines
       ) as text,
       jsonb_build_object('customer_id', c.customer_id, 'company', c.company_name,
                          'country', c.country, 'city', c.city,
                          'total_orders', s.order_count, 'total_spent', s.spent,
                          'categories', to_jsonb(coalesce(s.categories, '{}')),
                          'last_order_date', s.last_order::text) as metadata
from public.customers c
cross join lateral (
    select count(*)::integer as order_count, coalesce(sum(o.total), 0) as spent,
           min(o.order_date) as first_order, max(o.order_date) as last_order,
           (select array_agg(distinct cat order by cat)
              from public.nw_order_summary o2, unnest(o2.categories) cat
             where o2.customer_id = c.customer_id) as categories
    from public.nw_order_summary o where o.customer_id = c.customer_id
) s
cross join lateral (
    select string_agg(format('- Order %s on %s, $%s: %s.', x.order_id, x.order_date,
                             to_char(x.total, 'FM999,999,990.00'), x.lines),
                      E'\n' order by x.order_date desc, x.order_id desc) as lines
    from (select * from public.nw_order_summary o where o.customer_id = c.customer_id
          order by o.order_date desc, o.order_id desc limit 3) x
) recent;

-- Order: its lines, shipping, and who bought it; a child of the customer profile.
create or replace view public.nw_order_doc as
select o.order_id as source_key,
       o.customer_id as parent_key,
       concat_ws(E'\n',
           format('Order %s for %s (customer %s, %s) on %s, total $%s.', o.order_id,
                  c.company_name, c.customer_id, c.country, o.order_date,
                  to_char(o.total, 'FM999,999,990.00')),
           format('Lines: %s.', o.lines),
           format('Shipped %s via %s to %s.', coalesce(o.shipped_date::text, 'not yet'),
                  coalesce(o.shipper, 'unknown'), o.ship_country)
       ) as text,
       jsonb_build_object('order_id', o.order_id, 'customer_id', o.customer_id,
                          'order_date', o.order_date::text, 'shipped', o.shipped_date is not null,
                          'ship_country', o.ship_country, 'total', o.total,
                          'categories', to_jsonb(o.categories)) as metadata
from public.nw_order_summary o
join public.customers c on c.customer_id = o.customer_id;

select pgrag.declare_document(
    'nw_customer',
    'public.nw_customer_doc',
    jsonb_build_object(
        'public.customers', 'select customer_id from changed',
        'public.orders', 'select customer_id from changed',
        'public.order_details',
            'select o.customer_id from changed d join public.orders o on o.order_id = d.order_id',
        'public.products',
            'select distinct o.customer_id from changed p
               join public.order_details d on d.product_id = p.product_id
               join public.orders o on o.order_id = d.order_id'
    ),
    null,
    '{"customer_id": "text", "company": "text", "country": "text", "city": "text",
      "total_orders": "integer", "total_spent": "numeric", "categories": "text[]",
      "last_order_date": "date"}'
);

select pgrag.declare_document(
    'nw_order',
    'public.nw_order_doc',
    jsonb_build_object(
        'public.orders', 'select order_id from changed',
        'public.order_details', 'select order_id from changed',
        'public.customers',
            'select o.order_id from changed c join public.orders o on o.customer_id = c.customer_id',
        'public.products',
            'select distinct d.order_id from changed p
               join public.order_details d on d.product_id = p.product_id',
        'public.shippers',
            'select o.order_id from changed s join public.orders o on o.ship_via = s.shipper_id'
    ),
    'nw_customer',
    '{"order_id": "integer", "customer_id": "text", "order_date": "date", "shipped": "boolean",
      "ship_country": "text", "total": "numeric", "categories": "text[]"}'
);

-- Exact statistics (docs/search.md, "Exact statistics"): each query runs over the CTE hits,
-- every chunk of its type matching a search's filter (not only the top k), and reads the totals
-- from Northwind's tables (public.nw_order_summary), never from the text.
--
--   customer_count       distinct customers
--   order_count          orders
--   revenue              sum of the orders' totals (after discount)
--   average_order_value  revenue / orders, rounded to cents (null over no orders)
--   shipped_count        orders shipped
--
-- For nw_order the orders are the matching orders; for nw_customer they are all the orders of
-- the matching customers (a customer without orders counts as a customer, with no orders).

select pgrag.declare_stats('nw_order', $stats$
select jsonb_build_object(
    'customer_count', count(distinct o.customer_id),
    'order_count', count(o.order_id),
    'revenue', coalesce(sum(o.total), 0),
    'average_order_value', round(avg(o.total), 2),
    'shipped_count', count(o.shipped_date))
from hits h
join public.nw_order_summary o on o.order_id = h.source_key::smallint
$stats$);

select pgrag.declare_stats('nw_customer', $stats$
select jsonb_build_object(
    'customer_count', count(distinct c.customer_id),
    'order_count', count(o.order_id),
    'revenue', coalesce(sum(o.total), 0),
    'average_order_value', round(avg(o.total), 2),
    'shipped_count', count(o.shipped_date))
from hits h
join public.customers c on c.customer_id = h.source_key
left join lateral (
    select s.order_id, s.total, s.shipped_date
    from public.nw_order_summary s
    where s.customer_id = c.customer_id) o on true
$stats$);

-- To compute each filter's statistics once and reuse them until a write to a table they read
-- (docs/search.md, "The statistics cache"):
--   select pgrag.cache_stats('nw_order'); select pgrag.cache_stats('nw_customer');

select pgrag.refresh('nw_customer');
select pgrag.refresh('nw_order');
