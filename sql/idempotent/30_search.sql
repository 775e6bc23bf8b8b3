-- Search: vector (HNSW, filtered with iterative scans or an exact scan), full text, reciprocal
-- Introduced by revision 0004: applied by that revision and every later one.
-- rank fusion, exact statistics per document type, and context expansion. Re-applied by every
-- migration that reaches head. Every function: schema pgrag, declared volatility, security
-- invoker, fixed search_path. SQLSTATEs (pgrag/errors.py): PR002 dimension mismatch,
-- PR003 invalid declaration, PR006 invalid argument.
--
-- The Python client (pgrag/search.py) builds the same statement with psycopg.sql, with the full
-- filter language in its WHERE; these functions take a metadata containment filter
-- (`metadata @> filter`) and a list of document types. docs/search.md explains the statement.
--
-- pgvector's operators live in the extension's schema, which the fixed search path does not
-- hold: the statements are built with format() and OPERATOR(<schema>.<=>).

create or replace function pgrag.stats_common_lexemes(min_fraction real, min_rows bigint)
returns text[]
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The lexemes in at least min_fraction of the chunks and in at least min_rows of them, from
-- the planner's statistics of pgrag.chunks.tsv as the calling role sees them in pg_stats
-- (after ANALYZE; none before it, and none while row-level security applies to the role).
begin
    if (select c.reltuples from pg_class c where c.oid = 'pgrag.chunks'::regclass)
       < min_rows then
        return '{}';
    end if;
    return (select coalesce(array_agg(u.e order by u.e), '{}')
            from pg_stats s
            cross join lateral unnest(s.most_common_elems::text::text[],
                                      s.most_common_elem_freqs) as u(e, f)
            where s.schemaname = 'pgrag' and s.tablename = 'chunks' and s.attname = 'tsv'
              and u.e is not null and u.f >= min_fraction
              and u.f * (select c.reltuples from pg_class c
                         where c.oid = 'pgrag.chunks'::regclass) >= min_rows);
end
$$;

comment on function pgrag.stats_common_lexemes(real, bigint) is
    'Lexemes in at least min_fraction and min_rows of the chunks (pg_stats of chunks.tsv)';

create or replace function pgrag.common_lexemes(min_fraction real default 0.05,
                                                min_rows bigint default 20000)
returns text[]
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The words a search for any of a question's words leaves out (pgrag.search_tsquery): at
-- 1,000,000 chunks a word like "order" that is in most of them reads a posting list of hundreds
-- of thousands of rows and ranks them, for a word that tells no chunk from another. Small
-- stores (fewer than min_rows chunks) leave out nothing. From revision 0006, 40_security.sql
-- replaces this with a version that reads the statistics for the roles that see every tenant.
return pgrag.stats_common_lexemes(min_fraction, min_rows);

comment on function pgrag.common_lexemes(real, bigint) is
    'The lexemes an any-word search leaves out: in at least min_fraction and min_rows chunks';

create or replace function pgrag.search_tsquery(query_text text, match text,
                                                common_lexemes text[])
returns tsquery
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if match = 'all' then
        -- web search syntax: words all required, "quoted phrases", or, -negation
        return websearch_to_tsquery('english'::regconfig, query_text);
    elsif match = 'any' then
        -- any of the question's words (stemmed, stop words dropped) but the common ones
        -- (pgrag.common_lexemes): for natural-language questions, where requiring every word
        -- usually matches nothing. When every word is common, all of them (slow, not empty).
        return (with w as (
                    select l, common_lexemes is null or l <> all(common_lexemes) as rare
                    from unnest(tsvector_to_array(
                             to_tsvector('english'::regconfig, query_text))) l)
                select string_agg(quote_literal(w.l), ' | ' order by w.l)::tsquery
                from w
                where w.rare or not exists (select from w where w.rare));
    end if;
    raise exception using
        errcode = 'PR006',
        message = format('text match %L is not all or any', match),
        hint = 'use match => ''all'' (every word, web search syntax) or ''any'' (any word)';
end
$$;

comment on function pgrag.search_tsquery(text, text, text[]) is
    'The tsquery of a search text: all = websearch_to_tsquery (every word), any = any word '
    'but the given common lexemes';

create or replace function pgrag.text_query(query_text text, match text default 'all')
returns tsquery
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
    select pgrag.search_tsquery(query_text, match, null)
$$;

comment on function pgrag.text_query(text, text) is
    'The tsquery of a search text: all = websearch_to_tsquery (every word), any = any word';

create or replace function pgrag.stats_statement(stats_sql text, hits_where text,
                                                 materialized boolean default false)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The one statement every statistics call runs: a type's declared query (stats_sql) over the
-- CTE hits, its chunks matching hits_where (alias c). The newline ends a `--` comment the
-- declared query may end with.
return format(
    'with hits as %s(select c.id, c.doc_type, c.source_key, c.parent_id, c.parent_key, '
    'c.metadata, c.text from pgrag.chunks c where %s) '
    'select s.stats::jsonb from (%s',
    case when materialized then 'materialized ' else '' end, hits_where, stats_sql)
    || E'\n) as s(stats)';

comment on function pgrag.stats_statement(text, text, boolean) is
    'The statement of a statistics call: the declared query over the CTE hits (its columns '
    'defined here once)';

create or replace function pgrag.declare_stats(doc_type text, stats_sql text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pgrag.doc_types t where t.name = declare_stats.doc_type) then
        raise exception using
            errcode = 'PR003',
            message = format('document type %s is not declared', doc_type),
            hint = 'declare it first with pgrag.declare_document, then its statistics';
    end if;
    if stats_sql is null then
        delete from pgrag.doc_stats s where s.doc_type = declare_stats.doc_type;
        return;
    end if;
    -- Compile and run it once over no rows: a query that does not parse, names a missing
    -- table, or does not return one jsonb column fails here, not in a user's search.
    begin
        -- (one statement: a `;` after a closing parenthesis cannot add statements of its own)
        perform pgrag.check_one_statement(pgrag.stats_statement(stats_sql, 'false'));
    exception when others then
        raise exception using
            errcode = 'PR003',
            message = format('the statistics query of %s does not work over no rows: %s',
                             doc_type, sqlerrm),
            hint = 'write one SELECT returning one jsonb over the CTE hits (id, doc_type, '
                   'source_key, parent_id, parent_key, metadata, text), schema-qualifying tables';
    end;
    insert into pgrag.doc_stats as s (doc_type, stats_sql)
    values (declare_stats.doc_type, stats_sql)
    on conflict on constraint doc_stats_pkey
    do update set stats_sql = excluded.stats_sql, updated_at = now();
end
$$;

comment on function pgrag.declare_stats(text, text) is
    'Declare (or, with NULL, remove) the exact statistics of a document type: a SELECT over the '
    'CTE hits returning one jsonb';

-- From revision 0006, 40_security.sql replaces this with an invoker version that hands a
-- reader's call to the security definer pgrag.reader_doc_type_stats.
create or replace function pgrag.doc_type_stats(doc_type text, chunk_ids bigint[])
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    body text;
    result jsonb;
begin
    select s.stats_sql into body from pgrag.doc_stats s where s.doc_type = doc_type_stats.doc_type;
    if body is null then
        return null;
    end if;
    execute pgrag.stats_statement(body, 'c.id = any($1) and c.doc_type = $2', true)
        into result using chunk_ids, doc_type;
    return result;
end
$$;

comment on function pgrag.doc_type_stats(text, bigint[]) is
    'Run the declared statistics query of a document type over the given chunks (the CTE hits)';

create or replace function pgrag.stats(filter jsonb default null, doc_types text[] default null)
returns jsonb
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(jsonb_object_agg(s.doc_type, pgrag.doc_type_stats(
               s.doc_type,
               array(select c.id from pgrag.chunks c
                     where c.doc_type = s.doc_type
                       and (filter is null or c.metadata @> filter)))), '{}'::jsonb)
    from pgrag.doc_stats s
    where doc_types is null or s.doc_type = any(doc_types)
$$;

comment on function pgrag.stats(jsonb, text[]) is
    'Exact statistics over every chunk matching metadata @> filter, per document type with '
    'declared statistics: {"doc_type": {...}, ...}';

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

create or replace function pgrag.estimate_rows(condition text)
returns double precision
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The planner's estimate of the chunks (alias c) matching `condition`, a boolean SQL expression
-- with its values written as literals: `EXPLAIN` plans it without running it (about 0.1 ms).
-- The search statements use it to skip counting the matches of a filter the planner expects to
-- match many rows. One statement only; planning may evaluate immutable functions with constant
-- arguments, as the calling role.
declare
    cur refcursor;
    plan json;
begin
    -- a cursor refuses a string of several statements (pgrag.check_one_statement)
    open cur no scroll for execute
        'explain (format json) select from pgrag.chunks c where ' || condition;
    fetch cur into plan;
    close cur;
    return (plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
end
$$;

comment on function pgrag.estimate_rows(text) is
    'The planner''s estimate of the chunks (alias c) matching a condition with literal values';

-- The one statement behind search, hybrid_search and text_search (and the shape pgrag/search.py
-- builds). mode: vector, hybrid or text.
--   matched / counted: the filter's matching rows with their distances, up to exact_threshold,
--   and how many; skipped (counted as exact_threshold) when the planner expects 5 x
--   exact_threshold or more (pgrag.estimate_rows).
--   vec_index: at exact_threshold or more, the HNSW index with an iterative scan until kc
--   candidates pass the filter. path: exact when fewer rows match, or when the index came back
--   with fewer than kc rows (max_scan_tuples reached); vec_exact then takes matched's rows when
--   it holds them all, or compares every matching vector again.
--   fts: full-text matches ranked by ts_rank (the first fts_limit matching rows; ts_rank_cd,
--   which weighs how close the words are, cost three times as much for no better answers).
--   fused: reciprocal rank fusion, 1 / (rrf_k + rank) summed over the two lists.
create or replace function pgrag.filter_index_keys()
returns text[]
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The top-level keys of the filters of the store's filter indexes (pgrag/filter_index.py:
-- partial HNSW indexes named chunks_embedding_hnsw_f_*, their filter JSON as the comment).
-- Searches give these keys a condition of their own, which the planner matches against
-- the indexes' predicates. A comment that is not a JSON object is not a filter: skipped.
declare
    d text;
    keys text[] := '{}';
begin
    for d in select obj_description(x.indexrelid, 'pg_class')
               from pg_index x
               join pg_class i on i.oid = x.indexrelid
              where x.indrelid = 'pgrag.chunks'::regclass
                and i.relname like 'chunks\_embedding\_hnsw\_f\_%' loop
        begin
            if jsonb_typeof(d::jsonb) = 'object' then
                keys := keys || array(select jsonb_object_keys(d::jsonb));
            end if;
        exception when invalid_text_representation then
            null;
        end;
    end loop;
    return array(select distinct k from unnest(keys) as u(k) order by k);
end
$$;

comment on function pgrag.filter_index_keys() is
    'The top-level keys of the filter indexes'' filters, which searches split out';

create or replace function pgrag.run_search(
    mode text,
    query_text text,
    query_embedding vector,
    k integer,
    filter jsonb,
    doc_types text[],
    match text,
    candidates integer,
    ef_search integer,
    exact_threshold integer,
    rrf_k integer,
    fts_limit integer)
returns table (id bigint, doc_type text, source_key text, text text, metadata jsonb,
               score double precision, distance double precision, vector_rank integer,
               text_rank integer, text_score real, parent_id bigint, parent_source_key text,
               parent_text text, scan text)
language plpgsql volatile security invoker
-- The function's SET clauses make the set_config(..., true) calls below local to the call:
-- the caller's settings are restored when it returns.
set search_path = pg_catalog, pg_temp
set hnsw.iterative_scan = 'relaxed_order'
set hnsw.ef_search = 40
set hnsw.max_scan_tuples = 20000
as $$
declare
    vs name;
    op text;
    where_sql text := 'true';
    estimate_sql text := 'true';  -- where_sql with literal values, for pgrag.estimate_rows
    filter_sql text;
    split text[];
    has_filter boolean := filter is not null or doc_types is not null;
    kc integer;
    stmt text;
begin
    if mode not in ('vector', 'hybrid', 'text') then
        raise exception using errcode = 'PR006',
            message = format('search mode %L is not vector, hybrid or text', mode),
            hint = 'call pgrag.search, pgrag.hybrid_search or pgrag.text_search';
    end if;
    if k is null or k < 1 or k > 10000 then
        raise exception using errcode = 'PR006',
            message = format('k = %s is out of range', k),
            hint = 'ask for 1 to 10000 results';
    end if;
    if mode <> 'text' then
        if query_embedding is null then
            raise exception using errcode = 'PR006',
                message = 'query_embedding is null',
                hint = 'pass the question''s embedding from the store''s model (or use pgrag.text_search)';
        end if;
        perform pgrag.check_dimension(cardinality(query_embedding::real[]));
    end if;
    if mode <> 'vector' and query_text is null then
        raise exception using errcode = 'PR006',
            message = 'query_text is null',
            hint = 'pass the search text (or use pgrag.search with an embedding)';
    end if;
    if filter is not null and jsonb_typeof(filter) <> 'object' then
        raise exception using errcode = 'PR005',
            message = format('filter %s is not a JSON object', filter),
            hint = 'pass a containment filter like ''{"segment": "VIP"}''::jsonb';
    end if;
    exact_threshold := coalesce(exact_threshold, 2000);
    kc := greatest(coalesce(candidates, case when mode = 'vector' then 2 * k else 4 * k end), k);
    select n.nspname into strict vs
    from pg_catalog.pg_extension e join pg_catalog.pg_namespace n on n.oid = e.extnamespace
    where e.extname = 'vector';
    op := format('OPERATOR(%I.<=>)', vs);
    if filter is not null then
        -- as the Python client compiles a filter: the keys of filter indexes (pgrag
        -- filter-index) one containment each, so that the planner proves such an index's
        -- predicate; the other keys in one containment, which it estimates jointly
        split := pgrag.filter_index_keys();
        filter_sql := case when filter - split = '{}'::jsonb then ''
                           else format(' and c.metadata @> %L::jsonb', filter - split) end;
        select filter_sql || coalesce(string_agg(
                   format(' and c.metadata @> %L::jsonb', jsonb_build_object(e.key, e.value)),
                   '' order by e.key), '')
          into filter_sql
          from jsonb_each(filter) e
         where e.key = any(split);
        where_sql := where_sql || filter_sql;
        estimate_sql := estimate_sql || filter_sql;
    end if;
    if doc_types is not null then
        where_sql := where_sql || ' and c.doc_type = any($6)';
        estimate_sql := estimate_sql || format(' and c.doc_type = any(%L::text[])', doc_types);
    end if;
    -- No ef_search given: at least the database default `pgrag tune` stored (pgrag/tune.py).
    perform set_config('hnsw.ef_search',
                       greatest(coalesce(ef_search, 2 * kc), kc, 40,
                                case when ef_search is null
                                      and current_setting('pgrag.ef_search', true) ~ '^[0-9]{1,4}$'
                                     then least(current_setting('pgrag.ef_search', true)::integer,
                                                1000)
                                end)::text, true);
    perform set_config('hnsw.max_scan_tuples',
                       greatest(20000, 200 * kc)::text, true);
    stmt := 'with ';
    if mode <> 'text' then
        -- Without a filter the count is skipped and the index runs at once; it may still come
        -- back short (row-level security filters a reader's search: a small tenant in a large
        -- store), and then every visible vector is compared, as behind a filter.
        stmt := stmt || format($f$
est as materialized (select %3$s as skip),
matched as materialized (
    select c.id, c.embedding %2$s $3 as distance
    from pgrag.chunks c
    where %1$s and c.embedding is not null and not (select skip from est)
    limit $10),
counted as materialized (
    select case when (select skip from est) then $10::bigint
                else (select count(*) from matched) end as n),
vec_index as materialized (
    select c.id, c.embedding %2$s $3 as distance
    from pgrag.chunks c
    where %1$s and c.embedding is not null and (select n from counted) >= $10
    order by c.embedding %2$s $3
    limit $8),
path as materialized (
    select case when (select n from counted) >= $10 and (select count(*) from vec_index) >= $8
                then 'index' else 'exact' end as scan),
vec_exact as (
    (select m.id, m.distance
     from matched m
     where (select n from counted) < $10
     order by m.distance, m.id
     limit $8)
    union all
    (select c.id, c.embedding %2$s $3 as distance
     from pgrag.chunks c
     where %1$s and c.embedding is not null
       and (select n from counted) >= $10 and (select scan from path) = 'exact'
     order by (c.embedding %2$s $3) + 0, c.id
     limit $8)),
vec as (
    select u.id, u.distance, row_number() over (order by u.distance, u.id)::integer as rank
    from (select * from vec_exact
          union all
          select * from vec_index where (select scan from path) = 'index') u),
$f$, where_sql, op,
                case when has_filter
                     then format('pgrag.estimate_rows(%L) >= 5::bigint * $10', estimate_sql)
                     else 'true' end);
    end if;
    if mode <> 'vector' then
        stmt := stmt || format($f$
tq as materialized (select pgrag.search_tsquery($2, $7, pgrag.common_lexemes()) as q),
fts_rows as (
    select c.id, c.tsv
    from pgrag.chunks c
    where c.tsv @@ (select q from tq) and %1$s
    limit $12),
fts_scored as (
    select r.id, ts_rank(r.tsv, (select q from tq)) as score from fts_rows r),
fts as (
    select r.id, r.score, row_number() over (order by r.score desc, r.id)::integer as rank
    from fts_scored r
    order by rank
    limit $8),
$f$, where_sql);
    end if;
    stmt := stmt || case mode
        when 'vector' then $f$
fused as (
    select v.id, 1 - v.distance as score, v.distance, v.rank as vector_rank,
           null::integer as text_rank, null::real as text_score
    from vec v order by v.rank limit $4)
$f$
        when 'text' then $f$
fused as (
    select f.id, f.score::double precision as score, null::double precision as distance,
           null::integer as vector_rank, f.rank as text_rank, f.score as text_score
    from fts f order by f.rank limit $4)
$f$
        else $f$
fused as (
    select coalesce(v.id, f.id) as id,
           coalesce(1.0 / ($11 + v.rank), 0) + coalesce(1.0 / ($11 + f.rank), 0) as score,
           v.distance, v.rank as vector_rank, f.rank as text_rank, f.score as text_score
    from vec v full outer join fts f on f.id = v.id
    order by 2 desc, 1 limit $4)
$f$ end;
    stmt := stmt || format($f$
select c.id, c.doc_type, c.source_key, c.text, c.metadata, f.score::double precision,
       f.distance::double precision, f.vector_rank, f.text_rank, f.text_score::real,
       c.parent_id, p.source_key, p.text,
       %1$s
from fused f
join pgrag.chunks c on c.id = f.id
left join pgrag.chunks p on p.id = c.parent_id
order by f.score desc, f.id
$f$, case when mode = 'text' then '''text''::text' else '(select scan from path)' end);
    return query execute stmt
        using mode, query_text, query_embedding, k, filter, doc_types, match, kc, ef_search,
              exact_threshold, rrf_k, fts_limit;
end
$$;

comment on function pgrag.run_search(text, text, vector, integer, jsonb, text[], text, integer,
                                     integer, integer, integer, integer) is
    'The one search statement behind pgrag.search, pgrag.hybrid_search and pgrag.text_search';

create or replace function pgrag.search(
    query_embedding vector,
    k integer default 10,
    filter jsonb default null,
    doc_types text[] default null,
    ef_search integer default null,
    exact_threshold integer default 2000)
returns table (id bigint, doc_type text, source_key text, text text, metadata jsonb,
               score double precision, distance double precision, vector_rank integer,
               text_rank integer, text_score real, parent_id bigint, parent_source_key text,
               parent_text text, scan text)
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    select * from pgrag.run_search('vector', null, query_embedding, k, filter, doc_types, 'all',
                                   null, ef_search, exact_threshold, 60, 0)
$$;

comment on function pgrag.search(vector, integer, jsonb, text[], integer, integer) is
    'The k chunks nearest to an embedding (cosine), among those matching metadata @> filter';

create or replace function pgrag.hybrid_search(
    query_text text,
    query_embedding vector,
    k integer default 10,
    filter jsonb default null,
    doc_types text[] default null,
    match text default 'any',
    candidates integer default null,
    rrf_k integer default 60,
    ef_search integer default null,
    exact_threshold integer default 2000)
returns table (id bigint, doc_type text, source_key text, text text, metadata jsonb,
               score double precision, distance double precision, vector_rank integer,
               text_rank integer, text_score real, parent_id bigint, parent_source_key text,
               parent_text text, scan text)
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    select * from pgrag.run_search('hybrid', query_text, query_embedding, k, filter, doc_types,
                                   match, candidates, ef_search, exact_threshold, rrf_k, 10000)
$$;

comment on function pgrag.hybrid_search(text, vector, integer, jsonb, text[], text, integer,
                                        integer, integer, integer) is
    'Vector and full-text search fused by reciprocal rank (1 / (rrf_k + rank)), one statement';

create or replace function pgrag.text_search(
    query_text text,
    k integer default 10,
    filter jsonb default null,
    doc_types text[] default null,
    match text default 'all')
returns table (id bigint, doc_type text, source_key text, text text, metadata jsonb,
               score double precision, distance double precision, vector_rank integer,
               text_rank integer, text_score real, parent_id bigint, parent_source_key text,
               parent_text text, scan text)
language sql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
    select * from pgrag.run_search('text', query_text, null, k, filter, doc_types, match,
                                   null, null, null, 60, 10000)
$$;

comment on function pgrag.text_search(text, integer, jsonb, text[], text) is
    'Full-text search ranked by ts_rank, for stores or users without an embedder';
