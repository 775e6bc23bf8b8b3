-- Search, internals: the tsquery of a search text, the words an any-word search leaves out, the
-- planner's estimate of a filter, the filter indexes' keys, and the one search statement behind
-- the SQL API (docs/search.md explains the statement).
--
-- pgvector's operators live in the extension's schema, which the fixed search path does not
-- hold: the statements are built with format() and OPERATOR(<schema>.<=>).

create or replace function pgrag._stats_common_lexemes(min_fraction real, min_rows bigint)
returns text[]
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The lexemes in at least min_fraction of the chunks and in at least min_rows of them, from
-- the planner's statistics of pgrag.chunks.tsv as the calling role sees them in pg_stats
-- (after ANALYZE; none before it, and none while row-level security applies to the role).
-- Their frequencies are of the rows that have a tsvector: taken for every row's, those still
-- waiting for theirs (pgrag.index_text) being few (only small commits that ask to leave them,
-- pgrag.tsvector = worker: scaling by their share made a word common or not depending on when
-- ANALYZE ran; found by review).
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

comment on function pgrag._stats_common_lexemes(real, bigint) is
    'Lexemes in at least min_fraction and min_rows of the chunks (pg_stats of chunks.tsv)';


create or replace function pgrag._common_lexemes(min_fraction real default 0.05,
                                                min_rows bigint default 20000)
returns text[]
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
-- security definer, owned by the migrating role (the owner of pgrag.chunks): pg_stats hides the
-- statistics of a table while row-level security applies to the role asking, and it applies to
-- the writer role too (its policy lets it see everything, but is a policy). The words are read
-- for the roles that see every tenant anyway; a reader gets none, since the most common words
-- of all chunks would tell it about other tenants' chunks.
begin
    if not pgrag._sees_all_tenants() then
        return '{}';
    end if;
    return pgrag._stats_common_lexemes(min_fraction, min_rows);
end
$$;

comment on function pgrag._common_lexemes(real, bigint) is
    'The lexemes an any-word search leaves out: in at least min_fraction and min_rows chunks '
    '(none for a reader; security definer)';


create or replace function pgrag._search_tsquery(query_text text, match text,
                                                common_lexemes text[])
returns tsquery
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if match = 'all' then
        -- web search syntax: words all required, "quoted phrases", or, -negation
        return websearch_to_tsquery('english'::regconfig, query_text);
    elsif match = 'phrase' then
        -- the words in this order (stop words keep their places)
        return phraseto_tsquery('english'::regconfig, query_text);
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
        message = format('text match %L is not any, all or phrase', match),
        hint = 'use match => ''any'' (any word), ''all'' (every word, web search syntax) or '
               '''phrase'' (the words in order)';
end
$$;

comment on function pgrag._search_tsquery(text, text, text[]) is
    'The tsquery of a search text: all = websearch_to_tsquery (every word), any = any word '
    'but the given common lexemes';


create or replace function pgrag._filter_index_keys()
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

comment on function pgrag._filter_index_keys() is
    'The top-level keys of the filter indexes'' filters, which searches split out';



create or replace function pgrag._search_default(name text)
returns integer
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The search's tuning constants, in one place (docs/search.md says how each was chosen).
return case name
    when 'k' then 10
    when 'exact_threshold' then 2000   -- fewer matching rows: compare every vector (exact)
    when 'rrf_k' then 60               -- reciprocal rank fusion: 1 / (rrf_k + rank)
    when 'fts_limit' then 10000        -- full-text matches ranked at most
    -- how long a session keeps what a search decided from the store's state rather than its
    -- arguments (the filter's row estimate, pgrag._filter_estimate; a client's plan, pgrag/
    -- search.py): it moves with the table's statistics, the tuned ef_search, the declarations
    when 'plan_keep_s' then 60
    -- a statement longer than this (a filter of long $in lists) is never prepared: 19
    -- statements of 890 KB filters held 192 MB of a pooled backend (an unfiltered one: 2,200)
    when 'prepare_chars' then 16000
    end;

comment on function pgrag._search_default(text) is
    'The search''s defaults: k, exact_threshold, rrf_k, fts_limit, plan_keep_s, prepare_chars';


create or replace function pgrag._search_statement(mode text, where_sql text, skip_count boolean,
                                                   vector_schema name, bound jsonb default null,
                                                   tenant_sql text default null)
returns text
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The one search statement (docs/search.md explains it), for pgrag._search to run. where_sql:
-- the chunks' condition (alias c), values as literals (pgrag._filter_sql). skip_count: the
-- planner expects so many matching rows that counting them is skipped and the index runs at
-- once. Parameters: $1 query text, $2 query vector, $3 k, $4 kc (candidates per list),
-- $5 exact_threshold, $6 rrf_k, $7 fts_limit, $8 match. bound (k, kc, exact_threshold, rrf_k,
-- fts_limit, match): $3 to $8 written as these values instead, so that the statement's plan,
-- its limits known, can be prepared once and reused (pgrag._search); they go in by the same
-- format() as where_sql, whose literals are never scanned for $n. tenant_sql: on a partitioned store, the
-- condition on the tenants the search sees (pgrag._search_tenants, also in where_sql), so that
-- fetching the hits reads only their partitions. A chain of CTEs:
--   matched / counted: the filter's matching rows with their distances, up to exact_threshold,
--     and how many (skipped: counted as exact_threshold); a count that reaches it, where the
--     planner expected fewer, is kept as the filter's estimate for the session
--     (pgrag._filter_estimate_keep), so that its next plan skips the count;
--   vec_index: at exact_threshold or more, the HNSW index with pgvector's iterative scan
--     (hnsw.iterative_scan = relaxed_order), which keeps walking the graph until kc rows pass
--     the filter; materialized and re-sorted (relaxed order may be slightly out of order);
--   path: exact below the threshold, or when the index came back with fewer than kc rows (it
--     stopped at hnsw.max_scan_tuples, or row-level security filtered a reader's rows);
--   vec_exact: when the path is exact, every matching vector is compared: those of matched
--     when it holds them all, else all over again (+ 0 keeps the planner off the HNSW index);
--   fts: full-text matches ranked by ts_rank, every match ranked (the fts_limit best kept:
--     the same texts give the same ranking, whatever the rows' physical order), match any
--     leaving out the words in most chunks of a large store (pgrag._common_lexemes); a chunk
--     whose tsvector the worker has not filled in yet (left by a render at a writer's commit)
--     is matched and ranked on its text's, computed here, found by the index of those chunks
--     alone (chunks_tsv_pending);
--   fused: reciprocal rank fusion, 1 / (rrf_k + rank) summed over both lists, and each
--     list's first counted twice: what one leg is sure of is not outvoted by hits both legs
--     put lower (docs/search.md, "Fusion");
--   the final SELECT joins each hit to its chunk and its parent chunk.
declare
    op text := case when mode <> 'text' then format('OPERATOR(%I.<=>)', vector_schema) end;
    -- args, never read: it gives $1 and $2 their types in every mode, so that a client may
    -- bind both whichever one the mode reads (a parameter no statement types is an error)
    tpl text := $f$with
args as (select $1::text as query_text, $2::%12$s as query_embedding),$f$;
begin
    if mode <> 'text' then
        tpl := tpl || $f$
matched as materialized (
    select c.id, c.embedding %2$s $2 as distance
    from pgrag.chunks c
    where %1$s and c.embedding is not null and not %3$s
    limit %8$s),
counted as materialized (
    select case when %3$s then %8$s::bigint
                else (select case when m.n >= %8$s
                                  then pgrag._filter_estimate_keep(%13$s, m.n)::bigint
                                  else m.n end
                      from (select count(*) as n from matched) m) end as n),
vec_index as materialized (
    select c.id, c.embedding %2$s $2 as distance
    from pgrag.chunks c
    where %1$s and c.embedding is not null and (select n from counted) >= %8$s
    order by c.embedding %2$s $2
    limit %7$s),
path as materialized (
    select case when (select n from counted) >= %8$s and (select count(*) from vec_index) >= %7$s
                then 'index' else 'exact' end as scan),
vec_exact as (
    (select m.id, m.distance
     from matched m
     where (select n from counted) < %8$s
     order by m.distance, m.id
     limit %7$s)
    union all
    (select c.id, c.embedding %2$s $2 as distance
     from pgrag.chunks c
     where %1$s and c.embedding is not null
       and (select n from counted) >= %8$s and (select scan from path) = 'exact'
     order by (c.embedding %2$s $2) + 0, c.id
     limit %7$s)),
vec as (
    select u.id, u.distance, row_number() over (order by u.distance, u.id)::integer as rank
    from (select * from vec_exact
          union all
          select * from vec_index where (select scan from path) = 'index') u),
$f$;
    end if;
    if mode <> 'vector' then
        tpl := tpl || $f$
tq as materialized (select pgrag._search_tsquery($1, %11$s, pgrag._common_lexemes()) as q),
fts_scored as (
    select c.id, ts_rank(coalesce(c.tsv, pgrag.text_tsvector(c.text)), (select q from tq)) as score
    from pgrag.chunks c
    where (c.tsv @@ (select q from tq)
           or (c.tsv is null and pgrag.text_tsvector(c.text) @@ (select q from tq)))
      and %1$s
    order by 2 desc, c.id
    limit %10$s),
fts as (
    select r.id, r.score, row_number() over (order by r.score desc, r.id)::integer as rank
    from fts_scored r
    order by rank
    limit %7$s),
$f$;
    end if;
    tpl := tpl || case mode
        when 'vector' then $f$
fused as (
    select v.id, 1 - v.distance as score, v.distance, v.rank as vector_rank,
           null::integer as text_rank, null::real as text_score
    from vec v order by v.rank limit %6$s)
$f$
        when 'text' then $f$
fused as (
    select f.id, f.score::double precision as score, null::double precision as distance,
           null::integer as vector_rank, f.rank as text_rank, f.score as text_score
    from fts f order by f.rank limit %6$s)
$f$
        else $f$
fused as (
    select coalesce(v.id, f.id) as id,
           coalesce(1.0 / (%9$s + v.rank), 0) + coalesce(1.0 / (%9$s + f.rank), 0)
           + case when v.rank = 1 then 1.0 / (%9$s + 1) else 0 end
           + case when f.rank = 1 then 1.0 / (%9$s + 1) else 0 end as score,
           v.distance, v.rank as vector_rank, f.rank as text_rank, f.score as text_score
    from vec v full outer join fts f on f.id = v.id
    order by 2 desc, 1 limit %6$s)
$f$ end;
    tpl := tpl || $f$
select c.id, c.doc_type, c.source_key, c.text, c.metadata, f.score::double precision as score,
       f.distance::double precision as distance, f.vector_rank, f.text_rank,
       f.text_score::real as text_score, c.parent_id, p.source_key as parent_source_key,
       p.text as parent_text, %4$s as scan
from fused f
join pgrag.chunks c on c.id = f.id%5$s
left join pgrag.chunks p on p.id = c.parent_id
order by f.score desc, f.id
$f$;
    -- %6$s to %11$s: $3 to $8, or bound's values written in (one format, one pass over the
    -- text: replacing each $n in turn cost 24 of 27 µs)
    return format(tpl, where_sql, op, case when skip_count then 'true' else 'false' end,
                  case when mode = 'text' then '''text''::text' else '(select scan from path)' end,
                  coalesce(' and ' || tenant_sql, ''),
                  coalesce((bound ->> 'k')::integer::text, '$3'),
                  coalesce((bound ->> 'kc')::integer::text, '$4'),
                  coalesce((bound ->> 'exact_threshold')::integer::text, '$5'),
                  coalesce((bound ->> 'rrf_k')::integer::text, '$6'),
                  coalesce((bound ->> 'fts_limit')::integer::text, '$7'),
                  coalesce(quote_literal(bound ->> 'match') || '::text', '$8'),
                  format('%I.vector', vector_schema),
                  quote_literal(where_sql));
end
$$;

comment on function pgrag._search_statement(text, text, boolean, name, jsonb, text) is
    'The one search statement (CTEs: filter, HNSW or exact scan, full text, fusion)';


create or replace function pgrag._ef_search_value(setting text)
returns integer
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- A pgrag.ef_search setting's value: 1 to 4 digits, else NULL (ignored). The one rule for what
-- an administrator's ALTER DATABASE / ROLE SET pgrag.ef_search may hold: the search, `pgrag
-- status` and the tuner read it through this.
return case when setting ~ '^[0-9]{1,4}$' then setting::integer end;

comment on function pgrag._ef_search_value(text) is
    'A pgrag.ef_search setting''s value as an integer (1 to 4 digits), else NULL';


create or replace function pgrag._tuned_ef_search()
returns integer
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The ef_search this session's searches start from: an administrator's pgrag.ef_search
-- setting when it holds a value, else the store's (pgrag.settings.ef_search: `pgrag tune` and
-- the worker measure it), else NULL.
return coalesce(pgrag._ef_search_value(current_setting('pgrag.ef_search', true)),
                (select s.ef_search from pgrag.settings s));

comment on function pgrag._tuned_ef_search() is
    'The tuned ef_search searches start from (an administrator''s setting, else the store''s)';


create or replace function pgrag._filter_estimate(where_sql text)
returns double precision
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The planner's estimate of the chunks where_sql matches, which decides whether a search counts
-- the filter's matches first (pgrag._search_statement's skip_count). EXPLAIN costs 70 µs on a
-- warm backend, 0.18 ms between searches; its answer moves with the table's statistics and
-- size, not from one search to the next. So a session keeps it for a minute, as it keeps the
-- statement prepared for the same filter: the setting pgrag.filter_estimates holds
-- {key: [rows, epoch seconds]} for the 20 newest filters (key: a hash of the role and
-- where_sql). Only the session's own role keeps one: under a security definer function or SET
-- ROLE the estimate is another role's view of the table (row-level security enters it), which
-- the session's role could read there. Any role of the session may set that setting: a value
-- over 4,000 characters or not of that shape is ignored (never parsed: a deep or huge one
-- would fail or slow every search), numbers are read as numeric and clamped, and a value of
-- that shape only sends a search down the other path (count first, or the index at once),
-- whose cost is time, as of any wrong estimate (docs/search.md). (Volatile: EXPLAIN runs in
-- no other kind of function.)
declare
    fresh_s constant numeric := pgrag._search_default('plan_keep_s');
    now_s numeric := extract(epoch from clock_timestamp());
    hit jsonb;
    cur refcursor;
    plan json;
    estimate double precision;
begin
    if current_user = session_user then
        hit := pgrag._filter_estimates_held() -> pgrag._filter_estimate_key(where_sql);
        if hit is not null and (hit ->> 1)::numeric between now_s - fresh_s and now_s then
            return least(greatest(round((hit ->> 0)::numeric), 0), 1e15)::double precision;
        end if;
    end if;
    open cur no scroll for execute 'explain (format json) select from pgrag.chunks c where '
                                   || where_sql;
    fetch cur into plan;
    close cur;
    estimate := (plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
    return pgrag._filter_estimate_keep(where_sql, estimate);
end
$$;

comment on function pgrag._filter_estimate(text) is
    'The planner''s estimate of the chunks a filter matches, kept a minute per session';


create or replace function pgrag._filter_estimate_keep(where_sql text, estimate double precision)
returns double precision
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- Keep estimate as where_sql's in the session (pgrag.filter_estimates: the 20 newest filters,
-- a minute each; pgrag._filter_estimate says who keeps one and why) and return it. Called by
-- pgrag._filter_estimate with the planner's estimate, and by the search statement when its
-- count of the filter's matches reached exact_threshold where the planner expected fewer: the
-- planner's estimate of a jsonb containment is a fixed fraction of the table (100 rows of
-- 1,000,000 for a filter matching 10,000), and every search of the filter counted 2,000
-- matches with their distances (8 ms) before it walked the index (docs/benchmarks.md).
declare
    keep constant integer := 20;
    fresh_s constant numeric := pgrag._search_default('plan_keep_s');
    now_s numeric := extract(epoch from clock_timestamp());
    memo_key text := pgrag._filter_estimate_key(where_sql);
    memo jsonb;
begin
    if current_user <> session_user then
        return estimate;
    end if;
    select coalesce(jsonb_object_agg(e.key, e.value), '{}') into memo
      from (select m.key, m.value
              from jsonb_each(pgrag._filter_estimates_held()) m
             where m.key <> memo_key
               and (m.value ->> 1)::numeric between now_s - fresh_s and now_s
             order by (m.value ->> 1)::numeric desc
             limit keep - 1) e;
    perform set_config('pgrag.filter_estimates',
                       (memo || jsonb_build_object(memo_key,
                                                   jsonb_build_array(estimate, now_s)))::text,
                       false);
    return estimate;
end
$$;

comment on function pgrag._filter_estimate_keep(text, double precision) is
    'Keep an estimate of a filter''s chunks for the session (the planner''s, or a search''s count)';


create or replace function pgrag._filter_estimates_held()
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The session's kept estimates (pgrag.filter_estimates) when the setting holds the shape pgrag
-- writes, {"<hex>": [<number>, <number>], ...} in at most 4,000 characters; else none. (Any
-- role of the session may set it: pgrag._filter_estimate says why another shape is never
-- parsed.)
declare
    held text := current_setting('pgrag.filter_estimates', true);
    -- (JSON's numbers: no leading zero, which the cast would refuse: found by review)
    num constant text := '-?(0|[1-9][0-9]*)(\.[0-9]+)?(e[-+]?[0-9]{1,3})?';
    entry constant text := '"[0-9a-f]{1,16}": \[' || num || ', ' || num || '\]';
begin
    if length(held) <= 4000 and held ~ ('^\{(' || entry || '(, ' || entry || ')*)?\}$') then
        return held::jsonb;
    end if;
    return '{}';
end
$$;

comment on function pgrag._filter_estimates_held() is
    'The session''s kept filter estimates (pgrag.filter_estimates), when of pgrag''s shape';


create or replace function pgrag._filter_estimate_key(where_sql text)
returns text
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- A filter's key in pgrag.filter_estimates: a hash of the role, the tenant setting (a count is
-- of the tenant's chunks: one tenant's must not choose another's path) and the compiled filter.
return to_hex(hashtextextended(current_user || ' '
                               || coalesce(current_setting('pgrag.tenant', true), '') || ' '
                               || where_sql, 0));

comment on function pgrag._filter_estimate_key(text) is
    'The key of a filter''s kept estimate (the role, the tenant setting and the filter, hashed)';


create or replace function pgrag._search_statement_name(statement text)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The name pgrag._search prepares a statement under: a hash of its text (64 bits, 1 µs for a
-- 3,000-character statement where sha256 took 10; a collision only makes the two statements
-- replace each other, since a prepared statement runs only if it is the very text wanted).
return 'pgrag_search_' || to_hex(hashtextextended(statement, 0));

comment on function pgrag._search_statement_name(text) is
    'The name a search statement is prepared under (a hash of its text)';


-- (its outputs before 0010's last: without counts (and earlier settings, prepare and keep_s).
-- Dropped only then: pgrag._drop_if_changed compares printed arguments, whose vector type
-- prints qualified under its search_path, so it would drop the function at every upgrade,
-- under searches.)
do $$
declare
    fn regprocedure := to_regprocedure(
        'pgrag._search_plan(text, text, vector, text, integer, jsonb, text[], text, integer, '
        'integer, integer, integer, integer)');
begin
    if fn is not null
       and not (select 'counts' = any(p.proargnames) from pg_proc p where p.oid = fn) then
        execute format('drop function %s', fn);
    end if;
end
$$;

create or replace function pgrag._search_plan(
    mode text, query_text text, query_embedding vector, model text, inout k integer,
    filter jsonb, doc_types text[], inout match text, candidates integer, ef_search integer,
    inout exact_threshold integer, inout rrf_k integer, inout fts_limit integer,
    out statement text, out kc integer, out ef integer, out max_scan_tuples integer,
    out estimate double precision, out settings jsonb, out prepare boolean, out keep_s integer,
    out counts boolean)
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- Everything a search decides before it runs (pgrag._search runs it; the Python client keeps
-- it per connection and runs it itself, docs/search.md): its arguments checked against pgrag's
-- limits (pgrag._limit: the same for SQL callers as for the Python client) and given pgrag's
-- defaults (pgrag._search_default), its filter compiled, the planner's estimate of the
-- filter's rows, the statement (pgrag._search_statement, $1 the query text, $2 the query
-- vector) and what runs it: settings, the settings it runs under ({name: value}, set local
-- to the statement's transaction or function); prepare, whether it is short enough to be
-- prepared (prepare_chars); keep_s, how long a client may run it again for other questions
-- and vectors of the same shape (0: never, on a partitioned store, where it names the
-- session's tenants). Volatile: EXPLAIN runs in no other kind of function. It takes the filter
-- language, never SQL text: a caller learns the planner's estimate of its own filter under
-- its own row-level security, as EXPLAIN tells any role that reads pgrag.chunks
-- (docs/security.md).
declare
    where_sql text;
    tenant_sql text;
    schema jsonb;  -- the doc_types' metadata keys (read once: it checks them too)
    vs name;
begin
    if mode is null or mode not in ('vector', 'hybrid', 'text') then
        raise exception using errcode = 'PR006',
            message = format('search mode %s is not vector, hybrid or text', coalesce(mode, 'NULL')),
            hint = 'pass mode => ''hybrid'' (both), ''vector'' or ''text''';
    end if;
    k := coalesce(k, pgrag._search_default('k'));
    exact_threshold := coalesce(exact_threshold, pgrag._search_default('exact_threshold'));
    rrf_k := coalesce(rrf_k, pgrag._search_default('rrf_k'));
    fts_limit := coalesce(fts_limit, pgrag._search_default('fts_limit'));
    -- natural-language questions rarely hold every word of a chunk: any word, in every mode
    -- (a question's text leg with every word required found nothing on 25 questions of two
    -- schemas); all (web search syntax) and phrase on request
    match := coalesce(match, 'any');
    perform pgrag._check_range('k', k, 1, pgrag._limit('k'));
    perform pgrag._check_range('exact_threshold', exact_threshold, 0,
                               pgrag._limit('exact_threshold'));
    perform pgrag._check_range('rrf_k', rrf_k, 1, pgrag._limit('rrf_k'));
    perform pgrag._check_range('fts_limit', fts_limit, 1, pgrag._limit('fts_limit'));
    if candidates is not null then
        perform pgrag._check_range('candidates', candidates, 1, pgrag._limit('candidates'));
    end if;
    if ef_search is not null then
        perform pgrag._check_range('ef_search', ef_search, 1, pgrag._limit('ef_search'));
    end if;
    if mode <> 'text' then
        if query_embedding is null then
            raise exception using errcode = 'PR006',
                message = format('a %s search needs a query embedding', mode),
                hint = 'pass the question''s embedding from the store''s model, or search with '
                       'mode => ''text'' (pgrag.text_search)';
        end if;
        if model is not null then
            perform pgrag.check_embedder(model, cardinality(query_embedding::real[]));
        else
            perform pgrag.check_dimension(cardinality(query_embedding::real[]));
        end if;
    end if;
    if mode <> 'vector' then
        perform pgrag._check_question(query_text);
    end if;
    if match not in ('all', 'any', 'phrase') then
        raise exception using errcode = 'PR006',
            message = format('text match %L is not any, all or phrase', match),
            hint = 'use match => ''any'' (any word), ''all'' (every word, web search syntax) '
                   'or ''phrase'' (the words in order)';
    end if;
    if doc_types is not null then
        perform pgrag._check_names(doc_types, 'doc_types');
        schema := pgrag._filter_schema(doc_types);  -- PR003 for a type not declared
    end if;

    where_sql := case when filter is null or filter = '{}' then 'true'
                      else pgrag._filter_sql(filter, coalesce(schema, pgrag._filter_schema(null)),
                                             pgrag._filter_index_keys()) end;
    if doc_types is not null then
        where_sql := format('(%s) and c.doc_type = any(%L::text[])', where_sql, doc_types);
    end if;
    if pgrag._store_partitioned() then  -- only the partitions of the tenants it may see
        tenant_sql := pgrag._search_tenants(doc_types);
        where_sql := format('(%s) and %s', where_sql, tenant_sql);
    end if;
    -- Candidates per list: a vector search takes the first k rows the walk passes, as bare
    -- pgvector does (asking 2k walked twice as far behind a selective filter for +0.003 recall:
    -- 1% of 1,000,000 chunks, p50 22.4 against 14.7 ms, docs/benchmarks.md); a hybrid search
    -- 4k, so that the two lists overlap before they are fused.
    kc := greatest(coalesce(candidates, case when mode = 'vector' then k else 4 * k end), k);
    if mode <> 'text' then
        -- The planner's estimate of the filter's rows (pgrag._filter_estimate): counting the
        -- matches of a filter expected to match exact_threshold rows or more is skipped, the
        -- index runs at once (the count cost 4.5 ms of a 9.5 ms search at 10% of 100,000
        -- chunks, where the estimate was 9,091 against a threshold of 2,000). No filter: no
        -- count either (the index may still come back short under row-level security, and the
        -- exact scan follows, as behind a filter).
        if where_sql <> 'true' then
            estimate := pgrag._filter_estimate(where_sql);
        end if;
        -- HNSW: at least twice the candidates and at least the value tuned for this store
        -- (an administrator's pgrag.ef_search setting, else pgrag.settings.ef_search, which
        -- `pgrag tune` and the worker measure), at most pgvector's 1,000: past that the
        -- iterative scan walks on until kc rows pass, up to max_scan_tuples (200 per candidate).
        ef := least(greatest(coalesce(ef_search, 2 * kc), kc, 40,
                             case when ef_search is null then pgrag._tuned_ef_search() end),
                    pgrag._limit('ef_search'));
        max_scan_tuples := greatest(20000, 200 * kc);
    end if;
    vs := pgrag._vector_schema();
    -- Every vector search walks the graph iteratively (relaxed order, re-sorted by the
    -- statement): a plain scan stops at ef_search rows, and under row-level security even a
    -- search without a filter filters. No parallel workers: the statement's exact branches are
    -- guarded by one-time conditions that a Gather starts its workers before testing, so an
    -- unfiltered search that never takes them paid 15-25 ms to launch workers for nothing
    -- (EXPLAIN ANALYZE at 100,000 chunks); every branch reads at most exact_threshold rows or
    -- walks the index, which one backend does best.
    settings := jsonb_build_object('max_parallel_workers_per_gather', '0');
    if mode <> 'text' then
        settings := settings || jsonb_build_object('hnsw.iterative_scan', 'relaxed_order',
                                                   'hnsw.ef_search', ef::text,
                                                   'hnsw.max_scan_tuples', max_scan_tuples::text);
    end if;
    keep_s := case when tenant_sql is null then pgrag._search_default('plan_keep_s') else 0 end;
    -- (counts: the statement counts the filter's matches first; one that finds
    -- exact_threshold of them keeps the count, in the session's own role only
    -- (pgrag._filter_estimate_keep), and a client keeping this plan plans again)
    counts := mode <> 'text' and estimate < exact_threshold;
    statement := pgrag._search_statement(mode, where_sql, not coalesce(counts, false), vs, jsonb_build_object('k', k, 'kc', kc,
                                                                'exact_threshold', exact_threshold,
                                                                'rrf_k', rrf_k,
                                                                'fts_limit', fts_limit,
                                                                'match', match),
                                         tenant_sql);
    prepare := length(statement) <= pgrag._search_default('prepare_chars');
    counts := coalesce(counts, false) and current_user = session_user;
end
$$;

comment on function pgrag._search_plan(text, text, vector, text, integer, jsonb, text[], text,
                                       integer, integer, integer, integer, integer) is
    'A search''s arguments checked and defaulted, its filter compiled, its estimate, its '
    'statement and the settings it runs under';


create or replace function pgrag._search(
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
    fts_limit integer,
    model text)
returns setof pgrag.search_hit
language plpgsql volatile security invoker
-- Volatile: it prepares statements (a stable function may not).
-- The function's SET clauses scope the plan's settings (pgrag._search_plan says why each) to
-- the call: set_config(..., true) below lasts until it returns, then the caller's settings
-- are restored. Their values here are pgvector's and PostgreSQL's defaults; the plan's
-- replace them.
set search_path = pg_catalog, pg_temp
set hnsw.iterative_scan = 'off'
set hnsw.ef_search = 40
set hnsw.max_scan_tuples = 20000
set max_parallel_workers_per_gather = 2
as $$
-- Every search of the SQL API and of the Python client runs here: pgrag._search_plan, then the
-- statement, once, with the search's values bound.
declare
    keep_statements constant integer := 20;
    p record;
    setting record;
    prepared text;
    wanted text;
    held text;
    held_from_sql boolean;
    old text;
begin
    select * into strict p
      from pgrag._search_plan(mode, query_text, query_embedding, model, k, filter, doc_types,
                              match, candidates, ef_search, exact_threshold, rrf_k, fts_limit);
    for setting in select * from jsonb_each_text(p.settings) loop
        perform set_config(setting.key, setting.value, true);
    end loop;
    -- The statement, its limits and its filter's values written in, is prepared once per session
    -- and text: planning it cost 0.3-0.5 ms of every search (0.44 ms of a 2.8 ms unfiltered
    -- search at 100,000 chunks, 0.5 ms of a 0.8 ms search behind a 0.1% filter), and with its
    -- limits and values known PostgreSQL settles on one plan for it, which can use a filter
    -- index (the values are constants of the text, not parameters). Each is about 300 KB of the
    -- backend's memory: a session keeps at most keep_statements, and a new one replaces the
    -- oldest. A statement the plan says not to prepare (longer than prepare_chars: a filter of
    -- long $in lists) is planned and run unprepared: prepared, 19 statements of 890 KB filters
    -- held 192 MB of a pooled backend, and every later search there copied them all out of
    -- pg_prepared_statements.
    -- A prepared statement is run only if it is the very text pgrag prepares (pgrag._search may
    -- run for a more privileged caller than the session's role: a statement of the same name
    -- prepared by that role would otherwise run with the caller's rights); any other is
    -- replaced. Where PREPARE is not allowed (inside CREATE or REFRESH MATERIALIZED VIEW, or
    -- pg_prepared_statements is not readable) the statement is planned and run as it is.
    if p.prepare then
        begin
            prepared := pgrag._search_statement_name(p.statement);
            -- (the vector parameter's type as this function's argument has it, qualified)
            wanted := format('prepare %I (text, %s) as %s', prepared,
                             pg_typeof(query_embedding), p.statement);
            select s.statement, s.from_sql into held, held_from_sql
              from pg_prepared_statements s where s.name = prepared;
            if held is distinct from wanted or not held_from_sql then
                if held is not null then
                    execute format('deallocate %I', prepared);
                else
                    for old in select s.name from pg_prepared_statements s
                                where s.name like 'pgrag\_search\_%'
                                order by s.prepare_time desc, s.name
                               offset keep_statements - 1 loop
                        execute format('deallocate %I', old);
                    end loop;
                end if;
                execute wanted;
            end if;
            return query execute format('execute %I(%L, %L)', prepared, query_text,
                                        query_embedding::text);
            return;
        exception
            when insufficient_privilege then
                null;  -- planned and run below
            when feature_not_supported then
                -- "cached plan must not change result type" (a migration changed a column):
                -- prepared again at the next search
                if prepared is not null
                   and exists (select from pg_prepared_statements s where s.name = prepared) then
                    execute format('deallocate %I', prepared);
                end if;
        end;
    end if;
    return query execute p.statement using query_text, query_embedding;
end
$$;

comment on function pgrag._search(text, text, vector, integer, jsonb, text[], text, integer,
                                  integer, integer, integer, integer, text) is
    'Run a search: pgrag._search_plan, then its statement with the search''s values bound';


drop function if exists pgrag._refuse_partitioned_store(text);  -- (filter indexes are built
-- on a partitioned store too, partition by partition)


create or replace function pgrag._search_tenants(doc_types text[])
returns text
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- On a partitioned store (docs/scaling.md), the tenants a search can see as a condition on the
-- partition key, written into the statement as a constant so that the planner reads only their
-- partitions. It says no more than row-level security does (a shared type's chunks have no
-- tenant, a tenant-scoped type's have one; a role bound to a tenant sees the shared chunks and
-- its own): a session of one tenant searching a tenant-scoped type walks that tenant's
-- partition alone, not the shared one besides. A session that sees every tenant narrows only
-- a search of shared types.
declare
    shared boolean;  -- a searched type has no tenant column
    scoped boolean;  -- a searched type has one
    tenant text;
begin
    select bool_or(d.tenant_column is null), bool_or(d.tenant_column is not null)
      into shared, scoped
      from pgrag.doc_types d where doc_types is null or d.name = any(doc_types);
    if pgrag._sees_all_tenants() then
        return case when shared and not scoped then 'c.tenant is null' else 'true' end;
    end if;
    tenant := pgrag.current_tenant();
    if tenant is null or not coalesce(scoped, false) then
        return 'c.tenant is null';
    elsif not shared then
        return format('c.tenant = %L', tenant);
    end if;
    return format('(c.tenant is null or c.tenant = %L)', tenant);
end
$$;

comment on function pgrag._search_tenants(text[]) is
    'A partitioned store: the tenants a search sees, as a condition the planner prunes on';


create or replace function pgrag._filter_index_plan(filter jsonb,
                                                    out name text, out filter_json text,
                                                    out create_ddl text, out comment_ddl text)
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The DDL of a filter index (pgrag/filter_index.py builds it concurrently, which a function
-- cannot): a partial HNSW index whose predicate is the filter compiled exactly as a search
-- compiles it once the index exists (its top-level keys split out, canonical), so that the
-- planner proves it from a search's conditions; with the store index's m and ef_construction.
-- Named by its predicate: {"k": 1} and {"k": {"$eq": 1}} are one index. PR006 for a filter that
-- selects every chunk or none. A partitioned store (docs/scaling.md): PostgreSQL builds no
-- index concurrently on a partitioned table, so the DDL makes the index on the parent alone
-- (ON ONLY: invalid, no graph), and each partition's graph is built concurrently and attached
-- to it (pgrag._index_partition_plan), as a rebuild of the store index does.
declare
    predicate text;
    plan json;
    m integer;
    efc integer;
    vs name;
begin
    if filter is null or filter = '{}' then
        raise exception using errcode = 'PR006',
            message = 'a filter index needs a filter',
            hint = 'the store index already serves unfiltered searches';
    end if;
    predicate := pgrag._filter_sql(filter, pgrag._filter_schema(null),
                                   array(select jsonb_object_keys(filter)), '');
    execute 'explain (format json, costs off) select from pgrag.chunks where ' || predicate
       into plan;
    if plan -> 0 -> 'Plan' ->> 'One-Time Filter' = 'false'
       or not (plan::text ~ '"(Filter|Index Cond|Recheck Cond)"') then
        raise exception using errcode = 'PR006',
            message = format('filter %s matches %s chunk', filter,
                             case when plan -> 0 -> 'Plan' ->> 'One-Time Filter' = 'false'
                                  then 'no' else 'every' end),
            hint = 'a filter index needs a filter that selects some of the chunks';
    end if;
    select coalesce(max(o.option_value) filter (where o.option_name = 'm'), s.hnsw_m::text)::int,
           coalesce(max(o.option_value) filter (where o.option_name = 'ef_construction'),
                    s.hnsw_ef_construction::text)::int
      into m, efc
      from pgrag.settings s
      left join pg_class c on c.oid = to_regclass('pgrag.chunks_embedding_hnsw')
      left join lateral pg_options_to_table(c.reloptions) o on true
     group by s.hnsw_m, s.hnsw_ef_construction;
    vs := pgrag._vector_schema();
    name := 'chunks_embedding_hnsw_f_' || left(encode(sha256(convert_to(predicate, 'UTF8')), 'hex'), 12);
    filter_json := filter::text;
    create_ddl := format(case when pgrag._store_partitioned()
                              then 'create index if not exists %I on only pgrag.chunks '
                              else 'create index concurrently %I on pgrag.chunks ' end
                         || 'using hnsw (embedding %I.vector_cosine_ops) '
                            'with (m = %s, ef_construction = %s) where %s',
                         name, vs, m, efc, predicate);
    comment_ddl := format('comment on index pgrag.%I is %L', name, filter_json);
end
$$;

comment on function pgrag._filter_index_plan(jsonb) is
    'The CREATE INDEX and COMMENT of a filter index, its predicate compiled as a search compiles it';


select pgrag._drop_if_changed(
    to_regprocedure('pgrag._store_index_plan(integer, integer)'), 'record',
    'm integer, ef_construction integer, OUT create_ddl text, OUT drop_ddl text, '
    'OUT drop_new_ddl text, OUT partitioned boolean');

create or replace function pgrag._store_index_plan(m integer, ef_construction integer,
                                                   out create_ddl text, out drop_ddl text,
                                                   out drop_new_ddl text,
                                                   out partitioned boolean)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The DDL of a rebuild of the store's HNSW index with other graph parameters (pgrag/
-- filter_index.py runs it, concurrently, which a function cannot): the new index is built
-- beside the old one as chunks_embedding_hnsw_new, then the old one dropped and the new one
-- renamed (pgrag._store_index_swap). A partitioned store (docs/scaling.md): PostgreSQL builds
-- no index concurrently on a partitioned table, so the new index is made on the parent alone
-- (ON ONLY: invalid, no graph), each partition's graph built concurrently and attached to it
-- (pgrag._index_partition_plan), and it is valid once every partition's is; the old one
-- is then dropped in one short statement (no DROP INDEX CONCURRENTLY on a partitioned index:
-- it takes each partition's ACCESS EXCLUSIVE lock for the time of the drop).
declare
    vs name;
    owner regrole := (select c.relowner::regrole from pg_class c
                       where c.oid = 'pgrag.chunks'::regclass);
begin
    if not pg_has_role(current_user, owner, 'USAGE') then
        raise exception using errcode = 'PR006',
            message = format('rebuilding the store index needs the owner of pgrag.chunks (%s); '
                             '%s is not', owner, current_user),
            hint = format('connect as %s, the role that ran `pgrag db upgrade`', owner);
    end if;
    perform pgrag._check_range('m', m, 2, 100);  -- pgvector's limits (config.MAX_HNSW_*)
    perform pgrag._check_range('ef_construction', ef_construction, 4, 1000);
    if ef_construction < 2 * m then
        raise exception using errcode = 'PR006',
            message = format('ef_construction = %s is less than twice m = %s', ef_construction, m),
            hint = 'pgvector needs ef_construction >= 2 x m: raise ef_construction';
    end if;
    vs := pgrag._vector_schema();
    partitioned := pgrag._store_partitioned();
    if partitioned then
        create_ddl := format('create index if not exists chunks_embedding_hnsw_new on only '
                             'pgrag.chunks using hnsw (embedding %I.vector_cosine_ops) '
                             'with (m = %s, ef_construction = %s)', vs, m, ef_construction);
        drop_ddl := 'drop index if exists pgrag.chunks_embedding_hnsw';
        drop_new_ddl := 'drop index if exists pgrag.chunks_embedding_hnsw_new';
        return;
    end if;
    create_ddl := format('create index concurrently chunks_embedding_hnsw_new on pgrag.chunks '
                         'using hnsw (embedding %I.vector_cosine_ops) '
                         'with (m = %s, ef_construction = %s)', vs, m, ef_construction);
    drop_ddl := 'drop index concurrently if exists pgrag.chunks_embedding_hnsw';
    drop_new_ddl := 'drop index concurrently if exists pgrag.chunks_embedding_hnsw_new';
end
$$;

comment on function pgrag._store_index_plan(integer, integer) is
    'The DDL of a rebuild of the store''s HNSW index (built beside it, then swapped)';


drop function if exists pgrag._store_index_partition_plan();  -- (now any index's)

create or replace function pgrag._index_partition_plan(parent_index name)
returns table (partition_name text, index_name text, state text, create_ddl text,
               drop_ddl text, attach_ddl text)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- An HNSW index of a partitioned store, made on the parent alone (pgrag.<parent_index>: a
-- rebuild's chunks_embedding_hnsw_new, pgrag._store_index_plan, or a filter index,
-- pgrag._filter_index_plan), built partition by partition: each partition whose graph is not
-- yet attached to it, and what it needs: 'missing' (build it concurrently, then attach),
-- 'invalid' (a build that died: drop it, build, attach) or 'built' (attach). The graph's
-- parameters and the predicate (a filter index's) are the parent's; the name carries the
-- parent's oid and the partition's, so a rebuild's names never meet the graphs they replace,
-- and one that died is taken up where it stopped. Nothing when there is no such index.
declare
    parent oid := to_regclass(format('pgrag.%I', parent_index));
    vs name;
    opts text;
    predicate text;
begin
    if parent is null then
        return;
    end if;
    vs := pgrag._vector_schema();
    select array_to_string(c.reloptions, ', '), pg_get_expr(x.indpred, x.indrelid)
      into strict opts, predicate
      from pg_class c join pg_index x on x.indexrelid = c.oid where c.oid = parent;
    return query
    with parts as (
        select p.oid, p.relname,
               format('chunks_hnsw_%s_%s', parent, p.oid) as child  -- (ASCII, < 63 bytes)
          from pg_inherits h join pg_class p on p.oid = h.inhrelid
         where h.inhparent = 'pgrag.chunks'::regclass
           and not exists (  -- (attached already)
               select from pg_inherits hi join pg_index x on x.indexrelid = hi.inhrelid
                where hi.inhparent = parent and x.indrelid = p.oid))
    select parts.relname::text, parts.child,
           case when x.indexrelid is null then 'missing'
                when not x.indisvalid then 'invalid' else 'built' end,
           format('create index concurrently %I on pgrag.%I using hnsw '
                  '(embedding %I.vector_cosine_ops) with (%s)%s', parts.child, parts.relname, vs,
                  opts, coalesce(' where ' || predicate, '')),
           format('drop index concurrently if exists pgrag.%I', parts.child),
           format('alter index pgrag.%I attach partition pgrag.%I', parent_index, parts.child)
      from parts
      left join pg_class ci on ci.relname = parts.child
                          and ci.relnamespace = 'pgrag'::regnamespace
      left join pg_index x on x.indexrelid = ci.oid
     order by parts.relname;
end
$$;

comment on function pgrag._index_partition_plan(name) is
    'A partitioned store''s index made on the parent: each partition''s graph still to build '
    'and attach';


create or replace function pgrag._store_index_swap(out m integer, out ef_construction integer,
                                                   out size_bytes bigint)
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The end of a rebuild, in one transaction, once the old index is dropped: the new index takes
-- its name, and pgrag.settings its graph's parameters, read from the index itself (the one built
-- now, or one a run that died left finished; pgvector's defaults where the index gives none):
-- an index made for another dimension by pgrag.set_embedder uses them. The measured ef_search
-- stays until the rebuild measures the new graph: removed, searches would fall to their floor
-- (recall 0.53 at 1,000,000 chunks) if that measurement never came. ALTER INDEX ... RENAME
-- does not block searches or writes.
begin
    if to_regclass('pgrag.chunks_embedding_hnsw_new') is null then
        raise exception using errcode = 'PR006',
            message = 'there is no rebuilt index pgrag.chunks_embedding_hnsw_new to swap in',
            hint = 'run `pgrag reindex` again';
    end if;
    if not (select x.indisvalid from pg_index x
             where x.indexrelid = 'pgrag.chunks_embedding_hnsw_new'::regclass) then
        raise exception using errcode = 'PR006',
            message = 'the rebuilt index pgrag.chunks_embedding_hnsw_new is not valid (a '
                      'partition without its graph): it is not swapped in',
            hint = 'run `pgrag reindex` again';
    end if;
    select coalesce(max(o.option_value) filter (where o.option_name = 'm'), '16')::int,
           coalesce(max(o.option_value) filter (where o.option_name = 'ef_construction'),
                    '64')::int,
           coalesce((select sum(pg_relation_size(t.relid))::bigint
                       from pg_partition_tree(c.oid) t),  -- (a partitioned index: its parts')
                    pg_relation_size(c.oid))
      into m, ef_construction, size_bytes
      from pg_class c left join lateral pg_options_to_table(c.reloptions) o on true
     where c.oid = 'pgrag.chunks_embedding_hnsw_new'::regclass
     group by c.oid;
    alter index pgrag.chunks_embedding_hnsw_new rename to chunks_embedding_hnsw;
    update pgrag.settings s
       set hnsw_m = _store_index_swap.m, hnsw_ef_construction = _store_index_swap.ef_construction;
end
$$;

comment on function pgrag._store_index_swap() is
    'The end of a store index rebuild: the new index renamed, its graph''s parameters recorded';
