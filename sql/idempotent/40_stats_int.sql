-- Exact statistics, internals: the statement every statistics call runs, the generated function
-- that runs a type's declared statistics as their declarer (pgrag_docs.stats_<type>, its body
-- pgrag._type_stats), and the statistics cache: a type's exact statistics for a filter, computed
-- once and reused while no table its declared query reads has changed.
--
-- The statistics cache. docs/search.md ("The statistics cache") explains the design; this is
-- the argument that a cached result is exact.
--
-- Turned on per document type with pgrag.cache_stats(doc_type). It reads the tables the
-- declared query depends on (PostgreSQL's own dependency records of a temporary view over it)
-- and refuses a query whose result can change without any of them changing (the list is in
-- pgrag.stats_query_tables). pgrag.doc_stats is always one of the tables: a redeclared query,
-- or the cache turned off and on, is a write like any other.
--
-- Writes. A statement trigger on each of those tables (pgrag.stats_changed, ENABLE ALWAYS)
-- inserts (its top-level transaction id, the table) into pgrag.stats_changes once per
-- transaction and table. The row commits or aborts with the write. pgrag.chunks' trigger
-- leaves out the embedding columns: the worker storing vectors changes no statistics.
--
-- Reads. A result is stored with the snapshot S it was computed in. A later statement with
-- snapshot R reuses it only when R sees exactly the transactions S saw among those that wrote
-- the tables, so the query over R's data would read the same rows and return the same result:
--   1. R sees everything S saw: S.xmax <= R.xmax, and no transaction R sees as running is one
--      S saw as finished. (On a primary this always holds once R can see the stored row, since
--      the row commits after S; it is kept as a cheap guard.)
--   2. S sees everything R sees: no row of stats_changes for those tables that R can see has
--      an xid at or above S.xmin that S does not see (commits reach the WAL in order, so a
--      write S did not see and R does is recorded by a row R sees);
--   3. the computing transaction wrote none of those tables (its later writes are not in S,
--      though its own xid counts as seen by S).
-- And everything else the result depends on is as it was: the same server (xids restart in a
-- restored dump: pg_postmaster_start_time), the same session settings output depends on (in
-- the key), each table's trigger unchanged since (a trigger disabled, written around and
-- re-enabled has a new pg_trigger row), every table still readable by the role and without
-- row-level security or inheritance children, and no logical replication subscription in the
-- database (its apply process fires row triggers only).
-- Rows of stats_changes below the horizon are pruned (pgrag.prune_stats_changes); a result
-- whose S.xmin is below the horizon could miss a pruned row in 2, so it is not used.
--
-- Who: a result is computed and reused by the role that declared the statistics (they run as
-- that role, in pgrag_docs.stats_<type>; row-level security on pgrag.stats_cache keeps every
-- role to its own rows), and only for sessions that see every tenant: a reader's statistics
-- (its tenant's chunks only) are computed every time. SERIALIZABLE
-- transactions neither read nor store results (the cache's reads would add serialization
-- conflicts between searches).

-- (its earlier three-argument form would make two-argument calls ambiguous)
drop function if exists pgrag._stats_statement(text, text, boolean);

create or replace function pgrag._stats_statement(stats_sql text, hits_where text)
returns text
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
-- The one statement every statistics call runs: a type's declared query (stats_sql) over the
-- CTE hits, its chunks matching hits_where (alias c). The newline ends a `--` comment the
-- declared query may end with.
return format(
    'with hits as (select c.id, c.doc_type, c.source_key, c.parent_id, c.parent_key, '
    'c.metadata, c.text from pgrag.chunks c where %s) '
    'select s.stats::jsonb from (%s', hits_where, stats_sql)
    || E'\n) as s(stats)';

comment on function pgrag._stats_statement(text, text) is
    'The statement of a statistics call: the declared query over the CTE hits (its columns '
    'defined here once)';


create or replace function pgrag._stats_chunk_columns()
returns text[]
language sql immutable parallel safe security invoker
set search_path = pg_catalog, pg_temp
return '{id,doc_type,source_key,parent_id,parent_key,text,metadata,tenant}'::text[];

comment on function pgrag._stats_chunk_columns() is
    'The columns of pgrag.chunks whose writes invalidate cached statistics';


create or replace function pgrag._stats_query_tables(doc_type text)
returns regclass[]
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- The tables the declared statistics query of doc_type reads (through views too), with
-- pgrag.chunks and pgrag.doc_stats; PR003 naming the cause when its result could change with
-- none of them written: it reads a relation that is not a plain table or view (materialized
-- view, foreign or partitioned table), a table with row-level security or inheritance
-- children, a column of pgrag.chunks the trigger does not watch, samples rows (TABLESAMPLE),
-- or calls a function of the user's, a volatile one, or one that reads the clock, the
-- catalogs or the session.
declare
    body text;
    probe text := 'pgrag_stats_probe_' || pg_backend_pid();
    tables regclass[];
    why text;
    declarer regrole;
    was name := current_user;
    before jsonb := pgrag._session_token();
begin
    select s.stats_sql, s.owner into body, declarer
      from pgrag.doc_stats s where s.doc_type = doc_type;
    if body is null then
        raise exception using errcode = 'PR003',
            message = format('document type %s has no declared statistics', doc_type),
            hint = 'declare them first with pgrag.declare_stats, then cache them';
    end if;
    -- (SET ROLE below does not protect a privileged session: the declarer's code can reset
    -- the role to the session's own, and act outside the transaction before the rollback)
    perform pgrag._refuse_declared(declarer, format('the statistics of %s', doc_type));
    -- A temporary view records what the query depends on, in a subtransaction that is always
    -- rolled back. Its query is the declarer's SQL, and parsing it runs code (a domain's CHECK,
    -- for one): it is parsed as the declarer (the caller may act as it: pgrag.cache_stats
    -- checks), and whatever it did to the session (a search_path set for the rest of it, a
    -- temporary object, the role) is undone with the subtransaction; the statements it
    -- prepared, which a rollback keeps, are deallocated (pgrag._undo_prepared).
    begin
        if declarer is not null and declarer <> was::regrole then
            execute format('set local role %s', declarer);
        end if;
        execute format('create temporary view %I as %s', probe,
                       pgrag._stats_statement(body, 'false'));
    with recursive rel(oid, relkind, rewrite) as (
        select c.oid, c.relkind, r2.oid
          from pg_rewrite r
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = r.oid
                          and d.refclassid = 'pg_class'::regclass and d.refobjid <> r.ev_class
          join pg_class c on c.oid = d.refobjid
          left join pg_rewrite r2 on r2.ev_class = c.oid and r2.rulename = '_RETURN'
         where r.ev_class = format('pg_temp.%I', probe)::regclass
        union
        select c.oid, c.relkind, r2.oid
          from rel
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = rel.rewrite
                          and d.refclassid = 'pg_class'::regclass and d.refobjid <> rel.oid
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
                     and rel.oid <> 'pgrag.chunks'::regclass  -- (partitioned: its trigger sees
                                                               -- the writes, made through it)
        union all
        select format('it reads %s, which has %s', rel.oid::regclass,
                      case when c.relrowsecurity
                           then 'row-level security: its result depends on who asks'
                           else 'inheritance children, which it reads too' end)
          from rel join pg_class c on c.oid = rel.oid
         where rel.relkind = 'r' and rel.oid <> 'pgrag.chunks'::regclass
           and (c.relrowsecurity or c.relhassubclass)
        union all
        select format('it reads %s, a table of pgrag''s own whose writes the cache does not '
                      'follow', rel.oid::regclass)
          from rel join pg_class c on c.oid = rel.oid
         where c.relnamespace = 'pgrag'::regnamespace
           and rel.oid not in ('pgrag.chunks'::regclass, 'pgrag.doc_stats'::regclass)
        union all
        select format('it reads pgrag.chunks.%I, whose writes do not invalidate it', a.attname)
          from rules
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = rules.oid
                          and d.refobjid = 'pgrag.chunks'::regclass and d.refobjsubid > 0
          join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid
         where a.attname::text <> all(pgrag._stats_chunk_columns())
        union all
        select format('it calls %s, %s', p.oid::regprocedure,
                      case when p.pronamespace <> 'pg_catalog'::regnamespace
                           then 'a function of yours, which may read tables the cache cannot see'
                           when p.provolatile = 'v' then 'which is volatile'
                           else 'which reads the clock, the catalogs or the session' end)
          from called join pg_proc p on p.oid = called.oid
         where p.pronamespace <> 'pg_catalog'::regnamespace or p.provolatile = 'v'
            or (p.provolatile = 's'
                and (p.proname ~ '^(pg_|has_|to_reg|current_|session_|inet_|txid_)'
                     or p.proname in ('now', 'statement_timestamp', 'transaction_timestamp',
                                      'age', 'timeofday', 'obj_description', 'col_description',
                                      'shobj_description', 'format_type', 'quote_ident')))
        union all
        select 'it reads the clock or the session (CURRENT_DATE, CURRENT_USER...)'
          from rules where rules.ev_action::text ~ '\{SQLVALUEFUNCTION'
        union all
        select 'it samples rows (TABLESAMPLE)'
          from rules where rules.ev_action::text ~ '\{TABLESAMPLECLAUSE'
    )
    select (select array_agg(distinct rel.oid::regclass order by rel.oid::regclass)
              from rel where rel.relkind = 'r'),
           (select string_agg(distinct problems.why, '; ') from problems)
      into tables, why;
        raise exception using errcode = 'PR0RB';  -- (caught below: roll it all back)
    exception
        when sqlstate 'PR0RB' then
            null;
        when others or query_canceled or assert_failure then  -- (others: not the two)
            perform pgrag._undo_prepared(before);
            raise;
    end;
    perform pgrag._undo_prepared(before);
    if why is not null then
        raise exception using errcode = 'PR003',
            message = format('the statistics of %s cannot be cached: %s', doc_type, why),
            hint = 'leave them uncached (computed at every call), or declare a query that reads '
                   'only tables and built-in functions';
    end if;
    return (select array_agg(distinct t order by t)
              from unnest(tables || '{pgrag.chunks,pgrag.doc_stats}'::regclass[]) t);
end
$$;

comment on function pgrag._stats_query_tables(text) is
    'The tables a type''s declared statistics read (views followed, with pgrag.chunks and '
    'pgrag.doc_stats); PR003 when a cached result could go stale with none of them written';


create or replace function pgrag._sync_stats_triggers(ensure regclass[])
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- The trigger pgrag_stats_changed: created, or re-enabled ALWAYS, on the tables in `ensure`
-- (the type being cached); dropped from the tables no cached type reads any more (left, with
-- a notice, on a table the caller may not alter: it only records writes). pgrag.chunks' and
-- pgrag.doc_stats' stay once created: dropping a trigger takes an ACCESS EXCLUSIVE lock,
-- which would queue every search behind the longest one. pgrag.chunks' leaves out the vector
-- columns.
declare
    wanted regclass[];
    t regclass;
begin
    select coalesce(array_agg(distinct d), '{}') into wanted
      from pgrag.doc_stats s, unnest(s.cache_deps) d
     where s.cache_deps is not null
       and exists (select from pg_class c where c.oid = d);  -- not a dropped table's
    for t in select tg.tgrelid::regclass from pg_trigger tg
              where tg.tgname = 'pgrag_stats_changed' and tg.tgrelid <> all(wanted)
                and tg.tgrelid not in ('pgrag.chunks'::regclass, 'pgrag.doc_stats'::regclass)
    loop
        begin
            execute format('drop trigger pgrag_stats_changed on %s', t);
        exception when insufficient_privilege then
            raise notice 'pgrag_stats_changed stays on %: %', t, sqlerrm
                using hint = format('its owner may drop it: drop trigger pgrag_stats_changed '
                                    'on %s', t);
        end;
    end loop;
    foreach t in array coalesce(ensure, '{}') loop
        continue when exists (select from pg_trigger tg
                               where tg.tgname = 'pgrag_stats_changed' and tg.tgrelid = t
                                 and tg.tgenabled = 'A');
        -- never on pgrag's other tables: on pgrag.stats_changes, which its function writes, it
        -- fired itself until the stack ran out, and every write to the store failed
        continue when t not in ('pgrag.chunks'::regclass, 'pgrag.doc_stats'::regclass)
                  and exists (select from pg_class c
                               where c.oid = t and c.relnamespace = 'pgrag'::regnamespace);
        begin
            if not exists (select from pg_trigger tg
                            where tg.tgname = 'pgrag_stats_changed' and tg.tgrelid = t) then
                execute format(
                    'create trigger pgrag_stats_changed after insert or update%s or delete or '
                    'truncate on %s for each statement execute function pgrag.stats_changed()',
                    case when t = 'pgrag.chunks'::regclass
                         then ' of ' || array_to_string(pgrag._stats_chunk_columns(), ', ')
                         else '' end, t);
            end if;
            -- (also a disabled one: cache_stats is how to turn the cache back on)
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

comment on function pgrag._sync_stats_triggers(regclass[]) is
    'Put the trigger pgrag_stats_changed on the given tables; drop it where no cached type needs it';


create or replace function pgrag._stats_database_subscribed()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether this database has a logical replication subscription: its apply process fires row
-- triggers only, so writes it applies would go unrecorded.
return exists (select from pg_subscription s
                where s.subdbid = (select d.oid from pg_database d
                                    where d.datname = current_database()));

comment on function pgrag._stats_database_subscribed() is
    'Whether this database has a logical replication subscription (no cached statistics then)';


create or replace function pgrag._stats_redeclared()
returns trigger
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $$
-- pgrag.declare_stats changed a cached type's query: the new one may read other tables (or be
-- one that cannot be cached: PR003, nothing changes). Its old results are invalid anyway:
-- pgrag.doc_stats is one of every cached type's tables. Removed (declare_stats with NULL, the
-- type dropped): its tables may need their triggers no more.
begin
    if tg_op = 'DELETE' then
        if old.cache_deps is not null then
            perform pgrag._sync_stats_triggers('{}');
        end if;
    elsif new.cache_deps is not null and new.stats_sql is distinct from old.stats_sql then
        perform pgrag.cache_stats(new.doc_type, true);
    end if;
    return null;
end
$$;

comment on function pgrag._stats_redeclared() is
    'Trigger: a cached type''s statistics query changed or went: re-read its tables';

-- (created once, re-pointed only when it calls another function: a trigger's DDL locks its table)
do $$
begin
    if not exists (select from pg_trigger
                    where tgrelid = 'pgrag.doc_stats'::regclass
                      and tgname = 'pgrag_stats_redeclared'
                      and tgfoid = 'pgrag._stats_redeclared()'::regprocedure) then
        create or replace trigger pgrag_stats_redeclared
            after update of stats_sql or delete on pgrag.doc_stats
            for each row execute function pgrag._stats_redeclared();
    end if;
end
$$;


create or replace function pgrag._stats_triggers_state(deps regclass[])
returns text
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The tables' pgrag_stats_changed triggers as they are: NULL unless every table has one,
-- enabled always; else each trigger's row version, which ALTER TABLE ... DISABLE / ENABLE
-- TRIGGER changes (a write while it was disabled went unrecorded).
return (
    select case when count(*) = cardinality(deps) and bool_and(tg.tgenabled = 'A')
                then string_agg(tg.oid::text || ':' || tg.xmin::text, ',' order by tg.oid) end
      from pg_trigger tg
     where tg.tgrelid = any(deps::oid[]) and tg.tgname = 'pgrag_stats_changed');

comment on function pgrag._stats_triggers_state(regclass[]) is
    'The cached tables'' triggers as they are now (NULL when one is missing or not always on)';


create or replace function pgrag._stats_settings_key()
returns text
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- The session settings a statistics query's output may depend on (timestamptz and date
-- output, number and money formats): part of a cached result's key.
return concat_ws(E'\x1f', current_setting('TimeZone'), current_setting('DateStyle'),
                 current_setting('IntervalStyle'), current_setting('extra_float_digits'),
                 current_setting('lc_monetary'), current_setting('lc_numeric'),
                 current_setting('lc_time'), current_setting('bytea_output'),
                 current_setting('timezone_abbreviations'),
                 current_setting('default_text_search_config'));

comment on function pgrag._stats_settings_key() is
    'The session settings a cached statistics result is keyed by';


create or replace function pgrag._stats_cache_usable()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether this statement may read and store cached statistics: not under SERIALIZABLE, and
-- with the writer's grants on the cache's tables (a role that sees every tenant without them
-- computes every time, as before 0008).
return current_setting('transaction_isolation') <> 'serializable'
   and has_table_privilege('pgrag.stats_cache', 'select')
   and has_table_privilege('pgrag.stats_cache', 'insert')
   and has_table_privilege('pgrag.stats_cache', 'update')
   and has_table_privilege('pgrag.stats_changes', 'select')
   and has_table_privilege('pgrag.stats_cache_horizon', 'select');

comment on function pgrag._stats_cache_usable() is
    'Whether the calling statement may use the statistics cache';


create or replace function pgrag._stats_cache_valid(c pgrag.stats_cache, deps regclass[],
                                                   state text)
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether cached result c (of a type reading deps) holds for the calling statement's
-- snapshot: the conditions at the top of this file. state: pgrag._stats_triggers_state(deps)
-- in this snapshot (the caller has it already: read once, not once per result).
return (
    with now_snap as (select pg_current_snapshot() as r)
    select (c).server_started = pg_postmaster_start_time()
       and (c).triggers = state
       and not exists (select from pg_class t
                        where t.oid = any(deps::oid[])
                          -- pgrag's own: the chunks' policies are applied by who computes (a
                          -- reader's are never cached), doc_stats' guard its writes only
                          and t.oid not in ('pgrag.chunks'::regclass, 'pgrag.doc_stats'::regclass)
                          and (t.relrowsecurity or t.relhassubclass))
       and not exists (select from pg_class t
                        where t.oid = any(deps::oid[])
                          and not (has_table_privilege(t.oid, 'select')
                                   and has_schema_privilege(t.relnamespace, 'usage')))
       and not pgrag._stats_database_subscribed()
       and (select h.server_started = (c).server_started
                   and pg_snapshot_xmin((c).snap) >= h.pruned_below
              from pgrag.stats_cache_horizon h)
       and pg_snapshot_xmax((c).snap) <= pg_snapshot_xmax(now_snap.r)
       and not exists (select from pg_snapshot_xip(now_snap.r) x
                        where x < pg_snapshot_xmax((c).snap)
                          and x not in (select pg_snapshot_xip((c).snap)))
       and not exists (select from pgrag.stats_changes l
                        where l.xid >= pg_snapshot_xmin((c).snap)
                          and l.relid = any(deps::oid[])
                          and not pg_visible_in_snapshot(l.xid, (c).snap))
       and ((c).owner_xid is null
            or not exists (select from pgrag.stats_changes l
                            where l.xid = (c).owner_xid and l.relid = any(deps::oid[])))
    from now_snap);

comment on function pgrag._stats_cache_valid(pgrag.stats_cache, regclass[], text) is
    'Whether cached statistics still hold for the calling statement''s snapshot';


create or replace function pgrag._stats_cache_put(doc_type text, key bytea, condition text,
                                                 stats jsonb, snap pg_snapshot, owner_xid xid8,
                                                 state text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
set lock_timeout = '10ms'
as $$
#variable_conflict use_variable
-- Store a result (pgrag.doc_type_stats_where calls it on a miss). Best effort, never an error
-- and never a wait: on a standby, in a read-only transaction, when another session is storing
-- the same key (an advisory lock, tried), or on any failure, nothing is stored and the search
-- goes on. A newer result is never replaced by an older one. Every 1,000 rows of
-- pgrag.stats_changes it prunes them (pgrag.prune_stats_changes).
-- state: pgrag.stats_triggers_state as the statement that computed the result saw it (read
-- here, a volatile function's newer snapshot could miss a trigger disabled meanwhile).
declare
    h pgrag.stats_cache_horizon;
begin
    if pg_is_in_recovery() or current_setting('transaction_read_only')::boolean
       or state is null then
        return;
    end if;
    begin
        if not pg_try_advisory_xact_lock(7061727, hashtext(encode(key, 'hex') || current_user))
        then
            return;
        end if;
        select * into h from pgrag.stats_cache_horizon;
        if h.server_started is distinct from pg_postmaster_start_time() then
            -- a restored dump, a restart: the stored xids are another server's
            perform pgrag._prune_stats_changes();
            select * into h from pgrag.stats_cache_horizon;
        end if;
        if h.server_started is distinct from pg_postmaster_start_time()
           or pg_snapshot_xmin(snap) < h.pruned_below then
            return;
        end if;
        insert into pgrag.stats_cache as c
            (doc_type, role_name, condition_hash, condition, stats, snap, owner_xid,
             server_started, triggers)
        values (doc_type, current_user, key, condition, stats, snap, owner_xid,
                pg_postmaster_start_time(), state)
        on conflict on constraint stats_cache_pkey do update
            set stats = excluded.stats, snap = excluded.snap, owner_xid = excluded.owner_xid,
                condition = excluded.condition, server_started = excluded.server_started,
                triggers = excluded.triggers, computed_at = now()
            where pg_snapshot_xmax(excluded.snap) >= pg_snapshot_xmax(c.snap)
               or c.server_started <> excluded.server_started;
        if pgrag._stats_changes_to_prune() then
            perform pgrag._prune_stats_changes();
        end if;
    exception when others then
        null;  -- not stored (a concurrent change of the type, a lock): computed next time
    end;
end
$$;

comment on function pgrag._stats_cache_put(text, bytea, text, jsonb, pg_snapshot, xid8, text)
    is 'Store computed statistics with their snapshot (best effort; never an older over a newer)';


create or replace function pgrag._stats_changes_to_prune()
returns boolean
language sql stable security invoker
set search_path = pg_catalog, pg_temp
-- Whether pgrag.stats_changes holds enough rows (1,000) to be worth pruning: asked when a
-- result is stored, and by the worker after its work (pgrag/worker.py), since every write to a
-- table cached statistics read adds a row, and a write-heavy database whose statistics are
-- rarely asked for would otherwise grow the table until the next result is stored.
return (select count(*) from (select from pgrag.stats_changes limit 1000) x) >= 1000;

comment on function pgrag._stats_changes_to_prune() is
    'Whether pgrag.stats_changes has grown enough (1,000 rows) to prune';


create or replace function pgrag._prune_stats_changes()
returns bigint
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
-- Security definer (pgrag's owner): no writer may delete rows of stats_changes or move the
-- horizon itself (a deleted change would leave another role's cached result stale), and the
-- horizon is computed over every role's cached results, not the caller's alone. It takes no
-- argument.
-- Drop the cached results that no longer hold (or are older than a day), move the horizon up
-- to the oldest snapshot still needed (this session's, or a remaining result's), and delete
-- the rows of pgrag.stats_changes below it. Returns how many it deleted. On another server
-- than the horizon's (a restored dump), everything is dropped and the horizon starts over.
-- Skips when another session is pruning.
declare
    h pgrag.stats_cache_horizon;
    target xid8;
    n bigint;
begin
    select * into h from pgrag.stats_cache_horizon for update skip locked;
    if not found then
        return 0;
    end if;
    if h.server_started is distinct from pg_postmaster_start_time() then
        delete from pgrag.stats_cache;
        delete from pgrag.stats_changes;
        get diagnostics n = row_count;
        -- every row this snapshot saw is gone: only a snapshot that saw them all may be used
        update pgrag.stats_cache_horizon
           set pruned_below = pg_snapshot_xmax(pg_current_snapshot()),
               server_started = pg_postmaster_start_time();
        return n;
    end if;
    delete from pgrag.stats_cache c
     where c.computed_at < now() - interval '1 day'
        or not coalesce((select pgrag._stats_cache_valid(c, s.cache_deps,
                                                        pgrag._stats_triggers_state(s.cache_deps))
                           from pgrag.doc_stats s where s.doc_type = c.doc_type), false);
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

comment on function pgrag._prune_stats_changes() is
    'Drop stale cached statistics and the rows of pgrag.stats_changes none still needs';


create or replace function pgrag._type_stats(doc_type text, filter jsonb, doc_types text[],
                                             out stats jsonb, out cached boolean)
language plpgsql stable security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_variable
-- The body of pgrag_docs.stats_<type>(filter, doc_types), the security definer function owned by
-- the role that declared the type's statistics: inside it, this runs as that role, and the
-- declared query runs with its rights, whoever asks (a reader, the writer, a superuser). It
-- refuses to run as anyone else: calling it directly must not run another role's SQL.
--   hits: the type's chunks matching the filter (compiled here, from the filter language; never
--   SQL text from the caller) and, for a session that does not see every tenant, only its
--   tenant's and the shared chunks (pgrag.current_tenant of the calling session).
--   A session that sees every tenant gets the cached result when it is still exact
--   (pgrag.cache_stats; the top of this file), with cached = true, and stores a result it
--   computed. A reader's statistics are computed every time.
-- Stable: the query and the snapshot it reads are those of the calling statement, so the result
-- matches its search.
declare
    s pgrag.doc_stats;
    condition text;
    key bytea;
    state text;
    cur refcursor;
    all_tenants boolean := pgrag._sees_all_tenants();
begin
    cached := false;
    select * into s from pgrag.doc_stats d where d.doc_type = _type_stats.doc_type;
    if not found then
        return;
    end if;
    if s.owner <> current_user::regrole then
        raise exception using errcode = 'PR006',
            message = format('the statistics of %s run as %s, who declared them, not as %s',
                             doc_type, s.owner, current_user),
            hint = 'ask for them with pgrag.stats or pgrag.stats_detail';
    end if;
    condition := format('c.doc_type = %L and %s', doc_type,
                        pgrag._filter_sql(filter, pgrag._filter_schema(doc_types)));
    if doc_types is not null then
        condition := condition || format(' and c.doc_type = any(%L::text[])', doc_types);
    end if;
    if not all_tenants then
        -- row-level security does not apply to the declarer's role inside this function: the
        -- chunks policy is applied here, for the calling session's tenant
        condition := condition || format(' and (c.tenant is null or c.tenant = %L)',
                                         pgrag.current_tenant());
    end if;
    if all_tenants and s.cache_deps is not null and pgrag._stats_cache_usable() then
        key := sha256(convert_to(condition || E'\x1e' || pgrag._stats_settings_key(), 'UTF8'));
        state := pgrag._stats_triggers_state(s.cache_deps);  -- in this statement's snapshot
        select c.stats into stats from pgrag.stats_cache c
         where c.doc_type = _type_stats.doc_type and c.role_name = current_user
           and c.condition_hash = key and pgrag._stats_cache_valid(c, s.cache_deps, state);
        if found then
            cached := true;
            return;
        end if;
    end if;
    -- through a cursor, which refuses a string of several statements
    open cur no scroll for execute pgrag._stats_statement(s.stats_sql, condition);
    fetch cur into stats;
    close cur;
    if key is not null then
        perform pgrag._stats_cache_put(doc_type, key, condition, stats, pg_current_snapshot(),
                                      pg_current_xact_id_if_assigned(), state);
    end if;
end
$$;

comment on function pgrag._type_stats(text, jsonb, text[]) is
    'The body of pgrag_docs.stats_<type>: the declared statistics over the chunks matching a '
    'filter, as the role that declared them, cached when exact';


create or replace function pgrag._create_stats_function(doc_type text)
returns void
language plpgsql volatile security invoker
set search_path = pg_catalog, pg_temp
as $fn$
#variable_conflict use_variable
-- (Re)create pgrag_docs.stats_<type>(filter, doc_types), as the role that declared the type's
-- statistics (the current user): a security definer function it owns, executable by the reader
-- and writer roles, which runs pgrag._type_stats, so the declared query runs with the
-- declarer's rights for every caller. It takes a filter (the filter language), never SQL.
declare
    owner regrole;
begin
    select s.owner into strict owner from pgrag.doc_stats s where s.doc_type = _create_stats_function.doc_type;
    if owner <> current_user::regrole then
        raise exception using errcode = 'PR003',
            message = format('the statistics of %s belong to role %s; %s may not generate their '
                             'function', doc_type, owner, current_user),
            hint = format('act as %s (SET ROLE %s), or declare the statistics again',
                          owner, owner);
    end if;
    perform pgrag._create_generated(pgrag._generated('stats', doc_type), 'jsonb, text[]', format($f$
        create or replace function pgrag_docs.%1$I(filter jsonb, doc_types text[],
                                                   out stats jsonb, out cached boolean)
        language sql stable security definer
        set search_path = pg_catalog, pg_temp
        -- security definer, owned by the role that declared the statistics: they run with that
        -- role's rights, whoever asks; it takes a filter, never SQL.
        as $body$ select * from pgrag._type_stats(%2$L, filter, doc_types) $body$
        $f$, pgrag._generated('stats', doc_type), doc_type), readers => true);
end
$fn$;


create or replace function pgrag.stats_changed()
returns trigger
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
-- security definer, owned by the migrating role: any role that may write a table that cached
-- statistics read records its transaction, without any grant on pgrag's tables. It only
-- inserts the trigger's own table and the top-level transaction id.
begin
    insert into pgrag.stats_changes (relid) values (tg_relid) on conflict do nothing;
    return null;
end
$$;

comment on function pgrag.stats_changed() is
    'Statement trigger: record that this transaction wrote a table some cached statistics read';



-- A conversion of the chunk store (sql/migrate/store_shape.sql) makes a new pgrag.chunks: the
-- statistics cache's trigger goes back on it when a cached type reads it.
do $$
begin
    if exists (select from pgrag.doc_stats s where 'pgrag.chunks'::regclass = any(s.cache_deps))
       and not exists (select from pg_trigger
                        where tgrelid = 'pgrag.chunks'::regclass
                          and tgname = 'pgrag_stats_changed') then
        perform pgrag._sync_stats_triggers(array['pgrag.chunks'::regclass]);
    end if;
end
$$;
