-- Ground truth for pgrag.eval.questions.generate_shop_questions (docs/evaluation.md).
--
-- One SELECT per "-- name: X" section, read by name and run with bound parameters:
-- %(seed)s (text: candidates are ordered by md5(key || seed), so a seed picks a stable sample)
-- and %(lim)s (rows per template). No literal percent signs: psycopg reads them as placeholders.
-- Revenue everywhere is sum(quantity * unit_price) over orders that are not cancelled, as the
-- customer_profile documents count total_spent.

-- name: customer_returns
with uniq as (select name from shop.customers group by name having count(*) = 1)
select c.customer_id, c.name,
       array_agg(distinct o.order_id::text) as order_keys,
       string_agg(p.name || ' (' || i.return_status || ', order ' || o.order_id || ')', ', '
                  order by o.order_date, i.order_item_id) as answer
from shop.customers c
join uniq on uniq.name = c.name
join shop.orders o on o.customer_id = c.customer_id
join shop.order_items i on i.order_id = o.order_id
join shop.products p on p.product_id = i.product_id
where i.return_status <> 'none'
group by c.customer_id, c.name
order by md5(c.customer_id::text || %(seed)s), c.customer_id
limit %(lim)s;

-- name: customer_totals
with uniq as (select name from shop.customers group by name having count(*) = 1)
select c.customer_id, c.name, count(distinct o.order_id)::integer as order_count,
       coalesce(sum(i.quantity * i.unit_price) filter (where o.status <> 'cancelled'), 0)::numeric(12, 2)
           as spent
from shop.customers c
join uniq on uniq.name = c.name
left join shop.orders o on o.customer_id = c.customer_id
left join shop.order_items i on i.order_id = o.order_id
group by c.customer_id, c.name
order by count(o.order_id) = 0 desc, md5(c.customer_id::text || %(seed)s), c.customer_id
limit %(lim)s;

-- name: order_status
select o.order_id, o.status, o.order_date, c.name
from shop.orders o
join shop.customers c on c.customer_id = o.customer_id
order by md5(o.order_id::text || %(seed)s), o.order_id
limit %(lim)s;

-- name: undelivered_in_month
with uniq as (select name from shop.customers group by name having count(*) = 1)
select c.customer_id, c.name, date_trunc('month', o.order_date)::date as month,
       coalesce(array_agg(o.order_id::text order by o.order_id)
                    filter (where o.status in ('pending', 'processing', 'shipped')), '{}')
           as undelivered,
       array_agg(o.order_id::text order by o.order_id) as all_orders,
       string_agg('order ' || o.order_id || ' of ' || o.order_date || ' (' || o.status || ')', ', '
                  order by o.order_date, o.order_id)
           filter (where o.status in ('pending', 'processing', 'shipped')) as answer
from shop.customers c
join uniq on uniq.name = c.name
join shop.orders o on o.customer_id = c.customer_id
group by c.customer_id, c.name, date_trunc('month', o.order_date)
order by bool_or(o.status in ('pending', 'processing', 'shipped')) desc,
         md5(c.customer_id::text || date_trunc('month', o.order_date)::date::text || %(seed)s),
         c.customer_id, 3
limit %(lim)s;

-- name: segment_returns
with r as (
    select c.customer_id, c.name, c.segment,
           count(i.order_item_id) filter (where i.return_status <> 'none') as returns
    from shop.customers c
    left join shop.orders o on o.customer_id = c.customer_id
    left join shop.order_items i on i.order_id = o.order_id
    group by c.customer_id, c.name, c.segment
)
select r.segment, m.min_returns,
       coalesce(array_agg(r.customer_id::text order by r.customer_id)
                    filter (where r.returns >= m.min_returns), '{}') as keys,
       coalesce(string_agg(r.name, ', ' order by r.customer_id)
                    filter (where r.returns >= m.min_returns), '') as names
from r
cross join (values (1), (3), (5)) as m (min_returns)
group by r.segment, m.min_returns
order by md5(r.segment || m.min_returns::text || %(seed)s), r.segment, m.min_returns
limit %(lim)s;

-- name: segment_aggregates
with per_order as (
    select o.order_id, c.segment, extract(year from o.order_date)::integer as year, o.status,
           coalesce(sum(i.quantity * i.unit_price), 0) as total
    from shop.orders o
    join shop.customers c on c.customer_id = o.customer_id
    left join shop.order_items i on i.order_id = o.order_id
    group by o.order_id, c.segment, o.order_date, o.status
),
keys as (
    select segment, array_agg(customer_id::text order by customer_id) as keys
    from shop.customers group by segment
)
select p.segment, p.year,
       (sum(p.total) filter (where p.status <> 'cancelled'))::numeric(14, 2) as revenue,
       (count(*) filter (where p.status <> 'cancelled'))::integer as orders,
       k.keys
from per_order p
join keys k on k.segment = p.segment
group by grouping sets ((p.segment, k.keys), (p.segment, k.keys, p.year))
order by md5(p.segment || coalesce(p.year::text, 'all') || %(seed)s), p.segment, p.year
limit %(lim)s;

-- name: category_buyers
select c.city, p.category,
       array_agg(distinct c.customer_id::text) as keys,
       string_agg(distinct c.name, ', ') as names
from shop.customers c
join shop.orders o on o.customer_id = c.customer_id
join shop.order_items i on i.order_id = o.order_id
join shop.products p on p.product_id = i.product_id
where c.city is not null
group by c.city, p.category
having count(distinct c.customer_id) between 1 and 40
order by md5(c.city || p.category || %(seed)s), c.city, p.category
limit %(lim)s;

-- name: product_buyers_month
select p.name as product, date_trunc('month', o.order_date)::date as month,
       array_agg(distinct o.order_id::text) as keys,
       string_agg(distinct c.name, ', ') as names
from shop.products p
join shop.order_items i on i.product_id = p.product_id
join shop.orders o on o.order_id = i.order_id
join shop.customers c on c.customer_id = o.customer_id
group by p.name, date_trunc('month', o.order_date)
having count(distinct o.order_id) <= 15
order by md5(p.name || date_trunc('month', o.order_date)::date::text || %(seed)s), 1, 2
limit %(lim)s;

-- name: unsold_products
select p.name
from shop.products p
where not exists (select 1 from shop.order_items i where i.product_id = p.product_id)
order by md5(p.name || %(seed)s), p.name
limit %(lim)s;

-- name: absent_names
select n.name
from unnest(%(names)s::text[]) as n (name)
where not exists (select 1 from shop.customers c where c.name = n.name)
limit %(lim)s;

-- name: id_bounds
select coalesce(max(o.order_id), 0) as max_order,
       (select coalesce(max(customer_id), 0) from shop.customers) as max_customer,
       (select min(order_date) from shop.orders) as first_day,
       (select name from shop.customers order by md5(customer_id::text || %(seed)s) limit 1)
           as some_name
from shop.orders o
where %(lim)s::integer > 0;

-- name: type_rows
-- For generate_type_questions: chunks of one document type, each with one metadata value
-- (string or number) that no other chunk of the type has, so asking for it names one chunk.
with kv as (
    select c.source_key, e.key, e.value
    from pgrag.chunks c
    cross join lateral jsonb_each(c.metadata) as e
    where c.doc_type = %(doc_type)s and jsonb_typeof(e.value) in ('string', 'number')
),
uniq as (select key, value from kv group by key, value having count(*) = 1),
picked as (
    select distinct on (kv.source_key) kv.source_key, kv.key, kv.value #>> '{}' as value
    from kv
    join uniq on uniq.key = kv.key and uniq.value = kv.value
    order by kv.source_key, md5(kv.key || %(seed)s)
)
select source_key, key, value
from picked
order by md5(source_key || %(seed)s), source_key
limit %(lim)s;
