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
