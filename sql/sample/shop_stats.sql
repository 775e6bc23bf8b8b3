-- The sample shop's exact statistics, declared through pgrag's public SQL API (after
-- shop_documents.sql). Each query runs over the CTE `hits`: every chunk of its type that matches
-- a search's filter, not only the top k. Numbers come from the shop tables, never from text.
--
-- customer_count       distinct customers
-- order_count          orders (cancelled included)
-- revenue              sum of quantity x unit price over orders not cancelled
-- average_order_value  revenue / orders not cancelled
-- return_count         order items returned or being returned (return_status <> 'none')
--
-- For order_detail the orders are the matching orders; for customer_profile they are all the
-- orders of the matching customers.

select pgrag.declare_stats('order_detail', $stats$
select jsonb_build_object(
    'customer_count', count(distinct o.customer_id),
    'order_count', count(*),
    'revenue', coalesce(sum(t.total) filter (where o.status <> 'cancelled'), 0),
    'average_order_value', round(avg(t.total) filter (where o.status <> 'cancelled'), 2),
    'return_count', coalesce(sum(t.returns), 0))
from hits h
join shop.orders o on o.order_id = h.source_key::integer
cross join lateral (
    select coalesce(sum(i.quantity * i.unit_price), 0) as total,
           count(*) filter (where i.return_status <> 'none') as returns
    from shop.order_items i
    where i.order_id = o.order_id) t
$stats$);

select pgrag.declare_stats('customer_profile', $stats$
select jsonb_build_object(
    'customer_count', count(distinct c.customer_id),
    'order_count', count(o.order_id),
    'revenue', coalesce(sum(t.total) filter (where o.status <> 'cancelled'), 0),
    'average_order_value', round(avg(t.total) filter (where o.status <> 'cancelled'), 2),
    'return_count', coalesce(sum(t.returns), 0))
from hits h
join shop.customers c on c.customer_id = h.source_key::integer
left join shop.orders o on o.customer_id = c.customer_id
left join lateral (
    select coalesce(sum(i.quantity * i.unit_price), 0) as total,
           count(*) filter (where i.return_status <> 'none') as returns
    from shop.order_items i
    where i.order_id = o.order_id) t on true
$stats$);

-- Both are cached (pgrag.cache_stats; docs/search.md, "The statistics cache"): a filter's
-- statistics are computed once and reused until a write to one of the tables they read.
select pgrag.cache_stats('order_detail');
select pgrag.cache_stats('customer_profile');
