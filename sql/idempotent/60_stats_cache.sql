-- The statistics cache: a document type's exact statistics for a filter, computed once and
-- reused while no table its declared query reads has changed.
-- Introduced by revision 0008: applied by that revision and every later one.
-- Re-applied by every migration that reaches head. docs/search.md ("The statistics cache")
-- explains the design; this is the proof that a cached result is exact.
--
-- Turned on per document type with pgrag.cache_stats(doc_type). It reads the tables the
-- declared query depends on (PostgreSQL's own dependency records of a temporary view over it)
-- and refuses a query whose result can change without any of them changing: one that reads a
-- materialized view, a foreign or partitioned table, a table with row-level security, or calls
-- a function of the user's, a volatile one, or one that reads the clock or a setting.
--
-- Writes. A statement trigger on each of those tables and on pgrag.chunks (pgrag.stats_changed,
-- ENABLE ALWAYS: logical replication's apply fires it too) inserts (its transaction id, the
-- table) into pgrag.stats_changes once per transaction and table. The row commits or aborts
-- with the write. pgrag.chunks' trigger leaves out the embedding columns: the worker storing
-- vectors changes no statistics.
--
-- Reads. A result is stored with the snapshot S it was computed in. A later statement with
-- snapshot R reuses it only when R sees exactly the transactions S saw among those that wrote
-- the tables (so the query over R's data would read the same rows and return the same result):
--   1. R sees everything S saw: S.xmax <= R.xmax, and no transaction R sees as running is one
--      S saw as finished (every xid in R's running list below S.xmax is in S's);
--   2. S sees everything R sees: no row of stats_changes for those tables (R reads only the ones
--      visible to it) has an xid at or above S.xmin that S does not see;
--   3. the computing transaction wrote none of those tables (its later writes are not in S,
--      though its xid counts as seen by S).
-- Rows of stats_changes below the horizon are pruned (pgrag.stats_cache_put); a result whose
-- S.xmin is below the horizon could miss a pruned row in 2, so it is not used.
--
-- Who: a result is reused only by the role that computed it (its privileges ran the query),
-- and only for sessions that see every tenant: a reader's statistics (row-level security)
-- are computed every time, through pgrag.reader_doc_type_stats as before.

create or replace function pgrag.stats_changed()
returns trigger
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
-- security definer, owned by the migrating role: any role that may write a table that cached
-- statistics read records its transaction, without any grant on pgrag's tables. It only
-- inserts the trigger's own table and transaction id.
begin
    insert into pgrag.stats_changes (relid) values (tg_relid) on conflict do nothing;
    return null;
end
$$;

comment on function pgrag.stats_changed() is
    'Statement trigger: record that this transaction wrote a table some cached statistics read';

create or replace function pgrag.stats_query_tables(doc_type text)
returns regclass[]
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- The tables the declared statistics query of doc_type reads (through views too), pgrag.chunks
-- included; PR003 naming the cause when its result could change with none of them changing.
declare
    body text;
    probe text := 'pgrag_stats_probe_' || pg_backend_pid();
    tables regclass[];
    why text;
begin
    select s.stats_sql into body from pgrag.doc_stats s where s.doc_type = doc_type;
    if body is null then
        raise exception using errcode = 'PR003',
            message = format('document type %s has no declared statistics', doc_type),
            hint = 'declare them first with pgrag.declare_stats, then cache them';
    end if;
    -- a temporary view records what the query depends on; dropped before returning
    execute format('create temporary view %I as %s', probe,
                   pgrag.stats_statement(body, 'false'));
    with recursive rel(oid, relkind, rewrite) as (
        select c.oid, c.relkind, r.oid
          from pg_rewrite r
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = r.oid
                          and d.refclassid = 'pg_class'::regclass and d.refobjid <> r.ev_class
          join pg_class c on c.oid = d.refobjid
         where r.ev_class = format('pg_temp.%I', probe)::regclass
        union
        select c.oid, c.relkind, r2.oid
          from rel
          join pg_rewrite r on r.ev_class = rel.oid and r.rulename = '_RETURN'
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = r.oid
                          and d.refclassid = 'pg_class'::regclass and d.refobjid <> r.ev_class
          join pg_class c on c.oid = d.refobjid
          left join pg_rewrite r2 on r2.ev_class = c.oid and r2.rulename = '_RETURN'
    ),
    rules as (  -- the probe's rule and every view's on the way
        select r.oid, r.ev_action from pg_rewrite r
         where r.ev_class = format('pg_temp.%I', probe)::regclass
        union
        select r.oid, r.ev_action from rel join pg_rewrite r on r.oid = rel.rewrite
    ),
    called as (  -- every function the rules call, built-in ones included
        select distinct m[1]::oid as oid
          from rules, regexp_matches(rules.ev_action::text,
                                     ':(?:funcid|aggfnoid|winfnoid|opfuncid) (\d+)', 'g') m
    ),
    problems as (
        select format('it reads %s, a %s, which changes with no write a trigger sees',
                      rel.oid::regclass,
                      case rel.relkind when 'm' then 'materialized view'
                                       when 'f' then 'foreign table'
                                       when 'p' then 'partitioned table'
                                       else 'relation of kind ' || rel.relkind::text end) as why
          from rel where rel.relkind not in ('r', 'v')
        union all
        select format('it reads %s, which has row-level security: its result depends on who asks',
                      rel.oid::regclass)
          from rel join pg_class c on c.oid = rel.oid
         where rel.relkind = 'r' and c.relrowsecurity and rel.oid <> 'pgrag.chunks'::regclass
        union all
        select format('it calls %s, %s', p.oid::regprocedure,
                      case when p.pronamespace <> 'pg_catalog'::regnamespace
                           then 'a function of yours, which may read tables the cache cannot see'
                           when p.provolatile = 'v' then 'which is volatile'
                           else 'which reads the clock or a setting' end)
          from called join pg_proc p on p.oid = called.oid
         where p.pronamespace <> 'pg_catalog'::regnamespace or p.provolatile = 'v'
            or p.proname in ('now', 'statement_timestamp', 'transaction_timestamp', 'age',
                             'current_setting', 'current_schema', 'current_schemas',
                             'current_database', 'pg_current_xact_id', 'txid_current',
                             'inet_client_addr', 'pg_backend_pid', 'has_table_privilege',
                             'has_column_privilege', 'pg_has_role', 'to_regclass')
        union all
        select 'it reads the clock or the session (CURRENT_DATE, CURRENT_USER...)'
          from rules where rules.ev_action::text ~ '\{SQLVALUEFUNCTION'
    )
    select (select array_agg(distinct rel.oid::regclass order by rel.oid::regclass)
              from rel where rel.relkind = 'r'),
           (select string_agg(distinct problems.why, '; ') from problems)
      into tables, why;
    execute format('drop view pg_temp.%I', probe);
    if why is not null then
        raise exception using errcode = 'PR003',
            message = format('the statistics of %s cannot be cached: %s', doc_type, why),
            hint = 'leave them uncached (computed at every call), or declare a query that reads '
                   'only tables and built-in functions';
    end if;
    return (select array_agg(distinct t order by t)
              from unnest(tables || 'pgrag.chunks'::regclass) t);
end
$$;

comment on function pgrag.stats_query_tables(text) is
    'The tables a type''s declared statistics read (views followed); PR003 when a cached '
    'result could go stale with none of them written';

create or replace function pgrag.sync_stats_triggers()
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The trigger pgrag_stats_changed on exactly the tables some cached statistics read: created
-- where missing, dropped where no longer needed. pgrag.chunks' leaves out the vector columns.
declare
    wanted regclass[];
    t regclass;
begin
    select coalesce(array_agg(distinct d), '{}') into wanted
      from pgrag.doc_stats s, unnest(s.cache_deps) d
     where s.cache_deps is not null
       and exists (select from pg_class c where c.oid = d);  -- not a dropped table's
    for t in select tg.tgrelid::regclass from pg_trigger tg
              where tg.tgname = 'pgrag_stats_changed' and tg.tgrelid <> all(wanted) loop
        execute format('drop trigger pgrag_stats_changed on %s', t);
    end loop;
    foreach t in array wanted loop
        continue when exists (select from pg_trigger tg
                               where tg.tgname = 'pgrag_stats_changed' and tg.tgrelid = t);
        begin
            execute format(
                'create trigger pgrag_stats_changed after insert or update%s or delete or '
                'truncate on %s for each statement execute function pgrag.stats_changed()',
                case when t = 'pgrag.chunks'::regclass
                     then ' of doc_type, source_key, parent_id, parent_key, text, metadata, tenant'
                     else '' end, t);
            execute format('alter table %s enable always trigger pgrag_stats_changed', t);
        exception when insufficient_privilege then
            raise exception using errcode = 'PR003',
                message = format('cannot put the statistics cache''s trigger on %s: %s',
                                 t, sqlerrm),
                hint = format('run it as the owner of %s or a member of its owner''s role', t);
        end;
    end loop;
end
$$;

comment on function pgrag.sync_stats_triggers() is
    'Put the trigger pgrag_stats_changed on exactly the tables cached statistics read';

create or replace function pgrag.cache_stats(doc_type text, enabled boolean default true)
returns regclass[]
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- Cache (or, with false, stop caching) the statistics of doc_type; returns the tables whose
-- writes invalidate them (NULL when off). Drops the type's cached results either way: calling
-- it again is how to start afresh after DDL that rewrote a table without writing rows through
-- DML (ALTER TABLE ... TYPE), which no trigger sees.
declare
    deps regclass[];
begin
    if enabled then
        deps := pgrag.stats_query_tables(doc_type);
    elsif not exists (select from pgrag.doc_stats s where s.doc_type = doc_type) then
        raise exception using errcode = 'PR003',
            message = format('document type %s has no declared statistics', doc_type),
            hint = 'pgrag.doc_stats lists the types with statistics';
    end if;
    update pgrag.doc_stats s set cache_deps = deps where s.doc_type = doc_type;
    delete from pgrag.stats_cache c where c.doc_type = doc_type;
    perform pgrag.sync_stats_triggers();
    return deps;
end
$$;

comment on function pgrag.cache_stats(text, boolean) is
    'Cache a type''s exact statistics per filter, reused while the tables they read are unchanged '
    '(false: compute them at every call); returns those tables';

create or replace function pgrag.stats_redeclared()
returns trigger
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- pgrag.declare_stats changed a cached type's query: its cached results are of the old one,
-- and the new one may read other tables (or be one that cannot be cached: PR003, nothing
-- changes). Removed (declare_stats with NULL, the type dropped): its tables may need their
-- triggers no more.
begin
    if tg_op = 'DELETE' then
        if old.cache_deps is not null then
            perform pgrag.sync_stats_triggers();
        end if;
    elsif new.cache_deps is not null and new.stats_sql is distinct from old.stats_sql then
        perform pgrag.cache_stats(new.doc_type, true);
    end if;
    return null;
end
$$;

comment on function pgrag.stats_redeclared() is
    'Trigger: a cached type''s statistics query changed or went: re-read its tables';

drop trigger if exists pgrag_stats_redeclared on pgrag.doc_stats;
create trigger pgrag_stats_redeclared after update of stats_sql or delete on pgrag.doc_stats
    for each row execute function pgrag.stats_redeclared();

create or replace function pgrag.stats_cache_valid(snap pg_snapshot, owner_xid xid8,
                                                   deps regclass[])
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether statistics computed in snapshot `snap` (by transaction owner_xid, if it had an id)
-- hold for the calling statement's snapshot: the three conditions at the top of this file,
-- snap not older than the horizon of pgrag.stats_changes, and every table's trigger in place.
return (
    with now_snap as (select pg_current_snapshot() as r)
    -- every table still has its trigger, enabled always (a dropped and recreated table, or
    -- ALTER TABLE ... DISABLE TRIGGER, would write unseen: pgrag.cache_stats again restores it)
    select (select count(*) from pg_trigger tg
             where tg.tgrelid = any(deps::oid[]) and tg.tgname = 'pgrag_stats_changed'
               and tg.tgenabled = 'A') = cardinality(deps)
       and pg_snapshot_xmin(snap) >= (select h.pruned_below from pgrag.stats_cache_horizon h)
       and pg_snapshot_xmax(snap) <= pg_snapshot_xmax(now_snap.r)
       and not exists (select from pg_snapshot_xip(now_snap.r) x
                        where x < pg_snapshot_xmax(snap)
                          and x not in (select pg_snapshot_xip(snap)))
       and not exists (select from pgrag.stats_changes l
                        where l.xid >= pg_snapshot_xmin(snap)
                          and l.relid = any(deps::oid[])
                          and not pg_visible_in_snapshot(l.xid, snap))
       and (owner_xid is null
            or not exists (select from pgrag.stats_changes l
                            where l.xid = owner_xid and l.relid = any(deps::oid[])))
    from now_snap);

comment on function pgrag.stats_cache_valid(pg_snapshot, xid8, regclass[]) is
    'Whether statistics computed in a snapshot still hold for the calling statement''s snapshot';

create or replace function pgrag.stats_cache_put(doc_type text, condition text, stats jsonb,
                                                 snap pg_snapshot, owner_xid xid8)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
set lock_timeout = '50ms'
as $$
#variable_conflict use_variable
-- Store a result (pgrag.doc_type_stats_where calls it on a miss). Best effort: on a standby,
-- in a read-only transaction, or when another session holds the row, nothing is stored and
-- the search goes on. A newer result is never replaced by an older one. Every 1,000 changes
-- it prunes pgrag.stats_changes below the oldest snapshot any result or session may need.
declare
    horizon xid8;
begin
    if pg_is_in_recovery() or current_setting('transaction_read_only')::boolean then
        return;
    end if;
    begin
        select h.pruned_below into horizon from pgrag.stats_cache_horizon h;
        if pg_snapshot_xmin(snap) < horizon then
            return;
        end if;
        insert into pgrag.stats_cache as c
            (doc_type, role_name, condition_hash, condition, stats, snap, owner_xid)
        values (doc_type, current_user, sha256(convert_to(condition, 'UTF8')), condition,
                stats, snap, owner_xid)
        on conflict on constraint stats_cache_pkey do update
            set stats = excluded.stats, snap = excluded.snap, owner_xid = excluded.owner_xid,
                condition = excluded.condition, computed_at = now()
            where pg_snapshot_xmax(excluded.snap) >= pg_snapshot_xmax(c.snap);
        if (select count(*) from (select from pgrag.stats_changes limit 1000) x) >= 1000 then
            perform pgrag.prune_stats_changes();
        end if;
    exception
        when serialization_failure or lock_not_available or read_only_sql_transaction
             or insufficient_privilege then
            null;  -- not stored: the next call computes it again
    end;
end
$$;

comment on function pgrag.stats_cache_put(text, text, jsonb, pg_snapshot, xid8) is
    'Store computed statistics with their snapshot (best effort; never an older over a newer)';

create or replace function pgrag.prune_stats_changes()
returns bigint
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- Move the horizon up to the oldest snapshot that still matters: the oldest of this session's
-- snapshot and the cached results younger than a day (older ones are dropped), and delete the
-- rows of pgrag.stats_changes below it. Returns how many it deleted. Skips when another
-- session is pruning.
declare
    h pgrag.stats_cache_horizon;
    target xid8;
    n bigint;
begin
    select * into h from pgrag.stats_cache_horizon for update skip locked;
    if not found then
        return 0;
    end if;
    delete from pgrag.stats_cache c where c.computed_at < now() - interval '1 day';
    select least(pg_snapshot_xmin(pg_current_snapshot()), min(pg_snapshot_xmin(c.snap)))
      into target from pgrag.stats_cache c;
    if target <= h.pruned_below then
        return 0;
    end if;
    update pgrag.stats_cache_horizon set pruned_below = target;
    delete from pgrag.stats_changes l where l.xid < target;
    get diagnostics n = row_count;
    return n;
end
$$;

comment on function pgrag.prune_stats_changes() is
    'Delete the rows of pgrag.stats_changes no cached result or running snapshot needs';

-- Replaces 40_security.sql's version (the downgrade of 0008 re-applies that one): the cache.
create or replace function pgrag.doc_type_stats_where(doc_type text, condition text)
returns jsonb
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- pgrag.doc_type_stats over the chunks (alias c) of doc_type matching `condition`, a boolean
-- SQL expression with its values written as literals (the Python client's compiled filter):
-- for a session that sees every tenant, the declared query runs over those chunks in one pass,
-- or its cached result is returned when still exact (pgrag.cache_stats; the top of
-- 60_stats_cache.sql). Any other session (a reader) gets pgrag.reader_doc_type_stats over the
-- ids it may see, computed every time. It runs as the caller; through a cursor, which refuses
-- a string of several statements (pgrag.check_one_statement). The query and the snapshot it
-- reads are those of the calling statement (stable), so the result matches its search.
declare
    body text;
    deps regclass[];
    cur refcursor;
    result jsonb;
    snap pg_snapshot;
begin
    if not pgrag.sees_all_tenants() then
        open cur no scroll for execute format(
            'select pgrag.reader_doc_type_stats($1, array(select c.id from pgrag.chunks c '
            'where c.doc_type = $1 and (%s)))', condition)
            using doc_type;
        fetch cur into result;
        close cur;
        return result;
    end if;
    select s.stats_sql, s.cache_deps into body, deps
      from pgrag.doc_stats s where s.doc_type = doc_type;
    if body is null then
        return null;
    end if;
    -- (a role that sees every tenant without the writer's grants computes every time)
    deps := case when has_table_privilege('pgrag.stats_cache', 'select') then deps end;
    if deps is not null then
        select c.stats into result from pgrag.stats_cache c
         where c.doc_type = doc_type and c.role_name = current_user
           and c.condition_hash = sha256(convert_to(condition, 'UTF8'))
           and pgrag.stats_cache_valid(c.snap, c.owner_xid, deps);
        if found then
            return result;
        end if;
    end if;
    open cur no scroll for execute
        pgrag.stats_statement(body, format('c.doc_type = $1 and (%s)', condition))
        using doc_type;
    fetch cur into result;
    close cur;
    if deps is not null then
        perform pgrag.stats_cache_put(doc_type, condition, result, pg_current_snapshot(),
                                      pg_current_xact_id_if_assigned());
    end if;
    return result;
end
$$;

comment on function pgrag.doc_type_stats_where(text, text) is
    'A document type''s statistics over its chunks matching a condition with literal values, '
    'in one pass or from the statistics cache (readers through pgrag.reader_doc_type_stats)';

-- ---- grants, for the role names in pgrag.settings ----

do $$
declare
    s pgrag.settings;
begin
    select * into strict s from pgrag.settings;
    -- The trigger function is the migrating role's (security definer): anyone may write a
    -- watched table. Caching is the writer's to turn on, like declaring the statistics.
    revoke all on function pgrag.stats_changed() from public;
    revoke all on function pgrag.cache_stats(text, boolean) from public;
    execute format('grant execute on function pgrag.cache_stats(text, boolean) to %I',
                   s.writer_role);
    -- The cache holds every tenant's statistics: the writer's (and the owner's) alone.
    execute format('grant select, insert, update, delete on pgrag.stats_cache to %I',
                   s.writer_role);
    execute format('grant select, update on pgrag.stats_cache_horizon to %I', s.writer_role);
    execute format('grant select, delete on pgrag.stats_changes to %I', s.writer_role);
end
$$;
