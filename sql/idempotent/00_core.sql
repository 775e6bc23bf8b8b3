-- Core functions: re-applied by every migration that reaches head.
-- Introduced by revision 0001: applied by that revision and every later one.
-- Every function: schema pgrag, declared volatility, security invoker, fixed search_path.
-- pgrag raises its own SQLSTATEs (class PR); pgrag/errors.py maps them to Python classes:
--   PR002 dimension mismatch   PR003 invalid declaration   PR004 render failure
--   PR005 invalid filter       PR006 invalid argument

create or replace function pgrag.embedding_dim()
returns integer
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$ select embedding_dim from pgrag.settings $$;

comment on function pgrag.embedding_dim() is 'The vector dimension this store was migrated with';

create or replace function pgrag.check_dimension(dim integer)
returns void
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    stored integer := pgrag.embedding_dim();
begin
    if dim is distinct from stored then
        raise exception using
            errcode = 'PR002',
            message = format('embedding dimension %s does not match this store''s %s', dim, stored),
            hint = 'use a model with the stored dimension, or re-embed with `pgrag reembed --model ...`'
                   ' (or migrate a fresh database with `pgrag db upgrade --dimension N`)';
    end if;
end
$$;

create or replace function pgrag.status()
returns table (
    embedding_dim integer,
    embedding_model text,
    chunks bigint,
    pending bigint,
    doc_types jsonb
)
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select s.embedding_dim,
           s.embedding_model,
           (select count(*) from pgrag.chunks),
           (select count(*) from pgrag.chunks where embedding is null),
           coalesce((select jsonb_object_agg(doc_type, n)
                     from (select doc_type, count(*) as n from pgrag.chunks group by doc_type) t),
                    '{}'::jsonb)
    from pgrag.settings s
$$;

comment on function pgrag.status() is 'Store size, chunks waiting for a vector, and chunks per document type';
