-- Comparison document types for the strategy benchmark: the two ways teams usually point RAG
-- at a database, which lose the relationships pgrag keeps. Off by default
-- (`pgrag sample load --comparisons`). Their key queries map to text keys that no index
-- serves, so their triggers cost full scans: benchmark use only.

-- table_row: every row of every table, rendered apart.
create or replace view shop.table_row_doc as
select 'customer:' || c.customer_id as source_key,
       format('Customer %s: name %s, segment %s, registered %s, city %s, country %s.',
              c.customer_id, c.name, c.segment, c.registered_at, c.city, c.country) as text,
       jsonb_build_object('table', 'customers', 'customer_id', c.customer_id,
                          'segment', c.segment) as metadata
from shop.customers c
union all
select 'order:' || o.order_id,
       format('Order %s: customer %s, date %s, status %s.', o.order_id, o.customer_id,
              o.order_date, o.status),
       jsonb_build_object('table', 'orders', 'order_id', o.order_id, 'customer_id', o.customer_id,
                          'order_date', o.order_date::text, 'status', o.status)
from shop.orders o
union all
select 'item:' || i.order_item_id,
       format('Order item %s: order %s, product %s, quantity %s, unit price %s, return status %s.',
              i.order_item_id, i.order_id, i.product_id, i.quantity, i.unit_price, i.return_status),
       jsonb_build_object('table', 'order_items', 'order_id', i.order_id,
                          'product_id', i.product_id, 'return_status', i.return_status)
from shop.order_items i
union all
select 'product:' || p.product_id,
       format('Product %s: %s, category %s, price %s.', p.product_id, p.name, p.category, p.price),
       jsonb_build_object('table', 'products', 'product_id', p.product_id, 'category', p.category)
from shop.products p;

-- join_row: one flattened JOIN row per order item (customer and order repeated on each).
create or replace view shop.join_row_doc as
select i.order_item_id as source_key,
       format('Customer %s (id %s, %s) order %s on %s, status %s: %s (%s) x%s at $%s, return status %s.',
              c.name, c.customer_id, c.segment, o.order_id, o.order_date, o.status,
              p.name, p.category, i.quantity, i.unit_price, i.return_status) as text,
       jsonb_build_object('customer_id', c.customer_id, 'segment', c.segment,
                          'order_id', o.order_id, 'order_date', o.order_date::text,
                          'status', o.status, 'category', p.category,
                          'has_returns', i.return_status <> 'none') as metadata
from shop.order_items i
join shop.orders o on o.order_id = i.order_id
join shop.customers c on c.customer_id = o.customer_id
join shop.products p on p.product_id = i.product_id;

select pgrag.declare_document(
    'table_row',
    'shop.table_row_doc',
    jsonb_build_object(
        'shop.customers', 'select ''customer:'' || customer_id from changed',
        'shop.orders', 'select ''order:'' || order_id from changed',
        'shop.order_items', 'select ''item:'' || order_item_id from changed',
        'shop.products', 'select ''product:'' || product_id from changed'
    ),
    null,
    '{"table": "text", "customer_id": "integer", "order_id": "integer", "product_id": "integer",
      "segment": "text", "order_date": "date", "status": "text", "return_status": "text",
      "category": "text"}'
);

select pgrag.declare_document(
    'join_row',
    'shop.join_row_doc',
    jsonb_build_object(
        'shop.order_items', 'select order_item_id from changed',
        'shop.orders',
            'select i.order_item_id from changed c join shop.order_items i on i.order_id = c.order_id',
        'shop.customers',
            'select i.order_item_id from changed c join shop.orders o on o.customer_id = c.customer_id
               join shop.order_items i on i.order_id = o.order_id',
        'shop.products',
            'select i.order_item_id from changed c join shop.order_items i on i.product_id = c.product_id'
    ),
    null,
    '{"customer_id": "integer", "segment": "text", "order_id": "integer", "order_date": "date",
      "status": "text", "category": "text", "has_returns": "boolean"}'
);
