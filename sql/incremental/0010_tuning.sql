-- 0010: recall out of the box: the HNSW ef_search measured for this store, kept where every
-- search reads it, and each measurement (recall, store size, when, by whom) for `pgrag status`.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.

-- The ef_search the last tuning chose (NULL: none yet, the search's own floor applies). An
-- ALTER DATABASE / ROLE SET pgrag.ef_search still overrides it (an administrator's choice).
alter table pgrag.settings
    add column ef_search integer check (ef_search between 1 and 1000);

comment on column pgrag.settings.ef_search is
    'ef_search chosen by the last tuning (pgrag tune, or the worker after the store grew or '
    'shrank twofold); NULL: not tuned';

create table pgrag.tuning (
    id bigint generated always as identity primary key,
    measured_at timestamptz not null default now(),
    model text,                        -- the embedding model of the vectors measured
    chunks bigint not null check (chunks >= 0),
    k integer not null check (k > 0),
    target real not null check (target > 0 and target <= 1),
    ef_search integer check (ef_search between 1 and 1000),  -- NULL: no value reached target
    recall real not null check (recall between 0 and 1),      -- at ef_search, else the best
    best_ef_search integer not null check (best_ef_search between 1 and 1000),
    queries integer not null check (queries > 0),
    source text not null check (source in ('questions', 'chunks')),
    tuned_by text not null check (tuned_by in ('pgrag tune', 'worker', 'pgrag reindex'))
);

comment on table pgrag.tuning is
    'Each measurement of HNSW recall against exact search: the smallest ef_search reaching the '
    'target recall@k, on held-out vectors of the store (pgrag/tune.py)';

-- Before 0010, `pgrag tune` stored its value as a database default (ALTER DATABASE ... SET
-- pgrag.ef_search), which now reads as an administrator's override of every later tuning:
-- move it into the store, and remove the database default when the migrating role may.
do $$
declare
    v text;
begin
    select split_part(c, '=', 2) into v
      from pg_catalog.pg_db_role_setting s, unnest(s.setconfig) c
     where s.setdatabase = (select oid from pg_catalog.pg_database
                             where datname = current_database())
       and s.setrole = 0 and c like 'pgrag.ef\_search=%';
    if v is null or v !~ '^[0-9]{1,4}$' or v::integer not between 1 and 1000 then
        return;
    end if;
    update pgrag.settings set ef_search = v::integer;
    if pg_catalog.pg_has_role((select datdba from pg_catalog.pg_database
                                where datname = current_database()), 'USAGE') then
        execute format('alter database %I reset pgrag.ef_search', current_database());
    else
        raise warning using
            message = format('pgrag.ef_search = %s is set for database %s and overrides the '
                             'store''s tuning', v, current_database()),
            hint = format('have the database owner run `alter database %I reset '
                          'pgrag.ef_search;`', current_database());
    end if;
end
$$;

-- The rows a statement records for the commit's key queries (pgrag.sync_queue.changed) are
-- kept without compression: pglz tried every entry of 1,000 rows, and on rows it could not
-- shrink that was half the statement's time (an UPDATE of 100,000 rows of 2 KB: 11.9-12.1 s,
-- 5.5-6.3 s without; docs/benchmarks.md). sync_queue is unlogged and emptied at each commit:
-- compressing it never paid. (pgrag.render_queue keeps pglz: its entries wait for the worker
-- and go to the WAL, where ordinary rows shrink about fourfold.) SET STORAGE takes an ACCESS
-- EXCLUSIVE lock on the table, which every transaction recording rows for its commit takes
-- too: the migration waits at most 5 s for it rather than queue the application's writers
-- behind a long transaction, and fails (changing nothing) if it cannot have it.
do $$
declare
    waited text := current_setting('lock_timeout');
begin
    perform pg_catalog.set_config('lock_timeout', '5s', true);
    alter table pgrag.sync_queue alter column changed set storage external;
    perform pg_catalog.set_config('lock_timeout', waited, true);
exception when lock_not_available then
    raise exception using errcode = 'lock_not_available',
        message = 'pgrag.sync_queue is held by a transaction open for more than 5 s (a write '
                  'recording rows for its commit)',
        hint = 'let it end (pg_stat_activity shows it), then run the upgrade again';
end
$$;

-- The migrating role acts as the writer role (it regenerates the functions of the types
-- declared as it, and calls them for `pgrag verify` and `rebuild`): 0006 made it a member, but
-- checked MEMBER, which on PostgreSQL 16+ a CREATEROLE role has of the roles it creates with
-- ADMIN alone, neither SET nor INHERIT. Such a DBA could not verify, rebuild or upgrade again
-- once types were declared as the writer role. Granted here what 0006 meant to grant.
do $$
declare
    s pgrag.settings;
begin
    select * into strict s from pgrag.settings;
    if not pg_catalog.pg_has_role(current_user, s.writer_role, 'USAGE') then
        begin
            execute format('grant %I to %I', s.writer_role, current_user);
        exception when insufficient_privilege then
            raise exception using
                errcode = 'PR006',
                message = format('%I is not a member of the writer role %I and may not join it',
                                 current_user, s.writer_role),
                hint = format('have a DBA run `grant %I to %I;` and migrate again',
                              s.writer_role, current_user);
        end;
    end if;
end
$$;

-- The tables a type's declared statistics read, found at declaration in the declarer's own
-- session (pgrag.declare_stats): pgrag.cache_stats in a superuser's session uses them instead of
-- parsing the declarer's query there (docs/security.md).
alter table pgrag.doc_stats add column if not exists query_tables regclass[];
