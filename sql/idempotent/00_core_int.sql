-- pgrag's internals shared by every area: the settings a key's text depends on, the one-statement
-- check for declared SQL, and who the session is for row-level security and tenants.
--
-- The idempotent files (sql/idempotent/NN_<area>_api.sql and NN_<area>_int.sql) hold the one
-- current definition of every view, function, trigger, policy and grant of schema pgrag. They
-- are applied once, in order, in the migration's transaction, when it ends at pgrag's head
-- revision (pgrag/migrate.py); a function of schema pgrag they no longer define is dropped
-- then. A revision below head has pgrag's tables but none of these (docs/architecture.md).
-- *_api.sql: the SQL API (docs/sql-api.md), each function with a COMMENT. *_int.sql: internals,
-- named pgrag._<name>, not granted to readers unless a reader's call needs them.
--
-- Every function: schema pgrag, declared volatility, security invoker unless its comment says
-- why it is a definer, set search_path = pg_catalog, pg_temp. pgrag's own SQLSTATEs (class PR)
-- are listed once, in pgrag/errors.py.

create or replace function pgrag._pin_output_settings(ddl text)
returns text
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- A function that prints or parses document keys (or renders text) replaces the line
-- `@pinned_settings@` of its definition with these, the one list of the settings a value's
-- text form depends on: a key must print the same in every session (DateStyle 'SQL, DMY' would
-- print a date key 04/03/1990; extra_float_digits = 0 a float8 key 0.30000000000000004 as 0.3,
-- which no longer finds its row), or a keyed render misses its document and deletes its chunk.
return replace(ddl, '@pinned_settings@', $s$set datestyle = 'ISO, YMD'
        set intervalstyle = 'postgres'
        set timezone = 'UTC'
        set extra_float_digits = 1
        set bytea_output = 'hex'
        set lc_monetary = 'C'$s$);

comment on function pgrag._pin_output_settings(text) is
    'The settings every key-printing function pins, spliced into its definition';


create or replace function pgrag._refuse_temporary_objects()
returns void
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- A declaration is made in a session that holds no temporary object: the generated functions
-- that run declared SQL (search_path pg_catalog, pg_temp) would look a name that found one
-- here up in the temporary schema of whichever session calls them, where another role can put
-- a view, or a table whose row type has a domain with a CHECK, of its own that runs as the
-- declarer (found by two reviews, 2026-12-05: a temporary view as the source; a cast to a
-- temporary row type in JSON_QUERY's RETURNING, on which PostgreSQL records no dependency).
-- With none, every name the declared SQL uses resolves in pg_catalog or a schema it names, as
-- it will at run time, and `pg_temp.x` to nothing. Else PR003.
declare
    t oid := pg_my_temp_schema();
begin
    if t <> 0 and (exists (select from pg_class x where x.relnamespace = t)
                   or exists (select from pg_type x where x.typnamespace = t)
                   or exists (select from pg_proc x where x.pronamespace = t)
                   or exists (select from pg_operator x where x.oprnamespace = t)
                   or exists (select from pg_collation x where x.collnamespace = t)
                   or exists (select from pg_conversion x where x.connamespace = t)
                   or exists (select from pg_opclass x where x.opcnamespace = t)
                   or exists (select from pg_opfamily x where x.opfnamespace = t)
                   or exists (select from pg_ts_config x where x.cfgnamespace = t)
                   or exists (select from pg_ts_dict x where x.dictnamespace = t)
                   or exists (select from pg_ts_parser x where x.prsnamespace = t)
                   or exists (select from pg_ts_template x where x.tmplnamespace = t)
                   or exists (select from pg_statistic_ext x where x.stxnamespace = t)) then
        raise exception using errcode = 'PR003',
            message = 'declare from a session that holds no temporary table, view, type or '
                      'function: a name in the declared SQL that found one would be looked up '
                      'in the temporary schema of every session that writes or asks',
            hint = 'run DISCARD TEMP (or declare from a new session), over permanent tables '
                   'and views';
    end if;
end
$fn$;

comment on function pgrag._refuse_temporary_objects() is
    'Refuse a declaration made in a session that holds temporary objects (PR003)';


create or replace function pgrag._check_one_statement(query text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- Parse and plan `query` as exactly one statement without executing it: a cursor refuses a
-- string of several statements ("cannot open multi-query plan as cursor"), where EXECUTE would
-- run them all. Planning is not nothing: it may evaluate immutable functions with constant
-- arguments (constant folding), as the calling role. Declarations pass their SQL through here first, so a source or key query cannot
-- close its parenthesis and append statements of its own (`select 1) as q(k); drop ...`).
-- First, that the session holds no temporary object (pgrag._refuse_temporary_objects says
-- why; the declarations ask before anything else too, for an error of its own).
declare
    c refcursor;
begin
    perform pgrag._refuse_temporary_objects();
    open c no scroll for execute query;
    close c;
end
$fn$;

comment on function pgrag._check_one_statement(text) is
    'Parse and plan a query as exactly one statement without executing it (planning may still '
    'evaluate immutable functions)';


-- Tenants: a chunk's tenant is NULL (its type has no tenant column: every reader sees it) or the
-- value of its type's tenant column. A session's tenant is the binding in pgrag.tenant_roles of
-- its login role or of a role that one is a member of (SET ROLE cannot change it; conflicting
-- bindings: none), else the setting pgrag.tenant, else none: it then sees only the shared
-- (NULL) chunks (pgrag.current_tenant, 01_core_api.sql; docs/security.md).

create or replace function pgrag._session_role()
returns name
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The role the session acts as: SET ROLE's role, else the login role. Unlike current_user it
-- stays the caller's inside a security definer function.
return case when current_setting('role') = 'none' then session_user
            else current_setting('role')::name end;

comment on function pgrag._session_role() is
    'The role the session acts as (SET ROLE''s, else the login role), also inside definer functions';


create or replace function pgrag._tenant_identity()
returns name
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The role whose tenant bindings apply: the login role (session_user), which SET ROLE cannot
-- change, and SET SESSION AUTHORIZATION only for a superuser's session. For a superuser's
-- session (which may become anyone anyway) the role it acts as, so that a superuser can act as
-- a bound role with SET ROLE (tests, an administrator checking what a tenant sees).
return case when not coalesce((select r.rolsuper from pg_roles r where r.rolname = session_user),
                              false)
            then session_user
            else pgrag._session_role() end;

comment on function pgrag._tenant_identity() is
    'The role whose tenant bindings apply: the login role (SET ROLE cannot change it); '
    'a superuser''s session: the role it acts as';


create or replace function pgrag._sees_all_tenants()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- What row-level security lets the session's role see of pgrag.chunks: every row for a
-- superuser, a BYPASSRLS role, the table's owner and the writer role's members.
return coalesce((
    select r.rolsuper or r.rolbypassrls
        or pg_has_role(r.oid, (select c.relowner from pg_class c
                               where c.oid = 'pgrag.chunks'::regclass), 'USAGE')
        or pg_has_role(r.oid, (select s.writer_role from pgrag.settings s), 'USAGE')
    from pg_roles r
    where r.rolname = pgrag._session_role()), false);

comment on function pgrag._sees_all_tenants() is
    'Whether the session''s role sees every tenant''s chunks (owner, writer, superuser, BYPASSRLS)';



create or replace function pgrag._vector_schema()
returns name
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The schema pgvector is installed in: its type, operators and operator classes live there,
-- and the functions' fixed search path does not hold it, so statements name it (format('%I')).
declare
    vs name;
begin
    select n.nspname into strict vs
      from pg_extension e join pg_namespace n on n.oid = e.extnamespace
     where e.extname = 'vector';
    return vs;
end
$$;

comment on function pgrag._vector_schema() is
    'The schema pgvector is installed in (statements name its type and operators there)';


create or replace function pgrag._store_partitioned()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether pgrag.chunks is partitioned by tenant (`pgrag db upgrade --tenant-partitions`,
-- sql/migrate/store_shape.sql). (By name, not a regclass constant: a conversion drops the old
-- table, and no function should go with it.)
return coalesce((select c.relkind = 'p' from pg_class c
                  where c.oid = to_regclass('pgrag.chunks')), false);

comment on function pgrag._store_partitioned() is
    'Whether the chunk store is partitioned by tenant (pgrag db upgrade --tenant-partitions)';


create or replace function pgrag._store_shape()
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $fn$
-- The chunk store's partitions: NULL for one table, else {"by": "tenant", "strategy",
-- "partitions", "default_rows"} (list: the chunks of tenants waiting in the default partition
-- for the next `pgrag db upgrade --tenant-partitions list`).
declare
    shape jsonb;
    waiting bigint;
begin
    if not pgrag._store_partitioned() then
        return null;
    end if;
    select jsonb_build_object('by', 'tenant',
                              'strategy', case p.partstrat when 'l' then 'list' else 'hash' end,
                              'partitions', (select count(*) from pg_inherits h
                                              where h.inhparent = p.partrelid))
      into strict shape
      from pg_partitioned_table p where p.partrelid = 'pgrag.chunks'::regclass;
    if shape ->> 'strategy' = 'list' and to_regclass('pgrag.chunks_default') is not null then
        -- counted by the owner, who may read the partition (through pgrag.chunks no condition
        -- prunes to it: it would read them all); others get the statistics' live rows
        if pg_has_role((select c.relowner from pg_class c
                         where c.oid = 'pgrag.chunks'::regclass), 'USAGE') then
            execute 'select count(*) from pgrag.chunks_default' into waiting;
        else
            select greatest(t.n_live_tup, 0) into waiting
              from pg_stat_all_tables t where t.relid = to_regclass('pgrag.chunks_default');
        end if;
        shape := shape || jsonb_build_object('default_rows', waiting);
    end if;
    return shape;
end
$fn$;

comment on function pgrag._store_shape() is
    'The chunk store''s partitions (NULL: one table; else by, strategy, partitions, default_rows)';


create or replace function pgrag._limit(name text)
returns integer
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The limits on what callers hand pgrag, for SQL callers and the Python client alike
-- (pgrag/limits.py holds the same numbers to refuse before any I/O;
-- tests/security/test_input_limits.py checks they agree). docs/reliability.md says what each
-- guards against.
return case name
    when 'k' then 10000                    -- results of one search
    when 'candidates' then 40000           -- candidates per list (4 x k)
    when 'ef_search' then 1000             -- pgvector's own maximum
    when 'exact_threshold' then 2147483647  -- (any: all of them means always exact)
    when 'rrf_k' then 100000
    when 'fts_limit' then 2147483647
    when 'question_chars' then 10000       -- past any embedder's window and full text's use
    when 'question_words' then 100         -- ranking slows down with the square of the words
    when 'name_chars' then 300             -- a name: a document type, a table
    when 'sql_chars' then 100000           -- a declared query
    when 'document_chars' then 100000      -- a chunk's text (more is cut, and the chunk says
                                           -- so): its tsvector stays under PostgreSQL's 1 MB
    when 'filter_depth' then 32            -- $and / $or / $not levels
    when 'filter_terms' then 1000          -- conditions of one filter
    when 'filter_in_values' then 10000     -- values of one $in / $nin
    when 'filter_nodes' then 200000        -- JSON values of one filter
    when 'filter_chars' then 1000000       -- characters of a filter's JSON text
    end;

comment on function pgrag._limit(text) is
    'The limits on what callers hand pgrag (search arguments, questions, names, filters)';


create or replace function pgrag.text_tsvector(t text)
returns tsvector
language sql immutable strict parallel safe security invoker
-- A chunk's full-text vector (pgrag.chunks.tsv), the one definition: what a render writes, what
-- the worker fills in (pgrag.index_text) and what a search computes for a chunk still without
-- one. A SQL-standard body and no SET clause: its names are bound when it is created, and the
-- planner inlines it.
return to_tsvector('english'::regconfig, t);

comment on function pgrag.text_tsvector(text) is
    'A chunk''s full-text vector: to_tsvector(''english'', text)';


create or replace function pgrag._check_range(what text, value bigint, low bigint, high bigint)
returns void
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if value is null or value < low or value > high then
        raise exception using errcode = 'PR006',
            message = format('%s = %s is out of range', what, coalesce(value::text, 'NULL')),
            hint = format('use %s to %s', low, to_char(high, 'FM999,999,999,999'));
    end if;
end
$$;


create or replace function pgrag._check_question(query_text text)
returns void
language plpgsql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
-- A search text: present, at most question_chars characters and question_words words (the terms
-- PostgreSQL's text search parser makes of it), checked before any full text work.
declare
    words bigint;
begin
    if query_text is null or btrim(query_text) = '' then
        raise exception using errcode = 'PR006', message = 'the search text is empty',
            hint = 'pass the question (or search with an embedding only: mode => ''vector'')';
    end if;
    if length(query_text) > pgrag._limit('question_chars') then
        raise exception using errcode = 'PR006',
            message = format('the search text is %s characters long',
                             to_char(length(query_text), 'FM999,999,999')),
            hint = format('keep it to %s or fewer',
                          to_char(pgrag._limit('question_chars'), 'FM999,999'));
    end if;
    select count(*) into words from ts_parse('default', query_text) t where t.tokid <> 12;
    if words > pgrag._limit('question_words') then
        raise exception using errcode = 'PR006',
            message = format('the search text has %s words', words),
            hint = format('ask in %s words or fewer (full text ranking slows down with the '
                          'square of the words)', pgrag._limit('question_words'));
    end if;
end
$$;


create or replace function pgrag._check_names(names text[], what text)
returns void
language plpgsql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    if exists (select from unnest(names) n where n is null or length(n) > pgrag._limit('name_chars'))
    then
        raise exception using errcode = 'PR006',
            message = format('a name in %s is NULL or longer than %s characters', what,
                             pgrag._limit('name_chars')),
            hint = 'pass the names of declared document types';
    end if;
end
$$;


drop function if exists pgrag._drop_if_changed(regprocedure, text);  -- before it took args

create or replace function pgrag._drop_if_changed(fn regprocedure, result text,
                                                  args text default null)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- CREATE OR REPLACE cannot change a function's result type or its parameters' names and
-- defaults: an idempotent file calls this just before it defines a function whose shape
-- changed, with the new result (and arguments, as pg_get_function_arguments prints them), and
-- the old definition is dropped (nothing depends on it, or the migration stops naming what
-- does; nothing is dropped with CASCADE). fn: to_regprocedure(...) in the file's own
-- statement, where the migration's search path resolves pgvector's types.
begin
    if fn is not null and (pg_get_function_result(fn) is distinct from result
                           or (args is not null
                               and pg_get_function_arguments(fn) is distinct from args)) then
        execute format('drop function %s', fn);
    end if;
end
$$;


create or replace function pgrag._ensure_policy(tbl regclass, policy name, ddl text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- Create a row-level security policy with its CREATE POLICY statement, unless it exists from
-- the same statement already (its comment holds the statement's hash). Dropping and creating a
-- policy locks its table against every reader: a migration that changes nothing must not, or it
-- waits behind searches and deadlocks with them.
declare
    mark text := 'pgrag ' || md5(ddl);
begin
    if exists (select from pg_policy p
                where p.polrelid = tbl and p.polname = policy
                  and obj_description(p.oid, 'pg_policy') = mark) then
        return;
    end if;
    execute format('drop policy if exists %I on %s', policy, tbl);
    execute ddl;
    execute format('comment on policy %I on %s is %L', policy, tbl, mark);
end
$$;


create or replace function pgrag._may_act_as(owner regrole)
returns boolean
language sql stable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- Whether the current user may act as `owner` (be it, or SET ROLE to it: PostgreSQL 16's SET
-- option, membership before): the rule for changing a document type or its statistics, as for
-- altering an object PostgreSQL lets its owner's members alter. A superuser may act as anyone.
return owner is not null
   and pg_has_role(current_user, owner,
                   case when current_setting('server_version_num')::integer >= 160000
                        then 'SET' else 'MEMBER' end);

comment on function pgrag._may_act_as(regrole) is
    'Whether the current user may act as the given role (SET ROLE to it)';
