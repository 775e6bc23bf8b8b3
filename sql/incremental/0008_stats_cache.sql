-- 0008: the statistics cache: exact statistics reused while the tables they read are unchanged.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- A document type whose statistics are cached (pgrag.cache_stats) lists the tables its declared
-- query reads in doc_stats.cache_deps. A statement trigger on each of those tables (and on
-- pgrag.chunks) records the writing transaction in pgrag.stats_changes. A cached result keeps
-- the snapshot it was computed in: it is served only to a snapshot that sees the same
-- transactions of those tables, so it equals what the query would return (the functions and
-- the proof: sql/idempotent/60_stats_cache.sql; docs/search.md, "The statistics cache").

alter table pgrag.doc_stats add column cache_deps regclass[];

comment on column pgrag.doc_stats.cache_deps is
    'NULL: the statistics are computed at every call; else they are cached, and these are the '
    'tables the declared query reads (pgrag.cache_stats)';

create table pgrag.stats_cache (
    doc_type text not null,           -- no foreign key: a search storing a result locks no
                                      -- row of pgrag.doc_stats (prune drops orphans)
    role_name name not null,          -- whose privileges computed it: only that role reuses it
    condition_hash bytea not null,    -- sha256 of condition and the settings output depends on
    condition text not null,          -- the chunks' condition (alias c), values as literals
    stats jsonb,
    snap pg_snapshot not null,        -- the snapshot the statistics were computed in
    owner_xid xid8,                   -- the computing transaction's id, if it had one then
    server_started timestamptz not null,  -- pg_postmaster_start_time(): xids of this server
    triggers text not null,           -- the tables' triggers then (pgrag.stats_triggers_state)
    computed_at timestamptz not null default now(),
    primary key (doc_type, role_name, condition_hash)
);

comment on table pgrag.stats_cache is
    'Exact statistics per document type, role and filter, with the snapshot they were computed in';

-- Each role sees and writes only its own results (the policy: 60_stats_cache.sql).
alter table pgrag.stats_cache enable row level security;

-- One row per transaction and table it wrote, for the tables cached statistics read. Inserted
-- by pgrag.stats_changed (statement triggers), deleted below the horizon by pgrag.stats_cache_put.
create table pgrag.stats_changes (
    xid xid8 not null default pg_current_xact_id(),
    relid oid not null,
    primary key (xid, relid)
);

comment on table pgrag.stats_changes is
    'Transactions that wrote a table some cached statistics read (pruned below the horizon)';

-- One row: stats_changes has no row below pruned_below any more, so a cached result whose
-- snapshot is older than that can no longer be checked, and is not used.
create table pgrag.stats_cache_horizon (
    one boolean primary key default true check (one),
    pruned_below xid8 not null default '0',
    server_started timestamptz  -- the server whose xids pruned_below counts
);

insert into pgrag.stats_cache_horizon default values;

comment on table pgrag.stats_cache_horizon is
    'How far pgrag.stats_changes was pruned: cached statistics older than that are not used';
