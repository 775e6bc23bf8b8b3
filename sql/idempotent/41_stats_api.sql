-- Exact statistics: declare a type's statistics query, compute statistics for a filter, and turn
-- the statistics cache on or off (docs/search.md, "Exact statistics" and "The statistics cache").

create or replace function pgrag.declare_stats(doc_type text, stats_sql text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The declaring role (the current user, who must be able to act as the type's owner) owns the
-- statistics: they run as that role for every caller, through pgrag_docs.stats_<type>.
declare
    t pgrag.doc_types;
    found_tables regclass[];
begin
    select * into t from pgrag.doc_types d where d.name = declare_stats.doc_type;
    if not found then
        raise exception using
            errcode = 'PR003',
            message = format('document type %s is not declared', doc_type),
            hint = 'declare it first with pgrag.declare_document, then its statistics';
    end if;
    if not pgrag._may_act_as(t.owner) then
        raise exception using errcode = 'PR003',
            message = format('document type %s belongs to role %s, not to %s',
                             doc_type, t.owner, current_user),
            hint = format('declare its statistics as %s (SET ROLE %s) or a member of it',
                          t.owner, t.owner);
    end if;
    if stats_sql is null then
        delete from pgrag.doc_stats s where s.doc_type = declare_stats.doc_type;
        execute format('drop function if exists pgrag_docs.%I(jsonb, text[])',
                       pgrag._generated('stats', doc_type));
        return;
    end if;
    perform pgrag._refuse_temporary_objects();  -- (before the query's own checks: an error of
                                                -- its own)
    -- Compile and run it once over no rows, as the declarer: a query that does not parse, names
    -- a missing table, or does not return one jsonb column fails here, not in a user's search.
    begin
        -- (one statement: a `;` after a closing parenthesis cannot add statements of its own)
        perform pgrag._check_one_statement(pgrag._stats_statement(stats_sql, 'false'));
    exception when others then
        raise exception using
            errcode = 'PR003',
            message = format('the statistics query of %s does not work over no rows: %s',
                             doc_type, sqlerrm),
            hint = 'write one SELECT returning one jsonb over the CTE hits (id, doc_type, '
                   'source_key, parent_id, parent_key, metadata, text), schema-qualifying tables';
    end;
    insert into pgrag.doc_stats as s (doc_type, stats_sql, owner)
    values (declare_stats.doc_type, stats_sql, current_user::regrole)
    on conflict on constraint doc_stats_pkey
    do update set stats_sql = excluded.stats_sql, owner = excluded.owner, updated_at = now(),
                  query_tables = null;
    perform pgrag._create_stats_function(doc_type);
    -- the tables the query reads, found here, in the declarer's session: a superuser caching
    -- them later does not parse the declarer's query in its own (NULL: it cannot be cached)
    if pgrag._may_run_declared(current_user::regrole) then
        begin
            found_tables := pgrag._stats_query_tables(declare_stats.doc_type);
            update pgrag.doc_stats s set query_tables = found_tables
             where s.doc_type = declare_stats.doc_type;
        exception when sqlstate 'PR003' then
            null;  -- not cacheable: pgrag.cache_stats says why
        end;
    end if;
end
$$;

comment on function pgrag.declare_stats(text, text) is
    'Declare (or, with NULL, remove) the exact statistics of a document type: a SELECT over the '
    'CTE hits returning one jsonb';


create or replace function pgrag.stats_detail(filter jsonb default null,
                                              doc_types text[] default null)
returns table (doc_type text, stats jsonb, cached boolean)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
-- Each document type's exact statistics over every chunk matching the filter (the filter
-- language), for the types with declared statistics among doc_types (all when NULL), and
-- whether the result came from the statistics cache.
declare
    t record;
    one record;
    fn text;
    checked jsonb;
begin
    if doc_types is not null then
        perform pgrag._check_names(doc_types, 'doc_types');
    end if;
    perform pgrag._filter_sql(filter, pgrag._filter_schema(doc_types));  -- PR005 before any type
    -- each type's statistics run as their declarer (pgrag_docs.stats_<type>)
    -- (in a privileged session, only the statistics it may run: another role's are left
    -- out, pgrag._may_run_declared; asked for by name, they are refused)
    for t in select s.doc_type, s.owner from pgrag.doc_stats s
              where (stats_detail.doc_types is null and pgrag._may_run_declared(s.owner))
                 or s.doc_type = any(stats_detail.doc_types)
              order by s.doc_type loop
        checked := null;  -- (not an earlier type's, if the check below fails)
        fn := pgrag._generated('stats', t.doc_type);
        checked := pgrag._check_generated(array[fn], array[t.owner]);
        begin
            execute format('select * from pgrag_docs.%I($1::jsonb, $2::text[])', fn)
               into one using filter, stats_detail.doc_types;
            perform pgrag._check_generated_after(array[fn], checked, pgrag._session_state());
        exception
            when others or query_canceled or assert_failure then  -- (others: not the two)
                perform pgrag._undo_prepared(checked);  -- (a rollback keeps them)
                raise;
        end;
        doc_type := t.doc_type;
        stats := one.stats;
        cached := one.cached;
        return next;
    end loop;
end
$$;

comment on function pgrag.stats_detail(jsonb, text[]) is
    'Exact statistics per document type over every chunk matching a filter, with whether each '
    'came from the statistics cache';


select pgrag._drop_if_changed(to_regprocedure(
    'pgrag.stats(jsonb, text[])'), 'jsonb');

create or replace function pgrag.stats(filter jsonb default null, doc_types text[] default null)
returns jsonb
language sql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(jsonb_object_agg(d.doc_type, d.stats), '{}'::jsonb)
    from pgrag.stats_detail(filter, doc_types) d
$$;

comment on function pgrag.stats(jsonb, text[]) is
    'Exact statistics over every chunk matching a filter (the filter language), per document '
    'type with declared statistics: {"doc_type": {...}, ...}';


create or replace function pgrag.cache_stats(doc_type text, enabled boolean default true)
returns regclass[]
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- Cache (or, with false, stop caching) the statistics of doc_type; returns the tables whose
-- writes invalidate them (NULL when off). Invalidates the type's cached results either way:
-- calling it again is how to start afresh after DDL that rewrote a table without writing rows
-- through DML (ALTER TABLE ... TYPE), which no trigger sees.
declare
    deps regclass[];
    owner regrole;
begin
    select s.owner into owner from pgrag.doc_stats s where s.doc_type = cache_stats.doc_type;
    if owner is not null and not pgrag._may_act_as(owner) then
        raise exception using errcode = 'PR003',
            message = format('the statistics of %s belong to role %s, not to %s',
                             doc_type, owner, current_user),
            hint = format('cache them as %s (SET ROLE %s) or a member of it', owner, owner);
    end if;
    if enabled then
        if pgrag._stats_database_subscribed() then
            raise exception using errcode = 'PR003',
                message = format('the statistics of %s cannot be cached: this database has a '
                                 'logical replication subscription, whose apply process fires '
                                 'no statement trigger', doc_type),
                hint = 'leave them uncached here (computed at every call)';
        end if;
        if owner is null or pgrag._may_run_declared(owner) then
            deps := pgrag._stats_query_tables(doc_type);
        else
            -- a privileged session does not parse another role's query: the tables found
            -- when its declarer declared it
            select s.query_tables into deps from pgrag.doc_stats s
             where s.doc_type = cache_stats.doc_type;
            if deps is not null then  -- (tables that still exist: a conversion of the store
                -- replaced pgrag.chunks, whose current one is added as always; and that the
                -- declarer may read: it writes query_tables itself, and the tables listed get
                -- this session's statement triggers)
                deps := (select array_agg(distinct t order by t)
                           from unnest(deps || '{pgrag.chunks,pgrag.doc_stats}'::regclass[]) t
                          where exists (select from pg_class c where c.oid = t)
                            and (t in ('pgrag.chunks'::regclass, 'pgrag.doc_stats'::regclass)
                                 or has_table_privilege(owner, t, 'SELECT')));
                -- (pgrag's other tables, as pgrag._stats_query_tables refuses them)
                if exists (select from unnest(deps) t join pg_class c on c.oid = t
                            where c.relnamespace = 'pgrag'::regnamespace
                              and t not in ('pgrag.chunks'::regclass,
                                            'pgrag.doc_stats'::regclass)) then
                    raise exception using errcode = 'PR003',
                        message = format('the statistics of %s cannot be cached: they read a '
                                         'table of pgrag''s own whose writes the cache does '
                                         'not follow', doc_type),
                        hint = 'leave them uncached (computed at every call)';
                end if;
            end if;
            if deps is null then
                raise exception using errcode = 'PR008',
                    message = format('the statistics of %s, declared by %s, cannot be cached in a '
                                     'privileged session: pgrag does not parse %s''s query '
                                     'here, and it did not record its tables (not cacheable, or '
                                     'declared before revision 0010)', doc_type, owner, owner),
                    hint = format('cache them as %s (its own login), or declare them again as '
                                  '%s and cache them here', owner, owner);
            end if;
        end if;
    elsif not exists (select from pgrag.doc_stats s where s.doc_type = doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s has no declared statistics', doc_type),
            hint = 'pgrag.doc_stats lists the types with statistics';
    end if;
    -- the update is a write to pgrag.doc_stats, a table of every cached type: the type's
    -- results computed before it are never used again (and pruned); deleting them here could
    -- wait on a session that stored one and has not committed
    update pgrag.doc_stats s set cache_deps = deps where s.doc_type = doc_type;
    perform pgrag._sync_stats_triggers(deps);
    return deps;
end
$$;

comment on function pgrag.cache_stats(text, boolean) is
    'Cache a type''s exact statistics per filter, reused while the tables they read are unchanged '
    '(false: compute them at every call); returns those tables';

