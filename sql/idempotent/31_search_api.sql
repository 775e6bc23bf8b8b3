-- Search: hybrid, vector and full-text search with a metadata filter (the filter language of
-- docs/filters-and-answers.md), the tsquery of a search text, and a chunk's context (its parent,
-- children and siblings). docs/search.md. Every search runs pgrag._search; an argument left NULL
-- takes pgrag's default (pgrag._search_default), the same for SQL callers and the Python client.
--
-- The search functions below have no SET clause, unlike every other function of pgrag: a SET
-- clause stops PostgreSQL from inlining a SQL function into the query that calls it, which cost
-- a search 0.15 ms (a plan of the function's body at every call). Their bodies call one
-- schema-qualified function (pgrag._search, which sets its own search_path) and no operator or
-- unqualified function, so the caller's search_path cannot change what they run.

create or replace function pgrag.text_query(query_text text, match text default 'any')
returns tsquery
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgrag._check_question(query_text);  -- the limits of every search text
    return pgrag._search_tsquery(query_text, match, null);
end
$$;

comment on function pgrag.text_query(text, text) is
    'The tsquery of a search text: any = any word (the default), all = websearch_to_tsquery '
    '(every word), phrase = the words in order';


select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.search(text, vector, integer, jsonb, text[], text, text, integer, integer, integer, '
    'integer, integer, text)'), 'SETOF pgrag.search_hit');

create or replace function pgrag.search(
    query_text text,
    query_embedding vector default null,
    k integer default null,
    filter jsonb default null,
    doc_types text[] default null,
    mode text default null,
    match text default null,
    candidates integer default null,
    ef_search integer default null,
    exact_threshold integer default null,
    rrf_k integer default null,
    fts_limit integer default null,
    model text default null)
returns setof pgrag.search_hit
language sql stable security invoker
as $$
    select * from pgrag._search(
        coalesce(mode, case when query_embedding is null then 'text' else 'hybrid' end),
        query_text, query_embedding, k, filter, doc_types, match, candidates, ef_search,
        exact_threshold, rrf_k, fts_limit, model)
$$;

comment on function pgrag.search(text, vector, integer, jsonb, text[], text, text, integer,
                                 integer, integer, integer, integer, text) is
    'Search the chunks, as the Python client and `pgrag search` do: hybrid (vector and full '
    'text fused by reciprocal rank) with an embedding, full text without one; mode => vector '
    'or text to choose; filter in the filter language; model: refuse another model''s vector';


select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.vector_search(vector, integer, jsonb, text[], integer, integer)'),
    'SETOF pgrag.search_hit');

create or replace function pgrag.vector_search(
    query_embedding vector,
    k integer default null,
    filter jsonb default null,
    doc_types text[] default null,
    ef_search integer default null,
    exact_threshold integer default null)
returns setof pgrag.search_hit
language sql stable security invoker
as $$
    select * from pgrag._search('vector', null, query_embedding, k, filter, doc_types, null,
                                null, ef_search, exact_threshold, null, null, null)
$$;

comment on function pgrag.vector_search(vector, integer, jsonb, text[], integer, integer) is
    'The k chunks nearest to an embedding (cosine), among those matching the filter';


select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.hybrid_search(text, vector, integer, jsonb, text[], text, integer, integer, integer, '
    'integer)'), 'SETOF pgrag.search_hit');

create or replace function pgrag.hybrid_search(
    query_text text,
    query_embedding vector,
    k integer default null,
    filter jsonb default null,
    doc_types text[] default null,
    match text default null,
    candidates integer default null,
    rrf_k integer default null,
    ef_search integer default null,
    exact_threshold integer default null)
returns setof pgrag.search_hit
language sql stable security invoker
as $$
    select * from pgrag._search('hybrid', query_text, query_embedding, k, filter, doc_types,
                                match, candidates, ef_search, exact_threshold, rrf_k, null, null)
$$;

comment on function pgrag.hybrid_search(text, vector, integer, jsonb, text[], text, integer,
                                        integer, integer, integer) is
    'Vector and full-text search fused by reciprocal rank (1 / (rrf_k + rank)), one statement';


select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.text_search(text, integer, jsonb, text[], text)'), 'SETOF pgrag.search_hit');

create or replace function pgrag.text_search(
    query_text text,
    k integer default null,
    filter jsonb default null,
    doc_types text[] default null,
    match text default null)
returns setof pgrag.search_hit
language sql stable security invoker
as $$
    select * from pgrag._search('text', query_text, null, k, filter, doc_types, match, null,
                                null, null, null, null, null)
$$;

comment on function pgrag.text_search(text, integer, jsonb, text[], text) is
    'Full-text search ranked by ts_rank, for stores or users without an embedder';


-- The vector-only search of earlier releases, pgrag.search(embedding, ...): a deprecated alias
-- of pgrag.vector_search for one release (CHANGELOG.md).
select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.search(vector, integer, jsonb, text[], integer, integer)'), 'SETOF pgrag.search_hit');

create or replace function pgrag.search(
    query_embedding vector,
    k integer default null,
    filter jsonb default null,
    doc_types text[] default null,
    ef_search integer default null,
    exact_threshold integer default null)
returns setof pgrag.search_hit
language sql stable security invoker
as $$
    select * from pgrag.vector_search(query_embedding, k, filter, doc_types, ef_search,
                                      exact_threshold)
$$;

comment on function pgrag.search(vector, integer, jsonb, text[], integer, integer) is
    'Deprecated: pgrag.vector_search (pgrag.search with a text first is the hybrid search)';


create or replace function pgrag.ranked(by_key text, filter jsonb default null,
                                        doc_types text[] default null,
                                        descending boolean default true,
                                        k integer default null)
returns setof pgrag.search_hit
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The k chunks matching the filter with the largest (descending) or smallest values of a
-- numeric metadata key: "the customers with the most returns", "the 5 largest orders". Exact
-- (every matching chunk is compared), one statement; score is the key's value, scan 'ranked'.
declare
    schema jsonb;
    kk integer := coalesce(k, pgrag._search_default('k'));
begin
    perform pgrag._check_range('k', kk, 1, 10000);
    if doc_types is not null then
        perform pgrag._check_names(doc_types, 'doc_types');
    end if;
    schema := pgrag._filter_schema(doc_types);
    if by_key is null or coalesce(schema ->> by_key, '') not in ('integer', 'numeric') then
        perform pgrag._filter_invalid(format(
            'cannot rank by %s: not a numeric metadata key of %s (numeric keys: %s)',
            coalesce(quote_literal(by_key), 'NULL'),
            coalesce(array_to_string(doc_types, ', '), 'any declared type'),
            coalesce((select string_agg(e.key, ', ' order by e.key) from jsonb_each_text(schema) e
                       where e.value in ('integer', 'numeric')), 'none')));
    end if;
    return query execute format($q$
        select c.id, c.doc_type, c.source_key, c.text, c.metadata, r.v::double precision,
               null::double precision, null::integer, null::integer, null::real, c.parent_id,
               p.source_key, p.text, 'ranked'::text
          from pgrag.chunks c
         cross join lateral (
             select case when jsonb_typeof(c.metadata -> %2$L) = 'number'
                         then (c.metadata ->> %2$L)::numeric end as v) r
          left join pgrag.chunks p on p.id = c.parent_id
         where %1$s and ($1 is null or c.doc_type = any($1)) and r.v is not null
         order by r.v %3$s, c.id
         limit $2$q$,
        pgrag._filter_sql(filter, schema), by_key,
        case when descending then 'desc' else 'asc' end)
    using doc_types, kk;
end
$$;

comment on function pgrag.ranked(text, jsonb, text[], boolean, integer) is
    'The k chunks matching a filter with the largest (or smallest) values of a numeric metadata '
    'key: ranking by a number instead of by similarity';


create or replace function pgrag.context(chunk_id bigint, max_children integer default 20)
returns table (relation text, id bigint, doc_type text, source_key text, parent_id bigint,
               text text, metadata jsonb)
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select 'chunk', c.id, c.doc_type, c.source_key, c.parent_id, c.text, c.metadata
    from pgrag.chunks c where c.id = chunk_id
    union all
    select 'parent', p.id, p.doc_type, p.source_key, p.parent_id, p.text, p.metadata
    from pgrag.chunks c join pgrag.chunks p on p.id = c.parent_id where c.id = chunk_id
    union all
    (select 'child', k.id, k.doc_type, k.source_key, k.parent_id, k.text, k.metadata
     from pgrag.chunks k where k.parent_id = chunk_id
     order by k.id limit max_children)
    union all
    (select 'sibling', s.id, s.doc_type, s.source_key, s.parent_id, s.text, s.metadata
     from pgrag.chunks c join pgrag.chunks s on s.parent_id = c.parent_id and s.id <> c.id
     where c.id = chunk_id
     order by s.id limit max_children)
$$;

comment on function pgrag.context(bigint, integer) is
    'A chunk with its parent, its children and its siblings (up to max_children each)';



create or replace function pgrag.check_filter(filter jsonb, doc_types text[] default null)
returns text
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select pgrag._filter_sql(filter, pgrag._filter_schema(doc_types))
$$;

comment on function pgrag.check_filter(jsonb, text[]) is
    'Check a filter against the metadata of doc_types (all when NULL): PR005 naming what is '
    'valid, or the SQL condition it compiles to (alias c)';
