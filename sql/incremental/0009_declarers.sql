-- 0009: the shape of a search hit, written once.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.

-- One row of a search: the chunk, its scores, its parent, and how the vectors were searched
-- ('index', 'exact', or 'text' without a vector search). Every search function returns it.
create type pgrag.search_hit as (
    id bigint,
    doc_type text,
    source_key text,
    text text,
    metadata jsonb,
    score double precision,         -- hybrid: reciprocal rank fusion; vector: 1 - cosine
                                    -- distance; text: ts_rank
    distance double precision,      -- cosine distance (NULL when only full text found it)
    vector_rank integer,
    text_rank integer,
    text_score real,
    parent_id bigint,
    parent_source_key text,
    parent_text text,
    scan text
);

comment on type pgrag.search_hit is
    'One search result: the chunk, its scores and ranks, its parent, and the vector scan used';

-- Declared SQL runs with the rights of the role that declared it (docs/security.md): the
-- functions pgrag generates for a document type are security definer functions owned by that
-- role, in a schema of their own where writers may create them; schema pgrag holds pgrag's own
-- objects only (writers lose CREATE on it: revoked by the idempotent files' grants).
create schema pgrag_docs;

comment on schema pgrag_docs is
    'pgrag: the views and functions generated for declared document types, each owned by the '
    'role that declared the type';

-- Who declared each type (and its statistics): its generated functions belong to that role and
-- run with its rights, whoever triggers them. Until now, the owner of the type's generated render
-- function (the role that declared it; a migration kept it), else of the view pgrag made for it.
alter table pgrag.doc_types add column owner regrole;

update pgrag.doc_types d
   set owner = coalesce(
       (select p.proowner::regrole from pg_catalog.pg_proc p
         where p.pronamespace = 'pgrag'::regnamespace and p.proname = 'render_' || d.name
         limit 1),
       (select c.relowner::regrole from pg_catalog.pg_class c
         where c.oid = d.source and d.owns_source),
       (select n.nspowner::regrole from pg_catalog.pg_namespace n where n.nspname = 'pgrag'));

alter table pgrag.doc_types
    alter column owner set default current_user::regrole,
    alter column owner set not null;

comment on column pgrag.doc_types.owner is
    'The role that declared the type: its generated functions are its, and run with its rights';

alter table pgrag.doc_stats add column owner regrole;

update pgrag.doc_stats s set owner = (select d.owner from pgrag.doc_types d where d.name = s.doc_type);

alter table pgrag.doc_stats
    alter column owner set default current_user::regrole,
    alter column owner set not null;

comment on column pgrag.doc_stats.owner is
    'The role that declared the statistics: they run with its rights, whoever asks for them';

-- The catalog rows change only as their owner: row-level security lets a writer insert rows it
-- owns and change or delete only the rows of roles it may act as (the policies:
-- sql/idempotent/90_privileges.sql). The table owner (the migrating role) and superusers are not
-- subject to it.
alter table pgrag.doc_types enable row level security;
alter table pgrag.doc_watches enable row level security;
alter table pgrag.doc_stats enable row level security;

-- The query cache's TTL is the server's setting, not the caller's: a reader that chose it could
-- read entries older than the configured TTL and time when a guessed question was cached.
alter table pgrag.settings
    add column query_cache_ttl interval not null default interval '7 days'
        constraint settings_query_cache_ttl_check check (query_cache_ttl > interval '0');

comment on column pgrag.settings.query_cache_ttl is
    'How long a question''s cached vector is used and kept (pgrag.query_cache); set by the DBA';

-- The write path (docs/documents.md, Sync): a type renders at its writers' commit (`commit`)
-- or, recorded in the same transaction, by the worker (`queue`).
alter table pgrag.doc_types
    add column sync text not null default 'commit'
        constraint doc_types_sync_check check (sync in ('commit', 'queue'));

comment on column pgrag.doc_types.sync is
    'commit: documents a transaction changed are rendered when it commits; queue: recorded with '
    'it and rendered by the worker';

-- The relations a watch's key query reads besides `changed`, from its plan at declaration.
-- Keys that depend on `changed` alone are found once, by the statement; the others are found
-- again if other transactions committed meanwhile (a row moved to another document). NULL: not
-- known (declared before 0009; a migration plans no declared SQL): treated as reading others.
alter table pgrag.doc_watches add column reads regclass[];

comment on column pgrag.doc_watches.reads is
    'Relations the key query reads besides changed (its plan at declaration); NULL: unknown';

-- A document's text is cut to pgrag's limit (pgrag._limit('document_chars')) before it is
-- stored and indexed; the chunk says so.
alter table pgrag.chunks add column truncated_from integer;

comment on column pgrag.chunks.truncated_from is
    'The length of the rendered text when it was cut to pgrag''s limit; NULL: the whole text';

-- Documents to render by the worker: a queue-mode type's changes, and what a committing
-- transaction could not render itself. Committed with the source change: nothing is lost.
create table pgrag.render_queue (
    id bigint generated always as identity primary key,
    doc_type text not null,
    keys text[],              -- documents to render
    source_table regclass,    -- with rows: the watched table they belong to
    rows text,                -- changed rows (source_table's row type, as array text) whose
                              -- documents the watch's key query finds when they are rendered
    queued_at timestamptz not null default clock_timestamp()
    -- keys and rows NULL: every document of the type (after a TRUNCATE)
);

comment on table pgrag.render_queue is
    'Documents waiting to be rendered by the worker (queue-mode types; deferred renders)';

-- Documents whose render failed: skipped (their chunk stays as it was) and shown by
-- pgrag verify / status until a render succeeds.
create table pgrag.render_errors (
    doc_type text not null,
    source_key text not null,
    sqlstate text not null,
    message text not null,
    failed_at timestamptz not null default now(),
    primary key (doc_type, source_key)
);

comment on table pgrag.render_errors is
    'Documents whose last render failed (skipped; the chunk keeps its previous text)';

-- The worker's render lag (queued to rendered), per batch, for pgrag status: an hour kept.
create table pgrag.render_lag (
    rendered_at timestamptz not null default clock_timestamp(),
    doc_type text not null,
    documents integer not null,
    lags_ms real[] not null
);

create index render_lag_rendered_at on pgrag.render_lag (rendered_at);

comment on table pgrag.render_lag is
    'Queued-to-rendered lag of the worker''s render batches (the last hour)';

-- What the question parser may know of a type beyond its metadata keys and their values: a
-- description and synonyms of the type, and per key a description, synonyms and synonyms of
-- its values (pgrag.describe_document; docs/declaring.md).
alter table pgrag.doc_types add column vocabulary jsonb not null default '{}'::jsonb
    check (jsonb_typeof(vocabulary) = 'object');

comment on column pgrag.doc_types.vocabulary is
    'Words for the question parser: {"description", "synonyms", "keys": {key: {"description", '
    '"synonyms", "values": {value: [synonym, ...]}}}} (pgrag.describe_document)';
