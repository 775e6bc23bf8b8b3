-- Ground truth for pgrag.eval.northwind.generate_northwind_questions (docs/evaluation.md).
--
-- Reads Northwind's own tables (schema public: customers, orders, order_details, products,
-- categories, shippers), not pgrag's chunks. One SELECT per "-- name: X" section, run with
-- bound parameters: %(seed)s (text; candidates ordered by md5(key || seed)) and %(lim)s.
-- An order's total is sum(unit_price * quantity * (1 - discount)) rounded to cents, as the
-- nw_customer and nw_order documents (examples/northwind/documents.sql) count it.
-- No literal percent signs: psycopg reads them as placeholders.

-- name: customer_totals
with totals as (
    select o.order_id, o.customer_id,
           round(sum(d.unit_price * d.quantity * (1 - d.discount))::numeric, 2) as total
    from public.orders o
    join public.order_details d on d.order_id = o.order_id
    group by o.order_id, o.customer_id
)
select c.customer_id, c.company_name, count(t.order_id)::integer as order_count,
       coalesce(sum(t.total), 0)::numeric(12, 2) as spent
from public.customers c
join totals t on t.customer_id = c.customer_id
group by c.customer_id, c.company_name
order by md5(c.customer_id || %(seed)s), c.customer_id
limit %(lim)s;

-- name: order_shipping
select o.order_id, c.company_name, o.order_date, o.shipped_date, o.ship_country,
       s.company_name as shipper
from public.orders o
join public.customers c on c.customer_id = o.customer_id
left join public.shippers s on s.shipper_id = o.ship_via
order by md5(o.order_id::text || %(seed)s), o.order_id
limit %(lim)s;

-- name: customer_month_orders
with months as (
    select o.customer_id, date_trunc('month', o.order_date)::date as month,
           array_agg(o.order_id::text order by o.order_id) as keys
    from public.orders o
    where o.order_date is not null
    group by 1, 2
)
select m.customer_id, c.company_name, m.month, m.keys
from months m
join public.customers c on c.customer_id = m.customer_id
order by md5(m.customer_id || m.month::text || %(seed)s), m.customer_id, m.month
limit %(lim)s;

-- name: product_buyers_month
with buys as (
    select p.product_name, date_trunc('month', o.order_date)::date as month,
           array_agg(distinct o.order_id::text) as keys,
           string_agg(distinct c.company_name, ', ') as names
    from public.order_details d
    join public.orders o on o.order_id = d.order_id
    join public.products p on p.product_id = d.product_id
    join public.customers c on c.customer_id = o.customer_id
    where o.order_date is not null
    group by 1, 2
    having count(distinct o.order_id) between 1 and 4
)
select b.product_name, b.month, b.keys, b.names
from buys b
order by md5(b.product_name || b.month::text || %(seed)s), b.product_name, b.month
limit %(lim)s;

-- name: city_customers
select c.city, c.country, array_agg(c.customer_id::text order by c.customer_id) as keys,
       string_agg(c.company_name, ', ' order by c.company_name) as names
from public.customers c
where c.city is not null
group by c.city, c.country
having count(*) between 2 and 6
order by md5(c.city || %(seed)s), c.city
limit %(lim)s;

-- name: unshipped_by_country
select o.ship_country, array_agg(o.order_id::text order by o.order_id) as keys
from public.orders o
where o.shipped_date is null and o.ship_country is not null
group by o.ship_country
having count(*) between 1 and 6
order by md5(o.ship_country || %(seed)s), o.ship_country
limit %(lim)s;

-- name: category_customers_country
with bought as (
    select distinct o.customer_id, cat.category_name
    from public.orders o
    join public.order_details d on d.order_id = o.order_id
    join public.products p on p.product_id = d.product_id
    join public.categories cat on cat.category_id = p.category_id
)
select c.country, b.category_name as category,
       array_agg(c.customer_id::text order by c.customer_id) as keys,
       string_agg(c.company_name, ', ' order by c.company_name) as names
from bought b
join public.customers c on c.customer_id = b.customer_id
group by c.country, b.category_name
having count(*) between 1 and 5
order by md5(c.country || b.category_name || %(seed)s), c.country, b.category_name
limit %(lim)s;

-- name: bounds
select (select max(order_id) from public.orders) as max_order,
       (select min(order_date) from public.orders) as first_day,
       (select company_name from public.customers order by customer_id limit 1) as some_name;

-- name: absent_names
select n as name
from unnest(%(names)s::text[]) with ordinality as t(n, i)
where not exists (select from public.customers c where c.company_name = t.n)
order by t.i
limit %(lim)s;
